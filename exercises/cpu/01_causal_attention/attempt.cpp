// Exercise 1 (chapter 1, "A sequence, and what attention does with it"): causal attention
// of one request, written out step by step.
//
// Fill in causal_attention() below: the scores, the causal mask aligned bottom-right, a
// safe softmax, the weighted sum of V, and each row's log-sum-exp. The grader compares
// your o and lse with the reference's single_prefill_with_kv_cache on random requests
// (grouped-query heads, and requests with fewer or more queries than keys).
//
//     cmake --build build --target flashstep_exercise_cpu_01_causal_attention
//     flashstep exercise check 1          (or run build/bin/flashstep_exercise_cpu_01_causal_attention)
//
// Stuck? `flashstep exercise hint 1`. The solution is solution.cpp beside this file.
#include <flashstep/reference.hpp>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

/// Causal attention of one request.
/// \param q (qo_len, num_qo_heads, head_dim)
/// \param k (kv_len, num_kv_heads, head_dim); num_qo_heads is a multiple of num_kv_heads,
///        and query head h reads kv head h / (num_qo_heads / num_kv_heads)
/// \param v (kv_len, num_kv_heads, head_dim)
/// \param sm_scale multiplies every dot product q . k
/// \return o (qo_len, num_qo_heads, head_dim) and lse (qo_len, num_qo_heads), natural log.
///         Query i sees key j iff j <= i + (kv_len - qo_len); a row that sees no key gets
///         o = 0 and lse = -inf.
AttentionResult causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale) {
  AttentionResult result;
  // TODO(exercise): fill result.o and result.lse.
  return result;
}
