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

  /// The empty state; with `m_start`, the empty state whose running max is already
  /// m_start (for absorb: the max of several states, found before they are summed).
  __device__ __forceinline__ void init(float m_start = -INFINITY) {
    m = m_start;
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

  /// Adds the state (m_b, d_b, o_b) of a disjoint key set whose max is at most this one's
  /// (m_b <= m): d += 2^(m_b - m) d_b, o += 2^(m_b - m) o_b. An empty state (m_b = -inf)
  /// adds nothing. The second half of merge(); alone, it sums many states at once once
  /// their largest max is known (init(m_max), then absorb each): independent terms
  /// instead of a chain of rescales.
  __device__ __forceinline__ void absorb(float m_b, float d_b, const float* o_b) {
    const float w = m_b == -INFINITY ? 0.f : exp2f(m_b - m);
    d = fmaf(w, d_b, d);
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = fmaf(w, o_b[i], o[i]);
  }

  /// THE merge: folds the state (m_b, d_b, o_b) of a disjoint key set into this one, so
  /// that this becomes the state of the union (exact: the order of merges changes only
  /// rounding). m' = max(m, m_b); d' = 2^(m - m') d + 2^(m_b - m') d_b; o' likewise.
  /// Split-KV chunks, cascade levels, the GPUs of context parallelism and the C
  /// interface's merge_state all reduce to it.
  __device__ __forceinline__ void merge(float m_b, float d_b, const float* o_b) {
    const float m_new = fmaxf(m, m_b);
    if (m_new == -INFINITY) return;  // both empty
    rescale_to(m_new);
    absorb(m_b, d_b, o_b);
  }

  /// merge() of a *normalized* state (v, lse): an output v = o / d and its natural-log
  /// lse, as the kernels write partial rows. It is the state m = lse log2(e), d = 1, o = v
  /// (d = 0 when lse = -inf, the empty state).
  /// \param lse natural-log lse of the state \param v its N normalized output values
  __device__ __forceinline__ void merge_normalized(float lse, const float* v) {
    merge(lse * kLog2e, lse == -INFINITY ? 0.f : 1.f, v);
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

}  // namespace flashstep::kernels
