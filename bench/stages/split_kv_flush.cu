// A read-only L2 flush for bench/stages/split_kv_tune.cpp's "clean_l2" rows. The project's
// timer (bench/stages/timing.cpp) evicts the L2 by *writing* twice its size, which leaves the
// L2 full of dirty lines that the timed kernel's first reads must write back to HBM:
// up to one L2 (50 MB on an H100) of extra traffic, a large share of a small decode.
// This flush evicts by *reading* instead, so the L2 holds clean lines; the rows timed
// with it show how much of a small decode's time is that write-back (the peers are
// timed the same way by bench/peers/attention.py --clean-l2).
#include <cuda_runtime.h>

#include <cstdint>

#include "flashstep/kernels/cuda_check.cuh"
#include "split_kv_flush.hpp"

namespace flashstep::bench {

namespace {

__global__ void read_flush_kernel(const uint4* in, size_t count, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = in[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // almost never: keeps the loads without a real write
}

}  // namespace

void read_flush(const void* buffer, size_t bytes, uint32_t* sink, cudaStream_t stream) {
  read_flush_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(buffer), bytes / 16, sink);
  kernels::check_launch("read_flush_kernel");
}

}  // namespace flashstep::bench
