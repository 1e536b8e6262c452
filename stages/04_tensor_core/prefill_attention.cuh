/// \file prefill_attention.cuh
/// \brief Stage 04 — prefill/append (and large-group decode) on tensor cores.
///
/// What changed from stage 03: stages 01-03 give each query row its own threads and
/// compute q.k with scalar FMAs on CUDA cores (stage 03's tensor-core decode aside, which
/// has one query per request). That is right for decode (one query per
/// request: the kernel waits on memory anyway) but prefill has qo_len queries per request
/// sharing every key, so it is compute-bound, and CUDA cores give about a sixteenth of what
/// the tensor cores give. Here a block takes a tile of Br query rows and walks the keys in
/// tiles of Bc, FlashAttention-2's loop (Dao, "FlashAttention-2: Faster Attention with
/// Better Parallelism and Work Partitioning", https://arxiv.org/abs/2307.08691):
///
///   S = Q K^T            mma.sync m16n8k16, Q and K read by ldmatrix from swizzled smem
///   m, l, O rescaled     the online softmax, on the accumulator fragments in registers
///   O += P V             P converted in registers into the A operand (never in smem)
///
/// while the next K/V tiles stream in by cp.async (through the page table when paged).
/// A GQA group's query heads are packed as rows of the tile (packed row = token * group +
/// head in group), so they share each K/V tile: with group 32, decode (one token) is one
/// tile of 32 rows, FlashInfer's tensor-core decode (Ye et al., "FlashInfer: Efficient and
/// Customizable Attention Engine for LLM Inference Serving", https://arxiv.org/abs/2501.01005).
///
/// What it still does badly: at 128 registers per thread there is no room to load the
/// next fragments while the MMAs run, so warps wait on ldmatrix and MMA latencies (the
/// chapter's "Reading the targets"). mma.sync is the Ampere instruction; on an H100 the
/// warpgroup MMA (wgmma) with TMA loads and warp specialisation is much faster (stage 07).
/// Outputs are stored straight from fragments (4-byte stores).
///
/// **K/V formats.** How a pool's element reaches the MMAs is a compile-time Format with
/// three hooks (SameAsQ below, the lesson's: K/V in q's dtype, copied straight into the
/// swizzled tiles the MMAs read). A cache of another element type brings its own; stages/
/// fp8/fp8_prefill.cuh stages FP8 tiles and widens them once they land. A run's k_scale is
/// folded into the score scale and its v_scale into the output's normalisation.
///
/// **Policies** (kernels/attention_policy.cuh): the block takes a compile-time Policy and
/// calls its hooks: on_q_tile on the Q tile and on_k_tile on each K tile once they land
/// (swizzled tiles; a barrier follows when the policy writes them), on_state on each row's
/// finished (m, l) before it is normalised. The lesson runs the identity; RoPE in the loads
/// (stages/rope/) and attention sinks (stages/sinks/) are policies of their own.
///
/// How to run it: `ctest -L gpu` validates it on the prefill and decode grids;
/// `flashstep_bench --shapes=bench/shapes_prefill.csv` times it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::tensor_core {

/// The lesson's K/V format: the pool holds K and V in q's dtype T, and each 16-byte copy
/// lands where the MMAs read it, in the swizzled tile. Every hook below is one a format
/// must have:
///   - `Stored`: the pool's element type;
///   - `kTilesInQDtype`: the ring's tiles are the ones the MMAs read, so a policy that
///     rewrites a landed tile (RoPE) may run on them;
///   - `staging_bytes<Bc, HEAD_DIM>()`: shared memory the format needs besides the ring;
///   - `chunk_offset<HEAD_DIM>(r, c)`: where, in elements from a ring tile's start, the
///     16-byte copy c of key row r lands;
///   - `landed<HEAD_DIM, Bc, kThreads>(stage, staging)`: the K tile the MMAs read (its V
///     tile right after it) once the ring stage `stage` (K tile, then V tile) has landed
///     and a barrier has passed; collective over the block, and it may use `staging`.
template <typename T>
struct SameAsQ {
  using Stored = T;                             ///< the pool's element: q's dtype
  static constexpr bool kTilesInQDtype = true;  ///< the MMAs read the ring's tiles
  template <int Bc, int HEAD_DIM>
  __host__ __device__ static constexpr size_t staging_bytes() {
    return 0;
  }
  template <int HEAD_DIM>
  __device__ __forceinline__ static uint32_t chunk_offset(int r, int c) {
    return kernels::swizzled_offset(r, c, HEAD_DIM);
  }
  template <int HEAD_DIM, int Bc, int kThreads>
  __device__ __forceinline__ static const T* landed(const T* stage, T* /*staging*/) {
    return stage;
  }
};

/// Shapes of one instantiation. A block is 8 warps; warp w owns rows
/// [16 w, 16 (w + 1)) of the query tile, one m16 tile:
///
///                  Bc = 64 keys (8 n-tiles of S)
///               +--------------------------------+
///     warp 0    | 16 rows                        |   each warp: S = Q_w K^T,
///     warp 1    |                                |   its own rows' m and l,
///      ...      |                                |   O_w += P_w V
///     warp 7    |                                |   (no exchange between warps)
///               +--------------------------------+
///                  Br = 128 rows
///
/// Eight warps of one m16 tile each (rather than four of two) keep a thread's registers
/// at 128 for head_dim <= 128, so two blocks, sixteen warps, share a multiprocessor and
/// hide each other's latencies.
template <typename T, int HEAD_DIM, typename Format = SameAsQ<T>>
struct PrefillTraits {
  using KV = typename Format::Stored;                              ///< the pool's element type
  static constexpr int kWarps = 8;                                 ///< warps per block
  static constexpr int kThreads = 32 * kWarps;                     ///< threads per block
  static constexpr int kMinBlocksPerSM = HEAD_DIM <= 128 ? 2 : 1;  ///< caps registers at 128 per thread
  static constexpr int Br = 16 * kWarps;                           ///< packed query rows per block
  static constexpr int Bc = 64;                                    ///< keys per tile
  /// K/V tiles in flight + 1, for a 16-bit cache as for an FP8 one (a ring of three FP8
  /// stages, in the same shared memory, was slower on an H200: stages/fp8/README.md).
  static constexpr int kStages = 2;
  static constexpr int kChunks = HEAD_DIM / 8;                      ///< 16-byte chunks per row
  static constexpr int kTilesS = Bc / 8;                            ///< n-tiles of S (8 keys each)
  static constexpr int kTilesO = HEAD_DIM / 8;                      ///< n-tiles of O (8 dims each)
  static constexpr int kRowsPerPass = kThreads / kChunks;           ///< tile rows one cp.async pass covers
  static constexpr int kKVVec = 16 / static_cast<int>(sizeof(KV));  ///< K/V elements per 16-byte copy
  static constexpr int kKVChunks = HEAD_DIM / kKVVec;               ///< 16-byte copies per K/V row
  static constexpr int kKVRowsPerPass = kThreads / kKVChunks;       ///< K/V rows one cp.async pass covers
  static_assert(HEAD_DIM % 64 == 0, "the swizzle needs rows of at least 8 chunks");
  static_assert(kRowsPerPass % 8 == 0, "every pass must start on the same swizzle phase");
  static_assert(Bc % kKVRowsPerPass == 0, "a K/V tile must be whole passes");
  /// Q tile + kStages x (K tile + V tile) of the pool's type, plus what the format needs
  /// besides (its staging_bytes).
  __host__ __device__ static constexpr size_t tiles_bytes() {
    return size_t{Br} * HEAD_DIM * sizeof(T) + 2 * size_t{kStages} * Bc * HEAD_DIM * sizeof(KV) +
           Format::template staging_bytes<Bc, HEAD_DIM>();
  }
  /// Paged K/V: the pool offset of each key row of the next two tiles (fetch_row_offsets).
  __host__ __device__ static constexpr size_t row_offsets_bytes() { return 2 * size_t{Bc} * sizeof(int64_t); }
  __host__ __device__ static constexpr size_t smem_bytes() { return tiles_bytes() + row_offsets_bytes(); }
};

/// Arguments of prefill_attention_kernel; raw pointers and sizes only.
/// \tparam T element type of q and o \tparam KV the pool's element type (the format's Stored)
template <typename T, typename KV = T>
struct PrefillParams {
  const T* q = nullptr;                ///< (nnz_qo, num_qo_heads, head_dim)
  const int32_t* qo_indptr = nullptr;  ///< (batch_size + 1)
  // ragged K/V (paged == false)
  const KV* k = nullptr;               ///< (nnz_kv, num_kv_heads, head_dim)
  const KV* v = nullptr;               ///< (nnz_kv, num_kv_heads, head_dim)
  const int32_t* kv_indptr = nullptr;  ///< (batch_size + 1) token offsets
  // paged K/V (paged == true)
  kernels::PagedKV<KV> paged{};  ///< pool + CSR page table
  bool paged_kv = false;         ///< which of the two the block reads
  // outputs
  T* o = nullptr;        ///< (nnz_qo, num_qo_heads, head_dim)
  float* lse = nullptr;  ///< (nnz_qo, num_qo_heads), natural log
  // the schedule plan() wrote: work item i is (request, query tile, kv chunk)
  const int32_t* request_indices = nullptr;   ///< (num_items)
  const int32_t* qo_tile_indices = nullptr;   ///< (num_items)
  const int32_t* kv_chunk_indices = nullptr;  ///< (num_items)
  int kv_chunk_size = 0;                      ///< keys per chunk (a multiple of Bc); 0: no split
  // split-KV partial states (kv_chunk_size > 0)
  const int32_t* partial_indptr = nullptr;  ///< (nnz_qo + 1): query row t's partial rows
  float* partial_o = nullptr;               ///< (partial rows, num_qo_heads, head_dim)
  float* partial_lse = nullptr;             ///< (partial rows, num_qo_heads), natural log
  // sizes and options
  int num_qo_heads = 0;     ///< Hq
  int num_kv_heads = 0;     ///< Hkv
  int group_size = 1;       ///< Hq / Hkv: packed rows per query token
  bool causal = false;      ///< bottom-right aligned causal mask
  int window_left = -1;     ///< keep keys j >= i + (kv_len - qo_len) - window_left; -1 off
  float score_scale = 0.f;  ///< multiplies q.k into base-2 logits: sm_scale * log2(e); 1 with a soft cap
  float cap_pre = 0.f;      ///< soft cap only: sm_scale / cap, applied before tanh
  float cap_post = 0.f;     ///< soft cap only: cap * log2(e), applied after tanh
  bool soft_cap = false;    ///< s -> cap * tanh(s / cap) before the softmax
  float v_scale = 1.f;      ///< the run's v_scale: multiplies the output (folded into 1 / l)

  /// The four fields above from the batch's sm_scale and logits_soft_cap: the free
  /// set_score_transform below.
  void set_score_transform(float sm_scale, float logits_soft_cap);
};

/// score_scale, cap_pre, cap_post and soft_cap of any kernel's parameters that carry
/// PrefillParams' four fields (stage 07's do too), from the batch's sm_scale and
/// logits_soft_cap (0: no cap). Without a cap the logits are q.k sm_scale log2(e); with
/// one, cap log2(e) tanh(q.k sm_scale / cap). For a cache with a k_scale pass sm_scale * k_scale:
/// q . (k * k_scale) = k_scale (q . k).
template <typename Params>
void set_score_transform(Params& p, float sm_scale, float logits_soft_cap) {
  p.soft_cap = logits_soft_cap > 0.f;
  p.score_scale = p.soft_cap ? 1.f : sm_scale * kernels::kLog2e;
  p.cap_pre = p.soft_cap ? sm_scale / logits_soft_cap : 0.f;
  p.cap_post = p.soft_cap ? logits_soft_cap * kernels::kLog2e : 0.f;
}

template <typename T, typename KV>
void PrefillParams<T, KV>::set_score_transform(float sm_scale, float logits_soft_cap) {
  tensor_core::set_score_transform(*this, sm_scale, logits_soft_cap);
}

/// What one block works on, decoded from its work item.
struct BlockTask {
  int request;    ///< the request of this block's work item
  int qo_begin;   ///< the request's first query row in q
  int qo_len;     ///< the request's query rows
  int kv_len;     ///< the request's keys
  int row_begin;  ///< first packed row of the tile within the request
  int rows;       ///< packed rows of the tile: [row_begin, row_begin + rows)
  int kv_begin;   ///< first key this block visits (after skipping masked tiles)
  int kv_end;     ///< one past the last key this block visits
  int chunk_end;  ///< keys past this belong to another chunk (or do not exist)
  int num_tiles;  ///< Bc-tiles in [kv_begin, kv_end)
  int chunk;      ///< kv chunk index (split-KV), 0 without a split
  int kv_first;   ///< ragged: the request's first row of k/v; paged: its first entry of kv_indices
};

/// The request, query tile and key range of this block; tiles that the causal mask or the
/// window hide from every row of the tile are cut off here and never loaded.
template <int Br, int Bc, typename T, typename KV>
__device__ __forceinline__ BlockTask make_task(const PrefillParams<T, KV>& p, int item) {
  BlockTask t;
  t.request = p.request_indices[item];
  t.chunk = p.kv_chunk_indices[item];
  t.qo_begin = p.qo_indptr[t.request];
  t.qo_len = p.qo_indptr[t.request + 1] - t.qo_begin;
  t.kv_first = p.paged_kv ? p.paged.kv_indptr[t.request] : p.kv_indptr[t.request];
  t.kv_len = p.paged_kv ? p.paged.kv_len(t.request) : p.kv_indptr[t.request + 1] - t.kv_first;
  const int total_rows = t.qo_len * p.group_size;
  t.row_begin = p.qo_tile_indices[item] * Br;
  t.rows = min(Br, total_rows - t.row_begin);
  const int chunk_begin = p.kv_chunk_size ? t.chunk * p.kv_chunk_size : 0;
  t.chunk_end = p.kv_chunk_size ? min(t.kv_len, chunk_begin + p.kv_chunk_size) : t.kv_len;
  // Query token i sees keys up to i + delta (causal) and from i + delta - window_left.
  const int delta = t.kv_len - t.qo_len;
  const int first_token = t.row_begin / p.group_size;
  const int last_token = (t.row_begin + t.rows - 1) / p.group_size;
  t.kv_begin = chunk_begin;
  t.kv_end = t.chunk_end;
  if (p.causal) t.kv_end = min(t.kv_end, last_token + delta + 1);
  if (p.window_left >= 0) t.kv_begin = max(t.kv_begin, first_token + delta - p.window_left);
  t.num_tiles = t.kv_end > t.kv_begin ? (t.kv_end - t.kv_begin + Bc - 1) / Bc : 0;
  return t;
}

/// Copies this block's query rows into the swizzled Q tile; rows past the request are
/// zero-filled (they compute garbage that is never stored).
template <typename T, int HEAD_DIM, int Br, int kThreads, typename KV>
__device__ __forceinline__ void load_q_tile(const PrefillParams<T, KV>& p, const BlockTask& t, int kv_head, T* q_smem) {
  constexpr int kChunks = HEAD_DIM / 8, kRowsPerPass = kThreads / kChunks;
  const int chunk = threadIdx.x % kChunks;
#pragma unroll
  for (int pass = 0; pass < Br / kRowsPerPass; ++pass) {
    const int r = threadIdx.x / kChunks + pass * kRowsPerPass;
    const bool valid = r < t.rows;
    const int packed = t.row_begin + (valid ? r : 0);
    const int token = packed / p.group_size, head = kv_head * p.group_size + packed % p.group_size;
    const T* src = p.q + (int64_t{t.qo_begin + token} * p.num_qo_heads + head) * HEAD_DIM + chunk * 8;
    kernels::cp_async_16(q_smem + kernels::swizzled_offset(r, chunk, HEAD_DIM), src, valid);
  }
}

/// Paged K/V: the page-table walk of the tile starting at key kv0, one key row per thread
/// (threads 0 .. Bc-1): the pool offset of the row's K (its V is stride_kv further), or -1
/// past kv_end, into `row_offsets` (Bc entries in shared memory). Called one tile ahead of
/// load_kv_tile, so the dependent read of the page id is in flight while the block
/// computes. In shared memory rather than registers: a thread copies rows of four pages,
/// and holding their ids (and their slots' arithmetic) across a tile of compute made ptxas
/// spill at head_dim 128 (148 bytes a thread, now 76, as the ragged path); decode over
/// pages got 6% faster on an H200 (the chapter, "Paged K/V on an H200").
template <int Bc, typename T, typename KV>
__device__ __forceinline__ void fetch_row_offsets(const PrefillParams<T, KV>& p, const BlockTask& t, int kv_head,
                                                  int kv0, int64_t* row_offsets) {
  for (int r = threadIdx.x; r < Bc; r += blockDim.x) {
    const int j = kv0 + r;
    int64_t off = -1;
    if (j < t.kv_end) {
      uint32_t page_iter, slot;
      p.paged.page_size.divmod(static_cast<uint32_t>(j), page_iter, slot);
      off = p.paged.offset(p.paged.kv_indices[t.kv_first + page_iter], slot, kv_head);
    }
    row_offsets[r] = off;
  }
}

/// Starts the copies of keys [kv0, kv0 + Bc) of this block into one K tile and one V tile
/// (each copy where the format places it: Format::chunk_offset); keys at or past kv_end are
/// zero-filled, so no NaN of an unowned slot can reach P V. Ragged: one pointer per
/// thread, advanced by a fixed stride per pass. Paged: each row's offset in the pool was
/// read ahead by fetch_row_offsets into `row_offsets` (-1: past the end).
template <typename Format, typename T, int HEAD_DIM, int Bc, int kThreads, typename KV>
__device__ __forceinline__ void load_kv_tile(const PrefillParams<T, KV>& p, const BlockTask& t, int kv_head, int kv0,
                                             const int64_t* row_offsets, KV* k_smem, KV* v_smem) {
  constexpr int kVec = 16 / sizeof(KV), kChunks = HEAD_DIM / kVec, kRowsPerPass = kThreads / kChunks;
  const int r0 = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  // kRowsPerPass is a multiple of 8, so every pass has the same swizzle phase.
  const uint32_t dst0 = Format::template chunk_offset<HEAD_DIM>(r0, chunk);
  if (!p.paged_kv) {
    const int64_t stride = int64_t{kRowsPerPass} * p.num_kv_heads * HEAD_DIM;
    const int64_t off0 = (int64_t{t.kv_first + kv0 + r0} * p.num_kv_heads + kv_head) * HEAD_DIM + chunk * kVec;
#pragma unroll
    for (int pass = 0; pass < Bc / kRowsPerPass; ++pass) {
      const bool valid = kv0 + r0 + pass * kRowsPerPass < t.kv_end;
      const int64_t off = valid ? off0 + pass * stride : 0;
      kernels::cp_async_16(k_smem + dst0 + pass * kRowsPerPass * HEAD_DIM, p.k + off, valid);
      kernels::cp_async_16(v_smem + dst0 + pass * kRowsPerPass * HEAD_DIM, p.v + off, valid);
    }
  } else {
#pragma unroll
    for (int pass = 0; pass < Bc / kRowsPerPass; ++pass) {
      const int64_t row = row_offsets[r0 + pass * kRowsPerPass];
      const bool valid = row >= 0;
      const int64_t off = valid ? row + chunk * kVec : 0;
      kernels::cp_async_16(k_smem + dst0 + pass * kRowsPerPass * HEAD_DIM, p.paged.pool + off, valid);
      kernels::cp_async_16(v_smem + dst0 + pass * kRowsPerPass * HEAD_DIM, p.paged.pool + off + p.paged.stride_kv,
                           valid);
    }
  }
}

/// S = Q_w K^T for this warp's 16 rows: s[n] is the C fragment of keys 8 n.. of the
/// tile. A from the Q tile, B from the K tile, both by ldmatrix.
template <typename T, int HEAD_DIM, int kTilesS>
__device__ __forceinline__ void compute_qk(const T* q_smem, const T* k_smem, int warp_row0, float (&s)[kTilesS][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll
  for (int kd = 0; kd < HEAD_DIM / 16; ++kd) {
    // A: lanes 0-15 address rows 0-15 at dims 16 kd.., lanes 16-31 the same rows at +8.
    uint32_t a[4];
    const int row = warp_row0 + lane % 16;
    kernels::ldmatrix_x4(a, kernels::smem_u32(q_smem + kernels::swizzled_offset(row, kd * 2 + lane / 16, HEAD_DIM)));
    // B: two n-tiles at once; matrices (keys 0-7, dims lo), (0-7, hi), (8-15, lo), (8-15, hi).
#pragma unroll
    for (int n2 = 0; n2 < kTilesS / 2; ++n2) {
      const int key = n2 * 16 + (lane / 16) * 8 + lane % 8;
      uint32_t b[4];
      kernels::ldmatrix_x4(
          b, kernels::smem_u32(k_smem + kernels::swizzled_offset(key, kd * 2 + (lane / 8) % 2, HEAD_DIM)));
      kernels::mma_m16n8k16<T>(s[2 * n2], a, b[0], b[1]);
      kernels::mma_m16n8k16<T>(s[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

/// The soft cap, when on (scores become base-2 logits, and score_scale is 1), and -inf
/// where the mask hides the key. `mask` is false on tiles where every key is visible to
/// every row of the block (the causal interior): then no comparisons at all. Without a
/// cap the scale is left to update_softmax, which folds it into one FFMA per score.
template <typename T, int kTilesS, typename KV>
__device__ __forceinline__ void logits_and_mask(const PrefillParams<T, KV>& p, float (&s)[kTilesS][4], bool mask,
                                                int kv0, int kv_end, const int (&q_pos)[2]) {
  // Two uniform branches around whole loops (not one per score): the common tile, no cap
  // and no mask, runs no code here at all.
  if (p.soft_cap) {
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = tanhf(s[n][e] * p.cap_pre) * p.cap_post;
  }
  if (!mask) return;
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int n = 0; n < kTilesS; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // c0, c1: row g; c2, c3: row g + 8 (the fragment layout of mma.cuh).
      const int j = kv0 + n * 8 + 2 * t4 + (e & 1), i = q_pos[e >> 1];
      const bool visible = j < kv_end && (!p.causal || j <= i) && (p.window_left < 0 || j >= i - p.window_left);
      if (!visible) s[n][e] = -INFINITY;
    }
}

/// 2^x by the special-function unit alone (ex2.approx.ftz: no range fix-up for
/// denormal results, which only ever multiply probabilities below 2^-126).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The online softmax on this warp's fragments: each thread holds two rows per m-tile
/// (g and g + 8), each spread over the 4 lanes of its group, so a row max is the thread's
/// max and two shuffles. m is kept in score units (a positive scale keeps the order);
/// P = 2^(c s - c m) is one FFMA and one ex2 per score (c = score_scale) and overwrites
/// s; o and the thread's partial l are rescaled by 2^(c (m_old - m_new)). l stays per
/// thread until the end (sums commute).
template <int kTilesS, int kTilesO>
__device__ __forceinline__ void update_softmax(float (&s)[kTilesS][4], float c, float (&m)[2], float (&l)[2],
                                               float (&o)[kTilesO][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float row_max = m[h];
#pragma unroll
    for (int n = 0; n < kTilesS; ++n) row_max = fmaxf(row_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
    row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
    // A row that has seen only masked keys keeps m = -inf; subtract 0 then, never -inf.
    const float m_safe = row_max == -INFINITY ? 0.f : row_max;
    const float scale = exp2_approx((m[h] - m_safe) * c);
    const float cm = c * m_safe;
    m[h] = row_max;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        s[n][e] = exp2_approx(fmaf(s[n][e], c, -cm));
        sum += s[n][e];
      }
    l[h] = l[h] * scale + sum;
#pragma unroll
    for (int n = 0; n < kTilesO; ++n) {
      o[n][2 * h] *= scale;
      o[n][2 * h + 1] *= scale;
    }
  }
}

/// O += P V: the C fragments of S n-tiles 2k and 2k + 1 are, packed to 16 bits, the A
/// fragment of keys 16k..16k+15 (see mma.cuh), so P goes from registers to the tensor
/// cores directly. V (row-major [key][dim]) is read transposed by ldmatrix.trans.
template <typename T, int HEAD_DIM, int kTilesS, int kTilesO>
__device__ __forceinline__ void compute_pv(const float (&s)[kTilesS][4], const T* v_smem, float (&o)[kTilesO][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < kTilesS / 2; ++kk) {
    uint32_t a[4];
    a[0] = kernels::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = kernels::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = kernels::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = kernels::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    // B: matrices (keys 0-7, dims lo), (keys 8-15, dims lo), (0-7, hi), (8-15, hi).
    const int key = kk * 16 + (lane / 8) % 2 * 8 + lane % 8;
#pragma unroll
    for (int d2 = 0; d2 < kTilesO / 2; ++d2) {
      uint32_t b[4];
      kernels::ldmatrix_x4_trans(
          b, kernels::smem_u32(v_smem + kernels::swizzled_offset(key, d2 * 2 + lane / 16, HEAD_DIM)));
      kernels::mma_m16n8k16<T>(o[2 * d2], a, b[0], b[1]);
      kernels::mma_m16n8k16<T>(o[2 * d2 + 1], a, b[2], b[3]);
    }
  }
}

/// Two fp32 values to global memory as two T (one 4-byte store).
template <typename T>
__device__ __forceinline__ void store2(T* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = kernels::pack2<T>(a, b);
}

/// Finishes the rows: l summed over the row's 4 lanes, the policy's on_state on (m, l),
/// o / l, lse = (m + log2 l) ln 2 (a row that saw no key: o = 0, lse = -inf), written to o
/// and lse, or, when the KV was split, to this chunk's partial row in fp32 for the merge
/// kernel.
template <typename Policy, typename T, int HEAD_DIM, int kTilesO, typename KV>
__device__ __forceinline__ void store_output(const PrefillParams<T, KV>& p, const typename Policy::Params& pol,
                                             const BlockTask& t, int kv_head, int warp_row0, const float (&m)[2],
                                             float (&l)[2], const float (&o)[kTilesO][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int r = warp_row0 + g + 8 * h;
    if (r >= t.rows) continue;
    const int packed = t.row_begin + r;
    const int token = t.qo_begin + packed / p.group_size;
    const int head = kv_head * p.group_size + packed % p.group_size;
    // The row's base-2 max (m is kept in score units), through the policy with l: e.g. a
    // sink's term, added by the chunk that starts at key 0 only.
    float m2 = sum > 0.f ? m[h] * p.score_scale : -INFINITY;
    const float factor = Policy::on_state(pol, m2, sum, head, p.kv_chunk_size * t.chunk);
    const float inv = sum > 0.f ? p.v_scale * factor / sum : 0.f;  // v_scale 1 gives exactly 1 / sum
    const float lse = sum > 0.f ? (m2 + log2f(sum)) * kernels::kLn2 : -INFINITY;
    if (p.kv_chunk_size == 0) {
      T* dst = p.o + (int64_t{token} * p.num_qo_heads + head) * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < kTilesO; ++n) store2<T>(dst + n * 8 + 2 * t4, o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      if (t4 == 0) p.lse[int64_t{token} * p.num_qo_heads + head] = lse;
    } else {
      const int64_t row = int64_t{p.partial_indptr[token] + t.chunk} * p.num_qo_heads + head;
      float* dst = p.partial_o + row * HEAD_DIM;
#pragma unroll
      for (int n = 0; n < kTilesO; ++n)
        *reinterpret_cast<float2*>(dst + n * 8 + 2 * t4) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      if (t4 == 0) p.partial_lse[row] = lse;
    }
  }
}

/// One block = one work item (request, query tile, kv chunk) for one kv head.
/// grid = num_items * num_kv_heads (item-major, so plan()'s longest-first order holds
/// across heads), PrefillTraits::kThreads threads, PrefillTraits::smem_bytes() of
/// dynamic shared memory:
///
///     smem  [ Q tile: Br x D ][ K_0 | V_0 ][ K_1 | V_1 ][ the format's staging ]
///
/// each tile row-major and swizzled (SameAsQ; another format places its copies itself).
///
/// \tparam T __half or __nv_bfloat16
/// \tparam HEAD_DIM 64, 128 or 256
/// \tparam Format how a pool element reaches the MMAs (SameAsQ: K/V in q's dtype)
/// \tparam Policy called at the hooks on_q_tile, on_k_tile and on_state; `pol` its parameters
template <typename T, int HEAD_DIM, typename Format = SameAsQ<T>, typename Policy = kernels::IdentityPolicy>
__global__ void __launch_bounds__(PrefillTraits<T, HEAD_DIM, Format>::kThreads,
                                  PrefillTraits<T, HEAD_DIM, Format>::kMinBlocksPerSM)
    prefill_attention_kernel(const PrefillParams<T, typename Format::Stored> p, const typename Policy::Params pol);

/// The body of prefill_attention_kernel for its block `block` (blockIdx.x there), over
/// `smem_raw`, PrefillTraits::smem_bytes() of dynamic shared memory: for a later stage's
/// kernel whose blocks run several kinds of work (stage 09's POD attention).
template <typename T, int HEAD_DIM, typename Format = SameAsQ<T>, typename Policy = kernels::IdentityPolicy>
__device__ __forceinline__ void prefill_attention_block(const PrefillParams<T, typename Format::Stored>& p,
                                                        unsigned block, unsigned char* smem_raw,
                                                        const typename Policy::Params& pol = {}) {
  using Tr = PrefillTraits<T, HEAD_DIM, Format>;
  using KV = typename Format::Stored;
  static_assert(!Policy::kTouchesTiles || Format::kTilesInQDtype, "a policy that writes the tiles: K/V in q's dtype");
  constexpr int Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages;
  T* q_smem = reinterpret_cast<T*>(smem_raw);
  KV* kv_smem = reinterpret_cast<KV*>(q_smem + Br * HEAD_DIM);  // stage s: K at 2 s Bc D, V at (2 s + 1) Bc D
  T* staging = reinterpret_cast<T*>(kv_smem + 2 * kStages * Bc * HEAD_DIM);  // the format's, if it has any

  const int item = block / p.num_kv_heads, kv_head = block % p.num_kv_heads;
  // A plan for CUDA graphs pads the grid to a size fixed by batch_size and nnz_qo: the
  // padding items name no request.
  if (p.request_indices[item] < 0) return;
  const BlockTask t = make_task<Br, Bc>(p, item);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row0 = warp * 16;

  // Position (i + kv_len - qo_len) of each of this thread's rows, for the mask.
  int q_pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    q_pos[h] = (t.row_begin + warp_row0 + lane / 4 + 8 * h) / p.group_size + t.kv_len - t.qo_len;
  const int first_pos = t.row_begin / p.group_size + t.kv_len - t.qo_len;
  const int last_pos = (t.row_begin + t.rows - 1) / p.group_size + t.kv_len - t.qo_len;

  float o[Tr::kTilesO][4];
  float m[2], l[2];
#pragma unroll
  for (int n = 0; n < Tr::kTilesO; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.f;

  // ---- prologue: Q and K/V tiles 0 .. kStages - 2 in flight; the pages of the next tile
  // read ahead.
  // paged: tile i's row offsets in buffer i % 2, written a barrier before they are read
  int64_t* const row_offsets = reinterpret_cast<int64_t*>(smem_raw + Tr::tiles_bytes());
  int64_t* const offsets_of[2] = {row_offsets, row_offsets + Bc};
  load_q_tile<T, HEAD_DIM, Br, Tr::kThreads>(p, t, kv_head, q_smem);
  if (p.paged_kv) {
    fetch_row_offsets<Bc>(p, t, kv_head, t.kv_begin, offsets_of[0]);
    __syncthreads();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < t.num_tiles) {
      KV* k_dst = kv_smem + 2 * s * Bc * HEAD_DIM;
      load_kv_tile<Format, T, HEAD_DIM, Bc, Tr::kThreads>(p, t, kv_head, t.kv_begin + s * Bc, offsets_of[s % 2], k_dst,
                                                          k_dst + Bc * HEAD_DIM);
    }
    kernels::cp_async_commit_group();  // one group per tile, empty or not: the counts stay aligned
    if (p.paged_kv) {
      fetch_row_offsets<Bc>(p, t, kv_head, t.kv_begin + (s + 1) * Bc, offsets_of[(s + 1) % 2]);
      if (s + 1 < kStages - 1) __syncthreads();  // read by the prologue's next load
    }
  }

  // ---- main loop: wait for tile it, start tile it + kStages - 1 (and the page reads of
  // the one after), compute tile it.
  for (int it = 0; it < t.num_tiles; ++it) {
    kernels::cp_async_wait_group<kStages - 2>();
    __syncthreads();  // tile it visible to all; every warp is done with tile it - 1's buffer
    const int next = it + kStages - 1;
    if (next < t.num_tiles) {
      KV* k_next = kv_smem + 2 * (next % kStages) * Bc * HEAD_DIM;
      load_kv_tile<Format, T, HEAD_DIM, Bc, Tr::kThreads>(p, t, kv_head, t.kv_begin + next * Bc, offsets_of[next % 2],
                                                          k_next, k_next + Bc * HEAD_DIM);
    }
    kernels::cp_async_commit_group();
    // into the other buffer, whose last reader (the load of tile next - 1) ran before the barrier
    if (p.paged_kv && next + 1 < t.num_tiles)
      fetch_row_offsets<Bc>(p, t, kv_head, t.kv_begin + (next + 1) * Bc, offsets_of[(next + 1) % 2]);

    const int stage = it % kStages;
    const T* k_smem = Format::template landed<HEAD_DIM, Bc, Tr::kThreads>(kv_smem + 2 * stage * Bc * HEAD_DIM, staging);
    const T* v_smem = k_smem + Bc * HEAD_DIM;
    const int kv0 = t.kv_begin + it * Bc;
    if constexpr (Policy::kTouchesTiles) {
      // The policy on the landed K tile (keys kv0..) and, with the first, on the Q tile
      // (e.g. rotated in place, RoPE); then wait for all of it.
      if (it == 0)
        Policy::template on_q_tile<kernels::SwizzledTile, T, HEAD_DIM, Tr::kThreads>(
            pol, q_smem, Br, threadIdx.x, kernels::PackedRows{t.row_begin, p.group_size, t.kv_len - t.qo_len});
      Policy::template on_k_tile<kernels::SwizzledTile, KV, HEAD_DIM, Bc, Tr::kThreads>(
          pol, kv_smem + 2 * stage * Bc * HEAD_DIM, threadIdx.x, kv0);
      __syncthreads();
    }
    // Masks only where some (row, key) of the tile is hidden: the tile runs past the
    // chunk, crosses the causal diagonal, or reaches below the window.
    const bool mask = kv0 + Bc > t.kv_end || (p.causal && kv0 + Bc - 1 > first_pos) ||
                      (p.window_left >= 0 && kv0 < last_pos - p.window_left);

    // A warp whose rows are all past the tile's end (decode: group 32 fills 32 of the
    // 128 rows) only helps load.
    if (warp_row0 >= t.rows) continue;
    float s[Tr::kTilesS][4];
    compute_qk<T, HEAD_DIM, Tr::kTilesS>(q_smem, k_smem, warp_row0, s);
    logits_and_mask<T, Tr::kTilesS>(p, s, mask, kv0, t.kv_end, q_pos);
    update_softmax<Tr::kTilesS, Tr::kTilesO>(s, p.score_scale, m, l, o);
    compute_pv<T, HEAD_DIM, Tr::kTilesS, Tr::kTilesO>(s, v_smem, o);
  }
  kernels::cp_async_wait_group<0>();  // no copy may outlive the block (a block with no tiles)

  store_output<Policy, T, HEAD_DIM, Tr::kTilesO>(p, pol, t, kv_head, warp_row0, m, l, o);
}

template <typename T, int HEAD_DIM, typename Format, typename Policy>
__global__ void __launch_bounds__(PrefillTraits<T, HEAD_DIM, Format>::kThreads,
                                  PrefillTraits<T, HEAD_DIM, Format>::kMinBlocksPerSM)
    prefill_attention_kernel(const PrefillParams<T, typename Format::Stored> p, const typename Policy::Params pol) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  prefill_attention_block<T, HEAD_DIM, Format, Policy>(p, blockIdx.x, smem_raw, pol);
}

/// For a later stage that builds its own PrefillParams (stage 05 runs this kernel once per
/// cascade level, into its own partial rows): allows the instantiation for `head_dim` its
/// dynamic shared memory. Call once before launches (in plan(): not a stream operation).
/// Returns how many of its blocks fit on one multiprocessor (the occupancy calculator's
/// answer). Defined (prefill_launch.cuh) in tensor_core.cu for the lesson's format,
/// tensor_core_policies.cu under the features' policies and stages/fp8/prefill_fp8.cu for
/// an FP8 cache.
template <typename T, typename Format = SameAsQ<T>, typename Policy = kernels::IdentityPolicy>
int prepare_prefill_attention(int head_dim);
/// Launches prefill_attention_kernel for head_dim with `p` on `stream`: num_items x
/// p.num_kv_heads blocks, PrefillTraits::smem_bytes() of shared memory. Launches only
/// (CUDA-graph safe); p's schedule arrays must hold num_items entries.
template <typename T, typename Format = SameAsQ<T>, typename Policy = kernels::IdentityPolicy>
void launch_prefill_attention(const PrefillParams<T, typename Format::Stored>& p, int head_dim, int64_t num_items,
                              cudaStream_t stream, const typename Policy::Params& pol = {});

}  // namespace flashstep::stages::tensor_core
