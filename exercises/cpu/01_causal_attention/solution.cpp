// Exercise 1's solution: causal attention of one request, one (row, head) at a time.
#include <cmath>
#include <limits>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

AttentionResult causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale) {
  const int64_t qo_len = q.dim(0), num_qo_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t kv_len = k.dim(0), group = num_qo_heads / k.dim(1);
  AttentionResult result{Tensor({qo_len, num_qo_heads, head_dim}), Tensor({qo_len, num_qo_heads})};
  for (int64_t i = 0; i < qo_len; ++i) {
    const int64_t last = i + (kv_len - qo_len);  // the last key query i may see
    const int64_t visible = std::max<int64_t>(0, std::min(kv_len, last + 1));
    for (int64_t h = 0; h < num_qo_heads; ++h) {
      const int64_t kv_head = h / group;
      if (visible == 0) {  // the empty set of keys: o = 0, lse = -inf
        result.lse({i, h}) = -std::numeric_limits<double>::infinity();
        continue;
      }
      // 1. scores s_j = sm_scale * q . k_j over the visible keys, and their maximum m
      std::vector<double> s(static_cast<size_t>(visible));
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += q({i, h, d}) * k({j, kv_head, d});
        s[static_cast<size_t>(j)] = sm_scale * dot;
        m = std::max(m, s[static_cast<size_t>(j)]);
      }
      // 2. the safe softmax: exp(s_j - m) never overflows; its sum is the denominator
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - m));
      // 3. o = sum_j p_j v_j, and lse = log(sum_j exp(s_j)) = m + log(sum)
      for (int64_t j = 0; j < visible; ++j)
        for (int64_t d = 0; d < head_dim; ++d)
          result.o({i, h, d}) += s[static_cast<size_t>(j)] / sum * v({j, kv_head, d});
      result.lse({i, h}) = m + std::log(sum);
    }
  }
  return result;
}
