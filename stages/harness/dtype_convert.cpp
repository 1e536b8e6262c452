// Host-side dtype conversions through CUDA's own fp16/bf16 types, so host rounding is
// bit-identical to what the device's conversion instructions do; FP8 through the
// reference's encoder (reference/fp8.hpp), which the GPU suite checks bit for bit against
// the toolkit's conversions.
#include "harness/dtype_convert.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "flashstep/reference/fp8.hpp"

namespace flashstep::stages::harness {

namespace {
ref::FP8Format fp8_format(DType dtype) { return dtype == DType::e4m3 ? ref::FP8Format::e4m3 : ref::FP8Format::e5m2; }
}  // namespace

double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case DType::f32: return f;
    case DType::f16: return __half2float(__float2half_rn(f));
    case DType::bf16: return __bfloat162float(__float2bfloat16_rn(f));
    case DType::e4m3:
    case DType::e5m2: return ref::fp8_round(x, fp8_format(dtype));  // from the double: one rounding
  }
  return f;
}

void round_all(DType dtype, std::vector<double>& values) {
  for (double& x : values) x = round_to(dtype, x);
}

std::vector<uint8_t> encode(DType dtype, const std::vector<double>& values) {
  std::vector<uint8_t> bytes(values.size() * dtype_bytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    uint8_t* dst = bytes.data() + i * dtype_bytes(dtype);
    if (is_fp8(dtype)) {
      *dst = ref::fp8_from_double(values[i], fp8_format(dtype));
    } else if (dtype == DType::f32) {
      std::memcpy(dst, &f, 4);
    } else if (dtype == DType::f16) {
      const __half h = __float2half_rn(f);
      std::memcpy(dst, &h, 2);
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(f);
      std::memcpy(dst, &b, 2);
    }
  }
  return bytes;
}

std::vector<double> decode(DType dtype, const std::vector<uint8_t>& bytes, size_t count) {
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* src = bytes.data() + i * dtype_bytes(dtype);
    if (is_fp8(dtype)) {
      values[i] = ref::fp8_to_double(*src, fp8_format(dtype));
    } else if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, src, 4);
      values[i] = f;
    } else if (dtype == DType::f16) {
      __half h;
      std::memcpy(&h, src, 2);
      values[i] = __half2float(h);
    } else {
      __nv_bfloat16 b;
      std::memcpy(&b, src, 2);
      values[i] = __bfloat162float(b);
    }
  }
  return values;
}

}  // namespace flashstep::stages::harness
