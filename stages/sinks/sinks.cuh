/// \file sinks.cuh
/// \brief Attention sinks as a policy of kernels/attention_policy.cuh: each query head h has
/// a learned logit sink[h] that joins the softmax's denominator and carries no value,
///
///     o = sum_j e^{s_j} v_j / (e^{sink[h]} + sum_j e^{s_j}),   lse = log(e^{sink[h]} + sum_j e^{s_j}),
///
/// so a head may put weight "nowhere" instead of on the first tokens (Xiao et al.,
/// "Efficient Streaming Language Models with Attention Sinks", arXiv 2309.17453; gpt-oss
/// learns one per head, and FlashInfer's run() takes them as `sinks`). The chapter
/// (README.md) derives why one hook is enough.
///
/// One hook: on_state, on a head's finished state (m, d) before it is normalised, adds
/// the sink's term to d exactly as one more key of weight 2^(sink log2 e) and value 0
/// would: m' = max(m, t), d' = 2^(m - m') d + 2^(t - m'), o' = 2^(m - m') o. A split-KV
/// decode runs it on the chunk that starts at key 0 only, so the merge of the chunks
/// (stage 03's) counts the sink once: the term is a state like any other, and the merge
/// is exact. A request with no keys then gets o = 0 and lse = sink[h], as the formula says.
#pragma once

#include <cuda_runtime.h>

#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/state.cuh"

namespace flashstep::stages::sinks {

/// The policy: the identity's hooks but one.
struct Sinks : kernels::IdentityPolicy {
  /// What the hook reads at run time.
  struct Params {
    const float* sinks = nullptr;  ///< (num_qo_heads) natural-log sink logits, device memory
    /// The run's sinks.
    static Params from(const kernels::PolicyInputs& in) { return {in.sinks}; }
  };

  /// The sink's term joins the state of the keys from first_key = 0 (the whole request, or
  /// its first chunk); any later range's state is left as it is. Returns 2^(m - m'), the
  /// factor the kernel applies to its o (0 for an empty state, whose o is 0 anyway).
  __device__ __forceinline__ static float on_state(const Params& p, float& m2, float& d, int qo_head, int first_key) {
    if (first_key != 0) return 1.f;
    const float t = __ldg(p.sinks + qo_head) * kernels::kLog2e;  // base 2, as the scores
    const float m_new = fmaxf(m2, t);
    const float factor = m2 == -INFINITY ? 0.f : exp2f(m2 - m_new);
    d = d * factor + exp2f(t - m_new);
    m2 = m_new;
    return factor;
  }
};

}  // namespace flashstep::stages::sinks
