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

/// The end of the kernel: merges the num_z token groups' partial states of each of the
/// group's heads (exact) and writes o and lse, with the whole block working on the merge.
/// Why not DecodeLoop::merge_states: there one thread per (head, dims) folds the other
/// num_z - 1 states into its own, one after another, a chain of num_z - 1 dependent
/// rescales (31 for two halves of a group of 4). Stage 02 runs one block per SM when
/// the grid is small, so that chain is a tail every block pays with no other block to
/// hide it. Here every state goes to shared memory, and each thread takes VEC dims of
/// one head: the max over the num_z states first, then one weighted sum over them, whose
/// terms are independent (no rescale chain).
///
///     state id = (z * bdy + ty) * HPT + j: head ty * HPT + j of token group z
///     part_o [num_states][HEAD_DIM]   part_m [num_states]   part_d [num_states]
///
/// Collective over the whole block (a __syncthreads).
/// \param loop this thread's decode loop, its states final
/// \param z_base token group of this thread's tz = 0 (half * bdz)
/// \param num_z token groups of the block (SPLITS * bdz)
/// \param group_size query heads of the block
/// \param buf DecodeTraits::merge_bytes(num_z, bdy) bytes of shared memory, 16-byte
///        aligned, not read or written by any copy still in flight
/// \param o (batch_size, num_qo_heads, head_dim) output \param lse (batch_size,
///        num_qo_heads) natural-log lse \param first_row row of the group's first head
template <typename T, int HEAD_DIM>
__device__ __forceinline__ void merge_and_store(const kernels::DecodeLoop<T, HEAD_DIM>& loop, int z_base, int num_z,
                                                int group_size, float* buf, T* o, float* lse, int64_t first_row) {
  using L = kernels::DecodeLoop<T, HEAD_DIM>;
  constexpr int HPT = L::HPT, VEC = L::VEC, NV = L::NV, BDX = L::BDX;
  const int bdy = loop.bdy;
  const int num_states = num_z * bdy * HPT;
  float* part_o = buf;
  float* part_m = part_o + num_states * HEAD_DIM;
  float* part_d = part_m + num_states;
  if (loop.computes) {
    const int z = z_base + loop.tz;
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const int id = (z * bdy + loop.ty) * HPT + j;
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int e = 0; e < VEC; e += 4)
          *reinterpret_cast<float4*>(part_o + id * HEAD_DIM + (v * BDX + loop.tx) * VEC + e) =
              make_float4(loop.state[j].o[v * VEC + e], loop.state[j].o[v * VEC + e + 1],
                          loop.state[j].o[v * VEC + e + 2], loop.state[j].o[v * VEC + e + 3]);
      if (loop.tx == 0) {
        part_m[id] = loop.state[j].m;
        part_d[id] = loop.state[j].d;
      }
    }
  }
  __syncthreads();
  constexpr int CHUNKS = HEAD_DIM / VEC;  // VEC-dim pieces of one head's row
  // Only the first 256 threads (half 0) read the states back. On the device the
  // __syncthreads above (barrier 0, all 512 threads, each warp's second arrival at it
  // after attend's) orders every write before every read, and nothing writes this region
  // after it. But compute-sanitizer's racecheck reported half 0's writes of part_m vs
  // half 1's reads (fp32, head_dim 256, a group of 7: 448 items, so half 1 read too; 5
  // tiles, so half 0 had passed one more named barrier than half 1). Readers in half 0
  // only is the decode loop's merge_states pattern, which racecheck accepts, and costs
  // nothing where it matters: a group of 4 at bf16 / head_dim 128 is 64 items.
  if (threadIdx.x >= L::Tr::kThreads) return;
#pragma unroll 1
  for (int item = threadIdx.x; item < group_size * CHUNKS; item += L::Tr::kThreads) {
    const int h = item / CHUNKS, c = item % CHUNKS;
    const int first_id = h;           // (0 * bdy + ty) * HPT + j for head h = ty * HPT + j
    const int z_stride = bdy * HPT;   // ids between two token groups of one head
    float m_max = -INFINITY;
#pragma unroll 4
    for (int z = 0; z < num_z; ++z) m_max = fmaxf(m_max, part_m[first_id + z * z_stride]);
    float acc[VEC], d_sum = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = 0.f;
    if (m_max != -INFINITY) {  // else no key at all: o = 0, lse = -inf, as SoftmaxState says
#pragma unroll 4  // four states' loads in flight: the sum has no dependent chain to wait on
      for (int z = 0; z < num_z; ++z) {
        const int id = first_id + z * z_stride;
        const float m_z = part_m[id];
        const float w = m_z == -INFINITY ? 0.f : exp2f(m_z - m_max);  // an empty state adds nothing
        d_sum = fmaf(w, part_d[id], d_sum);
#pragma unroll
        for (int e = 0; e < VEC; e += 4) {
          const float4 x = *reinterpret_cast<const float4*>(part_o + id * HEAD_DIM + c * VEC + e);
          acc[e] = fmaf(w, x.x, acc[e]);
          acc[e + 1] = fmaf(w, x.y, acc[e + 1]);
          acc[e + 2] = fmaf(w, x.z, acc[e + 2]);
          acc[e + 3] = fmaf(w, x.w, acc[e + 3]);
        }
      }
    }
    const float inv_d = d_sum > 0.f ? 1.f / d_sum : 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] *= inv_d;
    const int64_t row = first_row + h;
    kernels::Vec16<T> ov;
    ov.from_float(acc);
    ov.store(o + row * HEAD_DIM + c * VEC);
    if (c == 0) lse[row] = d_sum > 0.f ? (m_max + log2f(d_sum)) * kernels::kLn2 : -INFINITY;
  }
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
  if constexpr (SPLITS == 1) {
    // Two blocks per SM: one block's merge tail hides behind the other's loads, so the
    // decode loop's own merge (its dependent chain over bdz states) is fine here.
    if (loop.merge_states(half * p.bdz, SPLITS * p.bdz, merge_buffers)) {
#pragma unroll
      for (int j = 0; j < Tr::kHeadsPerThread; ++j) {
        if (!loop.holds_head(j, p.group_size)) continue;
        float out[Tr::kElemsPerThread];
        loop.state[j].output(out);
        loop.store_output(j, out, p.o, p.lse, first_row + loop.ty * Tr::kHeadsPerThread + j);
      }
    }
  } else {
    // A lone block per SM: nothing hides the merge, so the whole block does it.
    merge_and_store<T, HEAD_DIM>(loop, half * p.bdz, SPLITS * p.bdz, p.group_size, merge_buffers, p.o, p.lse, first_row);
  }
}

}  // namespace flashstep::stages::paged
