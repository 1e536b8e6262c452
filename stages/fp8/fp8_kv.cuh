/// \file fp8_kv.cuh
/// \brief An FP8 cache as a K/V format of stage 03's tensor-core decode
/// (03_split_kv/mma_decode.cuh): the kernel's body is the lesson's, and this policy says
/// how an e4m3 or e5m2 byte reaches the tensor cores. The chapter (README.md, "Stage
/// 03's tensor-core decode") draws the lanes.
///
/// **Widening.** FP8 values are fp16 values, so K and V widen exactly to fp16
/// (kernels/vec.cuh's fp8x2_to_half2_bits: the toolkit's cvt for e4m3, a byte permute for
/// e5m2) and the MMAs are fp16 x fp16 with fp32 accumulation. q is fp16 or bf16: it is
/// multiplied by 2^-e, a power of two chosen per block from the group's largest |q| so
/// that it lands below 2^15, then rounded to fp16 — exact for every fp16 value and for
/// every bf16 value within 2^29 of the largest (a bf16 significand has 8 bits, fp16's 11);
/// 2^e is the score unit the kernel folds into its scale.
///
/// **Free permutations instead of shuffles.** There is no ldmatrix of bytes, so the
/// fragments come from 16-byte shared-memory reads. A dot product does not care in which
/// order its terms come, so the contraction index of each MMA may be any permutation of
/// the real one, as long as both operands use the same:
///   - S^T: lane (g, t) holds dims 32t .. 32t+31 of key rows g and g+8 (two 16-byte
///     reads a row); k-step s takes dims 32t+4s .. 32t+4s+3 of that run as the fragment's
///     k-slots 2t, 2t+1, 2t+8, 2t+9. Q^T's B fragment is loaded with the same assignment;
///   - O^T: the contraction is over keys and the M side is dims. Lane (g, t) reads the
///     16 bytes of dims 16g .. 16g+15 of the four keys 2t, 2t+1, 2t+8, 2t+9 it needs, and
///     one byte permute per 4 bytes pairs two keys' bytes of the same dim, which is
///     exactly an A-fragment register of V^T. M-tile i's row g is dim 16g + 2i, row g+8
///     is dim 16g + 2i + 1 (o_dims).
///
/// The tile layout is the kernel's: key row r of a K or V tile at byte r * head_dim (one
/// byte an element), its 16-byte chunk c at chunk c ^ (r % 8).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::fp8 {

/// The K/V format of an FP8 pool (E = __nv_fp8_e4m3 or __nv_fp8_e5m2) for
/// mma_decode_kernel: the hooks of 03_split_kv/mma_decode.cuh's SameAsQ, for head_dim 128.
template <typename E>
struct Fp8KV {
  static_assert(std::is_same_v<E, __nv_fp8_e4m3> || std::is_same_v<E, __nv_fp8_e5m2>, "an FP8 element type");
  using Stored = E;        ///< the pool's element: one FP8 byte
  using Operand = __half;  ///< the MMAs' input type: every FP8 value is an fp16 value

  /// Two FP8 elements (the low or high 16 bits of w) as an fp16 pair, exactly.
  __device__ __forceinline__ static uint32_t widen2(uint32_t w, bool high) {
    constexpr __nv_fp8_interpretation_t kFormat = std::is_same_v<E, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    return kernels::detail::fp8x2_to_half2_bits<kFormat>(w, high);
  }
  /// One 16-byte shared-memory read.
  __device__ __forceinline__ static uint4 lds128(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

  /// Q^T's B fragments: lane (g, t) holds head g's dims 32t .. 32t+31 (zero where the group
  /// has no head g), scaled by 2^-e into fp16's range; `unit` = 2^e. Every lane of the
  /// warp takes part (the largest |q| is the warp's).
  template <int HEAD_DIM, typename Q>
  __device__ __forceinline__ static void q_fragments(const Q* q_row, bool has_head, int lane,
                                                     uint32_t (&qb)[HEAD_DIM / 16][2], float& unit) {
    static_assert(HEAD_DIM == 128, "the lane assignment is written for head_dim 128 (8 chunks a row)");
    const int t = lane % 4;
    float qf[32];
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      if (has_head) {
        kernels::Vec16<Q> qv;
        qv.load(q_row + 32 * t + 8 * v);
        qv.to_float(&qf[8 * v]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) qf[8 * v + e] = 0.f;
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
    unit = ldexpf(1.f, shift);
#pragma unroll
    for (int s = 0; s < HEAD_DIM / 16; ++s) {
      qb[s][0] = kernels::pack2<__half>(qf[4 * s] * down, qf[4 * s + 1] * down);
      qb[s][1] = kernels::pack2<__half>(qf[4 * s + 2] * down, qf[4 * s + 3] * down);
    }
  }

  /// A lane's K: dims 32t .. 32t+31 of key rows g and g+8 of its warp's 16, as bytes.
  struct KFrags {
    uint32_t k0[8];  ///< row g's 32 bytes
    uint32_t k1[8];  ///< row g+8's 32 bytes
  };
  /// Reads this lane's K of the warp's 16 keys (rows row0 ..) from a landed K tile.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void load_k(KFrags& k, const uint8_t* tile, int row0, int lane) {
    const int g = lane / 4, t = lane % 4;
    const int r0 = row0 + g;  // rows r0 and r0 + 8, both = g mod 8 (row0 is a multiple of 16)
    const uint4 a = lds128(tile + r0 * HEAD_DIM + (((2 * t) ^ g) << 4));
    const uint4 b = lds128(tile + r0 * HEAD_DIM + (((2 * t + 1) ^ g) << 4));
    const uint4 c = lds128(tile + (r0 + 8) * HEAD_DIM + (((2 * t) ^ g) << 4));
    const uint4 d = lds128(tile + (r0 + 8) * HEAD_DIM + (((2 * t + 1) ^ g) << 4));
    k.k0[0] = a.x, k.k0[1] = a.y, k.k0[2] = a.z, k.k0[3] = a.w, k.k0[4] = b.x, k.k0[5] = b.y, k.k0[6] = b.z,
    k.k0[7] = b.w;
    k.k1[0] = c.x, k.k1[1] = c.y, k.k1[2] = c.z, k.k1[3] = c.w, k.k1[4] = d.x, k.k1[5] = d.y, k.k1[6] = d.z,
    k.k1[7] = d.w;
  }
  /// k-step s: dims 32t+4s .. 32t+4s+3 of rows g and g+8 as k-slots 2t, 2t+1, 2t+8, 2t+9.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void k_fragment(const KFrags& k, int s, uint32_t (&a)[4]) {
    a[0] = widen2(k.k0[s], false), a[1] = widen2(k.k1[s], false);
    a[2] = widen2(k.k0[s], true), a[3] = widen2(k.k1[s], true);
  }

  /// A lane's V: dims 16g .. 16g+15 of keys 2t, 2t+1, 2t+8, 2t+9 of its warp's 16.
  struct VFrags {
    uint32_t a[4];  ///< key 2t's 16 bytes
    uint32_t b[4];  ///< key 2t+1's
    uint32_t c[4];  ///< key 2t+8's
    uint32_t d[4];  ///< key 2t+9's
  };
  /// Reads this lane's V of the warp's 16 keys (rows row0 ..) from a landed V tile.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void load_v(VFrags& v, const uint8_t* tile, int row0, int lane) {
    const int g = lane / 4, t = lane % 4;
    const int vr = row0 + 2 * t;  // (vr & 7) == 2t
    const uint4 va = lds128(tile + vr * HEAD_DIM + ((g ^ (2 * t)) << 4));
    const uint4 vb = lds128(tile + (vr + 1) * HEAD_DIM + ((g ^ (2 * t + 1)) << 4));
    const uint4 vc = lds128(tile + (vr + 8) * HEAD_DIM + ((g ^ (2 * t)) << 4));
    const uint4 vd = lds128(tile + (vr + 9) * HEAD_DIM + ((g ^ (2 * t + 1)) << 4));
    v.a[0] = va.x, v.a[1] = va.y, v.a[2] = va.z, v.a[3] = va.w;
    v.b[0] = vb.x, v.b[1] = vb.y, v.b[2] = vb.z, v.b[3] = vb.w;
    v.c[0] = vc.x, v.c[1] = vc.y, v.c[2] = vc.z, v.c[3] = vc.w;
    v.d[0] = vd.x, v.d[1] = vd.y, v.d[2] = vd.z, v.d[3] = vd.w;
  }
  /// m-tile i: bytes (key 2t, key 2t+1) of dims 4w, 4w+1 (i = 2w) or 4w+2, 4w+3 (i = 2w+1)
  /// of this lane's 16, and the same of keys 2t+8, 2t+9.
  template <int HEAD_DIM>
  __device__ __forceinline__ static void vt_fragment(const VFrags& v, int i, uint32_t (&a)[4]) {
    const int w = i / 2;
    const uint32_t sel = (i % 2 == 0) ? 0x5140u : 0x7362u;
    const uint32_t x = __byte_perm(v.a[w], v.b[w], sel), y = __byte_perm(v.c[w], v.d[w], sel);
    a[0] = widen2(x, false), a[1] = widen2(x, true), a[2] = widen2(y, false), a[3] = widen2(y, true);
  }

  /// Rows g and g+8 of m-tile i hold dims 16g + 2i and 16g + 2i + 1.
  __device__ __forceinline__ static int2 o_dims(int i, int g) { return make_int2(16 * g + 2 * i, 16 * g + 2 * i + 1); }
};

}  // namespace flashstep::fp8
