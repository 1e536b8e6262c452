/// \file merge_states.cuh
/// \brief Stage 03's second kernel: each request's partial states, a variable number of
/// them, merged into its output — FlashInfer's VariableLengthMergeStates.
///
/// Request r's chunks wrote partial rows o_indptr[r] .. o_indptr[r+1] (a normalized
/// output v_k and its natural-log lse s_k per query head). The merge here is
/// SoftmaxState::merge_normalized of kernels/state.cuh, the same exact operator as inside
/// every decode block (and the reference's merge_state): the order of merges changes only
/// rounding.
///
/// Block layout: one block per (query head, request), 128 threads.
///
///     tid = tx + TX * tz       TX = head_dim / 4 lanes, 4 fp32 dims each (one 16-byte load)
///                              NZ = 128 / TX lanes over chunks: lane tz takes chunks
///                              tz, tz + NZ, ... and loads kLoadsInFlight of them at once
///
/// then the NZ lane states are merged in shared memory and lane 0 writes o (output dtype)
/// and lse. With programmatic dependent launch the block starts while the chunk kernel
/// finishes, reads its schedule (o_indptr, written by plan() before the chunk kernel ran),
/// and waits (cudaGridDependencySynchronize) only before it reads the partial rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/state.cuh"

namespace flashstep::stages::split_kv {

/// Threads of a merge block.
constexpr int kMergeThreads = 128;

/// Arguments of merge_states_kernel; raw pointers and sizes only.
template <typename T>
struct MergeStatesParams {
  const float* partial_o = nullptr;    ///< (num_work_items, num_qo_heads, head_dim) fp32
  const float* partial_lse = nullptr;  ///< (num_work_items, num_qo_heads) natural log
  const int32_t* o_indptr = nullptr;   ///< (batch_size + 1): request r's rows
  T* o = nullptr;                      ///< (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;                ///< (batch_size, num_qo_heads) natural log
  int num_qo_heads = 0;                ///< query heads, Hq (the row stride of every array)
};

/// Stores 4 fp32 values as 4 elements of T, in one 8-byte (16-bit T) or 16-byte store.
/// \param dst 4 elements, 8-byte aligned (16 for fp32)
/// \param v 4 floats, rounded to nearest even when T is 16-bit
template <typename T>
__device__ __forceinline__ void store4(T* dst, const float* v);
/// fp32: the 4 values as one float4, no rounding.
template <>
__device__ __forceinline__ void store4<float>(float* dst, const float* v) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
}
/// fp16: two rounded __half2 pairs, stored as one 8-byte word.
template <>
__device__ __forceinline__ void store4<__half>(__half* dst, const float* v) {
  __half2 h[2] = {__floats2half2_rn(v[0], v[1]), __floats2half2_rn(v[2], v[3])};
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(h);
}
/// bf16: two rounded __nv_bfloat162 pairs, stored as one 8-byte word.
template <>
__device__ __forceinline__ void store4<__nv_bfloat16>(__nv_bfloat16* dst, const float* v) {
  __nv_bfloat162 h[2] = {__floats2bfloat162_rn(v[0], v[1]), __floats2bfloat162_rn(v[2], v[3])};
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(h);
}

/// Folds normalized states into `st`, the running state of one query head's 4 dims `col`
/// (4 * col .. 4 * col + 3): states k = k_begin, k_begin + lanes, ... below k_end, state k
/// being row first + k * step of partial_o (rows, num_qo_heads, HEAD_DIM) and partial_lse
/// (rows, num_qo_heads). IN_FLIGHT rows are loaded before any is merged, then each is
/// merged (SoftmaxState::merge_normalized). VIA_L2 reads
/// through L2 only (__ldcg): rows other blocks of the same grid wrote, which this SM's L1
/// may hold older copies of. Used by merge_states_kernel, by stage 08's merge of gathered
/// states and by stage 09's fused merge (VIA_L2), so all fold the rows the same way.
template <int HEAD_DIM, int IN_FLIGHT, bool VIA_L2 = false>
__device__ __forceinline__ void fold_states(kernels::SoftmaxState<4>& st, const float* partial_o,
                                            const float* partial_lse, int num_qo_heads, int qo_head, int col,
                                            int k_begin, int k_end, int lanes, int64_t first = 0, int64_t step = 1) {
  for (int k0 = k_begin; k0 < k_end; k0 += lanes * IN_FLIGHT) {
    float4 v[IN_FLIGHT];
    float s[IN_FLIGHT];
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const int k = k0 + u * lanes;
      if (k < k_end) {
        const int64_t row = (first + k * step) * num_qo_heads + qo_head;
        const float4* src = reinterpret_cast<const float4*>(partial_o + row * HEAD_DIM) + col;
        v[u] = VIA_L2 ? __ldcg(src) : *src;
        s[u] = VIA_L2 ? __ldcg(partial_lse + row) : partial_lse[row];
      } else {
        v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        s[u] = -INFINITY;  // the empty state: merging it changes nothing
      }
    }
#pragma unroll
    for (int u = 0; u < IN_FLIGHT; ++u) {
      const float v_u[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
      st.merge_normalized(s[u], v_u);
    }
  }
}

/// The end of a merge block whose NZ lanes each folded some of one head's states: lane
/// tz's state of 4 dims (column tx) goes to shared memory, lane 0 merges the NZ of them
/// exactly and writes the 4 elements of o (rounded once, to T) and, where lse is not null,
/// the lse of `row` (a (token or request, head) row of o and lse). Collective over the
/// block (one __syncthreads). Stage 05's merge_levels_kernel ends the same way.
template <typename T, int HEAD_DIM, int NZ>
__device__ __forceinline__ void merge_lanes_and_store(kernels::SoftmaxState<4>& st, int tx, int tz, T* o, float* lse,
                                                      int64_t row) {
  __shared__ float part_o[NZ][HEAD_DIM];
  __shared__ float part_m[NZ];
  __shared__ float part_d[NZ];
  if (tz > 0) {
#pragma unroll
    for (int e = 0; e < 4; ++e) part_o[tz][tx * 4 + e] = st.o[e];
    if (tx == 0) {
      part_m[tz] = st.m;
      part_d[tz] = st.d;
    }
  }
  __syncthreads();
  if (tz == 0) {
    for (int z = 1; z < NZ; ++z) {
      const float o_b[4] = {part_o[z][tx * 4], part_o[z][tx * 4 + 1], part_o[z][tx * 4 + 2], part_o[z][tx * 4 + 3]};
      st.merge(part_m[z], part_d[z], o_b);
    }
    float out[4];
    st.output(out);
    store4<T>(o + row * HEAD_DIM + tx * 4, out);
    if (tx == 0 && lse != nullptr) lse[row] = st.lse();
  }
}

/// Merges request r's partial rows o_indptr[r] .. o_indptr[r+1] (any number, 0 included:
/// then o = 0, lse = -inf) into its o and lse for one query head. grid = (num_qo_heads,
/// batch_size), kMergeThreads threads; launched after chunk_decode_kernel, programmatically
/// dependent on it where the launch asks for that.
/// \tparam T element type of o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D: a multiple of 4, at most 4 * kMergeThreads
/// \param p partial_o (num_work_items, num_qo_heads, head_dim) and partial_lse
///        (num_work_items, num_qo_heads) in fp32, o_indptr (batch_size + 1), and the
///        outputs o (batch_size, num_qo_heads, head_dim), lse (batch_size, num_qo_heads)
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kMergeThreads) merge_states_kernel(const MergeStatesParams<T> p) {
  constexpr int TX = HEAD_DIM / 4;
  constexpr int NZ = kMergeThreads / TX;
  constexpr int kLoadsInFlight = 8;  // a request of up to 8 * NZ chunks is read in one round trip
  static_assert(HEAD_DIM % 4 == 0 && TX <= kMergeThreads && kMergeThreads % TX == 0,
                "head_dim must be a multiple of 4, at most 4 x kMergeThreads");
  const int qo_head = blockIdx.x, r = blockIdx.y;
  const int tx = threadIdx.x % TX, tz = threadIdx.x / TX;
  // The schedule was written before the chunk kernel started: safe to read before the wait.
  const int begin = p.o_indptr[r], end = p.o_indptr[r + 1];
  // Wait for the chunk kernel's writes (returns at once without programmatic launch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif

  // Lane tz merges chunks begin + tz, begin + tz + NZ, ...; loads first, then merges.
  kernels::SoftmaxState<4> st;
  st.init();
  fold_states<HEAD_DIM, kLoadsInFlight>(st, p.partial_o, p.partial_lse, p.num_qo_heads, qo_head, tx, begin + tz, end,
                                        NZ);

  merge_lanes_and_store<T, HEAD_DIM, NZ>(st, tx, tz, p.o, p.lse, int64_t{r} * p.num_qo_heads + qo_head);
}

/// Launches `merge_states_kernel` (for OutT and HEAD_DIM) over batch_size requests, one
/// block per (query head, request), on the given stream: request r's partial rows, from
/// o_indptr of r to o_indptr of r + 1, into o and lse. With programmatic_launch (sm_90) it
/// is a programmatic dependent launch: the merge grid may be scheduled before the grid that
/// writes the partials has finished (its blocks wait in cudaGridDependencySynchronize),
/// which hides its launch latency. Stages 03 and 10 (MLA, HEAD_DIM 512) launch their merges
/// here.
template <typename OutT, int HEAD_DIM>
void launch_merge(const float* partial_o, const float* partial_lse, const int32_t* o_indptr, OutT* o, float* lse,
                  int num_qo_heads, int batch_size, bool programmatic_launch, cudaStream_t stream,
                  const char* what = "merge_states_kernel") {
  MergeStatesParams<OutT> m;
  m.partial_o = partial_o;
  m.partial_lse = partial_lse;
  m.o_indptr = o_indptr;
  m.o = o;
  m.lse = lse;
  m.num_qo_heads = num_qo_heads;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(num_qo_heads, batch_size);
  config.blockDim = dim3(kMergeThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic_launch ? 1 : 0;
  FLASHSTEP_CUDA_CHECK(cudaLaunchKernelEx(&config, merge_states_kernel<OutT, HEAD_DIM>, m));
  kernels::check_launch(what);
}

}  // namespace flashstep::stages::split_kv
