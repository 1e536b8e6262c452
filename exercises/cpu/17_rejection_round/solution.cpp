// Exercise 17's solution: an inverse CDF over the candidates, then one counting pass.
#include "rejection_round.hpp"

using flashstep::ref::Mass;
using flashstep::ref::mass_of;

int32_t rejection_round(const std::vector<float>& probs, Mass top_p_bound, uint32_t u24, RejectionState& state) {
  // 1. draw: the first candidate whose cumulative mass exceeds u * q (exists: u < 1)
  const Mass threshold = flashstep::ref::scaled_threshold(u24, state.q);
  int32_t s = -1;
  Mass cdf = 0;
  for (size_t i = 0; i < probs.size() && s < 0; ++i)
    if (probs[i] > state.low && (cdf += mass_of(probs[i])) > threshold) s = static_cast<int32_t>(i);
  // 2. the mass strictly above each pivot, in one pass (pivot_1 in float, as the GPU computes it)
  const float pivot_0 = probs[static_cast<size_t>(s)];
  const float pivot_1 = (pivot_0 + state.high) * 0.5f;
  Mass mass_0 = 0, mass_1 = 0;
  for (float p : probs) {
    if (p > pivot_0) mass_0 += mass_of(p);
    if (p > pivot_1) mass_1 += mass_of(p);
  }
  // 3. accept, or discard everything at or below a pivot that fails
  if (mass_0 < top_p_bound) return s;
  if (mass_1 < top_p_bound) {
    state.low = pivot_0;
    state.high = pivot_1;
    state.q = mass_0;
  } else {
    state.low = pivot_1;
    state.q = mass_1;
  }
  return -1;
}
