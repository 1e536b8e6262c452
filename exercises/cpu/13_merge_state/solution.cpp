// Exercise 13's solution: each (row, head) reweighted by its share of the total.
#include <algorithm>
#include <cmath>
#include <limits>

#include <flashstep/reference.hpp>

using flashstep::ref::MergedState;
using flashstep::ref::Tensor;

MergedState merge(const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b, const Tensor& lse_b) {
  const int64_t seq_len = o_a.dim(0), heads = o_a.dim(1), head_dim = o_a.dim(2);
  MergedState merged{Tensor(o_a.shape), Tensor(lse_a.shape)};
  for (int64_t i = 0; i < seq_len; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const double a = lse_a({i, h}), b = lse_b({i, h});
      const double m = std::max(a, b);
      if (m == -std::numeric_limits<double>::infinity()) {  // both empty: the empty state
        merged.s({i, h}) = m;
        continue;
      }
      // exp(x - m) <= 1, and exp(-inf - m) = 0 for an empty side (m is finite here)
      const double wa = std::exp(a - m), wb = std::exp(b - m), sum = wa + wb;
      merged.s({i, h}) = m + std::log(sum);
      for (int64_t d = 0; d < head_dim; ++d) merged.v({i, h, d}) = (wa * o_a({i, h, d}) + wb * o_b({i, h, d})) / sum;
    }
  return merged;
}
