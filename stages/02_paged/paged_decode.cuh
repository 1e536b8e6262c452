/// \file paged_decode.cuh
/// \brief Stage 02's kernel: batch decode through a paged KV cache, one block of 256
/// threads per (kv head, request).
///
/// What changed from stage 01: one pass of online softmax instead of three over stored
/// scores; one K/V read shared by the query heads of a GQA group instead of one per query
/// head; 16-byte cp.async copies, several tiles in flight; bf16/fp16 storage with fp32
/// math; and the page table. The loop that does all of it is decode_loop.cuh; this file
/// says which keys a block reads (all of request b's) and where its result goes.
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
/// \tparam T element type of q and o \tparam KV element type of the pool (T, or FP8)
template <typename T, typename KV = T>
struct PagedDecodeParams {
  const T* q = nullptr;       ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<KV> kv{};  ///< the page pool and its CSR page table
  T* o = nullptr;             ///< (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;       ///< (batch_size, num_qo_heads), natural log
  int num_qo_heads = 0;       ///< query heads, Hq (the row stride of q, o and lse)
  int group_size = 0;         ///< num_qo_heads / num_kv_heads
  int bdy = 0;                ///< ceil(group_size / kHeadsPerThread)
  int bdz = 0;                ///< kThreads / (kBDX * bdy): token groups of a 256-thread loop
  int num_stages = 0;         ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f;  ///< sm_scale * k_scale * log2(e): folded into q once
  float v_scale = 1.f;        ///< folded into the output's normalisation
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
/// \tparam KV element type of the pool: T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with a 16-bit T
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, o (batch_size,
///        num_qo_heads, head_dim) and lse (batch_size, num_qo_heads), block shape and scales
template <typename T, int HEAD_DIM, typename KV = T>
__global__ void __launch_bounds__(256, 2) paged_decode_kernel(const PagedDecodeParams<T, KV> p) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int kv_head = blockIdx.x, b = blockIdx.y;
  DecodeLoop<T, HEAD_DIM, KV> loop(threadIdx.x, p.bdy, p.bdz);
  const int kv_len = p.kv.kv_len(b);
  const int num_tiles = (kv_len + Tr::kTile - 1) / Tr::kTile;
  const int32_t page_base = p.kv.kv_indptr[b];
  const int64_t first_row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size;  // the group's first head

  // ---- every key of request b through one pipeline.
  loop.load_q(p.q, first_row, p.group_size, p.sm_scale_log2);
  loop.template attend<1, false>(p.kv, kv_head, page_base, kv_len, 0, num_tiles, reinterpret_cast<KV*>(smem_raw),
                                 p.num_stages, [] { __syncthreads(); });

  // ---- merge the bdz partial states of each head (exact) in the pipeline's memory, then
  // write o and lse. Two blocks share an SM, so one block's merge hides behind the
  // other's loads.
  if (!loop.merge_states(p.bdz, reinterpret_cast<float*>(smem_raw))) return;
#pragma unroll
  for (int j = 0; j < Tr::kHeadsPerThread; ++j) {
    if (!loop.holds_head(j, p.group_size)) continue;
    float out[Tr::kElemsPerThread];
    loop.state[j].output(out, p.v_scale);
    loop.store_output(j, out, p.o, p.lse, first_row + loop.ty * Tr::kHeadsPerThread + j);
  }
}

}  // namespace flashstep::stages::paged
