/// \file attention_policy.cuh
/// \brief What an attention kernel lets a feature change, and nothing else: a policy type
/// the lesson kernels take as a template parameter and call at named hooks. The identity
/// policy below does nothing at each, and compiles to nothing, so a lesson read with it is
/// the plain algorithm; a feature (RoPE in the loads, attention sinks, ...) is a policy of
/// its own, in its own folder, and adding one changes no kernel body.
///
/// The idea is FlashInfer's attention variants (a variant type with query, key, logits and
/// output transforms; the FlashInfer paper, arXiv 2501.01005, section 3.2); the hooks
/// here are the ones this course's kernels need, at the points they need them:
///
///     hook         called                                          used by
///     on_q         on a thread's slice of one query head in fp32   RoPE in the loads (decode)
///                  registers, before the score scale
///     on_q_tile    on a Q tile in shared memory once it has        RoPE in the loads (prefill)
///                  landed (collective)
///     on_k_tile    on a K tile in shared memory once it has        RoPE in the loads
///                  landed (collective)
///     on_logit     on every base-2 score before the softmax        the logits soft cap
///     on_state     on a head's finished state (m2, d) before it    attention sinks
///                  is normalised; returns the factor for its o
///
/// The tile hooks write the tile when kTouchesTiles is set; the kernel then waits for
/// every thread before it reads the tile. A tile hook learns the kernel's layout from a
/// type (RowMajorTile, SwizzledTile: where 16-byte chunk c of row r sits), so one policy
/// serves stage 02's row-major tiles and stage 04's swizzled ones.
///
/// A policy carries its run-time inputs in a nested `Params` struct, which the kernel
/// holds in its own parameters (`p.policy`). The host fills it from PolicyInputs, the few
/// device pointers a policy may read, so that a stage's launch code treats every policy
/// alike.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashstep/kernels/state.cuh"

namespace flashstep::kernels {

/// The device inputs a policy may read, gathered by the launch code of any stage.
struct PolicyInputs {
  const double* rope_turns = nullptr;  ///< RoPE: (head_dim / 2) turns per position f_i, device memory
  const float* sinks = nullptr;        ///< sinks: (num_qo_heads) natural-log sink logits, device memory
  float logits_soft_cap = 0.f;         ///< soft cap: c > 0, scores s -> c tanh(s / c)
};

/// Where a thread's slice of one row sits, for on_q: the thread holds `N` values of the row
/// as N/2 rotate-half pairs (x[e], x[N/2 + e]) of pairs pair0 .. pair0 + N/2 - 1, and the row
/// is at sequence position `position`. A kernel whose slice is not laid out that way passes
/// pair0 = -1 (a policy that needs pairs refuses such a kernel at compile time, through its
/// own static_assert on N or the element type).
struct RowSlice {
  int position;  ///< the row's position in its request (query: kv_len - qo_len + i)
  int pair0;     ///< first rotate-half pair the slice holds, or -1
};

/// A tile of rows of HEAD_DIM 16-bit elements, stored row after row: chunk c (8 elements,
/// 16 bytes) of row r at element r * HEAD_DIM + 8 c.
struct RowMajorTile {
  /// Element offset of chunk `c` of row `r`.
  template <int HEAD_DIM>
  __device__ __forceinline__ static uint32_t offset(uint32_t r, uint32_t c) {
    return r * HEAD_DIM + (c << 3);
  }
};

/// The same rows with their chunks permuted by row (c XOR r % 8), the layout ldmatrix reads
/// without bank conflicts (kernels/mma.cuh's swizzled_offset).
struct SwizzledTile {
  /// Element offset of chunk `c` of row `r`.
  template <int HEAD_DIM>
  __device__ __forceinline__ static uint32_t offset(uint32_t r, uint32_t c) {
    return r * HEAD_DIM + ((c ^ (r & 7u)) << 3);
  }
};

/// The positions of a Q tile's rows: a GQA group's heads packed as consecutive rows
/// (packed row = token * group + head in group), row r of the tile at position
/// (first_row + r) / group + offset.
struct PackedRows {
  int first_row;  ///< the tile's first packed row within its request
  int group;      ///< query heads per kv head (1: one row per token)
  int offset;     ///< the position of the request's first query token: kv_len - qo_len
  /// The position of the tile's row `r`.
  __device__ __forceinline__ int position(int r) const { return (first_row + r) / group + offset; }
};

/// The identity: every hook does nothing. The lesson kernels' default, and the base of a
/// feature's policy, which defines only the hooks it needs (a hook it defines hides the
/// identity's; each identity hook takes any policy's Params, so the others still apply).
struct IdentityPolicy {
  /// What the hooks read at run time: nothing.
  struct Params {
    /// The parameters from the inputs a stage's launch gathers.
    static Params from(const PolicyInputs&) { return {}; }
  };
  /// Whether on_q_tile and on_k_tile write the tile (the kernel then waits for every thread).
  static constexpr bool kTouchesTiles = false;
  /// Whether on_logit changes a score. A kernel that folds the scale into its softmax
  /// (stage 07's one FFMA per score) scales the scores and calls on_logit only then.
  static constexpr bool kTransformsLogits = false;

  /// \param q the thread's N dims of one query head, fp32, not yet scaled
  template <typename T, int N, typename P>
  __device__ __forceinline__ static void on_q(const P&, float (&q)[N], RowSlice) {}

  /// \param tile `num_rows` rows of the Q tile, element type T, laid out as Layout says
  /// \param num_rows rows of the tile
  /// \param tid this thread's index among THREADS \param rows where each row sits in the sequence
  template <typename Layout, typename T, int HEAD_DIM, int THREADS, typename P>
  __device__ __forceinline__ static void on_q_tile(const P&, T* tile, int num_rows, int tid, PackedRows rows) {}

  /// \param tile (ROWS, HEAD_DIM) keys, element type KV, laid out as Layout says
  /// \param tid this thread's index among THREADS \param first_position the tile's first key's position
  template <typename Layout, typename KV, int HEAD_DIM, int ROWS, int THREADS, typename P>
  __device__ __forceinline__ static void on_k_tile(const P&, KV* tile, int tid, int first_position) {}

  /// \param s2 a base-2 score, q . k sm_scale log2(e) \param key_position the key's position
  template <typename P>
  __device__ __forceinline__ static float on_logit(const P&, float s2, int key_position) {
    return s2;
  }

  /// \param m2 the state's base-2 running max (-inf: empty) \param d its denominator
  /// \param qo_head the head's index among the query heads
  /// \param first_key the first key of the range the state covers (0: the request's start)
  /// \return the factor the kernel multiplies the state's unnormalised o by (1: unchanged)
  template <typename P>
  __device__ __forceinline__ static float on_state(const P&, float& m2, float& d, int qo_head, int first_key) {
    return 1.f;
  }
};

/// Policy::on_state on a SoftmaxState: (m, d) through the hook, o times the factor it returns.
template <typename Policy, int N>
__device__ __forceinline__ void policy_on_state(const typename Policy::Params& pol, SoftmaxState<N>& state, int qo_head,
                                                int first_key) {
  const float factor = Policy::on_state(pol, state.m, state.d, qo_head, first_key);
#pragma unroll
  for (int i = 0; i < N; ++i) state.o[i] *= factor;
}

}  // namespace flashstep::kernels
