/// \file mla_hopper.cuh
/// \brief MLA decode and append on Hopper (sm_90a): the 64-row tile of mla_decode.cuh on
/// wgmma, with a producer warp group, a warp group for the scores and one that helps with O.
///
/// What changed from mla_decode.cuh. There, every warp re-read its 16 query rows (576
/// columns) from shared memory into registers with ldmatrix for every 32-key tile. Here a
/// warp group multiplies straight from shared memory (stage 07's wgmma, descriptors and
/// 128-byte swizzle), so Q never travels through registers.
///
/// The block: warp group 0 copies (Q once, then 64-key cache tiles into two buffers, full
/// and empty mbarriers handing each over, as in stage 07); warp groups 1 and 2 compute. O
/// (64 rows x 512, fp32) would be 256 registers a thread for one warp group, so its columns
/// are split: consumer c owns O's columns 256 c .. 256 c + 255. S is not split:
///
///     consumer 0 (scores)                              consumer 1 (O's other half)
///     S = Q K_j^T   wgmma m64n64k16 x 36
///     m, alpha, P = exp2(S - m)  -> shared memory
///     ---------------- P ready (named barrier) ----------------
///     O_L = alpha O_L + P V_j[:, 0..255]               O_R = alpha O_R + P V_j[:, 256..511]
///     free buffer j                                     free buffer j
///
/// S over all 64 keys of a tile in one warp group reads Q once per 64 keys: a wgmma of N =
/// 64 reads 2 KB of Q and 2 KB of K for 32 cycles of the tensor cores, which shared memory
/// (128 bytes a cycle) just feeds. Split between two groups (N = 32 each), Q is read twice:
/// 3 KB for 16 cycles, and shared memory sets the pace (the chapter's v7).
///
/// P travels through the rotary block of its own tile: once S of a tile is done, nobody
/// reads its 64 k_pe columns again (P V reads the first 512), and P of 64 rows x 64 keys is
/// exactly that block's 8 KB. The running maximum moves only when a tile's maximum is more
/// than 8 (in log2 units) above it (FlashAttention-4's rule), so alpha is almost always
/// exactly 1 and the rescales are skipped.
///
/// Shared memory: Q (72 KB), two 64-key tiles (72 KB each: c in 8 column blocks of 64, then
/// k_pe in one), the exchanged alphas and row statistics, the barriers: 221 KB, one block an
/// SM. The wide tile's work items, split and merge are unchanged.
///
/// What it still does badly (the chapter measures it): the two buffers beside Q leave a
/// copy about one tile's compute to land, so loads and products overlap poorly; with 128
/// heads a request's two row tiles read its latents twice; warp group 2 idles through S and
/// the softmax. Run it with `flashstep_bench --shapes=bench/shapes_mla.csv`.
#pragma once

#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "07_hopper/mbarrier.cuh"
#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "10_mla/mla_decode.cuh"

namespace flashstep::stages::mla {

/// Sizes of the Hopper tile.
struct MlaHopperTile {
  static constexpr int kThreads = 384;               ///< producer + two consumer warp groups
  static constexpr int kRows = 64;                   ///< packed rows (one wgmma M)
  static constexpr int kKeys = 64;                   ///< keys of a cache tile (one wgmma N of S)
  static constexpr int kStages = 2;                  ///< cache tiles in the ring
  static constexpr int kColBlocks = kRowChunks / 8;  ///< 64-column blocks of a row: 8 of c, 1 of k_pe
  static constexpr int kBlockElems = 64 * 64;        ///< one column block of Q or of a tile
  static constexpr int kTileElems = kColBlocks * kBlockElems;
  static constexpr int kStatFloats = 2 * 2 * 128;  ///< alpha [stage][row half][thread], then m and l
  // setmaxnreg: the block starts with 168 a thread (384 x 168 = 64512); 128 x 40 + 256 x 232 fits
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  static constexpr size_t smem_bytes() {
    // + 1024: the base is aligned up to the swizzle atom by hand (the runtime promises 16 bytes);
    // then Q, the ring, alpha, m and l, and 1 + 2 x kStages mbarriers
    return 1024 + size_t(kTileElems * (1 + kStages)) * 2 + 2 * kStatFloats * sizeof(float) +
           (1 + 2 * kStages) * sizeof(uint64_t);
  }
};

namespace detail {

namespace ptx = cuda::ptx;

/// The named barriers of the kernel (0 is __syncthreads), each counting the 256 consumer
/// threads. (bar.sync with an id: no C++ API, one line of PTX.)
enum class MlaBarrier : uint32_t {
  kPReady = 1,   ///< consumer 0's P and alpha of a tile are in shared memory
  kRowSums = 2,  ///< consumer 0's final m and l are
};
__device__ __forceinline__ void bar_sync(MlaBarrier b) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(uint32_t(b)) : "memory");
}

/// Element offset of (row, 16-byte chunk) in a tile of 64-column blocks of 64 rows, each
/// block in the 128-byte swizzle wgmma's descriptors read (stage 07's wgmma.cuh).
__device__ __forceinline__ int swizzled64(int row, int chunk) {
  return (chunk >> 3) * MlaHopperTile::kBlockElems + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

/// The shared memory of a block (1024-byte aligned base): Q, the ring, the exchanged
/// statistics, the mbarriers.
template <typename T>
struct MlaHopperSmem {
  using Tile = MlaHopperTile;
  T* q;
  __device__ __forceinline__ explicit MlaHopperSmem(unsigned char* base) : q(reinterpret_cast<T*>(base)) {}
  __device__ __forceinline__ T* tile(int stage) const { return q + (1 + stage) * Tile::kTileElems; }
  /// P of the tile in `stage`, as wgmma A fragments [k-step][register][thread], in its k_pe block
  __device__ __forceinline__ uint32_t* p_of(int stage) const {
    return reinterpret_cast<uint32_t*>(tile(stage) + (Tile::kColBlocks - 1) * Tile::kBlockElems);
  }
  /// [row half][thread]: alpha of the tile in `stage`; m (i = 2) and l (i = 3) at the end
  __device__ __forceinline__ float* stat(int i) const {
    return reinterpret_cast<float*>(tile(Tile::kStages)) + i * 256;
  }
  __device__ __forceinline__ uint64_t* q_full() const { return reinterpret_cast<uint64_t*>(stat(4)); }
  __device__ __forceinline__ uint64_t* full(int stage) const { return q_full() + 1 + stage; }
  __device__ __forceinline__ uint64_t* empty(int stage) const { return q_full() + 1 + Tile::kStages + stage; }
};

/// The page-pool row of key `key` of tile `tile`, or -1 past the chunk (zero-filled).
template <typename T>
__device__ __forceinline__ int64_t pool_row(const MlaParams<T>& p, const MlaWorkItem& w, int tile, int key) {
  const int j = w.kv_begin + tile * MlaHopperTile::kKeys + key;
  if (j >= w.kv_end) return -1;
  return int64_t(p.kv_indices[w.page_begin + j / p.page_size]) * p.page_size + j % p.page_size;
}

/// The producer warp group: Q, then every cache tile j of the chunk into buffer j % kStages
/// once both consumers freed it, with cp.async, because a tile's 64 rows may lie in 64
/// pages. A warp's copy instruction takes 4 key rows x 8 lanes: 128 contiguous bytes of
/// each row (one column block), whole cache lines, so the L2 serves 4 requests where 16
/// rows x 32 bytes took 16. A thread copies column block b of keys 16 i + 4 warp + lane / 8
/// (i = 0..3): four page lookups a tile. Each thread's copies count one arrival on the
/// tile's "full" barrier when they land (cp.async.mbarrier.arrive.noinc).
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
    cp_async_16(smem.q + swizzled64(row, chunk), src, valid);
  }
  ptx::cp_async_mbarrier_arrive_noinc(smem.q_full());

  constexpr int kPasses = Tile::kKeys / 16;  // 4 warps x 4 rows a pass
  const int chunk = t % 8, key0 = (t / 32) * 4 + (t % 32) / 8;
  int64_t row[kPasses], next[kPasses];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) row[i] = num_tiles > 0 ? pool_row(p, w, 0, key0 + 16 * i) : -1;
  for (int j = 0; j < num_tiles; ++j) {
    const int stage = j % Tile::kStages;
    // the next tile's page ids, read before this tile's copies (each a memory clobber)
#pragma unroll
    for (int i = 0; i < kPasses; ++i) next[i] = j + 1 < num_tiles ? pool_row(p, w, j + 1, key0 + 16 * i) : -1;
    if (j >= Tile::kStages) hopper::wait_barrier(smem.empty(stage), ((j / Tile::kStages) & 1) ^ 1);
    T* tile = smem.tile(stage);
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int key = key0 + 16 * i;
      const bool valid = row[i] >= 0;
      const T* ckv = p.ckv + (valid ? row[i] : 0) * kCkv + chunk * 8;
      const T* kpe = p.kpe + (valid ? row[i] : 0) * kKpe + chunk * 8;
      T* dst = tile + key * 64 + ((chunk ^ (key & 7)) << 3);
#pragma unroll
      for (int b = 0; b < kCkvChunks / 8; ++b) cp_async_16(dst + b * Tile::kBlockElems, ckv + 64 * b, valid);
      cp_async_16(dst + (kCkvChunks / 8) * Tile::kBlockElems, kpe, valid);
    }
    ptx::cp_async_mbarrier_arrive_noinc(smem.full(stage));
#pragma unroll
    for (int i = 0; i < kPasses; ++i) row[i] = next[i];
  }
}

/// A cache tile (or Q) has landed. cp.async wrote it through the generic proxy and wgmma
/// reads shared memory through the async proxy: a proxy fence orders them.
__device__ __forceinline__ void wait_tile(uint64_t* full, uint32_t phase) {
  hopper::wait_barrier(full, phase);
  ptx::fence_proxy_async(ptx::space_shared);
}

/// S = Q K^T for the tile in `stage`: 36 k-steps of 16 dims, a k-step 32 bytes along a
/// 128-byte row, a column block kBlockElems further every 4.
template <typename T>
__device__ __forceinline__ void issue_scores(float (&s)[32], const hopper::SmemDescriptor& dq,
                                             const hopper::SmemDescriptor& dk) {
  using Tile = MlaHopperTile;
#pragma unroll
  for (int ks = 0; ks < kRowElems / 16; ++ks) {
    const uint32_t step = ((ks / 4) * Tile::kBlockElems + (ks % 4) * 16) * sizeof(T) / 16;
    hopper::wgmma_ss<T, 64>(s, dq.at(step), dk.at(step), ks > 0);
  }
}

/// O (this consumer's 256 columns) += P V for one tile: 4 k-steps of 16 keys, two halves of
/// 128 columns; V MN-major (a 128-byte row holds 64 of O's columns, the next 64 a column
/// block further: the descriptor's leading byte offset).
template <typename T>
__device__ __forceinline__ void issue_pv(float (&o)[2][64], const uint32_t (&a)[4][4],
                                         const hopper::SmemDescriptor& dv) {
  using Tile = MlaHopperTile;
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      hopper::wgmma_rs<T, 128>(o[half], a[k], dv.at((half * 2 * Tile::kBlockElems + k * 16 * 64) * sizeof(T) / 16), 1);
}

/// The online softmax of one tile's scores: scale and mask, the row maxima (a row's 64 keys
/// lie in the 4 threads of a quad), the new maximum m (moved only past the old one + 8),
/// alpha = exp2(m_old - m), P packed as wgmma A fragments, and the row sums l.
template <typename T>
__device__ __forceinline__ void softmax_tile(float (&s)[32], const int (&limit)[2], int key0, int t4, float scale_log2,
                                             float (&m)[2], float (&l)[2], float (&alpha)[2], uint32_t (&a)[4][4]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 8; ++n)
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
    // selects, not a branch: the warp stays converged for the named barrier that follows.
    // alpha is exactly 1 where the maximum stays; -inf + 8 is -inf, so the first finite
    // maximum always enters (and alpha = exp2(-inf) = 0 meets an O and l still 0)
    const bool moves = mx[h] > m[h] + 8.f;
    alpha[h] = moves ? exp2f(m[h] - mx[h]) : 1.f;
    m[h] = moves ? mx[h] : m[h];
    const float m_use = m[h] == -INFINITY ? 0.f : m[h];
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[4 * n + 2 * h] = exp2f(s[4 * n + 2 * h] - m_use);
      s[4 * n + 2 * h + 1] = exp2f(s[4 * n + 2 * h + 1] - m_use);
      sum += s[4 * n + 2 * h] + s[4 * n + 2 * h + 1];
    }
    l[h] = l[h] * alpha[h] + sum;
  }
#pragma unroll
  for (int k = 0; k < 4; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = kernels::pack2<T>(s[8 * k + 2 * r], s[8 * k + 2 * r + 1]);
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
    for (int s = 0; s < Tile::kStages; ++s) {
      ptx::mbarrier_init(smem.full(s), 128u);  // one arrival per producer thread
      ptx::mbarrier_init(smem.empty(s), 8u);   // one per consumer warp
    }
  }
  __syncthreads();
  // warp-uniform as the compiler sees it (a shuffle from lane 0): wgmma issued under a
  // branch it cannot prove uniform is serialized
  const int warp_group = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0), t = threadIdx.x % 128;
  if (warp_group == 0) {
    // the producer hands its registers to the consumers (no C++ API for setmaxnreg)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Tile::kProducerRegisters));
    detail::produce(p, w, num_tiles, smem, t);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Tile::kConsumerRegisters));  // no C++ API for setmaxnreg

  const int consumer = warp_group - 1;
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
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  const hopper::SmemDescriptor dq(smem.q, 16);
  if (consumer == 0 && num_tiles > 0) detail::wait_tile(smem.q_full(), 0);
  for (int j = 0; j < num_tiles; ++j) {
    const int stage = j % Tile::kStages;
    const uint32_t phase = (j / Tile::kStages) & 1;
    const hopper::SmemDescriptor dv(smem.tile(stage) + consumer * 4 * Tile::kBlockElems, Tile::kBlockElems * sizeof(T));
    uint32_t a[4][4];
    float alpha[2];
    if (consumer == 0) {
      // S = Q K_j^T, the online softmax, P and alpha to consumer 1
      detail::wait_tile(smem.full(stage), phase);
      float s[32];
      hopper::wgmma_fence();
      detail::issue_scores<T>(s, dq, hopper::SmemDescriptor(smem.tile(stage), 16));
      hopper::wgmma_commit();
      hopper::wgmma_wait<0>();
      hopper::wgmma_fence_operands(s);
      detail::softmax_tile<T>(s, limit, w.kv_begin + j * Tile::kKeys, t4, p.scale_log2, m, l, alpha, a);
      uint32_t* p_tile = smem.p_of(stage);
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_tile[(k * 4 + r) * 128 + t] = a[k][r];
#pragma unroll
      for (int h = 0; h < 2; ++h) smem.stat(stage)[h * 128 + t] = alpha[h];
    }
    detail::bar_sync(MlaBarrier::kPReady);  // one barrier instruction both consumers reach
    if (consumer == 1) {
      // thread t of consumer 0 held exactly the rows and keys thread t here needs
      detail::wait_tile(smem.full(stage), phase);  // landed long ago: the fence for this group's reads
      const uint32_t* p_tile = smem.p_of(stage);
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int r = 0; r < 4; ++r) a[k][r] = p_tile[(k * 4 + r) * 128 + t];
#pragma unroll
      for (int h = 0; h < 2; ++h) alpha[h] = smem.stat(stage)[h * 128 + t];
    }
    // O = alpha O + P V_j, on this consumer's columns
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) detail::scale_rows(o, alpha);
    hopper::wgmma_fence();
    detail::issue_pv<T>(o, a, dv);
    hopper::wgmma_commit();
    hopper::wgmma_wait<0>();
    hopper::wgmma_fence_operands(o[0]);
    hopper::wgmma_fence_operands(o[1]);
    if (lane == 0) ptx::mbarrier_arrive(smem.empty(stage));  // this warp is done with tile j
  }

  // ---- row sums: 4 lanes; consumer 0 hands m and l to consumer 1
  if (consumer == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
      smem.stat(2)[h * 128 + t] = m[h];
      smem.stat(3)[h * 128 + t] = l[h];
    }
  }
  detail::bar_sync(MlaBarrier::kRowSums);
  if (consumer == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m[h] = smem.stat(2)[h * 128 + t];
      l[h] = smem.stat(3)[h * 128 + t];
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = w.row_begin + warp * 16 + g + 8 * h;
    if (r >= request_rows) continue;
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    const float lse = l[h] > 0.f ? (m[h] + log2f(l[h])) * 0.69314718055994531f : -INFINITY;
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
