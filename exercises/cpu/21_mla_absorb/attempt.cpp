// Exercise 21 (the MLA lesson, stages/10_mla/README.md): decode attention over a latent
// cache, in the absorbed form.
//
// Fill in absorbed_decode() below: one query token, `heads` query heads, and a cache of
// one latent c_j (rank wide) and one rotary key k_pe_j (rope wide) per token, shared by
// every head. Head h's key is [W_UK[h] c_j ; k_pe_j] and its value W_UV[h] c_j, but do not
// build them: move W_UK onto the query (q_lat = W_UK[h]^T q_nope_h), score the latents
// (s_j = sm_scale (q_lat . c_j + q_pe_h . k_pe_j)), average them (o_lat = sum_j p_j c_j),
// and only then project once (o_h = W_UV[h] o_lat). The grader compares with the
// reference's naive form, which does build every head's keys and values.
//
//     cmake --build build --target flashstep_exercise_cpu_21_mla_absorb
//     flashstep exercise check 21         (or run build/bin/flashstep_exercise_cpu_21_mla_absorb)
//
// Stuck? `flashstep exercise hint 21`. The solution is solution.cpp beside this file.
#include <flashstep/reference.hpp>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

/// \param q_nope (heads, nope) \param q_pe (heads, rope)
/// \param ckv (kv_len, rank) the latents \param kpe (kv_len, rope) the rotary keys
/// \param w_uk (heads, nope, rank) \param w_uv (heads, vo, rank) \param sm_scale the score scale
/// \return o (heads, vo) and lse (heads); no keys: o = 0, lse = -inf
AttentionResult absorbed_decode(const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                                const Tensor& w_uk, const Tensor& w_uv, double sm_scale) {
  AttentionResult result;
  // TODO(exercise): fill result.o and result.lse.
  return result;
}
