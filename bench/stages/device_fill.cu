#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"

namespace flashstep::bench {

namespace {

/// splitmix64 of (seed, i): a counter-based generator, no state to carry between threads.
__device__ uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_kernel(T* out, size_t count, uint64_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const float u = static_cast<float>(mix(seed, i) >> 40) * (1.0f / 16777216.0f);  // 24 bits in [0, 1)
    out[i] = static_cast<T>(lo + (hi - lo) * u);
  }
}

template <typename T>
void launch(void* ptr, size_t count, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  fill_kernel<T><<<1024, 256, 0, stream>>>(static_cast<T*>(ptr), count, seed, lo, hi);
  kernels::check_launch("fill_kernel");
}

__global__ void fill_bytes_kernel(uint4* out, size_t count, uint32_t word) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x)
    out[i] = make_uint4(word, word, word, word);
}

}  // namespace

void fill_bytes(void* ptr, size_t bytes, uint8_t value, cudaStream_t stream) {
  const uint32_t word = value * 0x01010101u;
  fill_bytes_kernel<<<1056, 256, 0, stream>>>(static_cast<uint4*>(ptr), bytes / 16, word);
  kernels::check_launch("fill_bytes_kernel");
}

void fill_uniform(stages::DType dtype, void* ptr, size_t count, uint64_t seed, float lo, float hi,
                  cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case stages::DType::f32: return launch<float>(ptr, count, seed, lo, hi, stream);
    case stages::DType::f16: return launch<__half>(ptr, count, seed, lo, hi, stream);
    case stages::DType::bf16: return launch<__nv_bfloat16>(ptr, count, seed, lo, hi, stream);
    // FP8: the float rounded to nearest even, saturating (the __nv_fp8_* constructors)
    case stages::DType::e4m3: return launch<__nv_fp8_e4m3>(ptr, count, seed, lo, hi, stream);
    case stages::DType::e5m2: return launch<__nv_fp8_e5m2>(ptr, count, seed, lo, hi, stream);
  }
}

}  // namespace flashstep::bench
