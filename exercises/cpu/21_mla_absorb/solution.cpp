// Exercise 21's solution: the two projections leave the keys. Per head, one product with
// W_UK before the loop and one with W_UV after it; in the loop, dot products with the
// shared latents, which is why an MLA decode kernel reads each latent once for all heads.
#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>
#include <vector>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

AttentionResult absorbed_decode(const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                                const Tensor& w_uk, const Tensor& w_uv, double sm_scale) {
  const int64_t heads = q_nope.dim(0), nope = q_nope.dim(1), rope = q_pe.dim(1);
  const int64_t kv_len = ckv.dim(0), rank = ckv.dim(1), vo = w_uv.dim(1);
  AttentionResult r{Tensor({heads, vo}), Tensor({heads})};
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> q_lat(static_cast<size_t>(rank), 0.0);  // W_UK[h]^T q_nope_h
    for (int64_t e = 0; e < nope; ++e)
      for (int64_t d = 0; d < rank; ++d) q_lat[size_t(d)] += w_uk({h, e, d}) * q_nope({h, e});
    std::vector<double> s(static_cast<size_t>(kv_len));
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kv_len; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < rank; ++d) dot += q_lat[size_t(d)] * ckv({j, d});
      for (int64_t d = 0; d < rope; ++d) dot += q_pe({h, d}) * kpe({j, d});
      s[size_t(j)] = sm_scale * dot;
      m = std::max(m, s[size_t(j)]);
    }
    if (kv_len == 0) {
      r.lse({h}) = -std::numeric_limits<double>::infinity();
      continue;
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    std::vector<double> o_lat(static_cast<size_t>(rank), 0.0);  // sum_j p_j c_j / sum
    for (int64_t j = 0; j < kv_len; ++j)
      for (int64_t d = 0; d < rank; ++d) o_lat[size_t(d)] += s[size_t(j)] * ckv({j, d}) / sum;
    for (int64_t e = 0; e < vo; ++e) {  // W_UV[h] o_lat, once per head
      double acc = 0;
      for (int64_t d = 0; d < rank; ++d) acc += w_uv({h, e, d}) * o_lat[size_t(d)];
      r.o({h, e}) = acc;
    }
    r.lse({h}) = m + std::log(sum);
  }
  return r;
}
