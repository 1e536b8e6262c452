// Exercise 5's solution: rows appended at the end of row-major tensors, then one query
// against the whole cache.
#include <cmath>
#include <limits>
#include <vector>

#include "kv_cache.hpp"

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

namespace {

// Row-major (rows, heads, dim): new rows go at the end of the data, and the first extent grows.
void append_rows(Tensor& cache, const Tensor& rows) {
  if (cache.shape.empty()) cache.shape = {0, rows.dim(1), rows.dim(2)};
  cache.data.insert(cache.data.end(), rows.data.begin(), rows.data.end());
  cache.shape[0] += rows.dim(0);
}

}  // namespace

AttentionResult decode_step(KVCache& cache, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                            double sm_scale) {
  append_rows(cache.k, k_new);
  append_rows(cache.v, v_new);
  const int64_t kv_len = cache.k.dim(0), num_qo_heads = q.dim(0), head_dim = q.dim(1);
  const int64_t group = num_qo_heads / cache.k.dim(1);
  AttentionResult result{Tensor({num_qo_heads, head_dim}), Tensor({num_qo_heads})};
  for (int64_t h = 0; h < num_qo_heads; ++h) {
    std::vector<double> s(static_cast<size_t>(kv_len));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kv_len; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += q({h, d}) * cache.k({j, h / group, d});
      m = std::max(m, s[static_cast<size_t>(j)] = sm_scale * dot);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    for (int64_t j = 0; j < kv_len; ++j)
      for (int64_t d = 0; d < head_dim; ++d)
        result.o({h, d}) += s[static_cast<size_t>(j)] / sum * cache.v({j, h / group, d});
    result.lse({h}) = m + std::log(sum);
  }
  return result;
}
