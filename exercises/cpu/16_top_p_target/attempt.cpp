// Exercise 16 (chapter 10, "The textbook way"): the exact distribution top-p sampling
// must draw from.
//
// Fill in top_p_distribution() below: keep the smallest set of most likely tokens whose
// mass reaches top_p of the row's total, zero the rest, renormalize. Ties are kept or
// dropped together, so the rule is stated per token: token i is kept iff p_i > 0 and the
// mass of the tokens *strictly* more likely than it is below top_p * total. This is the
// oracle every sampler is tested against; the grader compares yours with the reference's
// sampling_target_distribution.
//
//     cmake --build build --target flashstep_exercise_cpu_16_top_p_target
//     flashstep exercise check 16         (or run build/bin/flashstep_exercise_cpu_16_top_p_target)
//
// Stuck? `flashstep exercise hint 16`. The solution is solution.cpp beside this file.
#include <vector>

#include <flashstep/reference.hpp>

/// The top-p target distribution of one row.
/// \param probs (vocab) float32 probabilities >= 0, positive total (not necessarily 1)
/// \param top_p in (0, 1]
/// \return (vocab) the kept tokens' probabilities divided by the kept mass; 0 elsewhere.
///         The reference sums masses exactly: flashstep::ref::mass_of(p) is p as an
///         integer number of 2^-96 units, and mass_fraction_ceil(total, top_p) the bound.
std::vector<double> top_p_distribution(const std::vector<float>& probs, float top_p) {
  std::vector<double> target;
  // TODO(exercise): decide which tokens are kept, then renormalize them.
  return target;
}
