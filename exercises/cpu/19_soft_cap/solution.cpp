// Exercise 19's solution: the cap goes on each score, before the max and the sum; the
// rest is the softmax of exercise 5.
#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>
#include <vector>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

AttentionResult capped_decode(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale, double cap) {
  const int64_t heads = q.dim(0), head_dim = q.dim(1), kv_len = k.dim(0), kv_heads = k.dim(1);
  AttentionResult r{Tensor({heads, head_dim}), Tensor({heads})};
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t kh = h / (heads / kv_heads);
    std::vector<double> s(static_cast<size_t>(kv_len));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kv_len; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += q({h, d}) * k({j, kh, d});
      s[size_t(j)] = cap * std::tanh(dot * sm_scale / cap);  // every score now in (-cap, cap)
      m = std::max(m, s[size_t(j)]);
    }
    if (kv_len == 0) {
      r.lse({h}) = -std::numeric_limits<double>::infinity();
      continue;
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int64_t d = 0; d < head_dim; ++d) {
      double acc = 0;
      for (int64_t j = 0; j < kv_len; ++j) acc += s[size_t(j)] * v({j, kh, d});
      r.o({h, d}) = acc / sum;
    }
    r.lse({h}) = m + std::log(sum);
  }
  return r;
}
