/// \file merge.hpp
/// \brief The attention-state merge: the one operator behind split-KV, cascade and
/// multi-GPU attention.
///
/// The attention state of a key set S for one query and head is (o_S, lse_S) with
/// lse_S = log sum_{j in S} exp(s_j) and o_S = sum_j exp(s_j - lse_S) v_j. For disjoint
/// A and B:
///
///     lse = log(exp(lse_A) + exp(lse_B))
///     o   = exp(lse_A - lse) o_A + exp(lse_B - lse) o_B
///
/// which is exactly the state of A u B: merging is exact, commutative and associative.
/// The empty set's state (o = 0, lse = -inf) is the identity.
#pragma once

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Merged state of two disjoint key sets.
struct MergedState {
  Tensor v;  ///< merged output, shape (seq_len, num_heads, head_dim)
  Tensor s;  ///< merged natural-log LSE, shape (seq_len, num_heads)
};

/// Merge two attention states (FlashInfer's merge_state).
/// \param v_a partial output of index set A, shape (seq_len, num_heads, head_dim)
/// \param s_a natural-log LSE of A, shape (seq_len, num_heads); -inf means "A is empty"
/// \param v_b partial output of index set B, shape (seq_len, num_heads, head_dim)
/// \param s_b natural-log LSE of B, shape (seq_len, num_heads)
MergedState merge_state(const Tensor& v_a, const Tensor& s_a, const Tensor& v_b, const Tensor& s_b);

/// Merge n attention states per position (FlashInfer's merge_states).
/// \param v partial outputs, shape (seq_len, num_states, num_heads, head_dim)
/// \param s their natural-log LSEs, shape (seq_len, num_states, num_heads)
/// \return v (seq_len, num_heads, head_dim), s (seq_len, num_heads)
MergedState merge_states(const Tensor& v, const Tensor& s);

}  // namespace flashstep::ref
