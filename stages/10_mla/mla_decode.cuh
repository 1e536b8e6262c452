/// \file mla_decode.cuh
/// \brief MLA decode and append, absorbed form, on mma.sync (sm_80+): the heads of a
/// request packed into the rows of one tensor-core tile, all reading the same latents.
///
/// In GQA decode a key is read by a handful of query heads, so decode is a matrix-vector
/// product and the memory decides its speed. In MLA every head of a request reads the same
/// latent c_j (512 wide) and rotary key k_pe_j (64 wide), so with 128 heads a tile of keys
/// meets 128 query rows: a matrix-matrix product, about 2 x 128 x (576 + 512) flops for
/// 1152 bytes of cache, which puts decode on the tensor cores' side of the roofline.
///
///     S (rows x keys) = [q_nope q_pe] (rows x 576) . [c k_pe]^T (576 x keys)   the scores
///     O (rows x 512) += softmax(S) (rows x keys) . c (keys x 512)              the output
///
/// A row is a (query token, head) pair of one request: row = token * num_heads + head, as
/// stage 04 packs a GQA group. One block takes one work item: a tile of kRows rows of one
/// request and one chunk of its keys (the whole request unless plan() split it).
///
/// **The block.** kRowGroups x kColSplit warps. Warp (rg, cs) owns rows 16 rg .. 16 rg + 15
/// and:
///   - for S, keys cs * (32 / kColSplit) .. of each 32-key tile, over all 576 dims;
///   - for O, latent columns cs * (512 / kColSplit) .. (an fp32 accumulator of 16 x 512
///     would be 256 registers a thread: no warp can hold a whole row of O).
/// So a row's softmax is spread over kColSplit warps: each finds the maximum of its keys,
/// the maxima meet in shared memory, every warp of the row takes the same new maximum,
/// and each writes its probabilities P into shared memory, where every warp of the row
/// reads all 32 keys' P for its own columns of O. Two configurations are built:
///
///     rows  warps (rg x cs)  S keys a warp  O columns a warp  shared memory
///      64    8 (4 x 2)          16               256           150 KB: sm_80, sm_90
///      16    4 (1 x 4)           8               128            92 KB: every sm_80+ GPU
///
/// **Shared memory.** Q (kRows x 576, loaded once per work item), two 32-key tiles of the
/// cache (each key row: c then k_pe, 1152 bytes) filled by cp.async while the other is
/// read, P (kRows x 32, rows padded to 40 elements: 80-byte rows put ldmatrix's 8 row
/// reads in 8 different bank groups), and one float per (warp column, row) for the
/// maxima, then the row sums. Q and the cache tiles are swizzled (kernels/mma.cuh). Key
/// rows past the chunk are zero-filled by the copy (P is 0 there; 0 x garbage could be
/// NaN). A warp copies 4 key rows at a time, 8 lanes a row, so each instruction reads
/// whole 128-byte lines; a thread resolves kPasses page ids a tile, read a tile ahead.
///
/// **A tile, three barriers.** (1) the tile landed and every warp is done with the
/// previous one (its buffer is refilled next); (2) the row maxima are in shared memory;
/// (3) P is. Between (1) and (2) S = Q K^T; between (2) and (3) the online softmax
/// (kernels/state.cuh's rescaling, in the exp2 domain); after (3) O += P V.
///
/// **Split keys.** When the batch has too few tiles to fill the GPU (batch 1, 128 heads:
/// two tiles), plan() cuts each request's keys into chunks; a block then writes its rows'
/// normalized partial output and lse in fp32, and stage 03's merge_states_kernel folds a
/// token's chunks, the same exact merge as everywhere in the course.
///
/// What is still slow (the chapter has the numbers): Q is re-read from shared memory for
/// every 32-key tile (the registers cannot hold 576 columns of it), 106 ldmatrix.x4 for 136
/// mma.sync a warp and tile, counted from the code. Stage 07's wgmma reads
/// both operands from shared memory without the trip through registers: the Hopper form
/// of this kernel is the next step.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "flashstep/kernels/cp_async.cuh"
#include "10_mla/mla.hpp"
#include "flashstep/kernels/mma.cuh"

namespace flashstep::stages::mla {

/// Latent and rotary widths of the kernel, and their sum: one key row of the tile.
constexpr int kCkv = 512, kKpe = 64, kRowElems = kCkv + kKpe;
/// 16-byte chunks of a key (or query) row: 64 of c, then 8 of k_pe.
constexpr int kRowChunks = kRowElems / 8, kCkvChunks = kCkv / 8;
/// Keys of a cache tile.
constexpr int kTileKeys = 32;
/// Row stride of P in shared memory, in elements (32 keys + 8 of padding).
constexpr int kPStride = kTileKeys + 8;

/// Arguments of mla_decode_kernel; raw pointers and sizes only.
template <typename T>
struct MlaParams {
  const T* q_nope = nullptr;            ///< (nnz_qo, num_heads, 512)
  const T* q_pe = nullptr;              ///< (nnz_qo, num_heads, 64)
  const T* ckv = nullptr;               ///< (num_pages, page_size, 512)
  const T* kpe = nullptr;               ///< (num_pages, page_size, 64)
  const int32_t* kv_indices = nullptr;  ///< page ids
  T* o = nullptr;                       ///< (nnz_qo, num_heads, 512)
  float* lse = nullptr;                 ///< (nnz_qo, num_heads), natural log; may be null
  float* partial_o = nullptr;           ///< split: (slots, num_heads, 512) fp32, normalized
  float* partial_lse = nullptr;         ///< split: (slots, num_heads), natural log
  const MlaWorkItem* items = nullptr;   ///< one per block
  int num_heads = 0;
  int page_size = 0;
  bool causal = false;
  float scale_log2 = 0.f;  ///< sm_scale * log2(e): the scores go straight to exp2
};

/// The sizes that follow from a configuration (kRowGroups x kColSplit warps).
template <int kRowGroups, int kColSplit>
struct MlaTile {
  static constexpr int kRowGroupsOf = kRowGroups, kColSplitOf = kColSplit;
  static constexpr int kWarps = kRowGroups * kColSplit;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16 * kRowGroups;               ///< packed rows of the tile
  static constexpr int kKeysPerWarp = kTileKeys / kColSplit;  ///< S columns of a warp
  static constexpr int kScoreTiles = kKeysPerWarp / 8;        ///< n8 tiles of S a warp
  static constexpr int kCols = kCkv / kColSplit;              ///< O columns of a warp
  static constexpr int kOutTiles = kCols / 8;                 ///< n8 tiles of O a warp
  static constexpr int kRowsPerPass = kThreads / 8;           ///< key rows one copy pass covers (8 lanes a row)
  static constexpr int kPasses = kTileKeys / kRowsPerPass;    ///< copy passes over a tile's keys
  static constexpr int kQElems = kRows * kRowElems;
  static constexpr int kKvElems = kTileKeys * kRowElems;
  static constexpr int kPElems = kRows * kPStride;
  static_assert(kScoreTiles == 1 || kScoreTiles == 2, "a warp's S is 8 or 16 keys wide");
  static_assert(kTileKeys % kRowsPerPass == 0, "whole copy passes over a tile's keys");
  /// Dynamic shared memory of a block, for 16-bit elements.
  static constexpr size_t smem_bytes() {
    return size_t(kQElems + 2 * kKvElems + kPElems) * 2 + size_t(kColSplit) * kRows * sizeof(float);
  }
};

/// The 64-row configuration (8 warps) and the 16-row one (4 warps).
using MlaWideTile = MlaTile<4, 2>;
using MlaNarrowTile = MlaTile<1, 4>;

/// One work item: S = Q K^T, online softmax and O += P V over the chunk's 32-key tiles,
/// then o and lse (or the partial state of a split). grid = (work items), block =
/// kThreads, dynamic shared memory MlaTile::smem_bytes().
template <typename T, int kRowGroups, int kColSplit>
__global__ void __launch_bounds__(32 * kRowGroups * kColSplit, 1) mla_decode_kernel(const MlaParams<T> p) {
  using Tile = MlaTile<kRowGroups, kColSplit>;
  using kernels::cp_async_16;
  using kernels::ldmatrix_x4;
  using kernels::ldmatrix_x4_trans;
  using kernels::mma_m16n8k16;
  using kernels::smem_u32;
  using kernels::swizzled_offset;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_kv = s_q + Tile::kQElems;  // two tiles
  T* s_p = s_kv + 2 * Tile::kKvElems;
  float* s_red = reinterpret_cast<float*>(s_p + Tile::kPElems);  // [kColSplit][kRows]

  const MlaWorkItem w = p.items[blockIdx.x];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int rg = warp % kRowGroups, cs = warp / kRowGroups;
  const int g = lane / 4, t4 = lane % 4;  // fragment row group and place (kernels/mma.cuh)
  const int heads = p.num_heads, request_rows = w.qo_len * heads;

  // ---- Q: the tile's rows, loaded once (in the first copy group, with key tile 0)
  for (int idx = tid; idx < Tile::kRows * kRowChunks; idx += Tile::kThreads) {
    const int row = idx / kRowChunks, chunk = idx % kRowChunks, r = w.row_begin + row;
    const bool valid = r < request_rows;
    const int64_t q_row = valid ? int64_t(w.qo_start + r / heads) * heads + r % heads : 0;
    const T* src = chunk < kCkvChunks ? p.q_nope + q_row * kCkv + chunk * 8
                                      : p.q_pe + q_row * kKpe + (chunk - kCkvChunks) * 8;
    cp_async_16(s_q + swizzled_offset(row, chunk, kRowElems), src, valid);
  }

  // ---- the cache tiles: a warp's copy instruction takes 4 key rows x 8 lanes, 128
  // contiguous bytes of each row (whole cache lines); thread t copies the 16-byte chunks
  // t % 8 + 8 b of keys key0 + kRowsPerPass i
  const int num_tiles = (w.kv_end - w.kv_begin + kTileKeys - 1) / kTileKeys;
  const int lane8 = tid % 8, key0 = tid / 8;
  // The pool rows (page * page_size + slot) of this thread's keys in `tile`; -1 past the chunk.
  auto pool_rows = [&](int tile, int64_t(&rows)[Tile::kPasses]) {
#pragma unroll
    for (int i = 0; i < Tile::kPasses; ++i) {
      const int j = w.kv_begin + tile * kTileKeys + key0 + Tile::kRowsPerPass * i;
      rows[i] = tile >= num_tiles || j >= w.kv_end
                    ? -1
                    : int64_t(p.kv_indices[w.page_begin + j / p.page_size]) * p.page_size + j % p.page_size;
    }
  };
  auto load_tile = [&](const int64_t(&rows)[Tile::kPasses], int buffer) {
    T* dst = s_kv + buffer * Tile::kKvElems;
#pragma unroll
    for (int i = 0; i < Tile::kPasses; ++i) {
      const int key = key0 + Tile::kRowsPerPass * i;
      const bool valid = rows[i] >= 0;
      const T* ckv = p.ckv + (valid ? rows[i] : 0) * kCkv;
      const T* kpe = p.kpe + (valid ? rows[i] : 0) * kKpe;
#pragma unroll
      for (int b = 0; b < kCkvChunks / 8; ++b) {
        const int chunk = 8 * b + lane8;
        cp_async_16(dst + swizzled_offset(key, chunk, kRowElems), ckv + chunk * 8, valid);
      }
      cp_async_16(dst + swizzled_offset(key, kCkvChunks + lane8, kRowElems), kpe + lane8 * 8, valid);
    }
  };

  // ---- this thread's two rows (g and g + 8 of its warp's 16): the keys each may see
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + rg * 16 + g + 8 * h;
    int lim = w.kv_end;
    if (p.causal) lim = min(lim, r / heads + w.kv_len - w.qo_len + 1);
    limit[h] = r < request_rows ? lim : w.kv_begin;  // a padding row sees nothing
  }

  float o[Tile::kOutTiles][4];
#pragma unroll
  for (int n = 0; n < Tile::kOutTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  int64_t rows[Tile::kPasses];
  pool_rows(0, rows);
  load_tile(rows, 0);
  kernels::cp_async_commit_group();
  pool_rows(1, rows);

  for (int tile = 0; tile < num_tiles; ++tile) {
    kernels::cp_async_wait_group<0>();
    __syncthreads();  // (1) tile landed; every warp is past the previous tile
    if (tile + 1 < num_tiles) load_tile(rows, (tile + 1) & 1);
    kernels::cp_async_commit_group();
    pool_rows(tile + 2, rows);
    const T* kv = s_kv + (tile & 1) * Tile::kKvElems;

    // S = Q K^T for 16 rows x kKeysPerWarp keys, k-steps taken in pairs (32 dims)
    float s[Tile::kScoreTiles][4];
#pragma unroll
    for (int n = 0; n < Tile::kScoreTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const int m8 = lane / 8, r8 = lane % 8;  // ldmatrix: matrix and row this lane addresses
#pragma unroll 6
    for (int kp = 0; kp < kRowChunks / 2; kp += 2) {
      uint32_t a[2][4];
#pragma unroll
      for (int u = 0; u < 2; ++u)
        ldmatrix_x4(a[u],
                    smem_u32(s_q + swizzled_offset(rg * 16 + (m8 & 1) * 8 + r8, 2 * (kp + u) + (m8 >> 1), kRowElems)));
      if constexpr (Tile::kScoreTiles == 2) {  // 16 keys x 16 dims per x4
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          uint32_t b[4];
          ldmatrix_x4(b,
                      smem_u32(kv + swizzled_offset(cs * 16 + (m8 >> 1) * 8 + r8, 2 * (kp + u) + (m8 & 1), kRowElems)));
          mma_m16n8k16<T>(s[0], a[u], b[0], b[1]);
          mma_m16n8k16<T>(s[1], a[u], b[2], b[3]);
        }
      } else {  // 8 keys x 32 dims per x4: both k-steps of the pair
        uint32_t b[4];
        ldmatrix_x4(b, smem_u32(kv + swizzled_offset(cs * 8 + r8, 2 * kp + m8, kRowElems)));
        mma_m16n8k16<T>(s[0], a[0], b[0], b[1]);
        mma_m16n8k16<T>(s[0], a[1], b[2], b[3]);
      }
    }

    // scale into the exp2 domain, mask, and this warp's maxima of its two rows
    const int key0 = w.kv_begin + tile * kTileKeys + cs * Tile::kKeysPerWarp;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < Tile::kScoreTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, j = key0 + n * 8 + 2 * t4 + (e & 1);
        s[n][e] = j < limit[h] ? s[n][e] * p.scale_log2 : -INFINITY;
        mx[h] = fmaxf(mx[h], s[n][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (t4 == 0) s_red[cs * Tile::kRows + rg * 16 + g + 8 * h] = mx[h];
    }
    __syncthreads();  // (2) every warp's maxima are in shared memory

    // the online softmax. The running maximum moves only when the tile's is more than 8
    // (log2 units) above it, mla_hopper.cuh's rule (FlashAttention-4's): P is then at most
    // 2^8, l and O stay against the same maximum, and a warp rescales O only when one of
    // its rows moved. Every warp of a row sees the same maxima and takes the same decision.
    float alpha[2] = {1.f, 1.f}, m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m_tile = -INFINITY;
#pragma unroll
      for (int c = 0; c < kColSplit; ++c) m_tile = fmaxf(m_tile, s_red[c * Tile::kRows + rg * 16 + g + 8 * h]);
      if (m_tile > m_run[h] + 8.f) {          // -inf + 8 is -inf: the first finite maximum always enters
        alpha[h] = exp2f(m_run[h] - m_tile);  // from -inf: 0, and O and l are still 0
        m_run[h] = m_tile;
      }
      m_use[h] = m_run[h] == -INFINITY ? 0.f : m_run[h];  // a row with no key yet: exp2(-inf) = 0
      l_run[h] *= alpha[h];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int n = 0; n < Tile::kScoreTiles; ++n) {
        const float p0 = exp2f(s[n][2 * h] - m_use[h]), p1 = exp2f(s[n][2 * h + 1] - m_use[h]);
        l_run[h] += p0 + p1;
        *reinterpret_cast<uint32_t*>(s_p + (rg * 16 + g + 8 * h) * kPStride + cs * Tile::kKeysPerWarp + n * 8 +
                                     2 * t4) = kernels::pack2<T>(p0, p1);
      }
    __syncthreads();  // (3) P of all 32 keys is in shared memory

    // O += P V: 16 rows x kCols columns over the tile's 32 keys (two k-steps of 16)
#pragma unroll
    for (int ks = 0; ks < kTileKeys / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, smem_u32(s_p + (rg * 16 + (m8 & 1) * 8 + r8) * kPStride + ks * 16 + (m8 >> 1) * 8));
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; n += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, smem_u32(kv + swizzled_offset(ks * 16 + (m8 & 1) * 8 + r8,
                                                           (cs * Tile::kCols + n * 8) / 8 + (m8 >> 1), kRowElems)));
        mma_m16n8k16<T>(o[n], a, b[0], b[1]);
        mma_m16n8k16<T>(o[n + 1], a, b[2], b[3]);
      }
    }
  }
  kernels::cp_async_wait_group<0>();

  // ---- the row sums: this thread's keys, then its 4 lanes, then the kColSplit warps
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  __syncthreads();  // every warp is done reading the maxima (s_red is reused)
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (t4 == 0) s_red[cs * Tile::kRows + rg * 16 + g + 8 * h] = l_run[h];
  __syncthreads();

  // ---- o and lse (normalized), or the partial state of this chunk
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + rg * 16 + g + 8 * h;
    if (r >= request_rows) continue;
    float l = 0.f;
#pragma unroll
    for (int c = 0; c < kColSplit; ++c) l += s_red[c * Tile::kRows + rg * 16 + g + 8 * h];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    const int token = r / heads, head = r % heads;
    const int col0 = cs * Tile::kCols + 2 * t4;
    if (w.slot_base < 0) {
      const int64_t row = int64_t(w.qo_start + token) * heads + head;
      T* dst = p.o + row * kCkv + col0;
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; ++n)
        *reinterpret_cast<uint32_t*>(dst + n * 8) = kernels::pack2<T>(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      if (p.lse != nullptr && cs == 0 && t4 == 0) p.lse[row] = lse;
    } else {
      const int64_t row = int64_t(w.slot_base + token * w.num_chunks + w.chunk) * heads + head;
      float* dst = p.partial_o + row * kCkv + col0;
#pragma unroll
      for (int n = 0; n < Tile::kOutTiles; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
      if (cs == 0 && t4 == 0) p.partial_lse[row] = lse;
    }
  }
}

}  // namespace flashstep::stages::mla
