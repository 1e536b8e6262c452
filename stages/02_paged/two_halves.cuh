/// \file two_halves.cuh
/// \brief An optimisation on top of paged_decode.cuh for small grids: a block of two
/// 256-thread halves, each running its own decode loop over every other tile.
///
/// When the batch gives fewer than two blocks per SM (batch_size * num_kv_heads < 2 *
/// SMs), each block is alone on its SM, and every block-wide barrier of the loop stalls
/// the SM with nothing else to run. plan() then launches this kernel instead: half h
/// takes tiles h, h + 2, h + 4, ... of the request with its own pipeline and its own
/// named barrier, so within one block the halves behave like the two blocks per SM of
/// the plain kernel. Then the states of both halves merge as one block's:
///
///     threadIdx.x = half * 256 + tid          tid: the decode loop's (tx, ty, tz)
///     token group of a state: z = half * bdz + tz, merged over all 2 * bdz
///
///     shared memory: [ half 0: num_stages x 32 KB | half 1: num_stages x 32 KB | merge buffers ]
///
/// The merge differs from the loop's merge_states, where one thread per (head, dims)
/// folds the other states into its own, a chain of 2 * bdz - 1 dependent rescales that
/// nothing hides when a block is alone on its SM: see merge_and_store.
#pragma once

#include <cmath>
#include <cstdint>

#include "02_paged/paged_decode.cuh"

namespace flashstep::stages::paged {

/// Byte offset of the merge buffers: after both pipelines, so that no shared-memory
/// address is used on both sides of the phase the named barriers govern (compute-
/// sanitizer's racecheck reported hazards between the last tiles' reads and the merge's
/// writes when the memory was shared).
template <typename KV, int HEAD_DIM>
__host__ __device__ constexpr size_t two_halves_merge_offset(int num_stages) {
  return 2 * DecodeTraits<KV, HEAD_DIM>::pipeline_bytes(num_stages);
}

/// Shared memory (bytes) of paged_decode_two_halves_kernel: two pipelines, then the
/// merge buffers of 2 * bdz token groups. \tparam KV element type of the pool
template <typename KV, int HEAD_DIM>
constexpr size_t two_halves_smem_bytes(int num_stages, int bdy, int bdz) {
  return two_halves_merge_offset<KV, HEAD_DIM>(num_stages) + DecodeTraits<KV, HEAD_DIM>::merge_bytes(2 * bdz, bdy);
}

/// The barrier of one 256-thread half: named barrier 1 or 2 (0 is __syncthreads), so
/// the two halves of a block never wait for each other. PTX, as the toolkit has no API
/// for a barrier over part of a block.
__device__ __forceinline__ void half_barrier(int half) {
  if (half == 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
  else asm volatile("bar.sync 2, 256;\n" ::: "memory");
}

/// Merges the num_z token groups' partial states of each of the group's heads (exact)
/// and writes o and lse, with the whole of half 0 working on it: every state goes to
/// shared memory, and each thread takes QVEC dims (one output vector) of one head: the max over the num_z
/// states first, then one weighted sum over them, whose terms are independent.
///
///     state id = (z * bdy + ty) * HPT + j: head ty * HPT + j of token group z
///     part_o [num_states][HEAD_DIM]   part_m [num_states]   part_d [num_states]
///
/// Collective over the whole block (a __syncthreads).
/// \param loop this thread's decode loop, its states final
/// \param z_base token group of this thread's tz = 0 (half * bdz)
/// \param num_z token groups of the block (2 * bdz)
/// \param group_size query heads of the block
/// \param buf DecodeTraits::merge_bytes(num_z, bdy) bytes of shared memory, 16-byte
///        aligned, not read or written by any copy still in flight
/// \param o (batch_size, num_qo_heads, head_dim) output \param lse (batch_size,
///        num_qo_heads) natural-log lse \param first_row row of the group's first head
/// \param v_scale multiplies the output, folded into its normalisation
template <typename T, int HEAD_DIM, typename KV>
__device__ __forceinline__ void merge_and_store(const DecodeLoop<T, HEAD_DIM, KV>& loop, int z_base, int num_z,
                                                int group_size, float* buf, T* o, float* lse, int64_t first_row,
                                                float v_scale) {
  using L = DecodeLoop<T, HEAD_DIM, KV>;
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
          *reinterpret_cast<float4*>(part_o + id * HEAD_DIM + (v * BDX + loop.tx) * VEC + e) = make_float4(
              loop.state[j].o[v * VEC + e], loop.state[j].o[v * VEC + e + 1], loop.state[j].o[v * VEC + e + 2],
              loop.state[j].o[v * VEC + e + 3]);
      if (loop.tx == 0) {
        part_m[id] = loop.state[j].m;
        part_d[id] = loop.state[j].d;
      }
    }
  }
  __syncthreads();
  // The reads go by output vectors (QVEC dims: part_o holds dims in order, whatever the
  // K/V's vector width was on the way in).
  constexpr int QVEC = L::QVEC;
  constexpr int CHUNKS = HEAD_DIM / QVEC;  // QVEC-dim pieces of one head's row
  // Readers in half 0 only: racecheck accepts that pattern (the loop's merge_states uses
  // it), while readers in both halves drew a report, and a group of 4 at bf16 / head_dim
  // 128 is 64 items, fewer than half 0's threads.
  if (threadIdx.x >= L::Tr::kThreads) return;
#pragma unroll 1
  for (int item = threadIdx.x; item < group_size * CHUNKS; item += L::Tr::kThreads) {
    const int h = item / CHUNKS, c = item % CHUNKS;
    const int first_id = h;          // (0 * bdy + ty) * HPT + j for head h = ty * HPT + j
    const int z_stride = bdy * HPT;  // ids between two token groups of one head
    float m_max = -INFINITY;
#pragma unroll 4
    for (int z = 0; z < num_z; ++z) m_max = fmaxf(m_max, part_m[first_id + z * z_stride]);
    float acc[QVEC], d_sum = 0.f;
#pragma unroll
    for (int e = 0; e < QVEC; ++e) acc[e] = 0.f;
    if (m_max != -INFINITY) {  // else no key at all: o = 0, lse = -inf, as SoftmaxState says
#pragma unroll 4               // four states' loads in flight: the sum has no dependent chain to wait on
      for (int z = 0; z < num_z; ++z) {
        const int id = first_id + z * z_stride;
        const float m_z = part_m[id];
        const float w = m_z == -INFINITY ? 0.f : exp2f(m_z - m_max);  // an empty state adds nothing
        d_sum = fmaf(w, part_d[id], d_sum);
#pragma unroll
        for (int e = 0; e < QVEC; e += 4) {
          const float4 x = *reinterpret_cast<const float4*>(part_o + id * HEAD_DIM + c * QVEC + e);
          acc[e] = fmaf(w, x.x, acc[e]);
          acc[e + 1] = fmaf(w, x.y, acc[e + 1]);
          acc[e + 2] = fmaf(w, x.z, acc[e + 2]);
          acc[e + 3] = fmaf(w, x.w, acc[e + 3]);
        }
      }
    }
    const float inv_d = d_sum > 0.f ? v_scale / d_sum : 0.f;
#pragma unroll
    for (int e = 0; e < QVEC; ++e) acc[e] *= inv_d;
    const int64_t row = first_row + h;
    kernels::Vec16<T> ov;
    ov.from_float(acc);
    ov.store(o + row * HEAD_DIM + c * QVEC);
    if (c == 0) lse[row] = d_sum > 0.f ? (m_max + log2f(d_sum)) * kernels::kLn2 : -INFINITY;
  }
}

/// paged_decode_kernel for a small grid: the same work per block, by two halves that
/// split the request's tiles. grid = (num_kv_heads, batch_size), 512 threads, shared
/// memory two_halves_smem_bytes(num_stages, bdy, bdz); one block per SM, so at most 128
/// registers a thread.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam KV element type of the pool: T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with a 16-bit T
/// \param p as for paged_decode_kernel (bdy, bdz: the shape of one half)
template <typename T, int HEAD_DIM, typename KV = T>
__global__ void __launch_bounds__(512, 1) paged_decode_two_halves_kernel(const PagedDecodeParams<T, KV> p) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int half = threadIdx.x / Tr::kThreads;
  const int S = p.num_stages;
  KV* pipeline = reinterpret_cast<KV*>(smem_raw) + half * S * Tr::kStageElems;
  const int kv_head = blockIdx.x, b = blockIdx.y;
  DecodeLoop<T, HEAD_DIM, KV> loop(threadIdx.x % Tr::kThreads, p.bdy, p.bdz);
  const int kv_len = p.kv.kv_len(b);
  const int num_tiles = (kv_len + Tr::kTile - 1) / Tr::kTile;
  const int my_tiles = num_tiles > half ? (num_tiles - half + 1) / 2 : 0;  // tiles half, half + 2, ...
  const int32_t page_base = p.kv.kv_indptr[b];
  const int64_t first_row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size;  // the group's first head
  loop.load_q(p.q, first_row, p.group_size, p.sm_scale_log2);
  loop.template attend<2, false>(p.kv, kv_head, page_base, kv_len, half, my_tiles, pipeline, S,
                                 [half] { half_barrier(half); });

  float* merge_buffers = reinterpret_cast<float*>(smem_raw + two_halves_merge_offset<KV, HEAD_DIM>(S));
  merge_and_store(loop, half * p.bdz, 2 * p.bdz, p.group_size, merge_buffers, p.o, p.lse, first_row, p.v_scale);
}

}  // namespace flashstep::stages::paged
