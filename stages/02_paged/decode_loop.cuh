/// \file decode_loop.cuh
/// \brief Stage 02's decode loop: the query heads of one GQA group attend a range of one
/// request's keys through the page table (online softmax over a cp.async tile pipeline,
/// one K/V read for the whole group), and the partial states of the threads merge into
/// one state per head. paged_decode.cuh runs it over a whole request; stage 03 includes
/// this file and runs it over one chunk. The chapter (README.md) draws the pipeline and
/// says why each part is fast.
///
/// Thread layout of the loop's 256 threads (a block, or one half of a two-halves block):
///
///     tid = tx + BDX * (ty + bdy * tz)
///       tx  in [0, BDX)  which 16 of the head_dim elements (BDX = head_dim / 16)
///       ty  in [0, bdy)  which pair of the group's query heads (bdy = ceil(group / 2))
///       tz  in [0, bdz)  which tokens of each tile: tz, tz + bdz, tz + 2 bdz, ...
///
/// The BDX threads of a (ty, tz) hold one row of q . k in pieces and add them by shuffle;
/// each (ty, tz) keeps its own state over its share of the tokens. Copies are mapped
/// apart from that, so every thread issues the same copies whatever the group size.
///
/// **FP8 K/V.** The pool's element type KV may differ from q's and o's T: an e4m3/e5m2
/// cache read with fp16/bf16 queries. A 16-byte vector then carries 16 elements, a
/// thread's whole share of a row, so a tile holds twice the tokens in the same bytes; the
/// elements are widened to fp32 in registers, as they are read from shared memory.
/// k_scale is folded into q's scale (load_q), v_scale into the output's normalisation
/// (SoftmaxState::output), so the scales cost nothing per key.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::paged {

using kernels::cp_async_16;
using kernels::cp_async_commit_group;
using kernels::cp_async_wait_group;
using kernels::cp_async_wait_group_dynamic;
using kernels::PagedKV;
using kernels::SoftmaxState;
using kernels::Vec16;

/// Thread-block shape of the decode loop for one GQA group size: bdy pairs of query heads
/// times bdz token groups (times BDX threads across head_dim) fill 256 threads.
struct DecodeBlockShape {
  int bdy;  ///< ceil(group_size / kHeadsPerThread): threads across the group's heads
  int bdz;  ///< kThreads / (kBDX * bdy): token groups, each with its own softmax states
};

/// Compile-time shape of one 256-thread decode loop, for K/V element type T (the pool's)
/// and head_dim HEAD_DIM, and the sizes that follow from it.
template <typename T, int HEAD_DIM>
struct DecodeTraits {
  static constexpr int kThreads = 256;                           ///< threads of one loop
  static constexpr int kVec = Vec16<T>::kSize;                   ///< elements per 16-byte vector
  static constexpr int kElemsPerThread = 16;                     ///< head_dim elements per thread
  static constexpr int kVecsPerThread = kElemsPerThread / kVec;  ///< 1 (fp8), 2 (16-bit) or 4 (fp32)
  static constexpr int kBDX = HEAD_DIM / kElemsPerThread;        ///< threads across head_dim: 4, 8, 16
  static constexpr int kHeadsPerThread = 2;                      ///< query heads per thread
  static constexpr int kChunksPerRow = HEAD_DIM / kVec;          ///< 16-byte chunks per K row
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;  ///< rows one copy pass covers
  static constexpr int kCopyPasses = 4;                          ///< rows (tokens) each thread copies per tile
  static constexpr int kTile = kCopyPasses * kRowsPerPass;       ///< tokens per pipeline stage
  static constexpr int kTokensPerStep = 4;                       ///< tokens per online-softmax update
  static constexpr int kStageElems = 2 * kTile * HEAD_DIM;       ///< K tile + V tile
  static_assert(HEAD_DIM % kElemsPerThread == 0 && kBDX <= 32 && (kBDX & (kBDX - 1)) == 0,
                "head_dim must be 16 x a power of two up to 512");
  static_assert(kThreads % kChunksPerRow == 0, "a copy pass must cover whole rows");

  /// The block shape for a GQA group of `group_size` query heads (1..2 * kThreads / kBDX).
  __host__ __device__ static constexpr DecodeBlockShape block_shape(int group_size) {
    const int bdy = (group_size + kHeadsPerThread - 1) / kHeadsPerThread;
    return {bdy, kThreads / (kBDX * bdy)};
  }
  /// Bytes of one loop's pipeline: num_stages x (K tile + V tile).
  __host__ __device__ static constexpr size_t pipeline_bytes(int num_stages) {
    return size_t(num_stages) * kStageElems * sizeof(T);
  }
  /// Bytes of the merge buffers for num_z token groups of bdy threads each: an fp32 o
  /// row, m and d per (token group, head slot).
  __host__ __device__ static constexpr size_t merge_bytes(int num_z, int bdy) {
    return size_t(num_z) * bdy * kHeadsPerThread * (HEAD_DIM + 2) * sizeof(float);
  }
};

/// One thread's part of the decode loop: its place in the 256-thread layout (the file
/// comment), the query heads it holds and their running softmax states. A kernel makes
/// one, then calls load_q, attend, merge_states and store_output in that order; each call
/// is collective over the threads named in its comment.
/// \tparam T element type of q and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \tparam KV element type of the K/V pool: T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with a
///         16-bit T
template <typename T, int HEAD_DIM, typename KV = T>
struct DecodeLoop {
  using Tr = DecodeTraits<KV, HEAD_DIM>;           ///< the loop's compile-time shape (of the K/V elements)
  static constexpr int BDX = Tr::kBDX;             ///< threads across head_dim
  static constexpr int HPT = Tr::kHeadsPerThread;  ///< query heads per thread
  static constexpr int EPT = Tr::kElemsPerThread;  ///< head_dim elements per thread
  static constexpr int VEC = Tr::kVec;             ///< K/V elements per 16-byte vector
  static constexpr int NV = Tr::kVecsPerThread;    ///< 16-byte K/V vectors per thread and row
  static constexpr int TILE = Tr::kTile;           ///< tokens per pipeline stage
  static constexpr int QVEC = Vec16<T>::kSize;     ///< q/o elements per 16-byte vector
  static constexpr int QPV = VEC / QVEC;           ///< q/o vectors per K/V vector: 1, or 2 for fp8 K/V
  static_assert(VEC % QVEC == 0, "a K/V vector must span whole q/o vectors (K/V no wider than q)");

  int tid;                       ///< this thread's index among the loop's 256, 0..255
  int tx;                        ///< which 16 of the head_dim elements: dims (v * BDX + tx) * VEC + e (VEC of K/V)
  int ty;                        ///< which pair of query heads: heads ty * HPT + j of the group
  int tz;                        ///< which tokens of each tile: tz, tz + bdz, ...
  int bdy;                       ///< ceil(group_size / HPT)
  int bdz;                       ///< token groups
  bool computes;                 ///< tz < bdz: false for the threads that only copy
  unsigned segment;              ///< shuffle mask of the BDX lanes that share one (ty, tz)
  float q[HPT][EPT];             ///< this thread's dims of its heads' q, times sm_scale * log2(e)
  SoftmaxState<EPT> state[HPT];  ///< running state of each of its heads (base 2)

  /// Places the thread. \param tid index among the loop's 256 threads
  /// \param bdy block shape (DecodeTraits::block_shape) \param bdz block shape
  __device__ __forceinline__ DecodeLoop(int tid, int bdy, int bdz)
      : tid(tid), tx(tid % BDX), ty((tid / BDX) % bdy), tz(tid / (BDX * bdy)), bdy(bdy), bdz(bdz) {
    computes = tz < bdz;
    // The BDX lanes of one (ty, tz) reduce q . k together; other lanes of the warp may
    // be on other tokens, so the shuffles name only this segment.
    const int lane = tid % 32;
    segment = ((BDX == 32) ? 0xffffffffu : ((1u << BDX) - 1u)) << (lane & ~(BDX - 1));
  }

  /// Loads this thread's dims of its two query heads into registers, pre-multiplied by
  /// sm_scale * log2(e) so that scores come out base 2 (times k_scale for a scaled cache:
  /// q . (k * k_scale) = (q * k_scale) . k), and empties the states. Heads past group_size
  /// (an odd group) get q = 0 and are never written.
  /// \param q_rows (rows, head_dim) queries, one row per (request, query head)
  /// \param first_row row of the group's first query head: request * num_qo_heads +
  ///        kv_head * group_size
  /// \param group_size query heads per kv head
  /// \param sm_scale_log2 sm_scale * k_scale * log2(e)
  __device__ __forceinline__ void load_q(const T* q_rows, int64_t first_row, int group_size, float sm_scale_log2) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      state[j].init();
      const int h_local = ty * HPT + j;
      const bool has_head = computes && h_local < group_size;
      const T* q_row = q_rows + (first_row + h_local) * HEAD_DIM;
#pragma unroll
      for (int v = 0; v < NV; ++v)
#pragma unroll
        for (int w = 0; w < QPV; ++w) {  // the q vectors of the dims one K/V vector holds
          Vec16<T> qv;
          if (has_head) qv.load(q_row + (v * BDX + tx) * VEC + w * QVEC);
          else qv.raw = make_uint4(0, 0, 0, 0);
          qv.to_float(&q[j][v * VEC + w * QVEC]);
        }
#pragma unroll
      for (int e = 0; e < EPT; ++e) q[j][e] *= sm_scale_log2;
    }
  }

  /// Folds keys 0 .. len-1 of a range that starts on a page boundary into the states,
  /// through a cp.async pipeline of num_stages tiles. The range's tiles are 0 ..
  /// ceil(len / kTile) - 1; this pipeline takes my_tiles of them, first_tile,
  /// first_tile + STRIDE, ... (STRIDE 1 takes them all; the two halves of two_halves.cuh
  /// each take every other tile). Collective over the loop's 256 threads, which all call `barrier`
  /// together; ends with a __syncthreads() after every copy has landed, so on return the
  /// caller may reuse the pipeline memory.
  /// \tparam STRIDE tiles between two of this pipeline's tiles (the number of pipelines)
  /// \tparam PAIRED_START true: the page ids of the first two tiles are loaded together,
  ///         for ranges of a few tiles, which pay for their start; false: one tile at a
  ///         time, for whole requests
  /// \tparam Barrier callable with no arguments: a barrier over the loop's 256 threads
  /// \param kv the paged-KV view (pool, strides, kv_indices, page_size)
  /// \param kv_head the kv head whose K and V rows are read
  /// \param page_begin index in kv_indices of the range's first page
  /// \param len keys in the range (0 leaves the states empty)
  /// \param first_tile this pipeline's first tile, 0 .. STRIDE-1
  /// \param my_tiles tiles this pipeline takes: ceil((ceil(len / kTile) - first_tile) / STRIDE), >= 0
  /// \param smem this pipeline's shared memory, DecodeTraits::pipeline_bytes(num_stages)
  ///        bytes, 16-byte aligned
  /// \param num_stages pipeline depth, 2..8
  /// \param barrier waits for the loop's 256 threads (and orders their shared memory)
  template <int STRIDE, bool PAIRED_START, typename Barrier>
  __device__ __forceinline__ void attend(const PagedKV<KV>& kv, int kv_head, int32_t page_begin, int len,
                                         int first_tile, int my_tiles, KV* smem, int num_stages, Barrier barrier) {
    const int S = num_stages;

    // ---- the copy mapping: this thread's 16-byte chunk of kCopyPasses rows of every tile.
    constexpr int PASSES = Tr::kCopyPasses;
    const int chunk = tid % Tr::kChunksPerRow;
    const int row0 = tid / Tr::kChunksPerRow;
    int32_t page[PASSES];   // physical page of each row's token in the tile being prefetched; -1 past len
    uint32_t slot[PASSES];  // the token's slot in that page

    // The page-table walk for a tile, one tile before its copies are issued, so the
    // dependent load of the page id hides behind a tile of compute.
    auto fetch_pages_into = [&](int local_tile, int32_t(&pg)[PASSES], uint32_t(&sl)[PASSES]) {
      const int tile = first_tile + local_tile * STRIDE;
#pragma unroll
      for (int r = 0; r < PASSES; ++r) {
        const int tok = tile * TILE + row0 + r * Tr::kRowsPerPass;
        pg[r] = -1;
        if (tok < len) {
          uint32_t page_iter;
          kv.page_size.divmod(static_cast<uint32_t>(tok), page_iter, sl[r]);
          pg[r] = __ldg(kv.kv_indices + page_begin + page_iter);
        }
      }
    };
    auto fetch_pages = [&](int local_tile) { fetch_pages_into(local_tile, page, slot); };
    // Copies of one tile into pipeline stage `stage`. Rows past len are zero-filled (no
    // read), so no stale or NaN data sits in shared memory.
    auto issue_copies = [&](int stage) {
      KV* k_dst = smem + stage * Tr::kStageElems;
      KV* v_dst = k_dst + TILE * HEAD_DIM;
#pragma unroll
      for (int r = 0; r < PASSES; ++r) {
        const int row = row0 + r * Tr::kRowsPerPass;
        const bool valid = page[r] >= 0;
        const int64_t src = valid ? kv.offset(page[r], slot[r], kv_head) + chunk * VEC : 0;
        cp_async_16(k_dst + row * HEAD_DIM + chunk * VEC, kv.pool + src, valid);
        cp_async_16(v_dst + row * HEAD_DIM + chunk * VEC, kv.pool + src + kv.stride_kv, valid);
      }
    };

    // ---- prologue: tiles 0 .. S-2 in flight, page ids of tile S-1 fetched.
    if constexpr (PAIRED_START) {
      // A range of a few tiles pays for its start, so the page ids of tiles 0 and 1 are
      // loaded together, not one dependent round trip after the other.
      int32_t page1[PASSES];
      uint32_t slot1[PASSES];
      fetch_pages(0);
      if (S > 2) fetch_pages_into(1, page1, slot1);
      for (int s = 0; s < S - 1; ++s) {
        if (s < my_tiles) {
          if (s == 1) {
#pragma unroll
            for (int r = 0; r < PASSES; ++r) page[r] = page1[r], slot[r] = slot1[r];
          } else if (s > 1) {
            fetch_pages(s);
          }
          issue_copies(s);
        }
        cp_async_commit_group();  // one group per tile, empty or not: counts stay aligned
      }
    } else {
      for (int s = 0; s < S - 1; ++s) {
        if (s < my_tiles) {
          fetch_pages(s);
          issue_copies(s);
        }
        cp_async_commit_group();  // one group per tile, empty or not: counts stay aligned
      }
    }
    if (S - 1 < my_tiles) fetch_pages(S - 1);

    // ---- main loop: wait for tile i, refill the stage tile i-1 used, compute tile i.
    for (int i = 0; i < my_tiles; ++i) {
      cp_async_wait_group_dynamic(S - 2);  // this thread's copies of tile i landed
      barrier();                           // everyone's copies of tile i landed, and everyone is done with tile i-1
      const int next = i + S - 1;
      if (next < my_tiles) issue_copies(next % S);
      cp_async_commit_group();
      if (next + 1 < my_tiles) fetch_pages(next + 1);
      if (computes) attend_tile(smem + (i % S) * Tr::kStageElems, (first_tile + i * STRIDE) * TILE, len);
    }
    cp_async_wait_group<0>();
    __syncthreads();  // every copy landed and every tile is consumed: the memory is free
  }

  /// Folds the keys of one tile in shared memory into the states: this thread's tokens
  /// tz, tz + bdz, ... of the tile, kTokensPerStep at a time. Keys at or past len (the end
  /// of the range) are masked. At 3 TB/s an H100 SM must consume about 12 bytes of K/V
  /// per clock, so the compute per byte matters as much as the loads: the scores of a
  /// step's tokens are computed without branches, so their loads, FMAs and shuffles
  /// interleave; each thread takes at least 4 tokens of a tile, spreading the per-tile
  /// work; the output is rescaled only when the running max grows.
  /// \param k_tile (kTile, head_dim) K rows in shared memory, followed by the V tile
  /// \param tile_start the tile's first key, counted from the range's first
  /// \param len keys in the range
  __device__ __forceinline__ void attend_tile(const KV* k_tile, int tile_start, int len) {
    const KV* v_tile = k_tile + TILE * HEAD_DIM;
    constexpr int STEP = Tr::kTokensPerStep;
    for (int base = tz; base < TILE; base += STEP * bdz) {
      // Base-2 scores of STEP tokens for both heads, with no branch: a token past the
      // tile reads a clamped row and is masked below, so the compiler can interleave the
      // STEP x HPT independent dot products and their shuffles.
      float s[STEP][HPT];
#pragma unroll
      for (int u = 0; u < STEP; ++u) {
        const int row = min(base + u * bdz, TILE - 1);
#pragma unroll
        for (int j = 0; j < HPT; ++j) s[u][j] = 0.f;
#pragma unroll
        for (int v = 0; v < NV; ++v) {
          Vec16<KV> k16;
          k16.load(k_tile + row * HEAD_DIM + (v * BDX + tx) * VEC);
          float k[VEC];
          k16.to_float(k);
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
            // Mask tokens past the tile or past the range, then rescale only if the max grew.
#pragma unroll
      for (int u = 0; u < STEP; ++u) {
        const int local = base + u * bdz;
        if (local >= TILE || tile_start + local >= len)
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
      // Each V row widened once and weighted into both heads (a masked token has weight
      // 0, and its row holds finite data: real values or the copies' zero-fill).
#pragma unroll
      for (int u = 0; u < STEP; ++u) {
        const int row = min(base + u * bdz, TILE - 1);
        float v[EPT];
#pragma unroll
        for (int vi = 0; vi < NV; ++vi) {
          Vec16<KV> v16;
          v16.load(v_tile + row * HEAD_DIM + (vi * BDX + tx) * VEC);
          v16.to_float(&v[vi * VEC]);
        }
#pragma unroll
        for (int j = 0; j < HPT; ++j) state[j].add(s[u][j], v);
      }
    }
  }

  /// Merges the num_z token groups' states of each head exactly (SoftmaxState::merge)
  /// into those of token group 0, through shared memory. Collective over the whole
  /// thread block (it holds a __syncthreads), whose threads together hold num_z token
  /// groups of the same bdy. Returns true on the threads that hold the merged states
  /// (z == 0 and computing): they write the result.
  /// \param num_z token groups of the block (this thread's is tz)
  /// \param buf DecodeTraits::merge_bytes(num_z, bdy) bytes of shared memory, not read or
  ///        written by any copy still in flight
  __device__ __forceinline__ bool merge_states(int num_z, float* buf) {
    const int num_states = num_z * bdy * HPT;
    const int z = tz;
    float* part_o = buf;                             // [state][HEAD_DIM]
    float* part_m = part_o + num_states * HEAD_DIM;  // [state]
    float* part_d = part_m + num_states;             // [state]
    if (num_z > 1) {
      if (computes && z > 0) {
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
          const int id = (z * bdy + ty) * HPT + j;
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
      if (computes && z == 0) {
        for (int zb = 1; zb < num_z; ++zb)
#pragma unroll
          for (int j = 0; j < HPT; ++j) {
            const int id = (zb * bdy + ty) * HPT + j;
            float o_b[EPT];
#pragma unroll
            for (int v = 0; v < NV; ++v)
#pragma unroll
              for (int e = 0; e < VEC; ++e) o_b[v * VEC + e] = part_o[id * HEAD_DIM + (v * BDX + tx) * VEC + e];
            state[j].merge(part_m[id], part_d[id], o_b);
          }
      }
    }
    return computes && z == 0;
  }

  /// Whether head slot j of this thread is one of the group's heads (an odd group leaves
  /// the last slot empty). \param j head slot, 0..HPT-1 \param group_size query heads per kv head
  __device__ __forceinline__ bool holds_head(int j, int group_size) const { return ty * HPT + j < group_size; }

  /// Writes head slot j's normalized output, rounded to T, and its natural-log lse: this
  /// thread's dims of o row `row`, and lse[row] from the tx == 0 thread. Call on the
  /// threads merge_states returned true on, for the slots holds_head accepts.
  /// \param j head slot, 0..HPT-1
  /// \param out this thread's EPT dims of the slot's normalized output (state[j].output)
  /// \param o (rows, head_dim) output \param lse (rows) natural-log lse
  /// \param row the head's row: request * num_qo_heads + query head
  __device__ __forceinline__ void store_output(int j, const float (&out)[EPT], T* o, float* lse, int64_t row) const {
#pragma unroll
    for (int v = 0; v < NV; ++v)
#pragma unroll
      for (int w = 0; w < QPV; ++w) {
        Vec16<T> ov;
        ov.from_float(&out[v * VEC + w * QVEC]);
        ov.store(o + row * HEAD_DIM + (v * BDX + tx) * VEC + w * QVEC);
      }
    if (tx == 0) lse[row] = state[j].lse();
  }
};

}  // namespace flashstep::stages::paged
