// Stage 07 — prefill attention on Hopper: the TMA copies tiles into shared memory, wgmma
// multiplies them, and the warp groups of a block specialise.
//
// What changes from stage 04 (prefill_attention.cuh), and why it is faster:
// - Loads: one thread issues a bulk tensor copy (TMA, cp.async.bulk.tensor) per 64
//   columns of a tile; the copy engine computes every address, swizzles the rows as it
//   writes them (128-byte swizzle) and signals an mbarrier when the bytes have landed.
//   Stage 04 spent its threads' issue slots on address arithmetic and cp.async.
// - MMAs: wgmma.mma_async m64nNk16 runs a 64 x N x 16 product per instruction for a
//   warp group (four warps) reading both operands of S = Q K^T straight from shared
//   memory, and P from registers for O += P V. Stage 04's mma.sync m16n8k16 needs every
//   fragment loaded into registers first (ldmatrix), and issues 16x more instructions.
// - Warp specialisation: warp group 0 only loads (its registers given to the others with
//   setmaxnreg), warp groups 1 and 2 only compute, each on 64 of the tile's 128 query
//   rows. A ring of kStages K/V buffers decouples them: the producer fills stage s while
//   the consumers read stage s - 1; full and empty mbarriers hand each stage over.
//
//   producer (WG 0)   Q | K0 V0 | K1 V1 | wait empty0 | K2 V2 | wait empty1 | K3 V3 ...
//   consumer (WG 1)       wait K0: S = Q K0^T, softmax, wait V0: O += P V0, free 0 | K1 ...
//   consumer (WG 2)       (the same on query rows 64..127)
//
// - Ping-pong: the two consumer warp groups take turns issuing their GEMMs (named
//   barriers), so one group's softmax runs while the other's GEMMs hold the tensor cores;
//   each turn issues S_j = Q K_j^T together with P_{j-1} V_{j-1}.
//
// - Overlap inside a warp group: S_j and P_{j-1} V_{j-1} are two commit groups; the
//   softmax of S_j waits only for the first (wgmma.wait_group 1) and runs while the
//   second still accumulates into O. O's rescale and P_j's packing wait for the second.
//
// What it still does badly: every block starts from an empty pipeline (one block per
// (work item, kv head), not a persistent grid); the output is written from registers
// (4-byte stores), not through shared memory and a TMA store; ragged K/V only.
#pragma once

#include <cuda/ptx>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "04_tensor_core/prefill_attention.cuh"  // exp2_approx
#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/mma.cuh"

namespace flashstep::stages::hopper {

/// Tile sizes and the shared-memory plan of one instantiation.
template <typename T, int HEAD_DIM>
struct HopperTraits {
  static constexpr int Br = 128;          ///< packed query rows per unit: 64 per consumer warp group
  static constexpr int Bc = 128;          ///< keys per K/V tile
  static constexpr int kStages = 2;       ///< K/V buffers in the ring
  static constexpr int kQBuffers = 2;     ///< Q buffers: the next unit's Q lands while this one runs
  static constexpr int kConsumers = 2;    ///< consumer warp groups
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kBlockCols = 64;   ///< elements per 128-byte swizzled row
  static constexpr int kColBlocks = HEAD_DIM / kBlockCols;
  static constexpr uint32_t kQBytes = Br * HEAD_DIM * sizeof(T);
  static constexpr uint32_t kKVBytes = Bc * HEAD_DIM * sizeof(T);  ///< one K (or V) tile
  // [Q0][Q1][K0][V0][K1][V1][barriers][unit slots], each tile 1024-byte aligned (the swizzle atom)
  static constexpr uint32_t kKVOffset = kQBuffers * kQBytes;
  static constexpr uint32_t kBarrierOffset = kKVOffset + 2 * kStages * kKVBytes;
  static constexpr int kBarriers = 4 * kQBuffers + 4 * kStages;  // q/unit full+empty, k/v full+empty
  static constexpr uint32_t kUnitOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr size_t smem_bytes() { return 1024 + kUnitOffset + 4 * kQBuffers; }
  static_assert(HEAD_DIM % kBlockCols == 0, "head_dim must be a multiple of 64");
};

/// What the kernel reads. The three tensor maps describe q (nnz_qo, Hq, D), k and v
/// (nnz_kv, Hkv, D) as 3-D tensors (D, heads, tokens) with boxes of 64 x heads x tokens.
struct HopperParams {
  CUtensorMap q_map;  ///< box (64, group, Br / group): one 64-column block of a packed query tile
  CUtensorMap k_map;  ///< box (64, 1, Bc)
  CUtensorMap v_map;  ///< box (64, 1, Bc)
  const int32_t* qo_indptr = nullptr;        ///< (batch_size + 1)
  const int32_t* kv_indptr = nullptr;        ///< (batch_size + 1) token offsets
  const int32_t* request_indices = nullptr;  ///< (num_items): request of work item i
  const int32_t* qo_tile_indices = nullptr;  ///< (num_items): query tile of work item i
  int* unit_counter = nullptr;               ///< zero before the launch: units taken past the first wave
  int num_units = 0;                         ///< num_items x num_kv_heads
  void* o = nullptr;                         ///< (nnz_qo, Hq, D), T
  float* lse = nullptr;                      ///< (nnz_qo, Hq), natural log
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int group_size = 1;       ///< Hq / Hkv, divides Br: the packed rows of a token
  bool causal = false;      ///< bottom-right aligned
  float score_scale = 0.f;  ///< sm_scale * log2(e): q.k to base-2 logits
};

namespace detail {

namespace ptx = cuda::ptx;

__device__ __forceinline__ void wait_barrier(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

/// The work of one block: a request's query tile against its keys, for one kv head.
struct Tile {
  int request, qo_begin, qo_len, kv_begin, kv_len;
  int row_begin;  ///< first packed row of the tile: token row_begin / group, head row_begin % group
  int num_kv_tiles;
};

template <int Br, int Bc>
__device__ __forceinline__ Tile make_tile(const HopperParams& p, int item) {
  Tile t;
  t.request = p.request_indices[item];
  t.qo_begin = p.qo_indptr[t.request];
  t.qo_len = p.qo_indptr[t.request + 1] - t.qo_begin;
  t.kv_begin = p.kv_indptr[t.request];
  t.kv_len = p.kv_indptr[t.request + 1] - t.kv_begin;
  t.row_begin = p.qo_tile_indices[item] * Br;
  int kv_end = t.kv_len;
  if (p.causal) {
    // the tile's last query token sees keys up to token + (kv_len - qo_len)
    const int last_token = min(t.row_begin + Br, t.qo_len * p.group_size) / p.group_size - 1;
    kv_end = min(kv_end, last_token + t.kv_len - t.qo_len + 1);
  }
  t.num_kv_tiles = kv_end > 0 ? (kv_end + Bc - 1) / Bc : 0;
  return t;
}


/// Consumer warp groups take turns issuing their GEMMs (ping-pong): consumer c waits on
/// named barrier 1 + c until the other has issued its own, and after issuing lets the
/// other go. While one group's GEMMs run on the tensor cores, the other does its softmax.
/// (bar.sync / bar.arrive with a barrier id: no C++ API, one line of PTX each.)
__device__ __forceinline__ void wait_turn(int consumer) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(1 + consumer) : "memory");
}
__device__ __forceinline__ void pass_turn(int consumer) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - consumer) : "memory");
}

/// S = Q K^T for this warp group's 64 rows: HEAD_DIM / 16 k-steps of wgmma, both operands
/// K-major in 128-byte swizzled column blocks of 64 (a k-step further: 32 bytes further).
template <typename T, int HEAD_DIM, int Br, int Bc>
__device__ __forceinline__ void issue_scores(float (&sc)[Bc / 2], const T* q_rows, const T* k_tile) {
  constexpr int kCols = 64;
#pragma unroll
  for (int c = 0; c < HEAD_DIM / kCols; ++c)
#pragma unroll
    for (int k = 0; k < kCols / 16; ++k)
      wgmma_ss<T, Bc>(sc, smem_descriptor(q_rows + c * Br * kCols + k * 16, 16),
                      smem_descriptor(k_tile + c * Bc * kCols + k * 16, 16), c + k > 0);
}

/// O += P V: Bc / 16 k-steps of 16 keys; P from registers, V MN-major (a 128-byte row
/// holds 64 of O's columns; the next 64 columns are Bc rows further).
template <typename T, int HEAD_DIM, int Bc>
__device__ __forceinline__ void issue_pv(float (&o)[HEAD_DIM / 2], const uint32_t (&a)[Bc / 16][4], const T* v_tile) {
  constexpr int kCols = 64;
#pragma unroll
  for (int k = 0; k < Bc / 16; ++k)
    wgmma_rs<T, HEAD_DIM>(o, a[k], smem_descriptor(v_tile + k * 16 * kCols, Bc * kCols * sizeof(T)), 1);
}

/// -inf for keys past kv_len and (causal) keys after the row's position q_pos[h].
template <int Bc>
__device__ __forceinline__ void mask_scores(float (&sc)[Bc / 2], int key0, int kv_len, bool causal,
                                            const int (&q_pos)[2], int lane) {
#pragma unroll
  for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + 8 * n + 2 * (lane % 4) + e;
        if (key >= kv_len || (causal && key > q_pos[h])) sc[4 * n + 2 * h + e] = -INFINITY;
      }
}

/// The online softmax on one tile of scores, in base 2, without touching O (which the
/// previous tile's P V may still be accumulating into):
///   m_new = max(m, rowmax(S) * scale);  P = exp2(S * scale - m_new);
///   alpha = exp2(m - m_new);  l = l * alpha + rowsum(P).
/// A row's max is shared by the four threads of a quad (shuffles); l stays per thread
/// until the end. sc holds P afterwards; rescale_output applies alpha to O once the
/// previous P V has landed.
template <int Bc>
__device__ __forceinline__ void online_softmax(float (&sc)[Bc / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                               float scale) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < Bc / 8; ++n) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * h], sc[4 * n + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx * scale);
    // a row that has seen no key yet keeps m = -inf: subtract 0 instead, so exp2 gives 0, not NaN
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = tensor_core::exp2_approx(m[h] - m_use);
    m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < Bc / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[4 * n + 2 * h + e];
        x = tensor_core::exp2_approx(fmaf(x, scale, -m_use));
        sum += x;
      }
    l[h] = l[h] * alpha[h] + sum;
  }
}

/// O *= alpha, row by row: O moves to the new running max before P_j V_j is added.
template <int HEAD_DIM>
__device__ __forceinline__ void rescale_output(float (&o)[HEAD_DIM / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * n + 2 * h] *= alpha[h];
      o[4 * n + 2 * h + 1] *= alpha[h];
    }
}

/// P (fp32 accumulator layout) as wgmma A fragments: k-step k covers keys 16k..16k+15,
/// which are accumulator column blocks 2k and 2k+1 (the mma.sync A layout).
template <typename T, int Bc>
__device__ __forceinline__ void pack_p(const float (&sc)[Bc / 2], uint32_t (&a)[Bc / 16][4]) {
#pragma unroll
  for (int k = 0; k < Bc / 16; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = kernels::pack2<T>(sc[8 * k + 2 * r], sc[8 * k + 2 * r + 1]);
}

}  // namespace detail

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(HopperTraits<T, HEAD_DIM>::kThreads, 1)
    hopper_attention_kernel(const __grid_constant__ HopperParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  namespace ptx = cuda::ptx;
  using Tr = HopperTraits<T, HEAD_DIM>;
  constexpr int Br = Tr::Br, Bc = Tr::Bc, kStages = Tr::kStages, kQBuffers = Tr::kQBuffers, kCols = Tr::kBlockCols;
  extern __shared__ unsigned char smem_raw[];
  // the 128-byte swizzle repeats every 1024 bytes: tiles start on that boundary
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  auto q_smem = [&](int b) { return reinterpret_cast<T*>(smem + b * Tr::kQBytes); };
  auto k_smem = [&](int s) { return reinterpret_cast<T*>(smem + Tr::kKVOffset + 2 * s * Tr::kKVBytes); };
  auto v_smem = [&](int s) { return reinterpret_cast<T*>(smem + Tr::kKVOffset + (2 * s + 1) * Tr::kKVBytes); };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + Tr::kBarrierOffset);  // [kQBuffers]: Q landed
  uint64_t* q_empty = q_full + kQBuffers;       // [kQBuffers]: both consumers done with Q (its last S)
  uint64_t* unit_full = q_empty + kQBuffers;    // [kQBuffers]: the unit's number is in its slot
  uint64_t* unit_empty = unit_full + kQBuffers; // [kQBuffers]: both consumers have read it
  uint64_t* k_full = unit_empty + kQBuffers;    // [kStages]: K tile landed
  uint64_t* v_full = k_full + kStages;          // [kStages]: V tile landed
  uint64_t* k_empty = v_full + kStages;         // [kStages]: both consumers done with the K tile
  uint64_t* v_empty = k_empty + kStages;        // [kStages]: both consumers done with the V tile
  int* unit_slot = reinterpret_cast<int*>(smem + Tr::kUnitOffset);  // [kQBuffers]: unit number, -1 = done
  constexpr uint32_t kConsumerWarps = Tr::kConsumers * 4;            // one arrival per consumer warp

  const int warp_group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int b = 0; b < kQBuffers; ++b) {
      ptx::mbarrier_init(&q_full[b], 1);
      ptx::mbarrier_init(&q_empty[b], kConsumerWarps);
      ptx::mbarrier_init(&unit_full[b], 1);
      ptx::mbarrier_init(&unit_empty[b], kConsumerWarps);
    }
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&k_full[s], 1);
      ptx::mbarrier_init(&v_full[s], 1);
      ptx::mbarrier_init(&k_empty[s], kConsumerWarps);
      ptx::mbarrier_init(&v_empty[s], kConsumerWarps);
    }
    // make the initialised barriers visible to the copy engine (the async proxy)
    ptx::fence_proxy_async(ptx::space_shared);
  }
  __syncthreads();

  // Persistent: one block per multiprocessor. Its first unit is blockIdx.x; each next one
  // is taken from a counter when the producer has issued the last copy of the current
  // one, so units (longest first in plan()'s list) go to whichever block frees up first.
  // Unit u is work item u / num_kv_heads for kv head u % num_kv_heads. The n-th unit of a
  // block uses Q buffer and unit slot n % 2; the K/V ring and every barrier's phase run
  // on across units.
  if (warp_group == 0) {
    // ---- producer: hand its registers to the consumers, then one thread issues every copy.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");  // no C++ API for setmaxnreg
    if (threadIdx.x != 0) return;
    int tile_count = 0;  // K/V tiles loaded so far: tile g goes to stage g % kStages
    for (int n = 0, u = blockIdx.x;; ++n) {
      const int b = n % kQBuffers;
      const uint32_t reuse_parity = ((n / kQBuffers) - 1) & 1;  // the phase of the slot's previous use
      if (n >= kQBuffers) detail::wait_barrier(&unit_empty[b], reuse_parity);
      unit_slot[b] = u < p.num_units ? u : -1;
      ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &unit_full[b]);
      if (u >= p.num_units) break;
      const int item = u / p.num_kv_heads, kv_head = u % p.num_kv_heads;
      const detail::Tile t = detail::make_tile<Br, Bc>(p, item);
      // Q: the unit's Br packed rows = Br / group tokens x group heads of this kv head
      if (n >= kQBuffers) detail::wait_barrier(&q_empty[b], reuse_parity);
      const int32_t token0 = t.qo_begin + t.row_begin / p.group_size;
      ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &q_full[b], uint32_t{Tr::kQBytes});
      for (int c = 0; c < Tr::kColBlocks; ++c) {
        const int32_t coords[3] = {c * kCols, kv_head * p.group_size, token0};
        ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, q_smem(b) + c * Br * kCols, &p.q_map, coords,
                                  &q_full[b]);
      }
      // K_j and V_j into the next stage of the ring, each once the consumers freed it
      // (a K tile after its S, a V tile after its P V, one turn later).
      for (int j = 0; j < t.num_kv_tiles; ++j, ++tile_count) {
        const int s = tile_count % kStages, fill = tile_count / kStages;
        const int32_t key0 = t.kv_begin + j * Bc;
        if (fill > 0) detail::wait_barrier(&k_empty[s], (fill - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &k_full[s], uint32_t{Tr::kKVBytes});
        for (int c = 0; c < Tr::kColBlocks; ++c) {
          const int32_t coords[3] = {c * kCols, kv_head, key0};
          ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, k_smem(s) + c * Bc * kCols, &p.k_map,
                                    coords, &k_full[s]);
        }
        if (fill > 0) detail::wait_barrier(&v_empty[s], (fill - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &v_full[s], uint32_t{Tr::kKVBytes});
        for (int c = 0; c < Tr::kColBlocks; ++c) {
          const int32_t coords[3] = {c * kCols, kv_head, key0};
          ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, v_smem(s) + c * Bc * kCols, &p.v_map,
                                    coords, &v_full[s]);
        }
      }
      u = gridDim.x + atomicAdd(p.unit_counter, 1);
    }
    return;
  }

  // ---- consumers: warp group 1 owns rows 0..63 of each unit, warp group 2 rows 64..127.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");  // no C++ API for setmaxnreg
  const int consumer = warp_group - 1;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  if (consumer == 1) detail::pass_turn(consumer);  // consumer 0 issues first
  int tile_count = 0;                              // as the producer's: K/V tile g is in stage g % kStages

  for (int n = 0;; ++n) {
    const int b = n % kQBuffers;
    const uint32_t parity = (n / kQBuffers) & 1;
    detail::wait_barrier(&unit_full[b], parity);
    const int u = unit_slot[b];
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(&unit_empty[b]);
    if (u < 0) break;
    const int item = u / p.num_kv_heads, kv_head = u % p.num_kv_heads;
    const detail::Tile t = detail::make_tile<Br, Bc>(p, item);
    const int n_tiles = t.num_kv_tiles;
    // this thread's two accumulator rows (h = 0, 1) within the unit, and their tokens'
    // positions among the keys (for the causal mask)
    int row[2], q_pos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row[h] = consumer * 64 + warp * 16 + lane / 4 + 8 * h;
      q_pos[h] = (t.row_begin + row[h]) / p.group_size + t.kv_len - t.qo_len;
    }
    // the smallest position in the unit: a tile of keys wholly at or below it needs no causal mask
    const int first_pos = t.row_begin / p.group_size + t.kv_len - t.qo_len;

    float o[HEAD_DIM / 2];
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};  // running max of the base-2 logits, per row
    float l[2] = {0.f, 0.f};              // running sum of exp2(logit - m), this thread's columns
    float alpha[2];                       // exp2(m_old - m_new) of the last softmax
    float sc[Bc / 2];                     // S_j, then P_j
    uint32_t a[Bc / 16][4];               // P_j as wgmma A fragments, read by the next turn's P V

    detail::wait_barrier(&q_full[b], parity);
    const T* q_rows = q_smem(b) + consumer * 64 * kCols;  // this warp group's 64 rows in each column block

    // One turn per key tile j: issue S_j = Q K_j^T and P_{j-1} V_{j-1} as two commit
    // groups, let the other group issue, then overlap within the warp group: the softmax
    // of S_j starts as soon as S_j lands (wgmma.wait_group 1), while P_{j-1} V_{j-1} still
    // runs (and the other group's GEMMs after it); O is rescaled and P_j packed only once
    // that P V has landed (wait_group 0), since both read or write registers it still
    // uses. Turn 0 has no P V yet and a last turn n issues P_{n-1} V_{n-1} alone; peeled,
    // so each turn's wgmma are one straight run of instructions. Q is free after the last S.
    auto softmax_of = [&](int j) {
      const int key0 = j * Bc;
      if (key0 + Bc > t.kv_len || (p.causal && key0 + Bc - 1 > first_pos))
        detail::mask_scores<Bc>(sc, key0, t.kv_len, p.causal, q_pos, lane);
      detail::online_softmax<Bc>(sc, m, l, alpha, p.score_scale);
    };
    if (n_tiles > 0) {
      const int s = tile_count % kStages;
      detail::wait_barrier(&k_full[s], (tile_count / kStages) & 1);
      detail::wait_turn(consumer);
      wgmma_fence();
      detail::issue_scores<T, HEAD_DIM, Br, Bc>(sc, q_rows, k_smem(s));
      wgmma_commit();
      detail::pass_turn(consumer);
      wgmma_wait<0>();
      wgmma_fence_operands(sc);
      if (lane == 0) {  // this warp is done reading K_0 (and Q, if it was the only tile)
        ptx::mbarrier_arrive(&k_empty[s]);
        if (n_tiles == 1) ptx::mbarrier_arrive(&q_empty[b]);
      }
      softmax_of(0);  // O is still zero: nothing to rescale
      detail::pack_p<T, Bc>(sc, a);
    } else if (lane == 0) {
      ptx::mbarrier_arrive(&q_empty[b]);  // no keys to see: Q is not read
    }
    for (int j = 1; j < n_tiles; ++j) {
      const int g = tile_count + j, s = g % kStages, prev = (g - 1) % kStages;
      detail::wait_barrier(&k_full[s], (g / kStages) & 1);
      detail::wait_barrier(&v_full[prev], ((g - 1) / kStages) & 1);
      detail::wait_turn(consumer);
      wgmma_fence();
      detail::issue_scores<T, HEAD_DIM, Br, Bc>(sc, q_rows, k_smem(s));
      wgmma_commit();
      detail::issue_pv<T, HEAD_DIM, Bc>(o, a, v_smem(prev));
      wgmma_commit();
      detail::pass_turn(consumer);
      wgmma_wait<1>();  // S_j has landed; P_{j-1} V_{j-1} may still run
      wgmma_fence_operands(sc);
      if (lane == 0) {  // this warp is done reading K_j (and Q after the last S)
        ptx::mbarrier_arrive(&k_empty[s]);
        if (j == n_tiles - 1) ptx::mbarrier_arrive(&q_empty[b]);
      }
      softmax_of(j);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} has landed: O and the A fragments are free
      wgmma_fence_operands(o);
      if (lane == 0) ptx::mbarrier_arrive(&v_empty[prev]);  // ... and done reading V_{j-1}
      detail::rescale_output<HEAD_DIM>(o, alpha);
      detail::pack_p<T, Bc>(sc, a);
    }
    if (n_tiles > 0) {
      const int g = tile_count + n_tiles - 1, last = g % kStages;
      detail::wait_barrier(&v_full[last], (g / kStages) & 1);
      detail::wait_turn(consumer);
      wgmma_fence();
      detail::issue_pv<T, HEAD_DIM, Bc>(o, a, v_smem(last));
      wgmma_commit();
      detail::pass_turn(consumer);
      wgmma_wait<0>();
      wgmma_fence_operands(o);
      if (lane == 0) ptx::mbarrier_arrive(&v_empty[last]);
    }
    tile_count += n_tiles;

    // ---- epilogue: O / l and lse = (m + log2 l) ln 2 for every row the unit owns (the
    // producer is already loading the next unit's Q and K/V meanwhile)
    T* out = static_cast<T*>(p.o);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int packed = t.row_begin + row[h];
      if (packed >= t.qo_len * p.group_size) continue;
      const int token = t.qo_begin + packed / p.group_size;
      const int head = kv_head * p.group_size + packed % p.group_size;
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      T* o_row = out + (int64_t(token) * p.num_qo_heads + head) * HEAD_DIM;
#pragma unroll
      for (int i = 0; i < HEAD_DIM / 8; ++i) {
        const int col = 8 * i + 2 * (lane % 4);
        *reinterpret_cast<uint32_t*>(o_row + col) = kernels::pack2<T>(o[4 * i + 2 * h] * inv, o[4 * i + 2 * h + 1] * inv);
      }
      if (lane % 4 == 0)
        p.lse[int64_t(token) * p.num_qo_heads + head] = sum > 0.f ? (m[h] + log2f(sum)) * 0.69314718055994531f : -INFINITY;
    }
  }
  // consumer 1's first pass_turn has no turn of consumer 0 to match: take it
  if (consumer == 0) detail::wait_turn(consumer);
#endif
}

}  // namespace flashstep::stages::hopper
