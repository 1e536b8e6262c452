/// \file mla_hopper.cuh
/// \brief MLA decode and append on Hopper (sm_90a): the 64-row tile of mla_decode.cuh with
/// its two products on wgmma, operands read by the tensor cores from shared memory.
///
/// What changed from mla_decode.cuh, and why it is faster (1.7x at 128 heads, the
/// chapter's table). There, every warp re-read its 16 query rows (576 columns) from shared
/// memory into registers with ldmatrix for every 32-key tile: 106 ldmatrix.x4 for 136
/// mma.sync a warp and tile. Here a warp group multiplies
/// straight from shared memory (stage 07's wgmma, descriptors and 128-byte swizzle), so Q
/// never travels through registers, and a tile is 64 keys:
///
///     warp group c (c = 0, 1): 64 rows, 128 threads
///       S_c = Q . K[32 c .. 32 c + 31]^T   wgmma m64n32k16 x 36 (576 dims), A and B in smem
///       online softmax of its 32 keys, the row maxima met through shared memory
///       P_c packed in registers as wgmma's A operand; the other group's P_c' read from
///       shared memory (thread t of one group holds exactly the rows and keys that thread
///       t of the other needs)
///       O_c += P . V[:, 256 c .. 256 c + 255]   wgmma m64n128k16 x 2 x 4, P from registers
///
/// The wgmma accumulator of a warp has the mma.sync fragment layout (16 rows a warp), so
/// the softmax code is mla_decode.cuh's. Shared memory: Q (72 KB), two 64-key tiles (72 KB
/// each: c in 8 column blocks of 64, then k_pe in one), the P exchange (8 KB) and the row
/// statistics: 227 KB with the alignment, all an SM has, so one block an SM. No producer warp group: every thread issues the
/// cp.async copies of the next tile before the products of this one, as in
/// mla_decode.cuh. The wide tile's work items, split and merge are unchanged.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "10_mla/mla_decode.cuh"

namespace flashstep::stages::mla {

/// Sizes of the Hopper tile.
struct MlaHopperTile {
  static constexpr int kThreads = 256;                             ///< two warp groups
  static constexpr int kRows = 64;                                 ///< packed rows (one wgmma M)
  static constexpr int kKeys = 64;                                 ///< keys of a cache tile
  static constexpr int kBlockElems = 64 * 64;                      ///< one 64-column block of 64 rows
  static constexpr int kTileElems = kRowChunks / 8 * kBlockElems;  ///< 9 column blocks: c, then k_pe
  static constexpr int kExchangeWords = 2 * 8 * 128;               ///< P: 8 registers a thread, both groups
  static constexpr size_t smem_bytes() {
    // + 1024: the base is aligned up to the swizzle atom by hand (the runtime promises 16 bytes)
    return 1024 + size_t(3 * kTileElems) * 2 + size_t(kExchangeWords) * 4 + size_t(2 * 2 * 128) * 4;
  }
};

namespace detail {

/// Element offset of (row, 16-byte chunk) in a tile of 64-column blocks of 64 rows, each
/// block in the 128-byte swizzle wgmma's descriptors read (stage 07's wgmma.cuh).
__device__ __forceinline__ int swizzled64(int row, int chunk) {
  return (chunk >> 3) * MlaHopperTile::kBlockElems + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

/// S (64 x 32, fp32) = A (64 x 16) B (16 x 32), both K-major in shared memory: wgmma
/// m64n32k16 (stage 07's wgmma.cuh has N = 64 and 128 only; inline PTX: no C++ API).
template <typename T>
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
        "%12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
  }
}

}  // namespace detail

/// The Hopper form of mla_decode_kernel: same parameters, work items and outputs.
/// grid = (work items), block = 256 threads, dynamic shared memory MlaHopperTile::smem_bytes().
template <typename T>
__global__ void __launch_bounds__(256, 1) mla_hopper_kernel(const MlaParams<T> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = MlaHopperTile;
  using hopper::smem_descriptor;
  using kernels::cp_async_16;
  extern __shared__ unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  T* s_kv = s_q + Tile::kTileElems;                                            // two tiles
  uint32_t* s_pex = reinterpret_cast<uint32_t*>(s_kv + 2 * Tile::kTileElems);  // [group][register][thread]
  float* s_red = reinterpret_cast<float*>(s_pex + Tile::kExchangeWords);       // [group][row half][thread]

  const MlaWorkItem w = p.items[blockIdx.x];
  const int tid = threadIdx.x, grp = tid / 128, t = tid % 128;
  const int warp = t / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int heads = p.num_heads, request_rows = w.qo_len * heads;

  // ---- Q (first copy group, with key tile 0)
  for (int idx = tid; idx < Tile::kRows * kRowChunks; idx += Tile::kThreads) {
    const int row = idx / kRowChunks, chunk = idx % kRowChunks, r = w.row_begin + row;
    const bool valid = r < request_rows;
    const int64_t q_row = valid ? int64_t(w.qo_start + r / heads) * heads + r % heads : 0;
    const T* src = chunk < kCkvChunks ? p.q_nope + q_row * kCkv + chunk * 8
                                      : p.q_pe + q_row * kKpe + (chunk - kCkvChunks) * 8;
    cp_async_16(s_q + detail::swizzled64(row, chunk), src, valid);
  }
  // ---- cache tiles: key row `key` copied by 4 threads, 18 chunks each
  const int num_tiles = (w.kv_end - w.kv_begin + Tile::kKeys - 1) / Tile::kKeys;
  const int key = tid / 4, sub = tid % 4;
  auto pool_row = [&](int tile) -> int64_t {
    const int j = w.kv_begin + tile * Tile::kKeys + key;
    if (tile >= num_tiles || j >= w.kv_end) return -1;
    return int64_t(p.kv_indices[w.page_begin + j / p.page_size]) * p.page_size + j % p.page_size;
  };
  // Thread (key, sub) copies chunks sub + 4 i of its key row. Chunk sub + 4 i lies in column
  // block i / 2 at in-row chunk sub (i even) or sub + 4 (i odd), so its place in the tile is
  // one of two per-thread offsets plus a constant: computed here once, not per copy.
  const int dst_even = key * 64 + ((sub ^ (key & 7)) << 3), dst_odd = key * 64 + (((sub + 4) ^ (key & 7)) << 3);
  auto load_tile = [&](int64_t row, int buffer) {
    T* dst = s_kv + buffer * Tile::kTileElems;
    const bool valid = row >= 0;
    const T* ckv = p.ckv + (valid ? row : 0) * kCkv + sub * 8;
    const T* kpe = p.kpe + (valid ? row : 0) * kKpe + sub * 8;
#pragma unroll
    for (int i = 0; i < kCkvChunks / 4; ++i)
      cp_async_16(dst + (i / 2) * Tile::kBlockElems + (i % 2 ? dst_odd : dst_even), ckv + 32 * i, valid);
#pragma unroll
    for (int i = 0; i < (kRowChunks - kCkvChunks) / 4; ++i)
      cp_async_16(dst + (kCkvChunks / 8) * Tile::kBlockElems + (i % 2 ? dst_odd : dst_even), kpe + 32 * i, valid);
  };

  // ---- this thread's rows: 16 warp + g and + 8 of the tile (the same in both groups)
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp * 16 + g + 8 * h;
    int lim = w.kv_end;
    if (p.causal) lim = min(lim, r / heads + w.kv_len - w.qo_len + 1);
    limit[h] = r < request_rows ? lim : w.kv_begin;
  }

  float o[2][64];  // O's columns 256 grp + 128 half + ..., wgmma m64n128 accumulators
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  load_tile(pool_row(0), 0);
  kernels::cp_async_commit_group();
  int64_t next_row = pool_row(1);

  // The descriptors, built once: a k-step, a column block or a buffer further is a constant
  // added to the start-address field (bits 0-13, in 16-byte units), which never carries out
  // below 256 KB. Rebuilt for every wgmma they cost ~10 instructions each, 36 + 8 a tile.
  const uint64_t q_desc = smem_descriptor(s_q, 16);
  const uint64_t k_desc0 = smem_descriptor(s_kv + grp * 32 * 64, 16);
  const uint64_t v_desc0 = smem_descriptor(s_kv + grp * 4 * Tile::kBlockElems, Tile::kBlockElems * sizeof(T));
  constexpr uint64_t kBufferStep = Tile::kTileElems * sizeof(T) / 16;
  for (int tile = 0; tile < num_tiles; ++tile) {
    kernels::cp_async_wait_group<0>();
    __syncthreads();  // (1) the tile landed; both groups are past the previous one
    if (tile + 1 < num_tiles) load_tile(next_row, (tile + 1) & 1);
    kernels::cp_async_commit_group();
    next_row = pool_row(tile + 2);
    const T* kv = s_kv + (tile & 1) * Tile::kTileElems;
    const uint64_t k_desc = k_desc0 + (tile & 1) * kBufferStep, v_desc = v_desc0 + (tile & 1) * kBufferStep;

    // S_grp = Q K[32 grp ..]^T: 36 k-steps of 16 dims; a k-step is 32 bytes along a 128-byte row
    float s[16];
    hopper::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kRowElems / 16; ++ks) {
      const uint64_t step = ((ks / 4) * Tile::kBlockElems + (ks % 4) * 16) * sizeof(T) / 16;
      detail::wgmma_ss_n32<T>(s, q_desc + step, k_desc + step, ks > 0);
    }
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::wgmma_fence_operands(s);

    // scale, mask, and the maxima of this group's 32 keys
    const int key0 = w.kv_begin + tile * Tile::kKeys + grp * 32;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1, j = key0 + n * 8 + 2 * t4 + (e & 1);
        s[4 * n + e] = j < limit[h] ? s[4 * n + e] * p.scale_log2 : -INFINITY;
        mx[h] = fmaxf(mx[h], s[4 * n + e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      s_red[(grp * 2 + h) * 128 + t] = mx[h];
    }
    __syncthreads();  // (2) both groups' maxima

    // online softmax; P of this group's keys as A fragments (k-steps 2 grp, 2 grp + 1).
    // The running maximum moves only when a tile's is more than 8 above it (FlashAttention-4's
    // rule): P is then at most 2^8, l and O stay against the same stale maximum (the result
    // is the same up to rounding), and most tiles rescale nothing. Both groups see the same
    // maxima, so they take the same decisions.
    uint32_t a_own[2][4];
    float alpha[2] = {1.f, 1.f}, m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_tile = fmaxf(mx[h], s_red[((1 - grp) * 2 + h) * 128 + t]);
      if (m_tile > m_run[h] + 8.f) {          // -inf + 8 is -inf: the first finite maximum always enters
        alpha[h] = exp2f(m_run[h] - m_tile);  // from -inf: 0, and O and l are still 0
        m_run[h] = m_tile;
      }
      m_use[h] = m_run[h] == -INFINITY ? 0.f : m_run[h];
      l_run[h] *= alpha[h];
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          o[half][4 * n] *= alpha[0];
          o[half][4 * n + 1] *= alpha[0];
          o[half][4 * n + 2] *= alpha[1];
          o[half][4 * n + 3] *= alpha[1];
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        s[4 * n + 2 * h] = exp2f(s[4 * n + 2 * h] - m_use[h]);
        s[4 * n + 2 * h + 1] = exp2f(s[4 * n + 2 * h + 1] - m_use[h]);
        l_run[h] += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
      }
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        a_own[k][r] = kernels::pack2<T>(s[8 * k + 2 * r], s[8 * k + 2 * r + 1]);
        s_pex[(grp * 8 + k * 4 + r) * 128 + t] = a_own[k][r];
      }
    __syncthreads();  // (3) both groups' P
    // P of all 64 keys in k-step order (group 0's keys first); a uniform branch keeps
    // every register index static
    uint32_t a[4][4];
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t other = s_pex[((1 - grp) * 8 + k * 4 + r) * 128 + t];
        a[k][r] = grp == 0 ? a_own[k][r] : other;
        a[2 + k][r] = grp == 0 ? other : a_own[k][r];
      }

    // O_grp += P V: 4 k-steps of 16 keys, columns in two halves of 128
    hopper::wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        hopper::wgmma_rs<T, 128>(o[half], a[k], v_desc + (half * 2 * Tile::kBlockElems + k * 16 * 64) * sizeof(T) / 16,
                                 1);
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::wgmma_fence_operands(o[0]);
    hopper::wgmma_fence_operands(o[1]);
  }
  kernels::cp_async_wait_group<0>();

  // ---- row sums: 4 lanes, then the two groups
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  __syncthreads();  // both groups are done with the maxima
#pragma unroll
  for (int h = 0; h < 2; ++h) s_red[(grp * 2 + h) * 128 + t] = l_run[h];
  __syncthreads();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp * 16 + g + 8 * h;
    if (r >= request_rows) continue;
    const float l = l_run[h] + s_red[((1 - grp) * 2 + h) * 128 + t];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    const int token = r / heads, head = r % heads;
    if (w.slot_base < 0) {
      const int64_t row = int64_t(w.qo_start + token) * heads + head;
      T* dst = p.o + row * kCkv + grp * 256 + 2 * t4;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<uint32_t*>(dst + half * 128 + n * 8) = kernels::pack2<T>(o[half][4 * n + 2 * h] * inv,
                                                                                     o[half][4 * n + 2 * h + 1] * inv);
      if (p.lse != nullptr && grp == 0 && t4 == 0) p.lse[row] = lse;
    } else {
      const int64_t row = int64_t(w.slot_base + token * w.num_chunks + w.chunk) * heads + head;
      float* dst = p.partial_o + row * kCkv + grp * 256 + 2 * t4;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<float2*>(dst + half * 128 + n * 8) = make_float2(o[half][4 * n + 2 * h] * inv,
                                                                             o[half][4 * n + 2 * h + 1] * inv);
      if (grp == 0 && t4 == 0) p.partial_lse[row] = lse;
    }
  }
#else
  __trap();  // sm_90a code only: the runner never launches it elsewhere
#endif
}

}  // namespace flashstep::stages::mla
