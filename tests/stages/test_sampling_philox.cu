// Device half of "the GPU Philox stream is cuRAND's and the CPU's" (test_sampling.cpp):
// cuRAND's curand_init(seed, subsequence, offset) words next to philox.cuh's on the device.
#include <curand_kernel.h>

#include <cstdint>
#include <vector>

#include "flashstep/kernels/philox.cuh"
#include "sampling_support.hpp"

namespace {

__global__ void curand_kernel(uint64_t seed, uint64_t offset, int words, uint32_t* out) {
  curandStatePhilox4_32_10_t state;
  curand_init(seed, blockIdx.x, offset, &state);
  for (int j = 0; j < words; ++j) out[blockIdx.x * words + j] = curand(&state);
}

__global__ void philox_kernel(uint64_t seed, uint64_t offset, int words, uint32_t* out) {
  for (int j = 0; j < words; ++j)
    out[blockIdx.x * words + j] = flashstep::kernels::philox_word(seed, blockIdx.x, offset + j);
}

std::vector<uint32_t> run(bool curand, uint64_t seed, uint64_t offset, int subsequences, int words) {
  flashstep::test::DeviceArray<uint32_t> out(static_cast<size_t>(subsequences * words));
  out.poison();
  if (curand) {
    curand_kernel<<<subsequences, 1>>>(seed, offset, words, out.get());
  } else {
    philox_kernel<<<subsequences, 1>>>(seed, offset, words, out.get());
  }
  flashstep::test::cuda_ok(cudaGetLastError(), "launch");
  return out.download();
}

}  // namespace

std::vector<uint32_t> curand_words(uint64_t seed, uint64_t offset, int subsequences, int words) {
  return run(true, seed, offset, subsequences, words);
}

std::vector<uint32_t> device_philox_words(uint64_t seed, uint64_t offset, int subsequences, int words) {
  return run(false, seed, offset, subsequences, words);
}
