/// \file paged_decode.cuh
/// \brief Stage 02's kernel: batch decode through a paged KV cache.
///
/// What changed from stage 01 (each line is a reason it is faster):
///  - One pass. The online softmax (kernels/state.cuh) folds each key into a running
///    (m, d, o), so no score ever goes to HBM and K and V are read exactly once.
///  - One K/V read per GQA group. A block owns (request, kv head) and computes all the
///    query heads that share that kv head; stage 01 re-read K and V once per query head.
///  - Wide, asynchronous loads. K/V rows move global -> shared memory with 16-byte
///    cp.async copies, num_stages tiles deep, so the memory system always has the next
///    tiles in flight while the threads compute on the current one.
///  - bf16/fp16 storage with fp32 math: half the bytes of stage 01's fp32.
///  - Paged KV: token t of request b is found through the page table
///    (kv_indices[kv_indptr[b] + t / page_size], slot t % page_size), with the division
///    done by FastDivmod and the page ids of the next tile fetched one tile ahead.
///
/// The loop that does all this is kernels/decode_loop.cuh (stage 03 runs the same loop
/// over chunks of requests): its file comment draws the 256-thread layout, the tile
/// pipeline and the instruction budget that make it fast. This file is what stage 02
/// adds around it: which keys a block reads (all of request b's), the block's halves,
/// and the write of o and lse.
///
/// Thread-block layout. grid = (num_kv_heads, batch_size); a block is SPLITS "halves"
/// of 256 threads (SPLITS = 1 normally, 2 when the grid has too few blocks to put two
/// on every SM). Each half runs its own decode loop over every SPLITS-th tile of the
/// request, with its own pipeline and its own named barrier, so the two halves of a lone
/// block never wait for each other until the end: within one block they behave like two
/// blocks. Then the states of both halves merge as one block's:
///
///     threadIdx.x = half * 256 + tid          tid: the decode loop's (tx, ty, tz)
///     half h takes tiles h, h + SPLITS, h + 2 SPLITS, ... of the request
///     token group of a state: z = half * bdz + tz, merged over all SPLITS * bdz
///
/// Shared memory:
///
///     [ half 0: num_stages x 32 KB | half 1: num_stages x 32 KB | merge buffers ]
///                                                                  ^ paged_decode_merge_offset
///     one half: the merge buffers reuse the pipeline's memory (offset 0)
///
/// What it still does badly: one block per (request, kv head), so a batch of a few
/// long requests leaves most SMs idle (stage 03 splits the KV across blocks); q . k runs
/// on CUDA cores, fine for decode (a GEMV) but not for prefill (stage 04).
#pragma once

#include <cstdint>

#include "flashstep/kernels/decode_loop.cuh"
#include "flashstep/kernels/paged_kv.cuh"

namespace flashstep::stages::paged {

/// Arguments of paged_decode_kernel; raw pointers and sizes only.
template <typename T>
struct PagedDecodeParams {
  const T* q = nullptr;      ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<T> kv{};  ///< the page pool and its CSR page table
  T* o = nullptr;            ///< (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;      ///< (batch_size, num_qo_heads), natural log
  int num_qo_heads = 0;      ///< query heads, Hq (the row stride of q, o and lse)
  int group_size = 0;        ///< num_qo_heads / num_kv_heads
  int bdy = 0;               ///< ceil(group_size / kHeadsPerThread)
  int bdz = 0;               ///< kThreads / (kBDX * bdy): token groups of a half
  int num_stages = 0;        ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f; ///< sm_scale * log2(e): folded into q once
};

/// Byte offset of the end-of-kernel merge buffers. One half reuses its pipeline memory
/// (the decode loop ends with a __syncthreads). Two halves get a region of their own
/// after both pipelines, so no shared-memory address is used on both sides of the phase
/// the named barriers govern: compute-sanitizer's racecheck reported hazards between the
/// last tiles' reads and the merge's writes when the memory was shared, and a region of
/// its own removes the question instead of arguing with the tool.
template <typename T, int HEAD_DIM>
__host__ __device__ constexpr size_t paged_decode_merge_offset(int splits, int num_stages) {
  return splits == 1 ? 0 : size_t(splits) * kernels::DecodeTraits<T, HEAD_DIM>::pipeline_bytes(num_stages);
}

/// Shared memory (bytes) the kernel needs for SPLITS halves, a pipeline depth and a
/// block shape: pipelines plus merge buffers, laid out as paged_decode_merge_offset says.
template <typename T, int HEAD_DIM>
constexpr size_t paged_decode_smem_bytes(int splits, int num_stages, int bdy, int bdz) {
  using Tr = kernels::DecodeTraits<T, HEAD_DIM>;
  const size_t pipeline = size_t(splits) * Tr::pipeline_bytes(num_stages);
  const size_t merge = Tr::merge_bytes(splits * bdz, bdy);
  const size_t offset = paged_decode_merge_offset<T, HEAD_DIM>(splits, num_stages);
  return offset + merge > pipeline ? offset + merge : pipeline;
}

/// The barrier of one 256-thread half: named barrier 1 or 2 (0 is __syncthreads), so
/// the two halves of a block never wait for each other.
__device__ __forceinline__ void half_barrier(int half) {
  if (half == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else asm volatile("bar.sync 2, 256;\n" ::: "memory");
}

/// Batch decode through the page table: block (kv head, request) computes the group_size
/// query heads that share that kv head, over all of the request's keys, and writes their
/// o and lse. grid = (num_kv_heads, batch_size), 256 * SPLITS threads, shared memory
/// paged_decode_smem_bytes(SPLITS, num_stages, bdy, bdz). Two blocks of one half, or one
/// block of two halves, per SM: at most 128 registers a thread.
/// \tparam T element type of q, the pool and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam SPLITS 1, or 2 halves each running its own pipeline over every other tile
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, o (batch_size,
///        num_qo_heads, head_dim) and lse (batch_size, num_qo_heads), block shape and scale
template <typename T, int HEAD_DIM, int SPLITS>
__global__ void __launch_bounds__(256 * SPLITS, 2 / SPLITS) paged_decode_kernel(const PagedDecodeParams<T> p) {
  using Tr = kernels::DecodeTraits<T, HEAD_DIM>;
  constexpr int HPT = Tr::kHeadsPerThread;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int half = threadIdx.x / Tr::kThreads;
  const int S = p.num_stages;
  T* pipeline = reinterpret_cast<T*>(smem_raw) + half * S * Tr::kStageElems;
  const int kv_head = blockIdx.x, b = blockIdx.y;
  kernels::DecodeLoop<T, HEAD_DIM> loop(threadIdx.x % Tr::kThreads, p.bdy, p.bdz);
  const int kv_len = p.kv.kv_len(b);
  const int num_tiles = (kv_len + Tr::kTile - 1) / Tr::kTile;
  const int my_tiles = num_tiles > half ? (num_tiles - half + SPLITS - 1) / SPLITS : 0;
  const int32_t page_base = p.kv.kv_indptr[b];
  const int64_t first_row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size;  // the group's first head
  loop.load_q(p.q, first_row, p.group_size, p.sm_scale_log2);
  auto half_sync = [half] {
    if (SPLITS == 1) __syncthreads();
    else half_barrier(half);
  };
  loop.template attend<SPLITS, false>(p.kv, kv_head, page_base, kv_len, half, my_tiles, pipeline, S, half_sync);

  // ---- merge the SPLITS x bdz partial states of each head (exact), then write o and lse.
  float* merge_buffers = reinterpret_cast<float*>(smem_raw + paged_decode_merge_offset<T, HEAD_DIM>(SPLITS, p.num_stages));
  if (loop.merge_states(half * p.bdz, SPLITS * p.bdz, merge_buffers)) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      if (!loop.holds_head(j, p.group_size)) continue;
      float out[Tr::kElemsPerThread];
      loop.state[j].output(out);
      loop.store_output(j, out, p.o, p.lse, first_row + loop.ty * HPT + j);
    }
  }
}

}  // namespace flashstep::stages::paged
