/// \file fused_merge.cuh
/// \brief Stage 03's chunk steps with the merge done by the last block: the decode blocks
/// of POD attention (pod_attention.cuh), a step in one launch, with no merge kernel after
/// it. In stage 03 alone it did not pay: within about 1% of the merge kernel (its chapter,
/// "The kernels").
///
/// Stage 03's chunk_decode_kernel steps, then: each block that wrote a partial row counts
/// itself on its (request, kv head) counter; the block that brings the count to the
/// request's number of chunks is the last, so every other row is written, and it merges
/// them into o and lse (stage 03's merge_request_chunks), then puts the counter back to 0 for the next
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

/// Arguments of chunk_decode_fused_block: stage 03's chunk kernel's, whose o_indptr and
/// merge_counters the last block needs.
template <typename T, typename KV = T>
using FusedChunkDecodeParams = split_kv::ChunkDecodeParams<T, KV>;

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

  // ---- the last of the request's blocks for this kv head merges (stage 03's merge_states.cuh).
  int32_t* counter = p.merge_counters + int64_t{b} * num_kv_heads + kv_head;
  if (!split_kv::last_to_count(counter, end_item - first_item)) return;
  split_kv::merge_request_chunks<T, HEAD_DIM, 8>(p.partial_o, p.partial_lse, p.o, p.lse, p.num_qo_heads,
                                                 kv_head * p.group_size, p.group_size, b, first_item, end_item,
                                                 reinterpret_cast<float*>(smem_raw));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next run, or the next graph replay
}

}  // namespace flashstep::stages::engine
