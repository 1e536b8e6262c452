/// \file mla_hopper.cuh
/// \brief MLA decode and append on Hopper (sm_90a): the 64-row tile of mla_decode.cuh on
/// wgmma, with a producer warp group and two consumer warp groups that take turns.
///
/// What changed from mla_decode.cuh. There, every warp re-read its 16 query rows (576
/// columns) from shared memory into registers with ldmatrix for every 32-key tile. Here a
/// warp group multiplies straight from shared memory (stage 07's wgmma, descriptors and
/// 128-byte swizzle), so Q never travels through registers.
///
/// The block: warp group 0 copies (Q once, then 32-key cache tiles into a ring of four
/// buffers, full and empty mbarriers handing each over, as in stage 07), and warp groups 1
/// and 2 compute. O (64 rows x 512, fp32) is 256 registers a thread for one warp group, so
/// its columns are split: consumer c owns O's columns 256 c .. 256 c + 255. Its S is not
/// split: the consumers take the tiles of a pair (A = 2i, B = 2i + 1) one each, so one's
/// softmax runs while the other's products hold the tensor cores:
///
///     consumer 0                              consumer 1
///     S_A = Q K_A^T                           S_B = Q K_B^T            (wgmma m64n32k16 x 36)
///     m_A, P_A = exp2(S_A - m_A)  -> smem
///     --- A ready (named barrier) -------->    m_B from m_A, P_B       -> smem
///     O_L += P_A V_A[:, 0..255]               (softmax of B under consumer 0's product)
///                 <------------------------   --- B ready
///     O_L *= alpha_B, O_L += P_B V_B          O_R *= alpha_A alpha_B,
///                                             O_R += P_A V_A + P_B V_B [:, 256..511]
///
/// The running maximum passes from one consumer to the other: m_A extends the previous
/// pair's m_B, and m_B extends m_A. It moves only when a tile's maximum is more than 8 (in
/// log2 units) above it (FlashAttention-4's rule), so alpha is almost always exactly 1 and
/// the rescales are skipped. Each P travels through the rotary block of its own tile: once
/// S of a tile is done, nobody reads its 64 k_pe columns again (P V reads the first 512),
/// and P of 64 rows x 32 keys is exactly that block's 4 KB.
///
/// Shared memory: Q (72 KB), four 32-key tiles (36 KB each: c in 8 column blocks of 64,
/// then k_pe in one), the exchanged maxima and row sums, the barriers: 221 KB, one block
/// an SM. The wide tile's work items, split and merge are unchanged.
#pragma once

#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "10_mla/mla_decode.cuh"

namespace flashstep::stages::mla {

/// Sizes of the Hopper tile.
struct MlaHopperTile {
  static constexpr int kThreads = 384;                                   ///< producer + two consumer warp groups
  static constexpr int kRows = 64;                                       ///< packed rows (one wgmma M)
  static constexpr int kKeys = kTileKeys;                                ///< keys of a cache tile
  static constexpr int kSlots = 4;                                       ///< cache tiles in the ring: two pairs
  static constexpr int kColBlocks = kRowChunks / 8;                      ///< 64-column blocks of a row: 8 of c, 1 of k_pe
  static constexpr int kQBlockElems = kRows * 64;                        ///< one column block of Q
  static constexpr int kKvBlockElems = kKeys * 64;                       ///< one column block of a cache tile
  static constexpr int kQElems = kColBlocks * kQBlockElems;
  static constexpr int kTileElems = kColBlocks * kKvBlockElems;
  static constexpr int kStatFloats = 2 * 2 * 128;                        ///< [consumer][row half][thread]
  // setmaxnreg: the block starts with 168 a thread (384 x 168 = 64512); 128 x 40 + 256 x 232 fits
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static constexpr size_t smem_bytes() {
    // + 1024: the base is aligned up to the swizzle atom by hand (the runtime promises 16 bytes);
    // then Q, the ring, the maxima and the row sums, and 1 + 2 x kSlots mbarriers
    return 1024 + size_t(kQElems + kSlots * kTileElems) * 2 + 2 * kStatFloats * sizeof(float) +
           (1 + 2 * kSlots) * sizeof(uint64_t);
  }
};

namespace detail {

namespace ptx = cuda::ptx;

/// The named barriers of the kernel (0 is __syncthreads), each counting the 256 consumer
/// threads. Both consumers sync at each: the one that waits would wait anyway, and the
/// other arrives there just after issuing its products, so a full barrier costs nothing and
/// orders the exchange both ways. (bar.sync with an id: no C++ API, one line of PTX.)
enum class MlaBarrier : uint32_t {
  kTileAReady = 1,  ///< consumer 0's m_A and P_A are in shared memory
  kTileBReady = 2,  ///< consumer 1's m_B and P_B are
  kRowSums = 3,     ///< both consumers' row sums are
};
__device__ __forceinline__ void bar_sync(MlaBarrier b) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(uint32_t(b)) : "memory");
}

__device__ __forceinline__ void wait_barrier(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

/// Element offset of (row, 16-byte chunk) in a tile of 64-column blocks of `rows` rows,
/// each block in the 128-byte swizzle wgmma's descriptors read (stage 07's wgmma.cuh).
template <int kBlockRows>
__device__ __forceinline__ int swizzled64(int row, int chunk) {
  return (chunk >> 3) * kBlockRows * 64 + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
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

/// The shared memory of a block (1024-byte aligned base): Q, the ring, the exchanged
/// maxima and row sums, the mbarriers.
template <typename T>
struct MlaHopperSmem {
  using Tile = MlaHopperTile;
  T* q;
  __device__ __forceinline__ explicit MlaHopperSmem(unsigned char* base) : q(reinterpret_cast<T*>(base)) {}
  __device__ __forceinline__ T* tile(int slot) const { return q + Tile::kQElems + slot * Tile::kTileElems; }
  /// P of the tile in `slot`, as wgmma A fragments [k-step][register][thread], in the tile's k_pe block
  __device__ __forceinline__ uint32_t* p_of(int slot) const {
    return reinterpret_cast<uint32_t*>(tile(slot) + (Tile::kColBlocks - 1) * Tile::kKvBlockElems);
  }
  __device__ __forceinline__ float* m_of(int consumer) const {  ///< [row half][thread]
    return reinterpret_cast<float*>(tile(Tile::kSlots)) + consumer * 256;
  }
  __device__ __forceinline__ float* l_of(int consumer) const { return m_of(2) + consumer * 256; }
  __device__ __forceinline__ uint64_t* q_full() const { return reinterpret_cast<uint64_t*>(m_of(4)); }
  __device__ __forceinline__ uint64_t* full(int slot) const { return q_full() + 1 + slot; }
  __device__ __forceinline__ uint64_t* empty(int slot) const { return q_full() + 1 + Tile::kSlots + slot; }
};

/// A tile's page-pool row for key `key` of tile `tile`, or -1 past the chunk (zero-filled).
template <typename T>
__device__ __forceinline__ int64_t pool_row(const MlaParams<T>& p, const MlaWorkItem& w, int tile, int key) {
  const int j = w.kv_begin + tile * MlaHopperTile::kKeys + key;
  if (j >= w.kv_end) return -1;
  return int64_t(p.kv_indices[w.page_begin + j / p.page_size]) * p.page_size + j % p.page_size;
}

/// The producer warp group: Q, then every cache tile j of the chunk into buffer j % kSlots
/// once both consumers freed it. Thread t copies key row t / 4, chunks t % 4 + 4 i: with
/// cp.async, because a tile's 32 rows may lie in 32 pages; each thread's copies count one
/// arrival on the tile's "full" barrier when they land (cp.async.mbarrier.arrive.noinc).
template <typename T>
__device__ __forceinline__ void produce(const MlaParams<T>& p, const MlaWorkItem& w, int num_tiles,
                                        const MlaHopperSmem<T>& smem, int t) {
  using Tile = MlaHopperTile;
  using kernels::cp_async_16;
  const int heads = p.num_heads, request_rows = w.qo_len * heads;
  for (int idx = t; idx < Tile::kRows * kRowChunks; idx += 128) {
    const int row = idx / kRowChunks, chunk = idx % kRowChunks, r = w.row_begin + row;
    const bool valid = r < request_rows;
    const int64_t q_row = valid ? int64_t(w.qo_start + r / heads) * heads + r % heads : 0;
    const T* src = chunk < kCkvChunks ? p.q_nope + q_row * kCkv + chunk * 8
                                      : p.q_pe + q_row * kKpe + (chunk - kCkvChunks) * 8;
    cp_async_16(smem.q + swizzled64<Tile::kRows>(row, chunk), src, valid);
  }
  ptx::cp_async_mbarrier_arrive_noinc(smem.q_full());

  // Chunk sub + 4 i of key row `key` lies in column block i / 2 at in-row chunk sub (i even)
  // or sub + 4 (i odd): one of two offsets plus a constant, computed once.
  const int key = t / 4, sub = t % 4;
  const int dst_even = key * 64 + ((sub ^ (key & 7)) << 3), dst_odd = key * 64 + (((sub + 4) ^ (key & 7)) << 3);
  int64_t row = num_tiles > 0 ? pool_row(p, w, 0, key) : -1;
  for (int j = 0; j < num_tiles; ++j) {
    const int slot = j % Tile::kSlots;
    // the next tile's page id, read before this tile's copies (each a memory clobber)
    const int64_t next = j + 1 < num_tiles ? pool_row(p, w, j + 1, key) : -1;
    if (j >= Tile::kSlots) wait_barrier(smem.empty(slot), ((j / Tile::kSlots) & 1) ^ 1);
    T* dst = smem.tile(slot);
    const bool valid = row >= 0;
    const T* ckv = p.ckv + (valid ? row : 0) * kCkv + sub * 8;
    const T* kpe = p.kpe + (valid ? row : 0) * kKpe + sub * 8;
#pragma unroll
    for (int i = 0; i < kCkvChunks / 4; ++i)
      cp_async_16(dst + (i / 2) * Tile::kKvBlockElems + (i % 2 ? dst_odd : dst_even), ckv + 32 * i, valid);
#pragma unroll
    for (int i = 0; i < (kRowChunks - kCkvChunks) / 4; ++i)
      cp_async_16(dst + (kCkvChunks / 8) * Tile::kKvBlockElems + (i % 2 ? dst_odd : dst_even), kpe + 32 * i, valid);
    ptx::cp_async_mbarrier_arrive_noinc(smem.full(slot));
    row = next;
  }
}

/// A cache tile has landed. cp.async wrote it through the generic proxy and wgmma reads
/// shared memory through the async proxy: a proxy fence orders them.
__device__ __forceinline__ void wait_tile(uint64_t* full, uint32_t phase) {
  wait_barrier(full, phase);
  ptx::fence_proxy_async(ptx::space_shared);
}

/// S = Q K^T for the tile in `slot`: 36 k-steps of 16 dims, a k-step 32 bytes along a
/// 128-byte row, a column block kQBlockElems (Q) or kKvBlockElems (K) further.
template <typename T>
__device__ __forceinline__ void issue_scores(float (&s)[16], const hopper::SmemDescriptor& dq,
                                             const hopper::SmemDescriptor& dk) {
  using Tile = MlaHopperTile;
#pragma unroll
  for (int ks = 0; ks < kRowElems / 16; ++ks)
    wgmma_ss_n32<T>(s, dq.at(((ks / 4) * Tile::kQBlockElems + (ks % 4) * 16) * sizeof(T) / 16),
                    dk.at(((ks / 4) * Tile::kKvBlockElems + (ks % 4) * 16) * sizeof(T) / 16), ks > 0);
}

/// O (this consumer's 256 columns) += P V for one tile: 2 k-steps of 16 keys, two halves of
/// 128 columns; V MN-major (a 128-byte row holds 64 of O's columns, the next 64 a column
/// block further: the descriptor's leading byte offset).
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[2][64], const uint32_t (&a)[2][4],
                                         const hopper::SmemDescriptor& dv) {
  using Tile = MlaHopperTile;
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      hopper::wgmma_rs<T, 128>(o[half], a[k], dv.at((half * 2 * Tile::kKvBlockElems + k * 16 * 64) * sizeof(T) / 16),
                               1);
}

/// The online softmax of one tile's scores against the maximum m_in: scale and mask, the
/// row maxima (a row's 32 keys lie in the 4 threads of a quad), the new maximum (moved only
/// past m_in + 8), P packed as wgmma A fragments, and P's partial row sums.
template <typename T>
__device__ __forceinline__ void softmax_tile(float (&s)[16], const int (&limit)[2], int key0, int t4, float scale_log2,
                                             const float (&m_in)[2], float (&m_out)[2], float (&p_sum)[2],
                                             uint32_t (&a)[2][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1, j = key0 + n * 8 + 2 * t4 + (e & 1);
      s[4 * n + e] = j < limit[h] ? s[4 * n + e] * scale_log2 : -INFINITY;
      mx[h] = fmaxf(mx[h], s[4 * n + e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    m_out[h] = mx[h] > m_in[h] + 8.f ? mx[h] : m_in[h];  // -inf + 8 is -inf: the first finite maximum enters
    const float m_use = m_out[h] == -INFINITY ? 0.f : m_out[h];
    p_sum[h] = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      s[4 * n + 2 * h] = exp2f(s[4 * n + 2 * h] - m_use);
      s[4 * n + 2 * h + 1] = exp2f(s[4 * n + 2 * h + 1] - m_use);
      p_sum[h] += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = kernels::pack2<T>(s[8 * k + 2 * r], s[8 * k + 2 * r + 1]);
}

/// exp2(m_old - m_new): exactly 1 where the maximum did not move (-inf to -inf included)
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return m_old == m_new ? 1.f : exp2f(m_old - m_new);
}

/// O *= alpha, row by row (registers 4n, 4n + 1 are row g, 4n + 2, 4n + 3 row g + 8).
__device__ __forceinline__ void scale_rows(float (&o)[2][64], const float (&alpha)[2]) {
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

/// A packed pair of 16-bit P values times f (the rare rescale of P_A, below).
template <typename T>
__device__ __forceinline__ uint32_t scale_pair(uint32_t packed, float f) {
  using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  T2 v;
  memcpy(&v, &packed, sizeof(v));
  float2 x;
  if constexpr (std::is_same_v<T, __half>) x = __half22float2(v);
  else x = __bfloat1622float2(v);
  return kernels::pack2<T>(x.x * f, x.y * f);
}

}  // namespace detail

/// The Hopper form of mla_decode_kernel: same parameters, work items and outputs.
/// grid = (work items), block = 384 threads, dynamic shared memory MlaHopperTile::smem_bytes().
template <typename T>
__global__ void __launch_bounds__(384, 1) mla_hopper_kernel(const MlaParams<T> p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = MlaHopperTile;
  using detail::MlaBarrier;
  namespace ptx = cuda::ptx;
  extern __shared__ unsigned char smem_raw[];
  const detail::MlaHopperSmem<T> smem(
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023)));

  const MlaWorkItem w = p.items[blockIdx.x];
  const int num_tiles = (w.kv_end - w.kv_begin + Tile::kKeys - 1) / Tile::kKeys;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(smem.q_full(), 128u);
    for (int s = 0; s < Tile::kSlots; ++s) {
      ptx::mbarrier_init(smem.full(s), 128u);  // one arrival per producer thread
      ptx::mbarrier_init(smem.empty(s), 8u);   // one per consumer warp
    }
  }
  __syncthreads();
  const int warp_group = threadIdx.x / 128, t = threadIdx.x % 128;
  if (warp_group == 0) {
    // the producer hands its registers to the consumers (no C++ API for setmaxnreg)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tile::kProducerRegisters));
    detail::produce(p, w, num_tiles, smem, t);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tile::kConsumerRegisters));  // no C++ API for setmaxnreg

  // warp-uniform as the compiler sees it (a shuffle from lane 0): wgmma issued under a
  // branch it cannot prove uniform is serialized
  const int consumer = __shfl_sync(0xffffffffu, warp_group, 0) - 1;
  const int warp = t / 32, lane = t % 32, g = lane / 4, t4 = lane % 4;
  const int heads = p.num_heads, request_rows = w.qo_len * heads;
  // this thread's rows: 16 warp + g and + 8 of the tile (the same in both consumers)
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp * 16 + g + 8 * h;
    int lim = w.kv_end;
    if (p.causal) lim = min(lim, r / heads + w.kv_len - w.qo_len + 1);
    limit[h] = r < request_rows ? lim : w.kv_begin;
  }

  float o[2][64];  // O's columns 256 consumer + 128 half + ..., wgmma m64n128 accumulators
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 64; ++i) o[h][i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  const hopper::SmemDescriptor dq(smem.q, 16);
  if (num_tiles > 0) detail::wait_tile(smem.q_full(), 0);
  for (int ja = 0; ja < num_tiles; ja += 2) {
    const int jb = ja + 1, sa = ja % Tile::kSlots, sb = jb % Tile::kSlots;
    const bool has_b = jb < num_tiles;
    const hopper::SmemDescriptor dv_a(smem.tile(sa) + consumer * 4 * Tile::kKvBlockElems,
                                      Tile::kKvBlockElems * sizeof(T)),
        dv_b(smem.tile(sb) + consumer * 4 * Tile::kKvBlockElems, Tile::kKvBlockElems * sizeof(T));
    float s[16], m_tile[2], p_sum[2];
    uint32_t a_own[2][4], a_other[2][4];
    if (consumer == 0) {
      // S_A, its softmax against the previous pair's maximum, P_A and m_A to consumer 1
      detail::wait_tile(smem.full(sa), (ja / Tile::kSlots) & 1);
      hopper::wgmma_fence();
      detail::issue_scores<T>(s, dq, hopper::SmemDescriptor(smem.tile(sa), 16));
      hopper::wgmma_commit();
      hopper::wgmma_wait<0>();
      hopper::wgmma_fence_operands(s);
      detail::softmax_tile<T>(s, limit, w.kv_begin + ja * Tile::kKeys, t4, p.scale_log2, m_run, m_tile, p_sum,
                              a_own);
      uint32_t* p_a = smem.p_of(sa);
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_a[(k * 4 + r) * 128 + t] = a_own[k][r];
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        smem.m_of(0)[h * 128 + t] = m_tile[h];
        alpha[h] = detail::rescale_factor(m_run[h], m_tile[h]);
        l_run[h] = l_run[h] * alpha[h] + p_sum[h];
        m_run[h] = m_tile[h];
      }
      detail::bar_sync(MlaBarrier::kTileAReady);
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) detail::scale_rows(o, alpha);
      // O_L += P_A V_A while consumer 1 runs the softmax of B
      hopper::wgmma_fence();
      detail::issue_pv<T>(o, a_own, dv_a);
      hopper::wgmma_commit();
      detail::bar_sync(MlaBarrier::kTileBReady);
      float alpha_b[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float m_b = smem.m_of(1)[h * 128 + t];
        alpha_b[h] = detail::rescale_factor(m_run[h], m_b);
        l_run[h] *= alpha_b[h];
        m_run[h] = m_b;
      }
      if (has_b) {
        const uint32_t* p_b = smem.p_of(sb);
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int r = 0; r < 4; ++r) a_other[k][r] = p_b[(k * 4 + r) * 128 + t];
      }
      // O is rescaled between the two products only when m_B moved (rarely): then P_A V_A
      // must have landed first; else P_B V_B follows it into the same accumulators at once
      if (__any_sync(0xffffffffu, alpha_b[0] != 1.f || alpha_b[1] != 1.f)) {
        hopper::wgmma_wait<0>();
        hopper::wgmma_fence_operands(o[0]);
        hopper::wgmma_fence_operands(o[1]);
        detail::scale_rows(o, alpha_b);
      }
      if (has_b) {
        hopper::wgmma_fence();
        detail::issue_pv<T>(o, a_other, dv_b);
        hopper::wgmma_commit();
      }
      hopper::wgmma_wait<0>();
      hopper::wgmma_fence_operands(o[0]);
      hopper::wgmma_fence_operands(o[1]);
      if (lane == 0) {
        ptx::mbarrier_arrive(smem.empty(sa));  // this warp is done with tiles A and B
        if (has_b) ptx::mbarrier_arrive(smem.empty(sb));
      }
    } else {
      // S_B under consumer 0's S_A; its softmax waits for m_A
      if (has_b) {
        detail::wait_tile(smem.full(sb), (jb / Tile::kSlots) & 1);
        hopper::wgmma_fence();
        detail::issue_scores<T>(s, dq, hopper::SmemDescriptor(smem.tile(sb), 16));
        hopper::wgmma_commit();
      }
      detail::bar_sync(MlaBarrier::kTileAReady);
      float m_a[2], alpha_a[2], alpha_b[2];
      const uint32_t* p_a = smem.p_of(sa);
#pragma unroll
      for (int k = 0; k < 2; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) a_other[k][r] = p_a[(k * 4 + r) * 128 + t];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_a[h] = smem.m_of(0)[h * 128 + t];
        alpha_a[h] = detail::rescale_factor(m_run[h], m_a[h]);
        m_tile[h] = m_a[h];
        p_sum[h] = 0.f;
      }
      if (has_b) {
        hopper::wgmma_wait<0>();
        hopper::wgmma_fence_operands(s);
        detail::softmax_tile<T>(s, limit, w.kv_begin + jb * Tile::kKeys, t4, p.scale_log2, m_a, m_tile, p_sum,
                                a_own);
        uint32_t* p_b = smem.p_of(sb);
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int r = 0; r < 4; ++r) p_b[(k * 4 + r) * 128 + t] = a_own[k][r];
      }
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        smem.m_of(1)[h * 128 + t] = m_tile[h];
        alpha_b[h] = detail::rescale_factor(m_a[h], m_tile[h]);
        alpha[h] = alpha_a[h] * alpha_b[h];
        l_run[h] = l_run[h] * alpha[h] + p_sum[h];
        m_run[h] = m_tile[h];
      }
      detail::bar_sync(MlaBarrier::kTileBReady);
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) detail::scale_rows(o, alpha);
      // P_A was taken against m_A: rescaled to m_B (rarely needed), then both products
      if (__any_sync(0xffffffffu, alpha_b[0] != 1.f || alpha_b[1] != 1.f)) {
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
          for (int r = 0; r < 4; ++r) a_other[k][r] = detail::scale_pair<T>(a_other[k][r], alpha_b[r & 1]);
      }
      hopper::wgmma_fence();
      detail::issue_pv<T>(o, a_other, dv_a);
      if (has_b) detail::issue_pv<T>(o, a_own, dv_b);
      hopper::wgmma_commit();
      hopper::wgmma_wait<0>();
      hopper::wgmma_fence_operands(o[0]);
      hopper::wgmma_fence_operands(o[1]);
      if (lane == 0) {
        ptx::mbarrier_arrive(smem.empty(sa));
        if (has_b) ptx::mbarrier_arrive(smem.empty(sb));
      }
    }
  }

  // ---- row sums: 4 lanes, then the two consumers
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
    smem.l_of(consumer)[h * 128 + t] = l_run[h];
  }
  detail::bar_sync(MlaBarrier::kRowSums);

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp * 16 + g + 8 * h;
    if (r >= request_rows) continue;
    const float l = l_run[h] + smem.l_of(1 - consumer)[h * 128 + t];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_run[h] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    const int token = r / heads, head = r % heads;
    if (w.slot_base < 0) {
      const int64_t row = int64_t(w.qo_start + token) * heads + head;
      T* dst = p.o + row * kCkv + consumer * 256 + 2 * t4;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<uint32_t*>(dst + half * 128 + n * 8) = kernels::pack2<T>(o[half][4 * n + 2 * h] * inv,
                                                                                     o[half][4 * n + 2 * h + 1] * inv);
      if (p.lse != nullptr && consumer == 0 && t4 == 0) p.lse[row] = lse;
    } else {
      const int64_t row = int64_t(w.slot_base + token * w.num_chunks + w.chunk) * heads + head;
      float* dst = p.partial_o + row * kCkv + consumer * 256 + 2 * t4;
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int n = 0; n < 16; ++n)
          *reinterpret_cast<float2*>(dst + half * 128 + n * 8) = make_float2(o[half][4 * n + 2 * h] * inv,
                                                                             o[half][4 * n + 2 * h + 1] * inv);
      if (consumer == 0 && t4 == 0) p.partial_lse[row] = lse;
    }
  }
#else
  __trap();  // sm_90a code only: the runner never launches it elsewhere
#endif
}

}  // namespace flashstep::stages::mla
