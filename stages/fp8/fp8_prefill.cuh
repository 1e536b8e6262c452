/// \file fp8_prefill.cuh
/// \brief An FP8 cache as a K/V format of stage 04's tensor-core prefill
/// (04_tensor_core/prefill_attention.cuh, whose SameAsQ lists the hooks). The kernel's body
/// is the lesson's; this format says where an e4m3 or e5m2 tile lands and how it becomes
/// the 16-bit tile the MMAs read. The chapter (README.md, "Stage 04: staged, then
/// widened") says why this way and what it measured.
///
///     smem  [ Q tile ][ K_0 | V_0 ][ K_1 | V_1 ]  FP8, row-major (the ring)
///                                  [ K | V ]      q's dtype, swizzled (the staging)
///
/// The copies move FP8 bytes, half a 16-bit cache's, into plain row-major tiles. Once a
/// stage has landed, the block widens it, exactly, into one 16-bit K tile and one V tile
/// in the lesson's swizzled layout, and the MMAs read those as they read a 16-bit cache.
/// Every FP8 value is an fp16 value and a bf16 value, so the widening loses nothing:
/// pairs go to fp16 (kernels/vec.cuh's fp8x2_to_half2_bits: the toolkit's conversion for
/// e4m3, a byte permute for e5m2), and for bf16 on through fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/vec.cuh"

namespace flashstep::fp8 {

/// The K/V format of an FP8 pool (E = __nv_fp8_e4m3 or __nv_fp8_e5m2) for stage 04's
/// prefill_attention_kernel with q and o of type T (__half or __nv_bfloat16).
template <typename T, typename E>
struct Fp8Staged {
  static_assert(std::is_same_v<E, __nv_fp8_e4m3> || std::is_same_v<E, __nv_fp8_e5m2>, "an FP8 element type");
  static_assert(sizeof(T) == 2, "q and o of 16 bits");
  using Stored = E;                              ///< the pool's element: one FP8 byte
  static constexpr bool kTilesInQDtype = false;  ///< the MMAs read the staging, not the ring

  /// The widened K and V tiles, in q's dtype.
  template <int Bc, int HEAD_DIM>
  __host__ __device__ static constexpr size_t staging_bytes() {
    return 2 * size_t{Bc} * HEAD_DIM * sizeof(T);
  }

  /// Row-major: copy c of row r holds elements 16c .. 16c+15.
  template <int HEAD_DIM>
  __device__ __forceinline__ static uint32_t chunk_offset(int r, int c) {
    return uint32_t(r) * HEAD_DIM + uint32_t(c) * 16;
  }

  /// Eight FP8 elements (byte e of `raw` is element e) as eight T, exactly.
  __device__ __forceinline__ static uint4 widen8(uint2 raw) {
    constexpr __nv_fp8_interpretation_t kFormat = std::is_same_v<E, __nv_fp8_e4m3> ? __NV_E4M3 : __NV_E5M2;
    const uint32_t w[2] = {raw.x, raw.y};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t bits = kernels::detail::fp8x2_to_half2_bits<kFormat>(w[i / 2], i % 2 == 1);
      if constexpr (std::is_same_v<T, __half>) {
        out[i] = bits;
      } else {
        __half2 h;
        memcpy(&h, &bits, sizeof(h));
        const float2 f = __half22float2(h);
        const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
        memcpy(&out[i], &b, sizeof(b));
      }
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }

  /// Widens the landed stage (K rows, then V rows, FP8 row-major) into the staging's K and
  /// V tiles, swizzled as a 16-bit cache's. Thread i takes 8 elements at a time (an 8-byte
  /// read, a 16-byte write of one swizzled chunk) in the 16-bit copies' (row, chunk) walk,
  /// so neither side conflicts in the banks. Every thread finished reading the staging for
  /// the previous tile before the barrier the kernel put ahead of this call; the barrier
  /// after it makes the tiles whole before the MMAs read them.
  template <int HEAD_DIM, int Bc, int kThreads>
  __device__ __forceinline__ static const T* landed(const E* stage, T* staging) {
    constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks of a 16-bit row
    constexpr int kPasses = 2 * Bc * kChunks / kThreads;
    static_assert(2 * Bc * kChunks % kThreads == 0, "the K and V tiles must be whole passes");
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int idx = pass * kThreads + threadIdx.x;
      const int row = idx / kChunks, chunk = idx % kChunks;  // rows 0..Bc-1: K, Bc..2Bc-1: V
      const uint2 raw = *reinterpret_cast<const uint2*>(stage + row * HEAD_DIM + chunk * 8);
      const int tile = row / Bc, r = row % Bc;
      *reinterpret_cast<uint4*>(staging + tile * Bc * HEAD_DIM +
                                kernels::swizzled_offset(r, chunk, HEAD_DIM)) = widen8(raw);
    }
    __syncthreads();
    return staging;
  }
};

}  // namespace flashstep::fp8
