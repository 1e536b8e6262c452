/// \file merge_gathered.cuh
/// \brief Stage 08's merge: the states of every request that the GPUs exchanged, folded
/// into its output by stage 03's merge steps.
///
/// After an all-gather of W ranks' fp32 states of (batch_size, heads, head_dim), state j
/// of request r is row j * batch_size + r: the rows of one request are batch_size apart,
/// not consecutive as stage 03's partial rows are (o_indptr). The block is stage 03's
/// merge block (merge_states.cuh: one block per (head, request), lanes over the states,
/// fold_states and merge_lanes_and_store); only the rows it reads differ.
#pragma once

#include <cstdint>

#include "03_split_kv/merge_states.cuh"

namespace flashstep::stages::context_parallel {

/// Arguments of merge_gathered_kernel; raw pointers and sizes only.
template <typename T>
struct MergeGatheredParams {
  const float* states_o = nullptr;    ///< (states_per_request * batch_size, num_qo_heads, head_dim) fp32
  const float* states_lse = nullptr;  ///< (states_per_request * batch_size, num_qo_heads) natural log
  int states_per_request = 0;         ///< W: state j of request r at row j * batch_size + r
  T* o = nullptr;                     ///< (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;               ///< (batch_size, num_qo_heads) natural log, or null
  int num_qo_heads = 0;               ///< query heads, Hq (the row stride of every array)
};

/// Merges request r's states_per_request states into its o and lse for one query head.
/// grid = (num_qo_heads, batch_size), split_kv::kMergeThreads threads.
/// \tparam T element type of o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, a multiple of 4, at most 4 * kMergeThreads
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(split_kv::kMergeThreads) merge_gathered_kernel(const MergeGatheredParams<T> p) {
  constexpr int TX = HEAD_DIM / 4;
  constexpr int NZ = split_kv::kMergeThreads / TX;
  constexpr int kLoadsInFlight = 8;
  const int qo_head = blockIdx.x, r = blockIdx.y;
  const int tx = threadIdx.x % TX, tz = threadIdx.x / TX;
  // Lane tz merges states tz, tz + NZ, ...: rows r + k * batch_size.
  kernels::SoftmaxState<4> st;
  st.init();
  split_kv::fold_states<HEAD_DIM, kLoadsInFlight>(st, p.states_o, p.states_lse, p.num_qo_heads, qo_head, tx, tz,
                                                  p.states_per_request, NZ, r, gridDim.y);
  split_kv::merge_lanes_and_store<T, HEAD_DIM, NZ>(st, tx, tz, p.o, p.lse, int64_t{r} * p.num_qo_heads + qo_head);
}

}  // namespace flashstep::stages::context_parallel
