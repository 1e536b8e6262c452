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
/// The merge differs from merge_states (decode_loop.cuh), where one thread per (head,
/// dims) folds the other states into its own, a chain of 2 * bdz - 1 dependent rescales
/// that nothing hides when a block is alone on its SM: see merge_and_store.
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
/// shared memory, and each thread takes QVEC dims (one output vector) of one head: the
/// max over the num_z states first (SoftmaxState::init(m_max)), then one weighted sum
/// over them (SoftmaxState::absorb), whose terms are independent.
///
///     state id = (z * bdy + ty) * HPT + j: head ty * HPT + j of token group z
///     part_o [num_states][HEAD_DIM]   part_m [num_states]   part_d [num_states]
///
/// Collective over the whole block (a __syncthreads).
/// \param state this thread's final states \param z this thread's token group (half * bdz + tz)
/// \param num_z token groups of the block (2 * bdz)
/// \param group_size query heads of the block
/// \param buf DecodeTraits::merge_bytes(num_z, bdy) bytes of shared memory, 16-byte
///        aligned, not read or written by any copy still in flight
/// \param o (batch_size, num_qo_heads, head_dim) output \param lse (batch_size,
///        num_qo_heads) natural-log lse \param first_row row of the group's first head
/// \param v_scale multiplies the output, folded into its normalisation
template <typename T, int HEAD_DIM, typename KV>
__device__ __forceinline__ void merge_and_store(const DecodeThread& th, const HeadStates<KV, HEAD_DIM>& state, int z,
                                                int num_z, int group_size, float* buf, T* o, float* lse,
                                                int64_t first_row, float v_scale) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  constexpr int HPT = Tr::HPT, VEC = Tr::VEC, NV = Tr::NV, BDX = Tr::BDX;
  const int num_states = num_z * th.bdy * HPT;
  float* part_o = buf;
  float* part_m = part_o + num_states * HEAD_DIM;
  float* part_d = part_m + num_states;
  if (th.computes) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const int id = (z * th.bdy + th.ty) * HPT + j;
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int e = 0; e < VEC; e += 4)
          *reinterpret_cast<float4*>(part_o + id * HEAD_DIM + (v * BDX + th.tx) * VEC +
                                     e) = make_float4(state[j].o[v * VEC + e], state[j].o[v * VEC + e + 1],
                                                      state[j].o[v * VEC + e + 2], state[j].o[v * VEC + e + 3]);
      if (th.tx == 0) {
        part_m[id] = state[j].m;
        part_d[id] = state[j].d;
      }
    }
  }
  __syncthreads();
  // The reads go by output vectors (QVEC dims: part_o holds dims in order, whatever the
  // K/V's vector width was on the way in).
  constexpr int QVEC = kernels::Vec16<T>::kSize;
  constexpr int CHUNKS = HEAD_DIM / QVEC;  // QVEC-dim pieces of one head's row
  // Readers in half 0 only: racecheck accepts that pattern (merge_states uses it), while
  // readers in both halves drew a report, and a group of 4 at bf16 / head_dim 128 is 64
  // items, fewer than half 0's threads.
  if (threadIdx.x >= Tr::kThreads) return;
#pragma unroll 1
  for (int item = threadIdx.x; item < group_size * CHUNKS; item += Tr::kThreads) {
    const int h = item / CHUNKS, c = item % CHUNKS;
    const int first_id = h;             // (0 * bdy + ty) * HPT + j for head h = ty * HPT + j
    const int z_stride = th.bdy * HPT;  // ids between two token groups of one head
    // m = max_z m_z, then d = sum_z 2^(m_z - m) d_z and o = sum_z 2^(m_z - m) o_z.
    float m_max = -INFINITY;
#pragma unroll 4
    for (int zb = 0; zb < num_z; ++zb) m_max = fmaxf(m_max, part_m[first_id + zb * z_stride]);
    SoftmaxState<QVEC> merged;
    merged.init(m_max);
    if (m_max != -INFINITY) {  // else no key at all: o = 0, lse = -inf, as SoftmaxState says
#pragma unroll 4               // four states' loads in flight: the sum has no dependent chain to wait on
      for (int zb = 0; zb < num_z; ++zb) {
        const int id = first_id + zb * z_stride;
        float o_z[QVEC];
#pragma unroll
        for (int e = 0; e < QVEC; e += 4) {
          const float4 x = *reinterpret_cast<const float4*>(part_o + id * HEAD_DIM + c * QVEC + e);
          o_z[e] = x.x, o_z[e + 1] = x.y, o_z[e + 2] = x.z, o_z[e + 3] = x.w;
        }
        merged.absorb(part_m[id], part_d[id], o_z);
      }
    }
    float out[QVEC];
    merged.output(out, v_scale);
    const int64_t row = first_row + h;
    kernels::Vec16<T> ov;
    ov.from_float(out);
    ov.store(o + row * HEAD_DIM + c * QVEC);
    if (c == 0) lse[row] = merged.lse();
  }
}

/// paged_decode_kernel for a small grid: the same work per block, by two halves that
/// split the request's tiles. grid = (num_kv_heads, batch_size), 512 threads, shared
/// memory two_halves_smem_bytes(num_stages, bdy, bdz); one block per SM, so at most 128
/// registers a thread.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam KV element type of the pool: T in this stage (paged_fp8.cu: an FP8 pool)
/// \param p as for paged_decode_kernel (bdy, bdz: the shape of one half)
template <typename T, int HEAD_DIM, typename KV = T>
__global__ void __launch_bounds__(512, 1) paged_decode_two_halves_kernel(const PagedDecodeParams<T, KV> p) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int half = threadIdx.x / Tr::kThreads;
  const int S = p.num_stages;
  KV* pipeline = reinterpret_cast<KV*>(smem_raw) + half * S * Tr::STAGE_ELEMS;  // this half's
  const int kv_head = blockIdx.x, b = blockIdx.y;
  const DecodeThread th = place_thread<Tr::BDX>(threadIdx.x % Tr::kThreads, p.bdy, p.bdz);
  const int kv_len = p.kv.kv_len(b);
  const int num_tiles = (kv_len + Tr::TILE - 1) / Tr::TILE;
  const int my_tiles = num_tiles > half ? (num_tiles - half + 1) / 2 : 0;  // tiles half, half + 2, ...
  const int32_t page_begin = p.kv.kv_indptr[b];
  const int64_t first_row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size;  // the group's first head

  QRegisters<KV, HEAD_DIM> q;
  HeadStates<KV, HEAD_DIM> state;
  load_q<T, HEAD_DIM, KV>(th, p.q, first_row, p.group_size, p.sm_scale_log2, q);
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) state[j].init();

  // ---- stage 02's pipeline, over this half's tiles half + 2 i, behind this half's barrier.
  TilePages<KV, HEAD_DIM> page;
  TileSlots<KV, HEAD_DIM> slot;
  for (int s = 0; s < S - 1; ++s) {
    if (s < my_tiles) {
      fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, half + 2 * s, page, slot);
      issue_copies<KV, HEAD_DIM>(th, p.kv, kv_head, page, slot, pipeline + s * Tr::STAGE_ELEMS);
    }
    cp_async_commit_group();
  }
  if (S - 1 < my_tiles) fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, half + 2 * (S - 1), page, slot);
  for (int i = 0; i < my_tiles; ++i) {
    cp_async_wait_group_dynamic(S - 2);
    half_barrier(half);
    const int next = i + S - 1;
    if (next < my_tiles)
      issue_copies<KV, HEAD_DIM>(th, p.kv, kv_head, page, slot, pipeline + (next % S) * Tr::STAGE_ELEMS);
    cp_async_commit_group();
    if (next + 1 < my_tiles) fetch_pages<KV, HEAD_DIM>(th, p.kv, page_begin, kv_len, half + 2 * (next + 1), page, slot);
    if (th.computes)
      attend_tile<KV, HEAD_DIM>(th, q, state, pipeline + (i % S) * Tr::STAGE_ELEMS, (half + 2 * i) * Tr::TILE, kv_len);
  }
  cp_async_wait_group<0>();
  __syncthreads();  // both halves' copies landed and every tile is consumed

  // ---- the 2 bdz states of each head, merged by half 0 into o and lse.
  float* merge_buffers = reinterpret_cast<float*>(smem_raw + two_halves_merge_offset<KV, HEAD_DIM>(S));
  merge_and_store<T, HEAD_DIM, KV>(th, state, half * p.bdz + th.tz, 2 * p.bdz, p.group_size, merge_buffers, p.o, p.lse,
                                   first_row, p.v_scale);
}

}  // namespace flashstep::stages::paged
