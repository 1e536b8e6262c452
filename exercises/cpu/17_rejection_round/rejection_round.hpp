// Exercise 17's types: the state of the top-p rejection loop between rounds, and the
// round you write.
#pragma once

#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

/// What the loop knows between rounds.
struct RejectionState {
  float low = 0.0f;            ///< the candidates are the tokens with p > low
  float high = 1.0f;           ///< a pivot of at least `high` is known to pass the top-p rule
  flashstep::ref::Mass q = 0;  ///< the exact mass of the candidates (the row's total at first)
};

/// One round of top-p sampling by rejection (chapter 10; FlashInfer's kernel).
/// 1. Draw: with the uniform u24 / 2^24, the threshold is scaled_threshold(u24, q); the
///    drawn token s is the first candidate, in vocabulary order, whose cumulative mass
///    (over candidates only) exceeds the threshold.
/// 2. Test two pivots in one pass: pivot_0 = probs[s] and pivot_1 = (pivot_0 + high) * 0.5f.
///    A pivot passes when the mass of the tokens strictly above it is below top_p_bound.
/// 3. If pivot_0 passes, s is accepted: return it. Otherwise return -1 after narrowing the
///    candidates: if pivot_1 passes, the cut lies in (pivot_0, pivot_1], so keep only
///    p > pivot_0 and lower `high` to pivot_1; if not, keep only p > pivot_1. Either way q
///    becomes the exact mass of the new candidates.
/// \param probs (vocab) float32 probabilities
/// \param top_p_bound mass_fraction_ceil(total, top_p): the exact bound of the rule
/// \param u24 this round's 24-bit uniform (Philox), < 2^24
/// \param state low, high and q, updated when the round rejects
/// \return the accepted token, or -1 for "draw again"
int32_t rejection_round(const std::vector<float>& probs, flashstep::ref::Mass top_p_bound, uint32_t u24,
                        RejectionState& state);
