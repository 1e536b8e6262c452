/// \file chunk_decode.cuh
/// \brief Stage 03's first kernel: stage 02's decode steps (02_paged/decode_loop.cuh) over
/// one work item of the plan — one chunk of one request's KV, for the query heads of one
/// kv head — instead of a whole request.
///
/// What differs from stage 02's kernel: a block reads its work item from the schedule in
/// the workspace (request, first page, chunk length; padding of a CUDA-graph-sized grid
/// exits at once); a chunk is a few tiles long, so its pipeline starts with the page ids
/// of its first two tiles loaded together (attend_chunk); and it writes the chunk's
/// normalized state as an fp32 partial row when the plan split (merge_states.cuh combines
/// them), or o and lse directly when it did not. The chapter (README.md, "The
/// kernels") draws the work items and the grid. Stage 09's POD attention runs the same
/// steps, its last block merging (09_engine/fused_merge.cuh).
#pragma once

#include <cstdint>

#include "02_paged/decode_loop.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::split_kv {

/// Arguments of chunk_decode_kernel; raw pointers and sizes only.
/// \tparam T element type of q and o \tparam KV element type of the pool (T, or FP8)
/// \tparam Policy the hooks' policy (kernels/attention_policy.cuh; the identity here)
template <typename T, typename KV = T, typename Policy = kernels::IdentityPolicy>
struct ChunkDecodeParams {
  const T* q = nullptr;       ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<KV> kv{};  ///< the page pool and its CSR page table
  // The schedule, in the workspace (written by plan()'s one copy).
  const int32_t* request_indices = nullptr;  ///< (padded_batch_size) request r of work item k
  const int32_t* kv_page_begin =
      nullptr;  ///< (padded_batch_size) kv_indptr[r] + t * c: item k's first page in kv_indices
  const int32_t* kv_chunk_len = nullptr;      ///< (padded_batch_size) tokens of item k's chunk, 0..c * page_size
  const uint8_t* block_valid_mask = nullptr;  ///< (padded_batch_size) 0: padding, exit
  // Where the result goes: partial rows (split) or the outputs (no split).
  bool partition_kv = false;     ///< the plan split: write partial rows, else o and lse
  float* partial_o = nullptr;    ///< split: (padded_batch_size, num_qo_heads, head_dim) fp32
  float* partial_lse = nullptr;  ///< split: (padded_batch_size, num_qo_heads) natural log
  T* o = nullptr;                ///< no split: (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;          ///< no split: (batch_size, num_qo_heads) natural log
  int num_qo_heads = 0;          ///< query heads, Hq (the row stride of q, o and the partials)
  int group_size = 0;            ///< num_qo_heads / num_kv_heads
  int bdy = 0;                   ///< ceil(group_size / DecodeTraits::HPT)
  int bdz = 0;                   ///< kThreads / (BDX * bdy)
  int num_stages = 0;            ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f;     ///< sm_scale * k_scale * log2(e), folded into q once
  /// Folded into each chunk's normalisation, so the partial rows (and the merge, linear in
  /// them) already carry it.
  float v_scale = 1.f;
  typename Policy::Params policy{};  ///< what the policy's hooks read
};

/// Shared memory (bytes) for a depth and block shape: the larger of the pipeline and the
/// end-of-block merge buffers (one region serves both). \tparam KV element type of the pool
template <typename KV, int HEAD_DIM>
constexpr size_t chunk_decode_smem_bytes(int num_stages, int bdy, int bdz) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  const size_t pipeline = Tr::pipeline_bytes(num_stages);
  const size_t merge = Tr::merge_bytes(bdz, bdy);
  return pipeline > merge ? pipeline : merge;
}

/// Stage 02's pipeline over the chunk's keys 0 .. len-1 (pages kv_indices[page_begin],
/// ...), with one change: a chunk is a few tiles long and pays for its start, so the page
/// ids of its first two tiles are loaded together, not one dependent round trip after the
/// other. Collective over the block; ends with a __syncthreads() after every copy has
/// landed, so the caller may reuse the pipeline memory.
/// \param pipeline DecodeTraits::pipeline_bytes(num_stages) bytes of shared memory
/// \param pol the policy's parameters \param chunk_position the chunk's first key's
///        position in its request
/// \tparam Policy its on_k_tile sees each tile once it lands, its on_logit every score
template <typename KV, int HEAD_DIM, typename Policy = kernels::IdentityPolicy>
__device__ __forceinline__ void attend_chunk(const paged::DecodeThread& th, const paged::QRegisters<KV, HEAD_DIM>& q,
                                             paged::HeadStates<KV, HEAD_DIM>& state, const kernels::PagedKV<KV>& kv,
                                             int kv_head, int32_t page_begin, int len, KV* pipeline, int num_stages,
                                             const typename Policy::Params& pol = {}, int chunk_position = 0) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  using paged::fetch_pages;
  using paged::issue_copies;
  const int S = num_stages;
  const int num_tiles = (len + Tr::TILE - 1) / Tr::TILE;

  // ---- prologue: the page ids of tiles 0 and 1 read together; tiles 0 .. S-2 in
  // flight; the page ids of tile S-1 read.
  paged::TilePages<KV, HEAD_DIM> page, page1;
  paged::TileSlots<KV, HEAD_DIM> slot, slot1;
  fetch_pages<KV, HEAD_DIM>(th, kv, page_begin, len, 0, page, slot);
  if (S > 2) fetch_pages<KV, HEAD_DIM>(th, kv, page_begin, len, 1, page1, slot1);
  for (int s = 0; s < S - 1; ++s) {
    if (s < num_tiles) {
      if (s == 1) {
#pragma unroll
        for (int r = 0; r < Tr::COPY_PASSES; ++r) page[r] = page1[r], slot[r] = slot1[r];
      } else if (s > 1) {
        fetch_pages<KV, HEAD_DIM>(th, kv, page_begin, len, s, page, slot);
      }
      issue_copies<KV, HEAD_DIM>(th, kv, kv_head, page, slot, pipeline + s * Tr::STAGE_ELEMS);
    }
    kernels::cp_async_commit_group();  // one group per tile, empty or not: the counts stay aligned
  }
  if (S - 1 < num_tiles) fetch_pages<KV, HEAD_DIM>(th, kv, page_begin, len, S - 1, page, slot);

  // ---- main loop, as stage 02's: wait for tile i, refill the stage tile i-1 used, fold tile i.
  for (int i = 0; i < num_tiles; ++i) {
    kernels::cp_async_wait_group_dynamic(S - 2);
    __syncthreads();
    const int next = i + S - 1;
    if (next < num_tiles)
      issue_copies<KV, HEAD_DIM>(th, kv, kv_head, page, slot, pipeline + (next % S) * Tr::STAGE_ELEMS);
    kernels::cp_async_commit_group();
    if (next + 1 < num_tiles) fetch_pages<KV, HEAD_DIM>(th, kv, page_begin, len, next + 1, page, slot);
    KV* tile = pipeline + (i % S) * Tr::STAGE_ELEMS;
    if constexpr (Policy::kTouchesTiles) {  // e.g. rotated in place (RoPE), then seen whole
      Policy::template on_k_tile<kernels::RowMajorTile, KV, HEAD_DIM, Tr::TILE, Tr::kThreads>(
          pol, tile, th.tid, chunk_position + i * Tr::TILE);
      __syncthreads();
    }
    if (th.computes)
      paged::attend_tile<KV, HEAD_DIM, Policy>(th, q, state, tile, i * Tr::TILE, len, pol, chunk_position);
  }
  kernels::cp_async_wait_group<0>();
  __syncthreads();  // every copy landed and every tile is consumed: the memory is free
}

/// Writes the chunk's normalized state of each of this thread's heads (call on the
/// threads merge_states returned true on): to partial row `item` in fp32 (then the merge
/// rounds once, to the output dtype, at the end), or, when `direct`, to request b's o and
/// lse. o = o_j / d_j times v_scale; lse = (m_j + log2 d_j) ln 2.
template <typename T, int HEAD_DIM, typename KV, typename Policy>
__device__ __forceinline__ void store_chunk_state(const ChunkDecodeParams<T, KV, Policy>& p,
                                                  const paged::DecodeThread& th,
                                                  const paged::HeadStates<KV, HEAD_DIM>& state, int kv_head, int item,
                                                  int b, bool direct) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  constexpr int VEC = Tr::VEC, NV = Tr::NV, BDX = Tr::BDX;
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) {
    if (th.ty * Tr::HPT + j >= p.group_size) continue;  // an odd group leaves the last slot empty
    const int qo_head = kv_head * p.group_size + th.ty * Tr::HPT + j;
    float out[Tr::EPT];
    state[j].output(out, p.v_scale);
    if (!direct) {
      const int64_t row = int64_t{item} * p.num_qo_heads + qo_head;
      float* dst = p.partial_o + row * HEAD_DIM;
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int w = 0; w < VEC; w += 4)
          *reinterpret_cast<float4*>(dst + (v * BDX + th.tx) * VEC + w) = make_float4(
              out[v * VEC + w], out[v * VEC + w + 1], out[v * VEC + w + 2], out[v * VEC + w + 3]);
      if (th.tx == 0) p.partial_lse[row] = state[j].lse();
    } else {
      paged::store_output<T, HEAD_DIM, KV>(th, out, state[j].lse(), p.o, p.lse, int64_t{b} * p.num_qo_heads + qo_head);
    }
  }
}

/// Decode attention of one work item: block (kv head, k) computes the group_size query
/// heads of that kv head over the keys of work item k's chunk, and writes their normalized
/// state to partial row k (partition_kv) or to the request's o and lse. grid =
/// (num_kv_heads, padded_batch_size), DecodeTraits::kThreads threads, shared memory
/// chunk_decode_smem_bytes(num_stages, bdy, bdz); two blocks per SM, so at most 128
/// registers a thread. Blocks whose block_valid_mask entry is 0 exit at once.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam KV element type of the pool: T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with a 16-bit T
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, the schedule
///        (padded_batch_size entries each), and the destination: partial_o
///        (padded_batch_size, num_qo_heads, head_dim) and partial_lse (padded_batch_size,
///        num_qo_heads) in fp32, or o (batch_size, num_qo_heads, head_dim) and lse
///        (batch_size, num_qo_heads)
/// \tparam Policy called at the four hooks: on_q (q at position kv_len - 1), on_k_tile and
///         on_logit (keys at their positions in the request), on_state (the chunk's state,
///         whose first key is the chunk's)
template <typename T, int HEAD_DIM, typename KV = T, typename Policy = kernels::IdentityPolicy>
__global__ void __launch_bounds__(256, 2) chunk_decode_kernel(const ChunkDecodeParams<T, KV, Policy> p) {
  using Tr = paged::DecodeTraits<KV, HEAD_DIM>;
  extern __shared__ __align__(16) uint8_t smem_raw[];

  // Every block of this grid is resident in the one wave the plan sized it for, so the
  // merge kernel may be scheduled as soon as blocks start to retire (programmatic
  // dependent launch, sm_90+; it still waits for this grid's writes before reading them).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif

  // ---- which work item: padding of a graph-sized grid exits here. The four schedule
  // loads are independent, so they are issued together, before the branch.
  const int kv_head = blockIdx.x, item = blockIdx.y;
  const uint8_t valid_item = p.block_valid_mask[item];
  const int b = p.request_indices[item];
  const int32_t page_begin = p.kv_page_begin[item];  // a chunk starts on a page boundary
  const int chunk_len = p.kv_chunk_len[item];
  if (!valid_item) return;

  // ---- stage 02's steps over the chunk's keys, then the exact merge of the bdz states in
  // the pipeline's memory (free once attend_chunk returns).
  const paged::DecodeThread th = paged::place_thread<Tr::BDX>(threadIdx.x, p.bdy, p.bdz);
  paged::QRegisters<KV, HEAD_DIM> q;
  paged::HeadStates<KV, HEAD_DIM> state;
  // Positions, for the policy's hooks (a policy that reads none leaves these loads dead):
  // q sits at kv_len - 1, the chunk's first key at its first page's offset in the request.
  const int q_position = p.kv.kv_len(b) - 1;
  const int chunk_position = (page_begin - p.kv.kv_indptr[b]) * static_cast<int>(p.kv.page_size.divisor);
  paged::load_q<T, HEAD_DIM, KV, Policy>(th, p.q, int64_t{b} * p.num_qo_heads + kv_head * p.group_size, p.group_size,
                                         p.sm_scale_log2, q, p.policy, q_position);
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) state[j].init();
  attend_chunk<KV, HEAD_DIM, Policy>(th, q, state, p.kv, kv_head, page_begin, chunk_len,
                                     reinterpret_cast<KV*>(smem_raw), p.num_stages, p.policy, chunk_position);
  if (!paged::merge_states<KV, HEAD_DIM>(th, state, p.bdz, reinterpret_cast<float*>(smem_raw))) return;
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j)  // e.g. a sink's term, which only the request's first chunk adds
    if (th.ty * Tr::HPT + j < p.group_size)
      kernels::policy_on_state<Policy>(p.policy, state[j], kv_head * p.group_size + th.ty * Tr::HPT + j,
                                       chunk_position);

  // ---- the chunk's normalized state: a partial row (split) or the output itself (no split).
  store_chunk_state<T, HEAD_DIM, KV>(p, th, state, kv_head, item, b, !p.partition_kv);
}

}  // namespace flashstep::stages::split_kv
