// Exercise 18 (the attention-sinks lesson, stages/sinks/README.md): add a head's sink to a
// finished attention state.
//
// Fill in add_sink() below. (o, lse) is the attention state of one query row and head over
// its keys: o the normalised output, lse = log(sum_j e^{s_j}) (-inf when it saw no key).
// A sink is a logit that joins the softmax's denominator and carries no value. Return the
// state with the sink in it:
//     lse' = log(e^{lse} + e^{sink}),    o' = o e^{lse - lse'}
// The grader attends random keys with the reference twice, without sinks (your input) and
// with them (what you must return), so an empty key set (lse = -inf) comes up too.
//
//     cmake --build build --target flashstep_exercise_cpu_18_attention_sinks
//     flashstep exercise check 18         (or run build/bin/flashstep_exercise_cpu_18_attention_sinks)
//
// Stuck? `flashstep exercise hint 18`. The solution is solution.cpp beside this file.
#include <flashstep/reference.hpp>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

/// The states of every row and head of `state` with sinks[h] added to head h's denominator.
/// \param state o (rows, heads, head_dim) and lse (rows, heads), natural log, as the
///        reference's attention returns them
/// \param sinks (heads) natural-log sink logits, finite
/// \return o' (rows, heads, head_dim) and lse' (rows, heads)
AttentionResult add_sink(const AttentionResult& state, const std::vector<double>& sinks) {
  AttentionResult out;
  // TODO(exercise): fill out.o and out.lse.
  return out;
}
