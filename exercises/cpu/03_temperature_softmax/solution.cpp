// Exercise 3's solution: a safe softmax of each row divided by its temperature.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

Tensor softmax_with_temperature(const Tensor& logits, const std::vector<double>& temperature) {
  const int64_t batch = logits.dim(0), vocab = logits.dim(1);
  Tensor probs({batch, vocab});
  for (int64_t b = 0; b < batch; ++b) {
    const double T = temperature[static_cast<size_t>(b)];
    // the largest scaled logit: subtracting it keeps every exponent <= 0
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, logits({b, i}) / T);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += probs({b, i}) = std::exp(logits({b, i}) / T - m);  // exp(-inf) = 0
    for (int64_t i = 0; i < vocab; ++i) probs({b, i}) /= sum;
  }
  return probs;
}
