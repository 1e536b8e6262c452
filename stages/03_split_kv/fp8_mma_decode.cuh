/// \file fp8_mma_decode.cuh
/// \brief Stage 03's decode of an FP8 page pool on the tensor cores: the same work items
/// and partial rows as chunk_decode.cuh, with q . k and p v done by mma.sync instead of
/// one fused multiply-add per element and query head.
///
/// Why a second kernel. On an FP8 pool the CUDA-core loop of chunk_decode.cuh runs out of
/// instruction issue before it runs out of bytes (the chapter's "Why: instructions, not
/// bytes"): a byte of e4m3 carries one element, and each element costs a widening plus one
/// multiply-add per query head of the group. Here the tensor cores take the multiply-adds,
/// and what is left per element is the widening: one instruction per two elements.
///
/// **The two products, with the keys on the M side.** A decode has one query row per
/// head, so a group of G <= 8 query heads is an n8 operand, and the keys fill M:
///
///     S^T (16 keys x 8 heads)  = K   (16 keys x D)       Q^T (D x 8 heads)      D / 16 MMAs
///     O^T (D x 8 heads)       += V^T (D x 16 keys)       P^T (16 keys x 8 heads)  D / 16 MMAs
///
/// Every accumulator holds heads 2t and 2t+1 in lane group t (mma.cuh's C fragment), in
/// S^T and O^T alike, so each lane rescales its own output columns with its own heads'
/// maxima. P^T, the B operand of the second product, is S^T's C fragment transposed:
/// one movmatrix per 8 keys turns "row g = key g, columns = heads" into "column g = head
/// g, rows = keys".
///
/// **Free permutations instead of shuffles.** A dot product does not care in which order
/// its terms come, so the contraction index of each MMA may be any permutation of the
/// real one, as long as both operands use the same:
///   - S^T: lane (g, t) holds dims 32t .. 32t+31 of key rows g and g+8 (two 16-byte
///     shared-memory reads a row); k-step s takes dims 32t+4s .. 32t+4s+3 of that run as
///     the fragment's k-slots 2t, 2t+1, 2t+8, 2t+9. Q^T's B fragment is loaded with the
///     same assignment, once per block;
///   - O^T: the contraction is over keys and the M side is dims. Lane (g, t) reads the
///     16 bytes of dims 16g .. 16g+15 of the four keys 2t, 2t+1, 2t+8, 2t+9 it needs, and
///     one byte permute per 4 bytes pairs two keys' bytes of the same dim, which is
///     exactly an A-fragment register of V^T. M-tile i's row g is dim 16g + 2i, row g+8
///     is dim 16g + 2i + 1.
/// FP8 has no transposing shared-memory read (ldmatrix.trans moves 16-bit elements), so
/// the byte permutes are V's transpose.
///
/// **Precision.** FP8 values are fp16 values, so K and V widen exactly to fp16 (the
/// toolkit's cvt for e4m3, a byte permute for e5m2) and the MMAs are fp16 x fp16 with
/// fp32 accumulation. q is fp16 or bf16: it is multiplied by 2^-e, a power of two chosen
/// per block from the group's largest |q| so that it lands below 2^15, then rounded to
/// fp16 — exact for every fp16 value and for every bf16 value within 2^29 of the largest
/// (a bf16 significand has 8 bits, fp16's 11); 2^e goes back into the score scale, with
/// sm_scale, k_scale and log2(e). P is rounded to fp16 for the second product, as stage
/// 04 rounds it to the operand type; the row sums use the fp32 values.
///
/// **Softmax.** Each warp keeps its own running max and sum per head (its keys are a
/// quarter of every tile), merged across the 4 warps at the end as chunk_decode.cuh
/// merges its token groups. The running max moves only when a new score exceeds it by
/// more than 8 (base 2): until then the probabilities are at most 2^8, well inside fp16
/// and fp32, and the 32 rescaling multiplies of the output are skipped — in a long chunk
/// nearly every tile.
///
/// **Pipeline.** A tile is 16 keys per warp (64 keys, K then V, 16 KB for head_dim 128),
/// copied by cp.async into `num_stages` stages with the XOR swizzle of mma.cuh (chunk c of
/// key row r at chunk c ^ (r % 8)), so both read patterns above touch 32 different banks.
/// The page ids of the next tile are read one tile ahead.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "03_split_kv/chunk_decode.cuh"
#include "flashstep/kernels/cp_async.cuh"
#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::stages::split_kv {

/// Compile-time shape of fp8_mma_decode_kernel.
template <int HEAD_DIM>
struct Fp8MmaTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int KEYS_PER_WARP = 16;             ///< one m16 tile of S^T per warp and tile
  static constexpr int TILE = kWarps * KEYS_PER_WARP;  ///< keys per pipeline stage
  static constexpr int CHUNKS = HEAD_DIM / 16;         ///< 16-byte chunks of one FP8 row
  static constexpr int KSTEPS = HEAD_DIM / 16;         ///< k-steps of S^T, m-tiles of O^T
  static constexpr int MAX_GROUP = 8;                  ///< query heads per kv head (the n8 operand)
  static constexpr int STAGE_BYTES = 2 * TILE * HEAD_DIM;
  static constexpr int ROWS_PER_PASS = kThreads / CHUNKS;  ///< key rows one copy pass covers
  static constexpr int PASSES = TILE / ROWS_PER_PASS;      ///< copy passes per tile (K and V each)
  static_assert(HEAD_DIM == 128, "the lane assignment above is written for head_dim 128 (8 chunks a row)");
  static_assert(TILE % ROWS_PER_PASS == 0, "a tile must be whole copy passes");

  /// Bytes of the merge buffers: each warp's o (MAX_GROUP x D fp32), m and sum per head.
  static constexpr size_t merge_bytes() { return size_t(kWarps) * MAX_GROUP * (HEAD_DIM + 2) * sizeof(float); }
  /// Dynamic shared memory of a launch with `num_stages` stages.
  static constexpr size_t smem_bytes(int num_stages) {
    const size_t pipeline = size_t(num_stages) * STAGE_BYTES;
    return pipeline > merge_bytes() ? pipeline : merge_bytes();
  }
};

namespace fp8_mma_detail {

/// The transpose of an 8x8 matrix of 16-bit elements held as one register per lane (row
/// lane / 4, columns 2 (lane % 4) and +1). PTX movmatrix; no CUDA API wraps it.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/// Two FP8 elements (the low or high 16 bits of w) as an fp16 pair, exactly.
template <typename KV>
__device__ __forceinline__ uint32_t widen2(uint32_t w, bool high) {
  constexpr __nv_fp8_interpretation_t kFormat = std::is_same_v<KV, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
  return kernels::detail::fp8x2_to_half2_bits<kFormat>(w, high);
}

__device__ __forceinline__ uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

}  // namespace fp8_mma_detail

/// Decode attention of one work item on an FP8 pool, on the tensor cores: block (kv head,
/// k) computes the group_size (<= 8) query heads of that kv head over the keys of work item
/// k's chunk and writes their normalized state to partial row k (partition_kv) or to the
/// request's o and lse — chunk_decode_kernel's contract, for head_dim 128.
/// grid = (num_kv_heads, padded_batch_size), Fp8MmaTraits::kThreads threads, dynamic
/// shared memory Fp8MmaTraits::smem_bytes(p.num_stages).
/// \tparam T element type of q and o (__half or __nv_bfloat16)
/// \tparam KV __nv_fp8_e4m3 or __nv_fp8_e5m2
template <typename T, typename KV, int HEAD_DIM>
__global__ void __launch_bounds__(Fp8MmaTraits<HEAD_DIM>::kThreads) fp8_mma_decode_kernel(
    const ChunkDecodeParams<T, KV> p) {
  using Tr = Fp8MmaTraits<HEAD_DIM>;
  using namespace fp8_mma_detail;
  extern __shared__ __align__(128) uint8_t smem[];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // as chunk_decode_kernel: the merge may be scheduled early
#endif

  // ---- which work item (padding of a graph-sized grid exits here).
  const int kv_head = blockIdx.x, item = blockIdx.y;
  const uint8_t valid_item = p.block_valid_mask[item];
  const int b = p.request_indices[item];
  const int32_t page_begin = p.kv_page_begin[item];
  const int len = p.kv_chunk_len[item];
  if (!valid_item) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma.cuh's row group and place in it
  const int G = p.group_size;

  // ---- Q^T's B fragments: lane (g, t) holds head g's dims 32t .. 32t+31 (zero past the
  // group), scaled by 2^-e into fp16's range; every warp loads the same (L1 hits).
  float qf[32];
  {
    const int64_t row = int64_t{b} * p.num_qo_heads + int64_t{kv_head} * G + g;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      if (g < G) {
        kernels::Vec16<T> qv;
        qv.load(p.q + row * HEAD_DIM + 32 * t + 8 * v);
        qv.to_float(&qf[8 * v]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[8 * v + e] = 0.f;
      }
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int e = 0; e < 32; ++e) amax = fmaxf(amax, fabsf(qf[e]));
#pragma unroll
  for (int x = 16; x >= 1; x /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
  int e2 = 0;  // amax < 2^e2 after frexp
  if (amax > 0.f && amax <= 3.4e38f) frexpf(amax, &e2);
  const int shift = min(max(e2 - 15, -100), 113);  // q * 2^-shift < 2^15
  const float down = ldexpf(1.f, -shift);
  const float scale = p.sm_scale_log2 * ldexpf(1.f, shift);  // base-2 score of one q_f16 . k unit
  uint32_t qb[Tr::KSTEPS][2];
#pragma unroll
  for (int s = 0; s < Tr::KSTEPS; ++s) {
    qb[s][0] = kernels::pack2<__half>(qf[4 * s] * down, qf[4 * s + 1] * down);
    qb[s][1] = kernels::pack2<__half>(qf[4 * s + 2] * down, qf[4 * s + 3] * down);
  }

  // ---- this warp's running state: heads 2t and 2t+1 (base-2 max, lane-partial sum), and
  // O^T's accumulators: o[i] = {(dim 16g+2i, head 2t), (.., 2t+1), (dim 16g+2i+1, 2t), (.., 2t+1)}.
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  float o[Tr::KSTEPS][4];
#pragma unroll
  for (int i = 0; i < Tr::KSTEPS; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

  // ---- the copies: thread tid copies chunk tid % CHUNKS of rows tid / CHUNKS + pass *
  // ROWS_PER_PASS, of K and of V, for every tile.
  const uint8_t* pool = reinterpret_cast<const uint8_t*>(p.kv.pool);
  const int copy_chunk = threadIdx.x % Tr::CHUNKS, copy_row = threadIdx.x / Tr::CHUNKS;
  const int num_tiles = (len + Tr::TILE - 1) / Tr::TILE;
  const int S = p.num_stages;
  int64_t src[Tr::PASSES];  // byte offset of this thread's K chunk of the next tile to issue, -1: past the chunk
  auto fetch = [&](int tile) {
#pragma unroll
    for (int r = 0; r < Tr::PASSES; ++r) {
      const int tok = tile * Tr::TILE + r * Tr::ROWS_PER_PASS + copy_row;
      src[r] = -1;
      if (tok < len) {
        uint32_t page_iter, slot;
        p.kv.page_size.divmod(static_cast<uint32_t>(tok), page_iter, slot);
        src[r] = p.kv.offset(p.kv.kv_indices[page_begin + page_iter], slot, kv_head) + copy_chunk * 16;
      }
    }
  };
  auto issue = [&](int stage) {
    uint8_t* base = smem + stage * Tr::STAGE_BYTES;
#pragma unroll
    for (int r = 0; r < Tr::PASSES; ++r) {
      const int row = r * Tr::ROWS_PER_PASS + copy_row;
      uint8_t* dst = base + row * HEAD_DIM + ((copy_chunk ^ (row & 7)) << 4);
      const bool ok = src[r] >= 0;
      const uint8_t* from = pool + (ok ? src[r] : 0);
      kernels::cp_async_16(dst, from, ok);  // rows past the chunk are zero-filled
      kernels::cp_async_16(dst + Tr::TILE * HEAD_DIM, from + (ok ? p.kv.stride_kv : 0), ok);
    }
  };

  // ---- one tile: S^T, the softmax update, O^T += V^T P^T (this warp's 16 keys).
  auto compute = [&](int stage, int tile_start) {
    const uint8_t* ks = smem + stage * Tr::STAGE_BYTES;
    const uint8_t* vs = ks + Tr::TILE * HEAD_DIM;
    const int r0 = warp * Tr::KEYS_PER_WARP + g;  // key rows r0 and r0 + 8 (both = g mod 8)
    uint32_t k0[8], k1[8];
    {
      const uint4 a = lds128(ks + r0 * HEAD_DIM + (((2 * t) ^ g) << 4));
      const uint4 bq = lds128(ks + r0 * HEAD_DIM + (((2 * t + 1) ^ g) << 4));
      const uint4 c = lds128(ks + (r0 + 8) * HEAD_DIM + (((2 * t) ^ g) << 4));
      const uint4 d = lds128(ks + (r0 + 8) * HEAD_DIM + (((2 * t + 1) ^ g) << 4));
      k0[0] = a.x, k0[1] = a.y, k0[2] = a.z, k0[3] = a.w, k0[4] = bq.x, k0[5] = bq.y, k0[6] = bq.z, k0[7] = bq.w;
      k1[0] = c.x, k1[1] = c.y, k1[2] = c.z, k1[3] = c.w, k1[4] = d.x, k1[5] = d.y, k1[6] = d.z, k1[7] = d.w;
    }
    float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int st = 0; st < Tr::KSTEPS; ++st) {
      const uint32_t a[4] = {widen2<KV>(k0[st], false), widen2<KV>(k1[st], false), widen2<KV>(k0[st], true),
                             widen2<KV>(k1[st], true)};
      kernels::mma_m16n8k16<__half>(s, a, qb[st][0], qb[st][1]);
    }
    // s: (key r0, head 2t), (key r0, 2t+1), (key r0+8, 2t), (key r0+8, 2t+1); keys past the chunk masked
    const int key0 = tile_start + r0;
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j] = (key0 + (j / 2) * 8 < len) ? s[j] * scale : -INFINITY;
    float mx[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
#pragma unroll
    for (int x = 4; x <= 16; x *= 2) {
      mx[0] = fmaxf(mx[0], __shfl_xor_sync(0xffffffffu, mx[0], x));
      mx[1] = fmaxf(mx[1], __shfl_xor_sync(0xffffffffu, mx[1], x));
    }
    // Move the max only when a score passes it by more than 2^8 (or on the first keys).
    const bool grow = mx[0] > m[0] + 8.f || mx[1] > m[1] + 8.f;
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mn = fmaxf(m[h], mx[h]);
        const float alpha = (m[h] == -INFINITY) ? 0.f : exp2f(m[h] - mn);
        m[h] = mn;
        l[h] *= alpha;
#pragma unroll
        for (int i = 0; i < Tr::KSTEPS; ++i) o[i][h] *= alpha, o[i][h + 2] *= alpha;
      }
    }
    const float m0 = m[0] == -INFINITY ? 0.f : m[0], m1 = m[1] == -INFINITY ? 0.f : m[1];
    const float p0 = exp2f(s[0] - m0), p1 = exp2f(s[1] - m1), p2 = exp2f(s[2] - m0), p3 = exp2f(s[3] - m1);
    l[0] += p0 + p2;
    l[1] += p1 + p3;
    // P^T's B fragment: rows (keys) 2t, 2t+1 / 2t+8, 2t+9 of column (head) g.
    const uint32_t pb0 = movmatrix_trans(kernels::pack2<__half>(p0, p1));
    const uint32_t pb1 = movmatrix_trans(kernels::pack2<__half>(p2, p3));
    // V^T's A fragments: keys 2t, 2t+1, 2t+8, 2t+9 of this warp's 16, dims 16g .. 16g+15.
    const int vr = warp * Tr::KEYS_PER_WARP + 2 * t;  // (vr & 7) == 2t
    const uint4 va = lds128(vs + vr * HEAD_DIM + ((g ^ (2 * t)) << 4));
    const uint4 vb = lds128(vs + (vr + 1) * HEAD_DIM + ((g ^ (2 * t + 1)) << 4));
    const uint4 vc = lds128(vs + (vr + 8) * HEAD_DIM + ((g ^ (2 * t)) << 4));
    const uint4 vd = lds128(vs + (vr + 9) * HEAD_DIM + ((g ^ (2 * t + 1)) << 4));
    const uint32_t wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
    const uint32_t wc[4] = {vc.x, vc.y, vc.z, vc.w}, wd[4] = {vd.x, vd.y, vd.z, vd.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      // bytes (key 2t, key 2t+1) of dims 4w, 4w+1 (lo) and 4w+2, 4w+3 (hi), and of keys 2t+8, 2t+9
      const uint32_t x_lo = __byte_perm(wa[w], wb[w], 0x5140), x_hi = __byte_perm(wa[w], wb[w], 0x7362);
      const uint32_t y_lo = __byte_perm(wc[w], wd[w], 0x5140), y_hi = __byte_perm(wc[w], wd[w], 0x7362);
      const uint32_t a0[4] = {widen2<KV>(x_lo, false), widen2<KV>(x_lo, true), widen2<KV>(y_lo, false),
                              widen2<KV>(y_lo, true)};
      kernels::mma_m16n8k16<__half>(o[2 * w], a0, pb0, pb1);
      const uint32_t a1[4] = {widen2<KV>(x_hi, false), widen2<KV>(x_hi, true), widen2<KV>(y_hi, false),
                              widen2<KV>(y_hi, true)};
      kernels::mma_m16n8k16<__half>(o[2 * w + 1], a1, pb0, pb1);
    }
  };

  // ---- the pipeline, as attend_chunk's: S - 1 tiles in flight while one is computed.
  for (int st = 0; st < S - 1; ++st) {
    if (st < num_tiles) {
      fetch(st);
      issue(st);
    }
    kernels::cp_async_commit_group();
  }
  if (S - 1 < num_tiles) fetch(S - 1);
  int read_stage = 0, write_stage = S - 1;  // i % S and (i + S - 1) % S, without a division
  for (int i = 0; i < num_tiles; ++i) {
    kernels::cp_async_wait_group_dynamic(S - 2);
    __syncthreads();
    const int next = i + S - 1;
    if (next < num_tiles) issue(write_stage);
    kernels::cp_async_commit_group();
    if (next + 1 < num_tiles) fetch(next + 1);
    compute(read_stage, i * Tr::TILE);
    read_stage = read_stage + 1 == S ? 0 : read_stage + 1;
    write_stage = write_stage + 1 == S ? 0 : write_stage + 1;
  }
  kernels::cp_async_wait_group<0>();
  __syncthreads();  // the pipeline memory is free for the merge

  // ---- each warp's state to shared memory: m and the full sum per head, o per (head, dim).
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int x = 4; x <= 16; x *= 2) l[h] += __shfl_xor_sync(0xffffffffu, l[h], x);
  float* m_buf = reinterpret_cast<float*>(smem);     // [warp][MAX_GROUP]
  float* l_buf = m_buf + Tr::kWarps * Tr::MAX_GROUP;  // [warp][MAX_GROUP]
  float* o_buf = l_buf + Tr::kWarps * Tr::MAX_GROUP;  // [warp][MAX_GROUP][HEAD_DIM]
  if (g == 0) {
    m_buf[warp * Tr::MAX_GROUP + 2 * t] = m[0], m_buf[warp * Tr::MAX_GROUP + 2 * t + 1] = m[1];
    l_buf[warp * Tr::MAX_GROUP + 2 * t] = l[0], l_buf[warp * Tr::MAX_GROUP + 2 * t + 1] = l[1];
  }
#pragma unroll
  for (int i = 0; i < Tr::KSTEPS; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float* row = o_buf + (warp * Tr::MAX_GROUP + 2 * t + h) * HEAD_DIM + 16 * g + 2 * i;
      *reinterpret_cast<float2*>(row) = make_float2(o[i][h], o[i][h + 2]);
    }
  __syncthreads();

  // ---- merge the warps and write: 4 consecutive dims of one head per thread and pass.
  for (int e = 4 * threadIdx.x; e < G * HEAD_DIM; e += 4 * Tr::kThreads) {
    const int h = e / HEAD_DIM, d = e % HEAD_DIM;
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) mmax = fmaxf(mmax, m_buf[w * Tr::MAX_GROUP + h]);
    float sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float mw = m_buf[w * Tr::MAX_GROUP + h];
      const float f = (mw == -INFINITY) ? 0.f : exp2f(mw - mmax);
      sum += f * l_buf[w * Tr::MAX_GROUP + h];
      const float4 ow = *reinterpret_cast<const float4*>(o_buf + (w * Tr::MAX_GROUP + h) * HEAD_DIM + d);
      acc[0] += f * ow.x, acc[1] += f * ow.y, acc[2] += f * ow.z, acc[3] += f * ow.w;
    }
    const float inv = sum > 0.f ? p.v_scale / sum : 0.f;
    const float lse = sum > 0.f ? (mmax + log2f(sum)) * 0.69314718055994531f : -INFINITY;
    const int qo_head = kv_head * G + h;
    if (p.partition_kv) {
      const int64_t row = int64_t{item} * p.num_qo_heads + qo_head;
      *reinterpret_cast<float4*>(p.partial_o + row * HEAD_DIM + d) =
          make_float4(acc[0] * inv, acc[1] * inv, acc[2] * inv, acc[3] * inv);
      if (d == 0) p.partial_lse[row] = lse;
    } else {
      const int64_t row = int64_t{b} * p.num_qo_heads + qo_head;
      T* dst = p.o + row * HEAD_DIM + d;
      dst[0] = static_cast<T>(acc[0] * inv), dst[1] = static_cast<T>(acc[1] * inv);
      dst[2] = static_cast<T>(acc[2] * inv), dst[3] = static_cast<T>(acc[3] * inv);
      if (d == 0 && p.lse != nullptr) p.lse[row] = lse;
    }
  }
}

}  // namespace flashstep::stages::split_kv
