/// \file paged_decode.cuh
/// \brief Stage 02's kernel: batch decode through a paged KV cache, one block of 256
/// threads per (kv head, request).
///
/// What changed from stage 01: one pass of online softmax instead of three over stored
/// scores; one K/V read shared by the query heads of a GQA group instead of one per query
/// head; 16-byte cp.async copies, several tiles in flight; bf16/fp16 storage with fp32
/// math; and the page table. The steps that do all of it are decode_loop.cuh's; the kernel
/// below runs them over all of request b's keys, in the order they are read.
///
/// What it still does badly: a batch of a few long requests is a grid of a few blocks,
/// which leaves most SMs idle (two_halves.cuh recovers a little of it, stage 03 splits
/// the KV across blocks); q . k runs on CUDA cores, fine for decode (a GEMV), not for
/// prefill (stage 04).
#pragma once

#include <cstdint>

#include "02_paged/decode_loop.cuh"
#include "flashstep/kernels/paged_kv.cuh"

namespace flashstep::stages::paged {

/// Arguments of the stage's kernels; raw pointers and sizes only.
/// \tparam T element type of q and o \tparam KV element type of the pool (T in this stage)
/// \tparam Policy the hooks' policy (kernels/attention_policy.cuh; the identity here)
template <typename T, typename KV = T, typename Policy = kernels::IdentityPolicy>
struct PagedDecodeParams {
  const T* q = nullptr;              ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<KV> kv{};         ///< the page pool and its CSR page table
  T* o = nullptr;                    ///< (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;              ///< (batch_size, num_qo_heads), natural log
  int num_qo_heads = 0;              ///< query heads, Hq (the row stride of q, o and lse)
  int group_size = 0;                ///< num_qo_heads / num_kv_heads
  int bdy = 0;                       ///< ceil(group_size / DecodeTraits::HPT)
  int bdz = 0;                       ///< kThreads / (BDX * bdy): token groups of a 256-thread loop
  int num_stages = 0;                ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f;         ///< sm_scale * k_scale * log2(e): folded into q once
  float v_scale = 1.f;               ///< folded into the output's normalisation
  typename Policy::Params policy{};  ///< what the policy's hooks read
};

/// Shared memory (bytes) of paged_decode_kernel: the pipeline, whose memory the merge
/// buffers reuse once the loop has returned. \tparam KV element type of the pool
template <typename KV, int HEAD_DIM>
constexpr size_t paged_decode_smem_bytes(int num_stages, int bdy, int bdz) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  const size_t pipeline = Tr::pipeline_bytes(num_stages);
  const size_t merge = Tr::merge_bytes(bdz, bdy);
  return pipeline > merge ? pipeline : merge;
}

/// Batch decode through the page table: block (kv head, request) computes the group_size
/// query heads that share that kv head, over all of the request's keys, and writes their
/// o and lse. grid = (num_kv_heads, batch_size), 256 threads, shared memory
/// paged_decode_smem_bytes(num_stages, bdy, bdz); two blocks per SM, so at most 128
/// registers a thread.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam KV element type of the pool: T in this stage (paged_fp8.cu: an FP8 pool)
/// \tparam Policy called at the four hooks: on_q, on_k_tile, on_logit, on_state
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, o (batch_size,
///        num_qo_heads, head_dim) and lse (batch_size, num_qo_heads), block shape and scales
template <typename T, int HEAD_DIM, typename KV = T, typename Policy = kernels::IdentityPolicy>
__global__ void __launch_bounds__(256, 2) paged_decode_kernel(const PagedDecodeParams<T, KV, Policy> p) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  KV* pipeline = reinterpret_cast<KV*>(smem_raw);  // stage s: K tile, V tile at s * STAGE_ELEMS
  const int kv_head = blockIdx.x, b = blockIdx.y;
  const DecodeThread th = place_thread<Tr::BDX>(threadIdx.x, p.bdy, p.bdz);
  const int kv_len = p.kv.kv_len(b);
  const int num_tiles = (kv_len + Tr::TILE - 1) / Tr::TILE;
  const int32_t page_begin = p.kv.kv_indptr[b];
  const int64_t first_row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size;  // the group's first head
  const int S = p.num_stages;

  // q_j * sm_scale * log2(e) in registers; every head's state empty (m = -inf, d = 0, o = 0).
  QRegisters<KV, HEAD_DIM> q;
  HeadStates<KV, HEAD_DIM> state;
  load_q<T, HEAD_DIM, KV, Policy>(th, p.q, first_row, p.group_size, p.sm_scale_log2, q, p.policy, kv_len - 1);
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) state[j].init();

  // ---- prologue: tiles 0 .. S-2 in flight, the page ids of tile S-1 read.
  TilePages<KV, HEAD_DIM> page;
  TileSlots<KV, HEAD_DIM> slot;
  for (int s = 0; s < S - 1; ++s) {
    if (s < num_tiles) {
      fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, s, page, slot);
      issue_copies<KV, HEAD_DIM>(th, p.kv, kv_head, page, slot, pipeline + s * Tr::STAGE_ELEMS);
    }
    cp_async_commit_group();  // one group per tile, empty or not: the counts stay aligned
  }
  if (S - 1 < num_tiles) fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, S - 1, page, slot);

  // ---- main loop: wait for tile i, refill the stage tile i-1 used, fold tile i into the states.
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait_group_dynamic(S - 2);  // this thread's copies of tile i landed
    __syncthreads();                     // everyone's copies of tile i landed, and everyone is done with tile i-1
    const int next = i + S - 1;
    if (next < num_tiles)
      issue_copies<KV, HEAD_DIM>(th, p.kv, kv_head, page, slot, pipeline + (next % S) * Tr::STAGE_ELEMS);
    cp_async_commit_group();
    if (next + 1 < num_tiles) fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, next + 1, page, slot);
    KV* tile = pipeline + (i % S) * Tr::STAGE_ELEMS;
    if constexpr (Policy::kTouchesTiles) {  // e.g. rotated in place (RoPE), then seen whole
      Policy::template on_k_tile<kernels::RowMajorTile, KV, HEAD_DIM, Tr::TILE, Tr::kThreads>(p.policy, tile, th.tid,
                                                                                              i * Tr::TILE);
      __syncthreads();
    }
    if (th.computes) attend_tile<KV, HEAD_DIM, Policy>(th, q, state, tile, i * Tr::TILE, kv_len, p.policy);
  }
  cp_async_wait_group<0>();
  __syncthreads();  // every copy landed and every tile is consumed: the memory is free

  // ---- merge the bdz partial states of each head (exact) in the pipeline's memory, then
  // o = o_j / d_j (times v_scale) and lse = (m_j + log2 d_j) ln 2. Two blocks share an SM,
  // so one block's merge hides behind the other's loads.
  if (!merge_states<KV, HEAD_DIM>(th, state, p.bdz, reinterpret_cast<float*>(smem_raw))) return;
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) {
    if (th.ty * Tr::HPT + j >= p.group_size) continue;  // an odd group leaves the last slot empty
    const int64_t row = first_row + th.ty * Tr::HPT + j;
    kernels::policy_on_state<Policy>(p.policy, state[j], static_cast<int>(row % p.num_qo_heads),
                                     0);  // e.g. a sink's term
    float out[Tr::EPT];
    state[j].output(out, p.v_scale);
    store_output<T, HEAD_DIM, KV>(th, out, state[j].lse(), p.o, p.lse, row);
  }
}

}  // namespace flashstep::stages::paged
