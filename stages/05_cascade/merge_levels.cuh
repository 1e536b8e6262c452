/// \file merge_levels.cuh
/// \brief Stage 05's own kernel: every level's partial states of a query row, folded into
/// its output.
///
/// After the level launches, query row t (one token, one query head) has a few partial
/// states (v, s): a normalized output and its natural-log LSE. Level l wrote them at rows
///
///     level_indptr[l][t] .. level_indptr[l][t + 1]      (one per KV chunk of t's group)
///
/// of one partial buffer: the shared levels first (the prefix, cut into chunks when the
/// level is split), then the row's own keys. Attention over the union of the levels'
/// keys is the merge of all of them — the same associative, commutative operator as
/// stage 03's merge (SoftmaxState::merge_normalized of kernels/state.cuh, the reference's merge_state), so neither the
/// order of levels nor the chunking changes the result beyond rounding:
///
///     state = empty
///     for each level l, for each of its rows k:   state = merge(state, (v_k, s_k))
///     o[t] = state.output(),  lse[t] = state.lse()
///
/// Block layout: one block per (query head, token), 128 threads, as stage 03's merge:
///
///     tid = tx + TX * tz       TX = head_dim / 4 lanes, 4 fp32 dims each (one 16-byte load)
///                              NZ = 128 / TX lanes over the row's partial states
///
/// Lane tz takes states tz, tz + NZ, ... of the concatenated list (level by level); the NZ
/// lane states are merged in shared memory at the end. With no state at all (a row that
/// sees no key), o = 0 and lse = -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "03_split_kv/merge_states.cuh"
#include "05_cascade/cascade.hpp"  // kMaxLevels
#include "flashstep/kernels/state.cuh"

namespace flashstep::stages::cascade {

/// Threads of a merge block.
constexpr int kMergeThreads = 128;

/// Arguments of merge_levels_kernel; raw pointers and sizes only.
template <typename T>
struct MergeLevelsParams {
  const float* partial_o = nullptr;    ///< (partial rows, num_qo_heads, head_dim) fp32, every level
  const float* partial_lse = nullptr;  ///< (partial rows, num_qo_heads) natural log
  /// level_indptr[l] (nnz_qo + 1): token t's rows of level l in the partial buffer.
  const int32_t* level_indptr[kMaxLevels] = {};
  int num_levels = 0;    ///< levels to fold, 1..kMaxLevels
  T* o = nullptr;        ///< (nnz_qo, num_qo_heads, head_dim)
  float* lse = nullptr;  ///< (nnz_qo, num_qo_heads) natural log
  int num_qo_heads = 0;  ///< Hq (the row stride of every array)
};

/// Folds the partial states of every level for one (query head, token): grid =
/// (num_qo_heads, nnz_qo), kMergeThreads threads.
/// \tparam T element type of o: __half, __nv_bfloat16, or float (a level's state alone,
///         for checking the intermediates)
/// \tparam HEAD_DIM head_dim, a multiple of 4, at most 4 * kMergeThreads
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kMergeThreads) merge_levels_kernel(const MergeLevelsParams<T> p) {
  constexpr int TX = HEAD_DIM / 4;
  constexpr int NZ = kMergeThreads / TX;
  static_assert(HEAD_DIM % 4 == 0 && TX <= kMergeThreads && kMergeThreads % TX == 0,
                "head_dim must be a multiple of 4, at most 4 x kMergeThreads");
  const int qo_head = blockIdx.x, t = blockIdx.y;
  const int tx = threadIdx.x % TX, tz = threadIdx.x / TX;

  kernels::SoftmaxState<4> st;
  st.init();
  // The row's states are the concatenation of the levels' ranges; `skip` carries lane
  // tz's position in the round-robin from one level's range into the next.
  int skip = tz;
  for (int l = 0; l < p.num_levels; ++l) {
    const int begin = p.level_indptr[l][t], end = p.level_indptr[l][t + 1];
    int k = begin + skip;
    for (; k < end; k += NZ) {
      const int64_t row = int64_t{k} * p.num_qo_heads + qo_head;
      const float4 v = *reinterpret_cast<const float4*>(p.partial_o + row * HEAD_DIM + tx * 4);
      const float v_k[4] = {v.x, v.y, v.z, v.w};
      st.merge_normalized(p.partial_lse[row], v_k);
    }
    skip = k - end;
  }

  // ---- the NZ lane states of this head, merged exactly by lane 0 (stage 03's end of a merge).
  split_kv::merge_lanes_and_store<T, HEAD_DIM, NZ>(st, tx, tz, p.o, p.lse, int64_t{t} * p.num_qo_heads + qo_head);
}

}  // namespace flashstep::stages::cascade
