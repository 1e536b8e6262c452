/// \file decode_loop.cuh
/// \brief Stage 02's device steps: the query heads of one GQA group attend a range of one
/// request's keys through the page table (online softmax over a cp.async tile pipeline,
/// one K/V read for the whole group), and the partial states of the threads merge into
/// one state per head. paged_decode.cuh strings them together over a whole request; stage
/// 03 includes this file and strings them over one chunk. The chapter (README.md) draws
/// the pipeline and says why each part is fast.
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
/// **The K/V element.** The steps take the pool's element type KV apart from q's and o's
/// T, and read K and V only as 16-byte vectors (kernels/vec.cuh's Vec16<KV>) widened to
/// fp32 in registers. Stage 02 runs KV = T; a narrower element packs more of a row into a
/// vector and nothing else changes (the FP8 cache of stages/fp8/ is that lesson). A
/// cache's k_scale is folded into q's scale (load_q), its v_scale into the output's
/// normalisation (SoftmaxState::output), so neither costs anything per key.
///
/// **Policies.** Every step takes a compile-time Policy (kernels/attention_policy.cuh)
/// and calls its hooks: on_q on each head's q as it is loaded, on_k_tile on each K tile
/// once it lands (the caller's job: attend_chunk and the kernels call it between the
/// barrier and attend_tile), on_logit on every score, and on_state on each head's merged
/// state. Stage 02 runs the identity, so the loop below is the plain algorithm; RoPE in
/// the loads (stages/rope/), the logits soft cap (stages/soft_cap/) and attention sinks
/// (stages/sinks/) are policies of their own.
/// A thread's 16 dims of a 16-bit row are dims tx * 8 + e and tx * 8 + e + head_dim / 2,
/// e = 0..7: exactly eight rotate-half pairs, which is the RowSlice load_q hands on_q.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "flashstep/kernels/attention_policy.cuh"
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
  int bdy;  ///< ceil(group_size / HPT): threads across the group's heads
  int bdz;  ///< kThreads / (BDX * bdy): token groups, each with its own softmax states
};

/// Compile-time shape of one 256-thread decode loop, for K/V element type KV (the pool's)
/// and head_dim HEAD_DIM, and the sizes that follow from it.
template <typename KV, int HEAD_DIM>
struct DecodeTraits {
  static constexpr int kThreads = 256;                   ///< threads of one loop
  static constexpr int VEC = Vec16<KV>::kSize;           ///< K/V elements per 16-byte vector
  static constexpr int EPT = 16;                         ///< head_dim elements per thread
  static constexpr int NV = EPT / VEC;                   ///< 16-byte K/V vectors per thread and row: 1, 2 or 4
  static constexpr int BDX = HEAD_DIM / EPT;             ///< threads across head_dim: 4, 8, 16
  static constexpr int HPT = 2;                          ///< query heads per thread
  static constexpr int CHUNKS_PER_ROW = HEAD_DIM / VEC;  ///< 16-byte chunks per K row
  static constexpr int ROWS_PER_PASS = kThreads / CHUNKS_PER_ROW;  ///< rows one copy pass covers
  static constexpr int COPY_PASSES = 4;                            ///< rows (tokens) each thread copies per tile
  static constexpr int TILE = COPY_PASSES * ROWS_PER_PASS;         ///< tokens per pipeline stage
  static constexpr int STEP = 4;                                   ///< tokens per online-softmax update
  static constexpr int STAGE_ELEMS = 2 * TILE * HEAD_DIM;          ///< K tile + V tile
  static_assert(HEAD_DIM % EPT == 0 && BDX <= 32 && (BDX & (BDX - 1)) == 0,
                "head_dim must be 16 x a power of two up to 512");
  static_assert(kThreads % CHUNKS_PER_ROW == 0, "a copy pass must cover whole rows");

  /// The block shape for a GQA group of `group_size` query heads (1..2 * kThreads / BDX).
  __host__ __device__ static constexpr DecodeBlockShape block_shape(int group_size) {
    const int bdy = (group_size + HPT - 1) / HPT;
    return {bdy, kThreads / (BDX * bdy)};
  }
  /// Bytes of one loop's pipeline: num_stages x (K tile + V tile).
  __host__ __device__ static constexpr size_t pipeline_bytes(int num_stages) {
    return size_t(num_stages) * STAGE_ELEMS * sizeof(KV);
  }
  /// Bytes of the merge buffers for num_z token groups of bdy threads each: an fp32 o
  /// row, m and d per (token group, head slot).
  __host__ __device__ static constexpr size_t merge_bytes(int num_z, int bdy) {
    return size_t(num_z) * bdy * HPT * (HEAD_DIM + 2) * sizeof(float);
  }
};

/// This thread's dims of its heads' q (load_q): q[j][e], head slot j, element e.
template <typename KV, int HEAD_DIM>
using QRegisters = float[DecodeTraits<KV, HEAD_DIM>::HPT][DecodeTraits<KV, HEAD_DIM>::EPT];
/// The running softmax state of each of this thread's heads (base 2).
template <typename KV, int HEAD_DIM>
using HeadStates = SoftmaxState<DecodeTraits<KV, HEAD_DIM>::EPT>[DecodeTraits<KV, HEAD_DIM>::HPT];
/// The page of each row this thread copies in one tile, and the row's slot in it.
template <typename KV, int HEAD_DIM>
using TilePages = int32_t[DecodeTraits<KV, HEAD_DIM>::COPY_PASSES];
template <typename KV, int HEAD_DIM>
using TileSlots = uint32_t[DecodeTraits<KV, HEAD_DIM>::COPY_PASSES];

/// One thread's place in the loop's 256-thread layout (the file comment).
struct DecodeThread {
  int tid;           ///< index among the loop's 256 threads, 0..255
  int tx;            ///< which 16 of the head_dim elements: dims (v * BDX + tx) * VEC + e
  int ty;            ///< which pair of query heads: heads ty * HPT + j of the group
  int tz;            ///< which tokens of each tile: tz, tz + bdz, ...
  int bdy;           ///< ceil(group_size / HPT)
  int bdz;           ///< token groups
  bool computes;     ///< tz < bdz: false for the threads that only copy
  unsigned segment;  ///< shuffle mask of the BDX lanes that share one (ty, tz)
};

/// Places thread `tid` of a loop of block shape (bdy, bdz).
template <int BDX>
__device__ __forceinline__ DecodeThread place_thread(int tid, int bdy, int bdz) {
  DecodeThread th;
  th.tid = tid;
  th.tx = tid % BDX;
  th.ty = (tid / BDX) % bdy;
  th.tz = tid / (BDX * bdy);
  th.bdy = bdy;
  th.bdz = bdz;
  th.computes = th.tz < bdz;
  // The BDX lanes of one (ty, tz) reduce q . k together; other lanes of the warp may be
  // on other tokens, so the shuffles name only this segment.
  const int lane = tid % 32;
  th.segment = ((BDX == 32) ? 0xffffffffu : ((1u << BDX) - 1u)) << (lane & ~(BDX - 1));
  return th;
}

/// q_j <- q_j * sm_scale * log2(e) for this thread's dims of its HPT query heads, so that
/// scores come out base 2 (times k_scale for a scaled cache: q . (k * k_scale) =
/// (q * k_scale) . k). Heads past group_size (an odd group) get q = 0 and are never written.
/// \param q_rows (rows, head_dim) queries, one row per (request, query head)
/// \param first_row row of the group's first query head: request * num_qo_heads +
///        kv_head * group_size
/// \param group_size query heads per kv head
/// \param sm_scale_log2 sm_scale * k_scale * log2(e)
/// \param q this thread's EPT dims of each of its heads
/// \param pol the policy's parameters \param q_position the query's position in its request
/// \tparam Policy its on_q sees each head's q (RowSlice: pairs tx * 8 + e for 16-bit K/V)
template <typename T, int HEAD_DIM, typename KV, typename Policy = kernels::IdentityPolicy>
__device__ __forceinline__ void load_q(const DecodeThread& th, const T* q_rows, int64_t first_row, int group_size,
                                       float sm_scale_log2, QRegisters<KV, HEAD_DIM>& q,
                                       const typename Policy::Params& pol = {}, int q_position = 0) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  constexpr int QVEC = Vec16<T>::kSize;  // q elements per 16-byte vector
  constexpr int QPV = Tr::VEC / QVEC;    // q vectors per K/V vector: 1 when K/V is q's type
  static_assert(Tr::VEC % QVEC == 0, "a K/V vector must span whole q vectors (K/V no wider than q)");
  // a 16-bit row's slice is eight rotate-half pairs; a narrower K/V's (16 contiguous dims) is not
  const kernels::RowSlice slice{q_position, Tr::NV == 2 && Tr::VEC == 8 ? th.tx * 8 : -1};
#pragma unroll
  for (int j = 0; j < Tr::HPT; ++j) {
    const int h_local = th.ty * Tr::HPT + j;
    const bool has_head = th.computes && h_local < group_size;
    const T* q_row = q_rows + (first_row + h_local) * HEAD_DIM;
#pragma unroll
    for (int v = 0; v < Tr::NV; ++v)
#pragma unroll
      for (int w = 0; w < QPV; ++w) {  // the q vectors of the dims one K/V vector holds
        Vec16<T> qv;
        if (has_head) qv.load(q_row + (v * Tr::BDX + th.tx) * Tr::VEC + w * QVEC);
        else qv.raw = make_uint4(0, 0, 0, 0);
        qv.to_float(&q[j][v * Tr::VEC + w * QVEC]);
      }
    Policy::template on_q<T>(pol, q[j], slice);
#pragma unroll
    for (int e = 0; e < Tr::EPT; ++e) q[j][e] *= sm_scale_log2;
  }
}

/// The page-table walk for one tile: the physical page and slot of each row this thread
/// copies (COPY_PASSES rows), -1 past len. Issued one tile before the tile's copies, so
/// the dependent load of the page id hides behind a tile of compute.
/// \param kv the paged-KV view \param page_begin index in kv_indices of the range's first
/// page (the range starts on a page boundary) \param len keys in the range
/// \param tile the tile, counted from the range's first key
/// \param page physical page of each row \param slot the row's slot in that page
template <typename KV, int HEAD_DIM>
__device__ __forceinline__ void fetch_pages(const DecodeThread& th, const PagedKV<KV>& kv, int32_t page_begin, int len,
                                            int tile, TilePages<KV, HEAD_DIM>& page, TileSlots<KV, HEAD_DIM>& slot) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  const int row0 = th.tid / Tr::CHUNKS_PER_ROW;
#pragma unroll
  for (int r = 0; r < Tr::COPY_PASSES; ++r) {
    const int tok = tile * Tr::TILE + row0 + r * Tr::ROWS_PER_PASS;
    page[r] = -1;
    if (tok < len) {
      uint32_t page_iter;
      kv.page_size.divmod(static_cast<uint32_t>(tok), page_iter, slot[r]);
      page[r] = __ldg(kv.kv_indices + page_begin + page_iter);
    }
  }
}

/// This thread's cp.async copies of one tile (its 16-byte chunk of COPY_PASSES K rows and
/// V rows) into one pipeline stage. Rows past len (page -1) are zero-filled, no read, so
/// no stale or NaN data sits in shared memory.
/// \param stage_smem the stage: the K tile (TILE, head_dim), then the V tile
template <typename KV, int HEAD_DIM>
__device__ __forceinline__ void issue_copies(const DecodeThread& th, const PagedKV<KV>& kv, int kv_head,
                                             const TilePages<KV, HEAD_DIM>& page, const TileSlots<KV, HEAD_DIM>& slot,
                                             KV* stage_smem) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  const int chunk = th.tid % Tr::CHUNKS_PER_ROW;
  const int row0 = th.tid / Tr::CHUNKS_PER_ROW;
  KV* k_dst = stage_smem;
  KV* v_dst = stage_smem + Tr::TILE * HEAD_DIM;
#pragma unroll
  for (int r = 0; r < Tr::COPY_PASSES; ++r) {
    const int row = row0 + r * Tr::ROWS_PER_PASS;
    const bool valid = page[r] >= 0;
    const int64_t src = valid ? kv.offset(page[r], slot[r], kv_head) + chunk * Tr::VEC : 0;
    cp_async_16(k_dst + row * HEAD_DIM + chunk * Tr::VEC, kv.pool + src, valid);
    cp_async_16(v_dst + row * HEAD_DIM + chunk * Tr::VEC, kv.pool + src + kv.stride_kv, valid);
  }
}

/// Folds the keys of one tile in shared memory into the states: this thread's tokens tz,
/// tz + bdz, ... of the tile, STEP at a time. Keys at or past len (the end of the range)
/// are masked. At 3 TB/s an H100 SM must consume about 12 bytes of K/V per clock, so the
/// compute per byte matters as much as the loads: the scores of a step's tokens are
/// computed without branches, so their loads, FMAs and shuffles interleave; each thread
/// takes at least 4 tokens of a tile, spreading the per-tile work; the output is rescaled
/// only when the running max grows.
/// \param q this thread's dims of its heads' q (load_q) \param state their running states
/// \param k_tile (TILE, head_dim) K rows in shared memory, followed by the V tile
/// \param tile_start the tile's first key, counted from the range's first
/// \param len keys in the range
/// \param pol the policy's parameters \param range_position the range's first key's
///        position in its request (the position on_logit sees is range_position +
///        tile_start + the key's row)
/// \tparam Policy its on_logit sees every score
template <typename KV, int HEAD_DIM, typename Policy = kernels::IdentityPolicy>
__device__ __forceinline__ void attend_tile(const DecodeThread& th, const QRegisters<KV, HEAD_DIM>& q,
                                            HeadStates<KV, HEAD_DIM>& state, const KV* k_tile, int tile_start, int len,
                                            const typename Policy::Params& pol = {}, int range_position = 0) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  constexpr int HPT = Tr::HPT, STEP = Tr::STEP, TILE = Tr::TILE, VEC = Tr::VEC, NV = Tr::NV, BDX = Tr::BDX;
  const KV* v_tile = k_tile + TILE * HEAD_DIM;
  for (int base = th.tz; base < TILE; base += STEP * th.bdz) {
    // s_uj = q_j . k_u for STEP tokens u and both heads j (base 2), with no branch: a
    // token past the tile reads a clamped row and is masked below, so the compiler can
    // interleave the STEP x HPT independent dot products and their shuffles.
    float s[STEP][HPT];
#pragma unroll
    for (int u = 0; u < STEP; ++u) {
      const int row = min(base + u * th.bdz, TILE - 1);
#pragma unroll
      for (int j = 0; j < HPT; ++j) s[u][j] = 0.f;
#pragma unroll
      for (int v = 0; v < NV; ++v) {
        Vec16<KV> k16;
        k16.load(k_tile + row * HEAD_DIM + (v * BDX + th.tx) * VEC);
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
        for (int j = 0; j < HPT; ++j) s[u][j] += __shfl_xor_sync(th.segment, s[u][j], offset);
          // The policy's logits (the identity leaves them), then s_uj = -inf past the tile or
          // past the range.
#pragma unroll
    for (int u = 0; u < STEP; ++u) {
      const int local = base + u * th.bdz;
#pragma unroll
      for (int j = 0; j < HPT; ++j) s[u][j] = Policy::on_logit(pol, s[u][j], range_position + tile_start + local);
      if (local >= TILE || tile_start + local >= len)
#pragma unroll
        for (int j = 0; j < HPT; ++j) s[u][j] = -INFINITY;
    }
    // m_j <- max(m_j, max_u s_uj), and d_j, o_j rescaled by 2^(m_old - m_new), only if it grew.
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      float m_new = state[j].m;
#pragma unroll
      for (int u = 0; u < STEP; ++u) m_new = fmaxf(m_new, s[u][j]);
      if (m_new > state[j].m) state[j].rescale_to(m_new);
    }
    // d_j += 2^(s_uj - m_j), o_j += 2^(s_uj - m_j) v_u: each V row widened once and
    // weighted into both heads (a masked token has weight 0, and its row holds finite
    // data: real values or the copies' zero-fill).
#pragma unroll
    for (int u = 0; u < STEP; ++u) {
      const int row = min(base + u * th.bdz, TILE - 1);
      float v[Tr::EPT];
#pragma unroll
      for (int vi = 0; vi < NV; ++vi) {
        Vec16<KV> v16;
        v16.load(v_tile + row * HEAD_DIM + (vi * BDX + th.tx) * VEC);
        v16.to_float(&v[vi * VEC]);
      }
#pragma unroll
      for (int j = 0; j < HPT; ++j) state[j].add(s[u][j], v);
    }
  }
}

/// Merges the num_z token groups' states of each head exactly (SoftmaxState::merge) into
/// those of token group 0, through shared memory. Collective over the whole thread block
/// (it holds a __syncthreads), whose threads together hold num_z token groups of the same
/// bdy. Returns true on the threads that hold the merged states (tz == 0 and computing):
/// they write the result.
/// \param num_z token groups of the block (this thread's is tz)
/// \param buf DecodeTraits::merge_bytes(num_z, bdy) bytes of shared memory, not read or
///        written by any copy still in flight
template <typename KV, int HEAD_DIM>
__device__ __forceinline__ bool merge_states(const DecodeThread& th, HeadStates<KV, HEAD_DIM>& state, int num_z,
                                             float* buf) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  constexpr int HPT = Tr::HPT, VEC = Tr::VEC, NV = Tr::NV, BDX = Tr::BDX;
  const int num_states = num_z * th.bdy * HPT;
  float* part_o = buf;                             // [state][HEAD_DIM]
  float* part_m = part_o + num_states * HEAD_DIM;  // [state]
  float* part_d = part_m + num_states;             // [state]
  if (num_z > 1) {
    if (th.computes && th.tz > 0) {
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int id = (th.tz * th.bdy + th.ty) * HPT + j;
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int e = 0; e < VEC; ++e) part_o[id * HEAD_DIM + (v * BDX + th.tx) * VEC + e] = state[j].o[v * VEC + e];
        if (th.tx == 0) {
          part_m[id] = state[j].m;
          part_d[id] = state[j].d;
        }
      }
    }
    __syncthreads();
    if (th.computes && th.tz == 0) {
      for (int zb = 1; zb < num_z; ++zb)
#pragma unroll
        for (int j = 0; j < HPT; ++j) {
          const int id = (zb * th.bdy + th.ty) * HPT + j;
          float o_b[Tr::EPT];
#pragma unroll
          for (int v = 0; v < NV; ++v)
#pragma unroll
            for (int e = 0; e < VEC; ++e) o_b[v * VEC + e] = part_o[id * HEAD_DIM + (v * BDX + th.tx) * VEC + e];
          state[j].merge(part_m[id], part_d[id], o_b);
        }
    }
  }
  return th.computes && th.tz == 0;
}

/// Writes one head's normalized output, rounded to T, and its natural-log lse: this
/// thread's dims of o row `row`, and lse[row] from the tx == 0 thread. Call on the threads
/// merge_states returned true on, for the head slots that hold one of the group's heads.
/// \param out this thread's EPT dims of the head's normalized output (SoftmaxState::output)
/// \param head_lse the head's lse (SoftmaxState::lse)
/// \param o (rows, head_dim) output \param lse (rows) natural-log lse
/// \param row the head's row: request * num_qo_heads + query head
template <typename T, int HEAD_DIM, typename KV>
__device__ __forceinline__ void store_output(const DecodeThread& th,
                                             const float (&out)[DecodeTraits<KV, HEAD_DIM>::EPT], float head_lse, T* o,
                                             float* lse, int64_t row) {
  using Tr = DecodeTraits<KV, HEAD_DIM>;
  constexpr int QVEC = Vec16<T>::kSize;  // o elements per 16-byte vector
  constexpr int QPV = Tr::VEC / QVEC;    // o vectors per K/V vector: 1 when K/V is q's type
#pragma unroll
  for (int v = 0; v < Tr::NV; ++v)
#pragma unroll
    for (int w = 0; w < QPV; ++w) {
      Vec16<T> ov;
      ov.from_float(&out[v * Tr::VEC + w * QVEC]);
      ov.store(o + row * HEAD_DIM + (v * Tr::BDX + th.tx) * Tr::VEC + w * QVEC);
    }
  if (th.tx == 0) lse[row] = head_lse;
}

}  // namespace flashstep::stages::paged
