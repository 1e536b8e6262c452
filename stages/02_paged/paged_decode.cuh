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
/// Thread-block layout. grid = (num_kv_heads, batch_size); a block is SPLITS "halves"
/// of 256 threads (SPLITS = 1 normally, 2 when the grid has too few blocks to put two
/// on every SM). Each half runs its own pipeline over every SPLITS-th tile of the
/// request, with its own named barrier, so the two halves of a lone block never wait
/// for each other until the end: within one block they behave like two blocks.
/// Inside a half:
///
///     tid = tx + BDX * (ty + bdy * tz)          (tid = threadIdx.x % 256)
///       tx  in [0, BDX)  which 16 of the head_dim elements (BDX = head_dim / 16)
///       ty  in [0, bdy)  which pair of the group's query heads (bdy = ceil(group / 2))
///       tz  in [0, bdz)  which tokens of each tile: tz, tz + bdz, tz + 2 bdz, ...
///
///     A thread converts each K/V element it reads once and uses it for its two query
///     heads. The BDX threads of a (ty, tz) hold one row of q . k in pieces and add them
///     with BDX-wide shuffles. Each (half, ty, tz) keeps its own online-softmax state
///     over its share of the tokens; at the end the states of each head are merged
///     exactly (the same merge as split-KV and cascade) in shared memory.
///
///     Loading is mapped separately, so that every thread issues the same copies
///     whatever the group size: thread tid copies 16-byte chunk (tid % chunks_per_row)
///     of rows tid / chunks_per_row + r * rows_per_pass, r < 4, of K and of V.
///
/// Shared memory: per half, num_stages x [K tile | V tile], each tile kTile rows of
/// head_dim elements: 32 KB per stage for every dtype and head_dim; then, for two
/// halves, the buffers of the final merge (about 66 KB).
///
/// Instruction budget. At 3 TB/s an H100 SM must consume about 12 bytes of K/V per clock,
/// so the compute per byte matters as much as the loads: the scores of a step's tokens
/// are computed without branches (rows past the tile are clamped and masked), so their
/// loads, FMAs and shuffles interleave instead of running one token after another; each
/// thread handles at least 4 tokens of a tile, so the per-tile work (barrier, copies,
/// page-table walk) is spread over them; and the running output is rescaled only when
/// the running max actually grows.
///
/// What it still does badly: one block per (request, kv head), so a batch of a few
/// long requests leaves most SMs idle (stage 03 splits the KV across blocks); q . k runs
/// on CUDA cores, fine for decode (a GEMV) but not for prefill (stage 04).
#pragma once

#include <cstdint>

#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::paged {

/// Compile-time shape of one 256-thread half of the kernel, for element type T and
/// head_dim HEAD_DIM.
template <typename T, int HEAD_DIM>
struct DecodeTraits {
  static constexpr int kThreads = 256;                         ///< threads of one half
  static constexpr int kVec = kernels::Vec16<T>::kSize;        ///< elements per 16-byte vector
  static constexpr int kElemsPerThread = 16;                   ///< head_dim elements per thread
  static constexpr int kVecsPerThread = kElemsPerThread / kVec;  ///< 2 (16-bit) or 4 (fp32)
  static constexpr int kBDX = HEAD_DIM / kElemsPerThread;      ///< threads across head_dim: 4, 8, 16
  static constexpr int kHeadsPerThread = 2;                    ///< query heads per thread
  static constexpr int kChunksPerRow = HEAD_DIM / kVec;        ///< 16-byte chunks per K row
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  ///< rows one copy pass covers
  static constexpr int kCopyPasses = 4;                        ///< rows (tokens) each thread copies per tile
  static constexpr int kTile = kCopyPasses * kRowsPerPass;     ///< tokens per pipeline stage
  static constexpr int kTokensPerStep = 4;                     ///< tokens per online-softmax update
  static constexpr int kStageElems = 2 * kTile * HEAD_DIM;     ///< K tile + V tile
  static_assert(HEAD_DIM % kElemsPerThread == 0 && kBDX <= 32 && (kBDX & (kBDX - 1)) == 0,
                "head_dim must be 16 x a power of two up to 512");
  static_assert(kThreads % kChunksPerRow == 0, "a copy pass must cover whole rows");
};

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
  int bdz = 0;               ///< kThreads / (kBDX * bdy): token groups of a block
  int num_stages = 0;        ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f; ///< sm_scale * log2(e): folded into q once
};

/// Byte offset of the end-of-kernel merge buffers. One half reuses its pipeline memory
/// (a __syncthreads separates the two uses). Two halves get a region of their own after
/// both pipelines, so no shared-memory address is used on both sides of the phase the
/// named barriers govern: compute-sanitizer's racecheck reported hazards between the
/// last tiles' reads and the merge's writes when the memory was shared, and a region of
/// its own removes the question instead of arguing with the tool.
template <typename T, int HEAD_DIM>
__host__ __device__ constexpr size_t paged_decode_merge_offset(int splits, int num_stages) {
  return splits == 1 ? 0 : size_t(splits) * num_stages * DecodeTraits<T, HEAD_DIM>::kStageElems * sizeof(T);
}

/// Shared memory (bytes) the kernel needs for SPLITS halves, a pipeline depth and a
/// block shape: pipelines plus merge buffers, laid out as paged_decode_merge_offset says.
template <typename T, int HEAD_DIM>
constexpr size_t paged_decode_smem_bytes(int splits, int num_stages, int bdy, int bdz) {
  using Tr = DecodeTraits<T, HEAD_DIM>;
  const size_t pipeline = size_t(splits) * num_stages * Tr::kStageElems * sizeof(T);
  const size_t states = size_t(splits) * bdz * bdy * Tr::kHeadsPerThread;
  const size_t merge = states * (HEAD_DIM + 2) * sizeof(float);
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
  using Tr = DecodeTraits<T, HEAD_DIM>;
  constexpr int BDX = Tr::kBDX, HPT = Tr::kHeadsPerThread, EPT = Tr::kElemsPerThread;
  constexpr int VEC = Tr::kVec, NV = Tr::kVecsPerThread, TILE = Tr::kTile;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const int half = threadIdx.x / Tr::kThreads;
  const int S = p.num_stages;
  T* smem = reinterpret_cast<T*>(smem_raw) + half * S * Tr::kStageElems;  // this half's pipeline

  const int kv_head = blockIdx.x, b = blockIdx.y;
  const int tid = threadIdx.x % Tr::kThreads;
  const int tx = tid % BDX;
  const int ty = (tid / BDX) % p.bdy;
  const int tz = tid / (BDX * p.bdy);
  const bool computes = tz < p.bdz;  // a few threads only copy when bdz * bdy * BDX < 256
  // The BDX lanes of one (ty, tz) reduce q . k together; other lanes of the warp may be
  // on other tokens, so the shuffles name only this segment.
  const int lane = tid % 32;
  const unsigned segment = ((BDX == 32) ? 0xffffffffu : ((1u << BDX) - 1u)) << (lane & ~(BDX - 1));

  const kernels::PagedKV<T>& kv = p.kv;
  const int kv_len = kv.kv_len(b);
  const int num_tiles = (kv_len + TILE - 1) / TILE;
  // This half's tiles are half, half + SPLITS, ...: local tile i is tile half + i * SPLITS.
  const int my_tiles = num_tiles > half ? (num_tiles - half + SPLITS - 1) / SPLITS : 0;
  const int32_t page_base = kv.kv_indptr[b];

  // ---- q in registers, pre-multiplied by sm_scale * log2(e): scores come out base 2.
  float q[HPT][EPT];
  kernels::SoftmaxState<EPT> state[HPT];
#pragma unroll
  for (int j = 0; j < HPT; ++j) {
    state[j].init();
    const int h_local = ty * HPT + j;
    const bool has_head = computes && h_local < p.group_size;
    const T* q_row = p.q + (int64_t{b} * p.num_qo_heads + kv_head * p.group_size + h_local) * HEAD_DIM;
#pragma unroll
    for (int v = 0; v < NV; ++v) {
      kernels::Vec16<T> qv;
      if (has_head) qv.load(q_row + (v * BDX + tx) * VEC);
      else qv.raw = make_uint4(0, 0, 0, 0);
      qv.to_float(&q[j][v * VEC]);
    }
#pragma unroll
    for (int e = 0; e < EPT; ++e) q[j][e] *= p.sm_scale_log2;
  }

  // ---- the copy mapping: this thread's chunk and its kCopyPasses rows of every tile.
  const int chunk = tid % Tr::kChunksPerRow;
  const int row0 = tid / Tr::kChunksPerRow;
  constexpr int PASSES = Tr::kCopyPasses;
  int32_t page[PASSES];   // physical page of each row's token in the tile being prefetched (-1: past kv_len)
  uint32_t slot[PASSES];  // the token's slot in that page

  // Page-table walk for a tile: the page ids are loaded one tile before their copies
  // are issued, so the dependent load's latency hides behind a tile of compute.
  auto fetch_pages = [&](int local_tile) {
    const int tile = half + local_tile * SPLITS;
#pragma unroll
    for (int r = 0; r < PASSES; ++r) {
      const int tok = tile * TILE + row0 + r * Tr::kRowsPerPass;
      page[r] = -1;
      if (tok < kv_len) {
        uint32_t page_iter;
        kv.page_size.divmod(static_cast<uint32_t>(tok), page_iter, slot[r]);
        page[r] = __ldg(kv.kv_indices + page_base + page_iter);
      }
    }
  };
  // Copies of this thread's chunks of one tile into pipeline stage `stage`. Rows past
  // kv_len are zero-filled (no read), so no stale or NaN data sits in shared memory.
  auto issue_copies = [&](int stage) {
    T* k_dst = smem + stage * Tr::kStageElems;
    T* v_dst = k_dst + TILE * HEAD_DIM;
#pragma unroll
    for (int r = 0; r < PASSES; ++r) {
      const int row = row0 + r * Tr::kRowsPerPass;
      const bool valid = page[r] >= 0;
      const int64_t src = valid ? kv.offset(page[r], slot[r], kv_head) + chunk * VEC : 0;
      kernels::cp_async_16(k_dst + row * HEAD_DIM + chunk * VEC, kv.pool + src, valid);
      kernels::cp_async_16(v_dst + row * HEAD_DIM + chunk * VEC, kv.pool + src + kv.stride_kv, valid);
    }
  };

  // ---- prologue: this half's tiles 0 .. S-2 in flight, page ids of tile S-1 fetched.
  for (int s = 0; s < S - 1; ++s) {
    if (s < my_tiles) {
      fetch_pages(s);
      issue_copies(s);
    }
    kernels::cp_async_commit_group();  // one group per tile, empty or not: counts stay aligned
  }
  if (S - 1 < my_tiles) fetch_pages(S - 1);

  // ---- main loop: wait for tile i, refill the stage tile i-1 used, compute tile i.
  for (int i = 0; i < my_tiles; ++i) {
    kernels::cp_async_wait_group_dynamic(S - 2);  // this thread's copies of tile i landed
    // Everyone in the half: copies of tile i landed, and tile i-1 is done with.
    if (SPLITS == 1) __syncthreads();
    else half_barrier(half);
    const int next = i + S - 1;
    if (next < my_tiles) issue_copies(next % S);
    kernels::cp_async_commit_group();
    if (next + 1 < my_tiles) fetch_pages(next + 1);
    const int tile = half + i * SPLITS;

    if (computes) {
      const T* k_tile = smem + (i % S) * Tr::kStageElems;
      const T* v_tile = k_tile + TILE * HEAD_DIM;
      const int tile_start = tile * TILE;
      constexpr int STEP = Tr::kTokensPerStep;
      for (int base = tz; base < TILE; base += STEP * p.bdz) {
        // Scores of STEP tokens for both heads, with no branch: a token past the tile
        // reads a clamped row and is masked below, so the compiler can interleave the
        // STEP x HPT independent dot products and their shuffles.
        float s[STEP][HPT];
#pragma unroll
        for (int u = 0; u < STEP; ++u) {
          const int row = min(base + u * p.bdz, TILE - 1);
#pragma unroll
          for (int j = 0; j < HPT; ++j) s[u][j] = 0.f;
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            kernels::Vec16<T> kv16;
            kv16.load(k_tile + row * HEAD_DIM + (v * BDX + tx) * VEC);
            float k[VEC];
            kv16.to_float(k);
#pragma unroll
            for (int j = 0; j < HPT; ++j)
#pragma unroll
              for (int e = 0; e < VEC; ++e) s[u][j] = fmaf(q[j][v * VEC + e], k[e], s[u][j]);
          }
        }
        // The BDX lanes of the segment each hold a part of every dot product.
#pragma unroll
        for (int offset = BDX / 2; offset > 0; offset /= 2)
#pragma unroll
          for (int u = 0; u < STEP; ++u)
#pragma unroll
            for (int j = 0; j < HPT; ++j) s[u][j] += __shfl_xor_sync(segment, s[u][j], offset);
        // Mask tokens past the tile or past kv_len, then rescale only if the max grew.
#pragma unroll
        for (int u = 0; u < STEP; ++u) {
          const int local = base + u * p.bdz;
          if (local >= TILE || tile_start + local >= kv_len)
#pragma unroll
            for (int j = 0; j < HPT; ++j) s[u][j] = -INFINITY;
        }
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
          float m_new = state[j].m;
#pragma unroll
          for (int u = 0; u < STEP; ++u) m_new = fmaxf(m_new, s[u][j]);
          if (m_new > state[j].m) state[j].rescale_to(m_new);
        }
        // Each V row converted once and weighted into both heads (a masked token has
        // weight 0, and its row holds finite data: real values or the copies' zero-fill).
#pragma unroll
        for (int u = 0; u < STEP; ++u) {
          const int row = min(base + u * p.bdz, TILE - 1);
          float v[EPT];
#pragma unroll
          for (int vi = 0; vi < NV; ++vi) {
            kernels::Vec16<T> vv;
            vv.load(v_tile + row * HEAD_DIM + (vi * BDX + tx) * VEC);
            vv.to_float(&v[vi * VEC]);
          }
#pragma unroll
          for (int j = 0; j < HPT; ++j) state[j].add(s[u][j], v);
        }
      }
    }
  }
  kernels::cp_async_wait_group<0>();
  __syncthreads();  // every copy landed and every tile is consumed

  // ---- merge the SPLITS x bdz partial states of each head (exact), then write o and lse.
  const int num_states = SPLITS * p.bdz * p.bdy * HPT;
  const int group_z = half * p.bdz + tz;  // this thread's state among the SPLITS x bdz
  const int num_z = SPLITS * p.bdz;
  float* part_o = reinterpret_cast<float*>(smem_raw + paged_decode_merge_offset<T, HEAD_DIM>(SPLITS, S));  // [state][HEAD_DIM]
  float* part_m = part_o + num_states * HEAD_DIM;      // [state]
  float* part_d = part_m + num_states;                 // [state]
  if (num_z > 1) {
    if (computes && group_z > 0) {
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int id = (group_z * p.bdy + ty) * HPT + j;
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int e = 0; e < VEC; ++e) part_o[id * HEAD_DIM + (v * BDX + tx) * VEC + e] = state[j].o[v * VEC + e];
        if (tx == 0) {
          part_m[id] = state[j].m;
          part_d[id] = state[j].d;
        }
      }
    }
    __syncthreads();
    if (computes && group_z == 0) {
      for (int z = 1; z < num_z; ++z)
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
          const int id = (z * p.bdy + ty) * HPT + j;
          float o_b[EPT];
#pragma unroll
          for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int e = 0; e < VEC; ++e) o_b[v * VEC + e] = part_o[id * HEAD_DIM + (v * BDX + tx) * VEC + e];
          state[j].merge(part_m[id], part_d[id], o_b);
        }
    }
  }
  if (computes && group_z == 0) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const int h_local = ty * HPT + j;
      if (h_local >= p.group_size) continue;
      const int64_t row = int64_t{b} * p.num_qo_heads + kv_head * p.group_size + h_local;
      float out[EPT];
      state[j].output(out);
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        kernels::Vec16<T> ov;
        ov.from_float(&out[v * VEC]);
        ov.store(p.o + row * HEAD_DIM + (v * BDX + tx) * VEC);
      }
      if (tx == 0) p.lse[row] = state[j].lse();
    }
  }
}

}  // namespace flashstep::stages::paged
