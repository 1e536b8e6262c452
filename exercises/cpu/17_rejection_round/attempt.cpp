// Exercise 17 (chapter 10, "Sampling without sorting"): one round of top-p sampling by
// rejection, as FlashInfer's kernels run it.
//
// Fill in rejection_round() below (its contract is in rejection_round.hpp). The grader
// runs the loop around your round, with the same Philox uniforms as the reference, and
// compares the accepted token and the number of rounds with the reference's
// rejection_sample_row, draw for draw: sorting-free sampling is exact, so they must agree.
//
//     cmake --build build --target flashstep_exercise_cpu_17_rejection_round
//     flashstep exercise check 17         (or run build/bin/flashstep_exercise_cpu_17_rejection_round)
//
// Stuck? `flashstep exercise hint 17`. The solution is solution.cpp beside this file.
#include "rejection_round.hpp"

int32_t rejection_round(const std::vector<float>& probs, flashstep::ref::Mass top_p_bound, uint32_t u24,
                        RejectionState& state) {
  // TODO(exercise): draw, test the two pivots, accept or narrow the state.
  return -1;
}
