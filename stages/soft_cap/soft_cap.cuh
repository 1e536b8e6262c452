/// \file soft_cap.cuh
/// \brief The logits soft cap as a policy of kernels/attention_policy.cuh: every score s
/// (natural units, after the scale) becomes c tanh(s / c) before the softmax, so no score
/// leaves (-c, c) (Gemma 2 caps its attention logits at 50; FlashInfer's
/// `logits_soft_cap`). The chapter (README.md) says why a cap and why here.
///
/// One hook: on_logit, on each base-2 score s2 = s log2(e) (stage 03's decode loop, stage
/// 07's score tiles). In base 2 the cap is c2 = c log2(e), and c tanh(s / c) log2(e) =
/// c2 tanh(s2 / c2), so the hook needs no conversion back and forth. The kernel masks keys after the hook, so a masked key stays
/// -inf whatever the cap.
#pragma once

#include <cuda_runtime.h>

#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/state.cuh"

namespace flashstep::stages::soft_cap {

/// The policy: the identity's hooks but one.
struct SoftCap : kernels::IdentityPolicy {
  static constexpr bool kTransformsLogits = true;  ///< on_logit changes every score
  /// What the hook reads at run time.
  struct Params {
    float cap2 = 0.f;      ///< c log2(e): the cap in base-2 units
    float inv_cap2 = 0.f;  ///< 1 / cap2
    /// The plan's cap.
    static Params from(const kernels::PolicyInputs& in) {
      const float cap2 = in.logits_soft_cap * kernels::kLog2e;
      return {cap2, 1.f / cap2};
    }
  };

  /// s2 -> c2 tanh(s2 / c2).
  __device__ __forceinline__ static float on_logit(const Params& p, float s2, int) {
    return p.cap2 * tanhf(s2 * p.inv_cap2);
  }
};

}  // namespace flashstep::stages::soft_cap
