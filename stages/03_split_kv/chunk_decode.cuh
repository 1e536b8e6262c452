/// \file chunk_decode.cuh
/// \brief Stage 03's first kernel: decode attention of one work item — one chunk of one
/// request's KV, for the query heads of one kv head — through the page table.
///
/// What changed from stage 02 (paged_decode.cuh): a block no longer owns a whole request
/// but a work item of the plan, (request_indices[k], kv_tile_indices[k]), and reads only
/// that chunk's tokens
///
///     [t * c * page_size, min((t + 1) * c * page_size, kv_len))     c = kv_chunk_size_in_pages
///
/// so a batch of a few long requests becomes G = num_sm * ctas_per_sm blocks, one full
/// wave, instead of batch_size * num_kv_heads blocks that leave most SMs idle. When the
/// plan split, each block writes its chunk's *normalized* state (o, lse) as a partial
/// row in fp32 (merge_states.cuh combines them); when it did not (the batch fills the
/// chip alone), it writes o and lse directly, and the kernel is stage 02's.
///
/// Graph-safe by construction: nothing the launch captures depends on the lengths. Each
/// block reads its work item from the schedule in the workspace — the request, the index
/// of the chunk's first page in kv_indices, the chunk's length in tokens (plan() computed
/// both from the host copy of the page table's lengths, so the block's first dependent
/// load is already the page ids) — and blocks of the padded grid past the real items exit
/// at once (block_valid_mask), so a graph replay after a new plan() runs the new schedule.
///
/// The inner loop is stage 02's design (its second version: branch-free scores over 4
/// tokens, 4 copy passes per tile, a rescale only when the max grows), rebuilt from the
/// same kernels/ building blocks; what each piece buys is explained in paged_decode.cuh.
/// Stage 02's two-halves block for lone blocks is not needed here: a plan that would
/// leave blocks alone on their SMs splits instead.
///
///     tid = tx + BDX * (ty + bdy * tz)      256 threads
///       tx  which 16 of the head_dim elements          (BDX = head_dim / 16)
///       ty  which pair of the group's query heads      (bdy = ceil(group / 2))
///       tz  which tokens of each tile: tz, tz + bdz, ...
///
///     kernels/cp_async.cuh   K/V tiles global -> shared, num_stages deep, 16-byte copies,
///                            rows past the chunk zero-filled
///     kernels/paged_kv.cuh   token -> (page, slot) by FastDivmod, page ids one tile ahead
///     kernels/vec.cuh        16-byte shared loads, widened to fp32
///     kernels/state.cuh      online softmax per (head, tz), exact merge of the bdz states
///
/// Shared memory: num_stages x [K tile | V tile], 32 KB per stage for every dtype and
/// head_dim (a tile is 4 copy passes of 256 x 16 bytes, for K and for V); reused at
/// the end for the merge of the bdz states.
#pragma once

#include <cstdint>

#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::split_kv {

/// Compile-time shape of the chunk kernel for element type T and head_dim HEAD_DIM.
template <typename T, int HEAD_DIM>
struct ChunkTraits {
  static constexpr int kThreads = 256;                            ///< threads of a block
  static constexpr int kVec = kernels::Vec16<T>::kSize;          ///< elements per 16-byte vector
  static constexpr int kElemsPerThread = 16;                      ///< head_dim elements per thread
  static constexpr int kVecsPerThread = kElemsPerThread / kVec;   ///< 2 (16-bit) or 4 (fp32)
  static constexpr int kBDX = HEAD_DIM / kElemsPerThread;         ///< threads across head_dim
  static constexpr int kHeadsPerThread = 2;                       ///< query heads per thread
  static constexpr int kChunksPerRow = HEAD_DIM / kVec;           ///< 16-byte pieces of a K row
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;   ///< rows one copy pass covers
  static constexpr int kCopyPasses = 4;                           ///< rows (tokens) each thread copies per tile
  static constexpr int kTile = kCopyPasses * kRowsPerPass;        ///< tokens per pipeline stage
  static constexpr int kTokensPerStep = 4;                        ///< tokens per softmax rescale
  static constexpr int kStageElems = 2 * kTile * HEAD_DIM;        ///< K tile + V tile
  static_assert(HEAD_DIM % kElemsPerThread == 0 && kBDX <= 32 && (kBDX & (kBDX - 1)) == 0,
                "head_dim must be 16 x a power of two up to 512");
  static_assert(kThreads % kChunksPerRow == 0, "a copy pass must cover whole rows");
};

/// Arguments of chunk_decode_kernel; raw pointers and sizes only.
template <typename T>
struct ChunkDecodeParams {
  const T* q = nullptr;      ///< (batch_size, num_qo_heads, head_dim)
  kernels::PagedKV<T> kv{};  ///< the page pool and its CSR page table
  // The schedule, in the workspace (written by plan()'s one copy).
  const int32_t* request_indices = nullptr;  ///< (padded_batch_size) request r of work item k
  const int32_t* kv_page_begin = nullptr;    ///< (padded_batch_size) kv_indptr[r] + t * c: item k's first page in kv_indices
  const int32_t* kv_chunk_len = nullptr;     ///< (padded_batch_size) tokens of item k's chunk, 0..c * page_size
  const uint8_t* block_valid_mask = nullptr; ///< (padded_batch_size) 0: padding, exit
  // Where the result goes: partial rows (split) or the outputs (no split).
  bool partition_kv = false;     ///< the plan split: write partial rows, else o and lse
  float* partial_o = nullptr;    ///< split: (padded_batch_size, num_qo_heads, head_dim) fp32
  float* partial_lse = nullptr;  ///< split: (padded_batch_size, num_qo_heads) natural log
  T* o = nullptr;                ///< no split: (batch_size, num_qo_heads, head_dim)
  float* lse = nullptr;          ///< no split: (batch_size, num_qo_heads) natural log
  int num_qo_heads = 0;       ///< query heads, Hq (the row stride of q, o and the partials)
  int group_size = 0;         ///< num_qo_heads / num_kv_heads
  int bdy = 0;                ///< ceil(group_size / kHeadsPerThread)
  int bdz = 0;                ///< kThreads / (kBDX * bdy)
  int num_stages = 0;         ///< pipeline depth, 2..8
  float sm_scale_log2 = 0.f;  ///< sm_scale * log2(e), folded into q once
};

/// Shared memory (bytes) for a depth and block shape: the larger of the pipeline and the
/// end-of-block merge buffers (one region serves both).
template <typename T, int HEAD_DIM>
constexpr size_t chunk_decode_smem_bytes(int num_stages, int bdy, int bdz) {
  using Tr = ChunkTraits<T, HEAD_DIM>;
  const size_t pipeline = size_t(num_stages) * Tr::kStageElems * sizeof(T);
  const size_t states = size_t(bdz) * bdy * Tr::kHeadsPerThread;
  const size_t merge = states * (HEAD_DIM + 2) * sizeof(float);
  return pipeline > merge ? pipeline : merge;
}

/// Lets the kernel launched after this one with programmatic dependent launch start its
/// prologue now (sm_90+; a no-op when nothing depends on this grid programmatically). The
/// dependent still waits for this grid's completion before it reads what this grid wrote.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Decode attention of one work item: block (kv head, k) computes the group_size query
/// heads of that kv head over the keys of work item k's chunk, and writes their normalized
/// state to partial row k (partition_kv) or to the request's o and lse. grid =
/// (num_kv_heads, padded_batch_size), ChunkTraits::kThreads threads, shared memory
/// chunk_decode_smem_bytes(num_stages, bdy, bdz); two blocks per SM, so at most 128
/// registers a thread. Blocks whose block_valid_mask entry is 0 exit at once.
/// \tparam T element type of q, the pool and o (float, __half or __nv_bfloat16)
/// \tparam HEAD_DIM head_dim, D
/// \param p q (batch_size, num_qo_heads, head_dim), the paged KV view, the schedule
///        (padded_batch_size entries each), and the destination: partial_o
///        (padded_batch_size, num_qo_heads, head_dim) and partial_lse (padded_batch_size,
///        num_qo_heads) in fp32, or o (batch_size, num_qo_heads, head_dim) and lse
///        (batch_size, num_qo_heads)
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(256, 2) chunk_decode_kernel(const ChunkDecodeParams<T> p) {
  using Tr = ChunkTraits<T, HEAD_DIM>;
  constexpr int BDX = Tr::kBDX, HPT = Tr::kHeadsPerThread, EPT = Tr::kElemsPerThread;
  constexpr int VEC = Tr::kVec, NV = Tr::kVecsPerThread, TILE = Tr::kTile;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  // Every block of this grid is resident in the one wave the plan sized it for, so the
  // merge kernel may be scheduled as soon as blocks start to retire.
  allow_dependent_launch();

  // ---- which work item: padding of a graph-sized grid exits here. The four schedule
  // loads are independent, so they are issued together, before the branch.
  const int kv_head = blockIdx.x, item = blockIdx.y;
  const uint8_t valid_item = p.block_valid_mask[item];
  const int b = p.request_indices[item];
  const int32_t page_base = p.kv_page_begin[item];  // a chunk starts on a page boundary
  const int chunk_len = p.kv_chunk_len[item];
  if (!valid_item) return;
  const kernels::PagedKV<T>& kv = p.kv;
  const int num_tiles = (chunk_len + TILE - 1) / TILE;
  const int S = p.num_stages;

  const int tid = threadIdx.x;
  const int tx = tid % BDX;
  const int ty = (tid / BDX) % p.bdy;
  const int tz = tid / (BDX * p.bdy);
  const bool computes = tz < p.bdz;  // a few threads only copy when bdz * bdy * BDX < 256
  // The BDX lanes of one (ty, tz) reduce q . k together; only they take part in a shuffle.
  const int lane = tid % 32;
  const unsigned segment = ((BDX == 32) ? 0xffffffffu : ((1u << BDX) - 1u)) << (lane & ~(BDX - 1));

  // ---- q of both heads in registers, pre-scaled by sm_scale * log2(e): base-2 scores.
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

  // ---- the copy mapping: this thread's 16-byte piece of kCopyPasses rows of every tile.
  constexpr int PASSES = Tr::kCopyPasses;
  const int piece = tid % Tr::kChunksPerRow;
  const int row0 = tid / Tr::kChunksPerRow;
  int32_t page[PASSES];   // physical page of each row's token in the tile being prefetched; -1 past the chunk
  uint32_t slot[PASSES];  // the token's slot in that page

  // The page-table walk for a tile, one tile before its copies are issued, so the
  // dependent load of the page id hides behind a tile of compute.
  auto fetch_pages_into = [&](int tile, int32_t (&pg)[PASSES], uint32_t (&sl)[PASSES]) {
#pragma unroll
    for (int r = 0; r < PASSES; ++r) {
      const int local = tile * TILE + row0 + r * Tr::kRowsPerPass;
      pg[r] = -1;
      if (local < chunk_len) {
        uint32_t page_iter;
        kv.page_size.divmod(static_cast<uint32_t>(local), page_iter, sl[r]);
        pg[r] = __ldg(kv.kv_indices + page_base + page_iter);
      }
    }
  };
  auto fetch_pages = [&](int tile) { fetch_pages_into(tile, page, slot); };
  // Copies of one tile into pipeline stage `stage`; rows past the chunk become zeros.
  auto issue_copies = [&](int stage) {
    T* k_dst = smem + stage * Tr::kStageElems;
    T* v_dst = k_dst + TILE * HEAD_DIM;
#pragma unroll
    for (int r = 0; r < PASSES; ++r) {
      const int row = row0 + r * Tr::kRowsPerPass;
      const bool valid = page[r] >= 0;
      const int64_t src = valid ? kv.offset(page[r], slot[r], kv_head) + piece * VEC : 0;
      kernels::cp_async_16(k_dst + row * HEAD_DIM + piece * VEC, kv.pool + src, valid);
      kernels::cp_async_16(v_dst + row * HEAD_DIM + piece * VEC, kv.pool + src + kv.stride_kv, valid);
    }
  };

  // ---- prologue: tiles 0 .. S-2 in flight, page ids of tile S-1 fetched. A chunk is
  // short (a few tiles), so the start matters: the page ids of tiles 0 and 1 are loaded
  // together, not one dependent round trip after the other.
  {
    int32_t page1[PASSES];
    uint32_t slot1[PASSES];
    fetch_pages(0);
    if (S > 2) fetch_pages_into(1, page1, slot1);
    for (int s = 0; s < S - 1; ++s) {
      if (s < num_tiles) {
        if (s == 1) {
#pragma unroll
          for (int r = 0; r < PASSES; ++r) page[r] = page1[r], slot[r] = slot1[r];
        } else if (s > 1) {
          fetch_pages(s);
        }
        issue_copies(s);
      }
      kernels::cp_async_commit_group();  // one group per tile, empty or not: counts stay aligned
    }
  }
  if (S - 1 < num_tiles) fetch_pages(S - 1);

  // ---- main loop: wait for tile i, refill the stage tile i-1 used, compute tile i.
  for (int tile = 0; tile < num_tiles; ++tile) {
    kernels::cp_async_wait_group_dynamic(S - 2);  // this thread's copies of `tile` landed
    __syncthreads();  // everyone's copies landed, and everyone is done with tile - 1
    const int next = tile + S - 1;
    if (next < num_tiles) issue_copies(next % S);
    kernels::cp_async_commit_group();
    if (next + 1 < num_tiles) fetch_pages(next + 1);

    if (computes) {
      const T* k_tile = smem + (tile % S) * Tr::kStageElems;
      const T* v_tile = k_tile + TILE * HEAD_DIM;
      const int tile_start = tile * TILE;
      constexpr int STEP = Tr::kTokensPerStep;
      for (int base = tz; base < TILE; base += STEP * p.bdz) {
        // Base-2 scores of STEP tokens for both heads, without a branch: a token past the
        // tile reads a clamped row and is masked below, so the STEP x HPT independent dot
        // products and their shuffles interleave (stage 02's instruction budget).
        float s[STEP][HPT];
#pragma unroll
        for (int u = 0; u < STEP; ++u) {
          const int row = min(base + u * p.bdz, TILE - 1);
#pragma unroll
          for (int j = 0; j < HPT; ++j) s[u][j] = 0.f;
#pragma unroll
          for (int v = 0; v < NV; ++v) {
            kernels::Vec16<T> k16;
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
        // Mask tokens past the tile or past the chunk; rescale only if the max grew.
#pragma unroll
        for (int u = 0; u < STEP; ++u) {
          const int local = base + u * p.bdz;
          if (local >= TILE || tile_start + local >= chunk_len)
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
          const int row = min(base + u * p.bdz, TILE - 1);
          float v[EPT];
#pragma unroll
          for (int vi = 0; vi < NV; ++vi) {
            kernels::Vec16<T> v16;
            v16.load(v_tile + row * HEAD_DIM + (vi * BDX + tx) * VEC);
            v16.to_float(&v[vi * VEC]);
          }
#pragma unroll
          for (int j = 0; j < HPT; ++j) state[j].add(s[u][j], v);
        }
      }
    }
  }
  kernels::cp_async_wait_group<0>();
  __syncthreads();  // the pipeline buffers are free: reuse them for the merge

  // ---- merge the bdz states of each head exactly (kernels/state.cuh), in shared memory.
  const int num_states = p.bdz * p.bdy * HPT;
  float* part_o = reinterpret_cast<float*>(smem_raw);  // [state][HEAD_DIM]
  float* part_m = part_o + num_states * HEAD_DIM;      // [state]
  float* part_d = part_m + num_states;                 // [state]
  if (p.bdz > 1) {
    if (computes && tz > 0) {
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int id = (tz * p.bdy + ty) * HPT + j;
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
    if (computes && tz == 0) {
      for (int z = 1; z < p.bdz; ++z)
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

  // ---- write the chunk's normalized state: a partial row (split) or the output itself.
  if (computes && tz == 0) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const int h_local = ty * HPT + j;
      if (h_local >= p.group_size) continue;
      const int qo_head = kv_head * p.group_size + h_local;
      float out[EPT];
      state[j].output(out);
      if (p.partition_kv) {
        const int64_t row = int64_t{item} * p.num_qo_heads + qo_head;
        float* dst = p.partial_o + row * HEAD_DIM;
        // fp32 partials: the merge then rounds once, to the output dtype, at the end.
#pragma unroll
        for (int v = 0; v < NV; ++v)
#pragma unroll
          for (int w = 0; w < VEC; w += 4)
            *reinterpret_cast<float4*>(dst + (v * BDX + tx) * VEC + w) =
                make_float4(out[v * VEC + w], out[v * VEC + w + 1], out[v * VEC + w + 2], out[v * VEC + w + 3]);
        if (tx == 0) p.partial_lse[row] = state[j].lse();
      } else {
        const int64_t row = int64_t{b} * p.num_qo_heads + qo_head;
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
}

}  // namespace flashstep::stages::split_kv
