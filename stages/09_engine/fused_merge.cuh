/// \file fused_merge.cuh
/// \brief Stage 03's chunk steps with the merge done by the last block: the decode blocks
/// of POD attention (pod_attention.cuh), a step in one launch, with no merge kernel after
/// it. In stage 03 alone it did not pay: within about 1% of the merge kernel (its chapter,
/// "The kernels").
///
/// Stage 03's chunk_decode_kernel steps, then: each block that wrote a partial row counts
/// itself on its (request, kv head) counter; the block that brings the count to the
/// request's number of chunks is the last, so every other row is written, and it merges
/// them into o and lse (merge_request_chunks), then puts the counter back to 0 for the next
/// run or graph replay. A request of one chunk writes o and lse directly.
///
///     block (kv head h, item k of request r):  write row k   -> fence -> n = ++count[r][h]
///                                              n < chunks(r): exit
///                                              n = chunks(r): merge rows of r, count[r][h] = 0
///
/// Kept out of stage 03's chunk kernel: compiled into it as a branch, the merge raised its
/// register count to the 128 cap of two blocks per SM and slowed its streaming loop.
#pragma once

#include <cstdint>

#include "03_split_kv/chunk_decode.cuh"
#include "03_split_kv/merge_states.cuh"

namespace flashstep::stages::engine {

/// Arguments of chunk_decode_fused_block: stage 03's chunk kernel's, and what the last
/// block needs.
template <typename T, typename KV = T>
struct FusedChunkDecodeParams : split_kv::ChunkDecodeParams<T, KV> {
  const int32_t* o_indptr = nullptr;  ///< (batch_size + 1) request r's items
  int32_t* merge_counters = nullptr;  ///< (batch_size, num_kv_heads) counters, 0 between runs
};

/// The fused merge, by the last block of request b for one kv head: the partial rows
/// first_item .. end_item of the group's query heads, merged exactly (SoftmaxState::merge,
/// as stage 03's merge_states_kernel does) into o and lse. The whole block works on it, as
/// the merge kernel's blocks do: thread t takes 4 dims (a column) of one head and one lane of rows
/// (rows lane, lane + lanes, ...), folded by the merge kernel's fold_states with 8 loads in
/// flight, through L2 (other blocks wrote the rows); the lanes' states then meet in shared
/// memory and lane 0 writes.
/// \param buf (blockDim.x * 6) floats of shared memory no copy is still writing
template <typename T, int HEAD_DIM, typename KV>
__device__ __forceinline__ void merge_request_chunks(const FusedChunkDecodeParams<T, KV>& p, int b, int kv_head,
                                                     int first_item, int end_item, float* buf) {
  constexpr int kInFlight = 8;
  const int columns = p.group_size * (HEAD_DIM / 4);  // 4-float columns of the group's heads
  const int threads = blockDim.x;
  const int lanes = columns >= threads ? 1 : threads / columns;
  const int per_pass = threads / lanes;  // columns merged at once
  const int lane = threadIdx.x / per_pass;
  float* lane_o = buf;                                    // [lanes][per_pass][4]
  float* lane_m = lane_o + 4 * threads;                   // [lanes][per_pass]
  float* lane_d = lane_m + threads;                       // [lanes][per_pass]
  for (int base = 0; base < columns; base += per_pass) {  // the same trip count in every thread
    const int col = base + threadIdx.x % per_pass;
    const bool active = lane < lanes && col < columns;
    const int qo_head = kv_head * p.group_size + col / (HEAD_DIM / 4), c = col % (HEAD_DIM / 4);
    kernels::SoftmaxState<4> st;
    st.init();
    if (active) {
      split_kv::fold_states<HEAD_DIM, kInFlight, true>(st, p.partial_o, p.partial_lse, p.num_qo_heads, qo_head, c,
                                                       first_item + lane, end_item, lanes);
      if (lane > 0) {
        const int slot = threadIdx.x;  // = lane * per_pass + column in pass
#pragma unroll
        for (int e = 0; e < 4; ++e) lane_o[4 * slot + e] = st.o[e];
        lane_m[slot] = st.m;
        lane_d[slot] = st.d;
      }
    }
    __syncthreads();
    if (active && lane == 0) {
      for (int l = 1; l < lanes; ++l) {
        const int slot = l * per_pass + threadIdx.x;
        const float o_b[4] = {lane_o[4 * slot], lane_o[4 * slot + 1], lane_o[4 * slot + 2], lane_o[4 * slot + 3]};
        st.merge(lane_m[slot], lane_d[slot], o_b);
      }
      float out[4];
      st.output(out);
      const int64_t row = int64_t{b} * p.num_qo_heads + qo_head;
      split_kv::store4<T>(p.o + row * HEAD_DIM + c * 4, out);
      if (c == 0) p.lse[row] = st.lse();
    }
    __syncthreads();  // the buffers are reused by the next pass
  }
}

/// One block of stage 03's chunk kernel for the valid work item `item` and kv head
/// `kv_head`, over `smem_raw` (split_kv::chunk_decode_smem_bytes of dynamic shared memory),
/// the last of its request's blocks merging: a decode block of POD attention.
/// \param num_kv_heads kv heads of the batch: the row length of the merge counters
template <typename T, int HEAD_DIM, typename KV = T>
__device__ __forceinline__ void chunk_decode_fused_block(const FusedChunkDecodeParams<T, KV>& p, int kv_head, int item,
                                                         int num_kv_heads, uint8_t* smem_raw) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  const int b = p.request_indices[item];
  const int32_t page_begin = p.kv_page_begin[item];
  const int chunk_len = p.kv_chunk_len[item];
  // The request's items; loaded now, used at the end.
  const int first_item = p.o_indptr[b], end_item = p.o_indptr[b + 1];

  const paged::DecodeThread th = paged::place_thread<Tr::BDX>(threadIdx.x, p.bdy, p.bdz);
  paged::QRegisters<KV, HEAD_DIM> q;
  paged::HeadStates<KV, HEAD_DIM> state;
  paged::load_q<T, HEAD_DIM, KV>(th, p.q, int64_t{b} * p.num_qo_heads + kv_head * p.group_size, p.group_size,
                                 p.sm_scale_log2, q);
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) state[j].init();
  split_kv::attend_chunk<KV, HEAD_DIM>(th, q, state, p.kv, kv_head, page_begin, chunk_len,
                                       reinterpret_cast<KV*>(smem_raw), p.num_stages);
  const bool holds = paged::merge_states<KV, HEAD_DIM>(th, state, p.bdz, reinterpret_cast<float*>(smem_raw));

  // ---- a partial row, or o and lse for a request of one chunk (then no merge follows).
  const bool direct = end_item - first_item == 1;
  if (holds) split_kv::store_chunk_state<T, HEAD_DIM, KV>(p, th, state, kv_head, item, b, direct);
  if (direct) return;

  // ---- the last of the request's blocks for this kv head merges.
  __shared__ int is_last;
  __threadfence();  // this block's partial row is visible device-wide before it is counted
  __syncthreads();
  int32_t* counter = p.merge_counters + int64_t{b} * num_kv_heads + kv_head;
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == end_item - first_item - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // and every other block's rows, counted before ours, are read after it
  merge_request_chunks<T, HEAD_DIM>(p, b, kv_head, first_item, end_item, reinterpret_cast<float*>(smem_raw));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next run, or the next graph replay
}

}  // namespace flashstep::stages::engine
