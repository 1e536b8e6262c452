// Exercise 13 (chapter 8, "Cascade attention and the merge operator"): merge two
// attention states exactly.
//
// Fill in merge() below. (o_a, lse_a) is attention over one set of keys, (o_b, lse_b)
// over a disjoint set; return the state of their union. The empty set's state
// (o = 0, lse = -inf) must change nothing, and two empty sets merge to an empty set. The
// grader splits random keys in two (sometimes leaving a side empty), attends each part
// with the reference, and compares your merge with the reference's merge_state.
//
//     cmake --build build --target flashstep_exercise_cpu_13_merge_state
//     flashstep exercise check 13         (or run build/bin/flashstep_exercise_cpu_13_merge_state)
//
// Stuck? `flashstep exercise hint 13`. The solution is solution.cpp beside this file.
#include <flashstep/reference.hpp>

using flashstep::ref::MergedState;
using flashstep::ref::Tensor;

/// The state of A u B from the states of disjoint A and B:
///     lse = log(exp(lse_a) + exp(lse_b))
///     o   = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b
/// computed without overflow (subtract the larger lse first) and without forming
/// (-inf) - (-inf).
/// \param o_a (seq_len, num_heads, head_dim) \param lse_a (seq_len, num_heads), natural log
/// \param o_b (seq_len, num_heads, head_dim) \param lse_b (seq_len, num_heads)
/// \return v: the merged o (seq_len, num_heads, head_dim); s: the merged lse (seq_len, num_heads)
MergedState merge(const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b, const Tensor& lse_b) {
  MergedState merged;
  // TODO(exercise): fill merged.v and merged.s.
  return merged;
}
