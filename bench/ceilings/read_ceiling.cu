// The read ceiling's kernel (see read_ceiling.hpp): a grid-stride stream of 16-byte loads
// folded with XOR into a register, one word written per block.
#include <cuda_runtime.h>

#include <algorithm>

#include "flashstep/kernels/cuda_check.cuh"
#include "read_ceiling.hpp"

namespace flashstep::bench {

namespace {

constexpr int kLoads = kReadLoadsInFlight;

__global__ void __launch_bounds__(1024)
    read_only_kernel(const uint4* __restrict__ in, size_t count, uint32_t* __restrict__ sink) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  uint32_t acc = 0;
  // kLoads loads issued back to back before the first is used: the memory system sees
  // kLoads x 16 bytes in flight per thread, as a pipelined decode keeps its tiles in flight.
  for (; i + (kLoads - 1) * stride < count; i += kLoads * stride) {
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) v[k] = in[i + k * stride];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < count; i += stride) {
    const uint4 v = in[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  // One word per block: each warp's words folded by shuffles, then the warps' by one thread.
  for (int offset = 16; offset > 0; offset /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, offset);
  __shared__ uint32_t warp_acc[32];
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t block_acc = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) block_acc ^= warp_acc[w];
    sink[blockIdx.x] = block_acc;
  }
}

}  // namespace

std::string to_string(const ReadConfig& config) {
  return std::to_string(config.threads) + " threads x " + std::to_string(config.blocks_per_sm) + " blocks/SM";
}

int read_grid_blocks(const ReadConfig& config) {
  int device = 0, sms = 0, resident = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FLASHSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, read_only_kernel, config.threads, 0));
  return sms * std::max(1, std::min(config.blocks_per_sm, resident));
}

void read_only(const void* buffer, size_t bytes, uint32_t* sink, int blocks, int threads, cudaStream_t stream) {
  read_only_kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(buffer), bytes / 16, sink);
  kernels::check_launch("read_only_kernel");
}

}  // namespace flashstep::bench
