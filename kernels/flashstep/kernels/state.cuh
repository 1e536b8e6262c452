/// \file state.cuh
/// \brief The online-softmax state of one query row, and the exact merge of two states.
///
/// Softmax attention over keys j is o = sum_j exp(s_j) v_j / sum_j exp(s_j). Reading the
/// keys in chunks, a kernel keeps three numbers per query row (Milakov & Gimelshein's
/// online softmax, the heart of FlashAttention and of every decode kernel):
///
///     m  running max of the scores seen so far
///     d  running denominator  sum_j exp(s_j - m)
///     o  running numerator    sum_j exp(s_j - m) v_j      (head_dim values)
///
/// When a chunk raises the max from m to m', the old sums are rescaled by exp(m - m').
/// At the end o / d is the output and m + log(d) the log-sum-exp (lse).
///
/// **Base 2.** The kernels keep scores as s2 = s * log2(e) (the log2(e) is folded into
/// the query once, with sm_scale), so every exponential is exp2f, one MUFU.EX2
/// instruction, instead of expf, which is EX2 plus a multiply. Everything stored in
/// SoftmaxState is base 2; lse() converts back to the natural log every public API uses.
///
/// **Empty state.** A row that has seen no key has m = -inf, d = 0, o = 0; its lse is
/// -inf and its output 0. It is the identity of merge(): merging it changes nothing.
/// exp2f(-inf) = 0 makes most of this automatic; the only care needed is never to form
/// (-inf) - (-inf).
#pragma once

#include <cuda_runtime.h>
#include <cmath>

namespace flashstep::kernels {

/// log2(e): multiply a natural-log score by this to get its base-2 score.
constexpr float kLog2e = 1.4426950408889634f;
/// ln(2): multiply a base-2 lse by this to get the natural-log lse.
constexpr float kLn2 = 0.6931471805599453f;

/// Running softmax state of one query row; each thread holds `N` of the head_dim
/// output values (its slice of o), and the same m and d as the other threads of the row.
template <int N>
struct SoftmaxState {
  float m;     ///< running max of base-2 scores (-inf: no key seen)
  float d;     ///< running denominator sum_j 2^(s2_j - m)
  float o[N];  ///< running numerator sum_j 2^(s2_j - m) v_j, this thread's N dims

  /// The empty state.
  __device__ __forceinline__ void init() {
    m = -INFINITY;
    d = 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = 0.f;
  }

  /// Raises the running max to `m_new` (>= m), rescaling d and o. Returns the factor
  /// applied, 2^(m - m_new), which is 0 when the state was empty.
  __device__ __forceinline__ float rescale_to(float m_new) {
    const float scale = m == -INFINITY ? 0.f : exp2f(m - m_new);
    d *= scale;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= scale;
    m = m_new;
    return scale;
  }

  /// Adds key j with base-2 score s2 and value slice v (call after rescale_to with a max
  /// >= s2). A masked key has s2 = -inf and adds nothing, even to an empty state (where
  /// s2 - m would be -inf - (-inf) = NaN).
  /// \param s2 the key's score q . k_j * sm_scale * log2(e), or -inf if masked
  /// \param v this thread's N values of V row j
  __device__ __forceinline__ void add(float s2, const float* v) {
    const float p = s2 == -INFINITY ? 0.f : exp2f(s2 - m);
    d += p;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = fmaf(p, v[i], o[i]);
  }

  /// Merges the state of a disjoint key set into this one (exact: the result is the
  /// state of the union, whatever the order of merges).
  __device__ __forceinline__ void merge(float m_b, float d_b, const float* o_b) {
    const float m_new = fmaxf(m, m_b);
    if (m_new == -INFINITY) return;  // both empty
    const float scale_a = m == -INFINITY ? 0.f : exp2f(m - m_new);
    const float scale_b = m_b == -INFINITY ? 0.f : exp2f(m_b - m_new);
    d = d * scale_a + d_b * scale_b;
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = o[i] * scale_a + o_b[i] * scale_b;
    m = m_new;
  }

  /// Natural-log lse of the keys seen: (m + log2 d) ln 2; -inf when empty.
  __device__ __forceinline__ float lse() const { return d > 0.f ? (m + log2f(d)) * kLn2 : -INFINITY; }

  /// The normalized output o / d (0 when empty), times `scale`: a scaled FP8 cache's
  /// v_scale, folded into the one division (scale 1 gives exactly o * (1 / d)).
  /// \param out N floats \param scale multiplies every output value
  __device__ __forceinline__ void output(float* out, float scale = 1.f) const {
    const float inv_d = d > 0.f ? scale / d : 0.f;
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = o[i] * inv_d;
  }
};

/// How two *normalized* states (o_a, lse_a) and (o_b, lse_b) combine (FlashInfer's
/// merge_state, natural-log lse): o = w_a o_a + w_b o_b with the weights below.
struct MergeWeights {
  float w_a;  ///< exp(lse_a - lse), 0 when A is empty
  float w_b;  ///< exp(lse_b - lse), 0 when B is empty
  float lse;  ///< log(exp(lse_a) + exp(lse_b)); -inf when both are empty
};

/// Merge weights of two states given their natural-log lse (either may be -inf).
__device__ __forceinline__ MergeWeights merge_weights(float lse_a, float lse_b) {
  const float mx = fmaxf(lse_a, lse_b);
  if (mx == -INFINITY) return {0.f, 0.f, -INFINITY};
  const float ea = __expf(lse_a - mx), eb = __expf(lse_b - mx);  // one of them is 1
  const float sum = ea + eb;
  return {ea / sum, eb / sum, mx + __logf(sum)};
}

}  // namespace flashstep::kernels
