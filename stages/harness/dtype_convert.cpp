// Host-side dtype conversions through CUDA's own fp16/bf16 types, so host rounding is
// bit-identical to what the device's conversion instructions do.
#include "harness/dtype_convert.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

namespace flashstep::stages::harness {

double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case DType::f32: return f;
    case DType::f16: return __half2float(__float2half_rn(f));
    case DType::bf16: return __bfloat162float(__float2bfloat16_rn(f));
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
    if (dtype == DType::f32) {
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
    if (dtype == DType::f32) {
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
