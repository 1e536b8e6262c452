// Tensor utilities shared by the tests and the tour.
#include "flashstep/reference/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashstep::ref {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape != b.shape || a.data.size() != b.data.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (a.data[i] == b.data[i]) continue;  // also equal infinities
    const double d = std::abs(a.data[i] - b.data[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

}  // namespace flashstep::ref
