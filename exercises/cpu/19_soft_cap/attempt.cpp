// Exercise 19 (the soft-cap lesson, stages/soft_cap/README.md): decode attention whose
// scores are capped before the softmax.
//
// Fill in capped_decode() below: one query row per head attends all keys of its kv head
// (GQA: query head h reads kv head h / (heads / kv_heads)), each score
// s = sm_scale q . k capped to c tanh(s / c) before the softmax. Return o and the
// natural-log lse. The grader compares with the reference's single_decode_with_kv_cache
// under AttentionOptions::logits_soft_cap; some of its scores are far above the cap.
//
//     cmake --build build --target flashstep_exercise_cpu_19_soft_cap
//     flashstep exercise check 19         (or run build/bin/flashstep_exercise_cpu_19_soft_cap)
//
// Stuck? `flashstep exercise hint 19`. The solution is solution.cpp beside this file.
#include <flashstep/reference.hpp>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

/// \param q (heads, head_dim) \param k, v (kv_len, kv_heads, head_dim), NHD
/// \param sm_scale the score scale \param cap c > 0
/// \return o (heads, head_dim) and lse (heads); a head with no key: o = 0, lse = -inf
AttentionResult capped_decode(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale, double cap) {
  AttentionResult result;
  // TODO(exercise): fill result.o and result.lse.
  return result;
}
