// Exercise 2's solution: RoPE, pair by pair.
#include <cmath>
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

Tensor rope(const Tensor& x, const std::vector<int32_t>& positions, double rope_theta, bool interleave) {
  const int64_t nnz = x.dim(0), heads = x.dim(1), head_dim = x.dim(2), half = head_dim / 2;
  Tensor out = x;
  for (int64_t t = 0; t < nnz; ++t)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        // pair i turns by p * theta_i; pair 0 fastest (one radian per position)
        const double theta = std::pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
        const double angle = positions[static_cast<size_t>(t)] * theta;
        const int64_t ia = interleave ? 2 * i : i, ib = interleave ? 2 * i + 1 : i + half;
        const double a = x({t, h, ia}), b = x({t, h, ib});
        out({t, h, ia}) = a * std::cos(angle) - b * std::sin(angle);
        out({t, h, ib}) = b * std::cos(angle) + a * std::sin(angle);
      }
  return out;
}
