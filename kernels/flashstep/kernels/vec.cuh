/// \file vec.cuh
/// \brief 16-byte vectors: one load or store instruction per thread, converted to fp32.
///
/// Decode attention is a stream of bytes through a few FMAs, so the width of each memory
/// instruction matters: a warp issuing 16-byte loads moves 512 bytes per instruction,
/// four times what 4-byte loads move, with a quarter of the instructions to issue and
/// track. Vec16<T> holds exactly 16 bytes of T (16 fp8, 8 fp16/bf16 or 4 fp32), is loaded and
/// stored as one `uint4`, and converts to and from fp32, the accumulation type of every
/// stage. The address must be 16-byte aligned: every row this project loads starts at a
/// multiple of head_dim elements, and head_dim * sizeof(T) is a multiple of 16.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

namespace flashstep::kernels {

/// 16 bytes of `T` (float, __half, __nv_bfloat16, __nv_fp8_e4m3 or __nv_fp8_e5m2).
template <typename T>
struct alignas(16) Vec16 {
  /// Elements per vector: 4 for fp32, 8 for fp16/bf16, 16 for fp8.
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  uint4 raw;  ///< the 16 bytes, as the hardware moves them

  /// One 16-byte load. \param ptr kSize elements, 16-byte aligned
  __device__ __forceinline__ void load(const T* ptr) { raw = *reinterpret_cast<const uint4*>(ptr); }
  /// One 16-byte store. \param ptr kSize elements, 16-byte aligned
  __device__ __forceinline__ void store(T* ptr) const { *reinterpret_cast<uint4*>(ptr) = raw; }

  /// Widen to fp32. \param out kSize floats
  __device__ __forceinline__ void to_float(float* out) const;
  /// Narrow from fp32, rounding to nearest even. \param in kSize floats
  __device__ __forceinline__ void from_float(const float* in);
};

/// fp32: the four words reinterpreted, no conversion.
template <>
__device__ __forceinline__ void Vec16<float>::to_float(float* out) const {
  out[0] = __uint_as_float(raw.x);
  out[1] = __uint_as_float(raw.y);
  out[2] = __uint_as_float(raw.z);
  out[3] = __uint_as_float(raw.w);
}
/// fp32: the four floats stored bit for bit, no rounding.
template <>
__device__ __forceinline__ void Vec16<float>::from_float(const float* in) {
  raw = make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
}

/// fp16: four __half2 pairs widened, exactly (every fp16 value is an fp32 value).
template <>
__device__ __forceinline__ void Vec16<__half>::to_float(float* out) const {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
/// fp16: rounded to nearest even in pairs (__floats2half2_rn).
template <>
__device__ __forceinline__ void Vec16<__half>::from_float(const float* in) {
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
}

/// bf16: each element shifted into the top half of an fp32 word.
template <>
__device__ __forceinline__ void Vec16<__nv_bfloat16>::to_float(float* out) const {
  // bf16 is the top half of an fp32: widening is a shift, no rounding.
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
/// bf16: rounded to nearest even in pairs (__floats2bfloat162_rn).
template <>
__device__ __forceinline__ void Vec16<__nv_bfloat16>::from_float(const float* in) {
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
}

namespace detail {

/// Two FP8 elements (the low or the high 16 bits of `w`, by `high`) as an fp16 pair (the
/// 32 bits of a __half2, element 0 low), exactly: every FP8 value is an fp16 value. e4m3:
/// the toolkit's fp8x2 -> f16x2 conversion (one cvt.rn.f16x2.e4m3x2 on sm_89 and later,
/// after a shift for the high pair). e5m2 is the top byte of an fp16 (the same sign,
/// 5-bit exponent and bias 15, its subnormals, infinities and NaNs included), so one byte
/// permute places both bytes.
template <__nv_fp8_interpretation_t FORMAT>
__device__ __forceinline__ uint32_t fp8x2_to_half2_bits(uint32_t w, bool high) {
  if constexpr (FORMAT == __NV_E5M2) {
    // result bytes, low to high: 0, element 0, 0, element 1 (selector nibble 4: a byte of 0u)
    return __byte_perm(w, 0u, high ? 0x3424u : 0x1404u);
  } else {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(high ? w >> 16 : w & 0xffffu),
                                                     FORMAT);
    uint32_t bits;
    memcpy(&bits, &h, sizeof(bits));
    return bits;
  }
}

/// 16 FP8 elements widened exactly: each pair to fp16 (fp8x2_to_half2_bits), then f16 ->
/// f32. Element e is byte e (little-endian).
template <__nv_fp8_interpretation_t FORMAT>
__device__ __forceinline__ void fp8x16_to_float(const uint4& raw, float* out) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint32_t bits = fp8x2_to_half2_bits<FORMAT>(w[i], p == 1);
      __half2 h;
      memcpy(&h, &bits, sizeof(h));
      const float2 f = __half22float2(h);
      out[4 * i + 2 * p] = f.x;
      out[4 * i + 2 * p + 1] = f.y;
    }
}

/// 16 floats rounded to FP8 (to nearest even, saturating to +-max: __NV_SATFINITE),
/// in pairs (cvt.rn.satfinite.e4m3x2.f32 / .e5m2x2 on sm_89 and later).
template <__nv_fp8_interpretation_t FORMAT>
__device__ __forceinline__ uint4 float_to_fp8x16(const float* in) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(in[4 * i], in[4 * i + 1]), __NV_SATFINITE, FORMAT);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(in[4 * i + 2], in[4 * i + 3]), __NV_SATFINITE, FORMAT);
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

}  // namespace detail

/// e4m3: sixteen elements widened exactly (detail::fp8x16_to_float).
template <>
__device__ __forceinline__ void Vec16<__nv_fp8_e4m3>::to_float(float* out) const {
  detail::fp8x16_to_float<__NV_E4M3>(raw, out);
}
/// e4m3: rounded to nearest even, saturating (the __nv_fp8_e4m3(float) constructor's rule).
template <>
__device__ __forceinline__ void Vec16<__nv_fp8_e4m3>::from_float(const float* in) {
  raw = detail::float_to_fp8x16<__NV_E4M3>(in);
}
/// e5m2: sixteen elements widened exactly (detail::fp8x16_to_float).
template <>
__device__ __forceinline__ void Vec16<__nv_fp8_e5m2>::to_float(float* out) const {
  detail::fp8x16_to_float<__NV_E5M2>(raw, out);
}
/// e5m2: rounded to nearest even, saturating (the __nv_fp8_e5m2(float) constructor's rule).
template <>
__device__ __forceinline__ void Vec16<__nv_fp8_e5m2>::from_float(const float* in) {
  raw = detail::float_to_fp8x16<__NV_E5M2>(in);
}

}  // namespace flashstep::kernels
