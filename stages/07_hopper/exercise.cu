// Stage 07 exercise — one warpgroup MMA from shared memory.
//
// The program below computes S = Q K^T for one 64 x 64 tile (64 query rows, 64 keys,
// head_dim 64, bf16) with wgmma.mma_async.m64n64k16, both operands read from shared
// memory through descriptors, exactly as the stage's S = Q K^T does. The tiles are
// stored in the 128-byte swizzled layout (written by the threads here; the TMA writes
// the same layout in the stage). Two holes are marked TODO:
//   1. the shared-memory matrix descriptor of a swizzled tile (wgmma.cuh draws its bits);
//   2. where the k-th 16-column step of a row starts, in elements from the row's start.
// As shipped it prints FAIL; fill the holes until it prints PASS. Then read
// hopper_attention.cuh for what the stage adds (TMA, mbarriers, the producer and two
// consumer warp groups, P V with P from registers, the online softmax).
//
//     cmake --build build --target flashstep_exercise_07_hopper
//     build/bin/flashstep_exercise_07_hopper
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "07_hopper/hopper.hpp"
#include "07_hopper/wgmma.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"

namespace {

using bf16 = __nv_bfloat16;
constexpr int kRows = 64;  // query rows = keys = head_dim

/// TODO(exercise) 1 — the descriptor of a tile that starts at `tile` (1024-byte aligned),
/// rows of 64 bf16 (128 bytes), 16-byte chunks swizzled in atoms of 8 rows (1024 bytes).
/// It needs: the start address (shared-memory address >> 4) in bits 0-13, the stride
/// byte offset from one 8-row atom to the next (>> 4) in bits 32-45, and the 128-byte
/// swizzle mode (1) in bits 62-63. (__cvta_generic_to_shared gives the address.)
__device__ uint64_t descriptor(const bf16* tile) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(tile));
  return uint64_t((addr & 0x3FFFF) >> 4);  // placeholder: no stride, no swizzle
}

/// TODO(exercise) 2 — k-step k (0..3) reads columns 16k..16k+15 of every row: how many
/// elements after a row's start does it begin? (In a swizzled row the hardware applies
/// the XOR to the address it computes, so the descriptor moves as if unswizzled.)
__device__ int k_step_offset(int k) { return 0; }  // placeholder: every k-step reads columns 0..15

/// Element (row, col) of a 64-wide tile in the 128-byte swizzled layout: the 16-byte
/// chunk col / 8 of row r is stored at chunk (col / 8) ^ (r % 8).
__host__ __device__ int swizzled(int row, int col) { return row * kRows + (((col / 8) ^ (row % 8)) * 8) + col % 8; }

__global__ void __launch_bounds__(128) exercise_kernel(const bf16* q, const bf16* k, float* s) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) bf16 q_tile[kRows * kRows];
  __shared__ __align__(1024) bf16 k_tile[kRows * kRows];
  for (int i = threadIdx.x; i < kRows * kRows; i += blockDim.x) {
    q_tile[swizzled(i / kRows, i % kRows)] = q[i];
    k_tile[swizzled(i / kRows, i % kRows)] = k[i];
  }
  // the tensor cores read shared memory through the async proxy: order the stores first
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // no C++ API for this fence
  __syncthreads();

  float acc[kRows / 2];
  flashstep::stages::hopper::wgmma_fence();
  for (int kk = 0; kk < kRows / 16; ++kk)
    flashstep::stages::hopper::wgmma_ss<bf16, kRows>(acc, descriptor(q_tile + k_step_offset(kk)),
                                                     descriptor(k_tile + k_step_offset(kk)), kk > 0);
  flashstep::stages::hopper::wgmma_commit();
  flashstep::stages::hopper::wgmma_wait<0>();
  flashstep::stages::hopper::wgmma_fence_operands(acc);

  // the accumulator layout (wgmma.cuh): d[4n + 2h + e] is row 16w + t/4 + 8h, column 8n + 2(t%4) + e
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int n = 0; n < kRows / 8; ++n)
    for (int h = 0; h < 2; ++h)
      for (int e = 0; e < 2; ++e)
        s[(16 * warp + lane / 4 + 8 * h) * kRows + 8 * n + 2 * (lane % 4) + e] = acc[4 * n + 2 * h + e];
#endif
}

}  // namespace

int main() {
  std::string why;
  if (!flashstep::stages::harness::gpu_available(&why)) {
    std::printf("SKIPPED: the exercise needs a CUDA GPU (%s)\n", why.c_str());
    return 77;
  }
  if (const std::string reason = flashstep::stages::hopper::hopper_unavailable_reason(); !reason.empty()) {
    std::printf("SKIPPED: %s\n", reason.c_str());
    return 77;
  }
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<bf16> q(kRows * kRows), k(kRows * kRows);
  for (auto& x : q) x = __float2bfloat16(uniform(rng));
  for (auto& x : k) x = __float2bfloat16(uniform(rng));
  bf16 *dq, *dk;
  float* ds;
  FLASHSTEP_CUDA_CHECK(cudaMalloc(&dq, q.size() * sizeof(bf16)));
  FLASHSTEP_CUDA_CHECK(cudaMalloc(&dk, k.size() * sizeof(bf16)));
  FLASHSTEP_CUDA_CHECK(cudaMalloc(&ds, kRows * kRows * sizeof(float)));
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(dq, q.data(), q.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(dk, k.data(), k.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  FLASHSTEP_CUDA_CHECK(cudaMemset(ds, 0xff, kRows * kRows * sizeof(float)));  // NaN: unwritten fails
  exercise_kernel<<<1, 128>>>(dq, dk, ds);
  FLASHSTEP_CUDA_CHECK(cudaGetLastError());
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> s(kRows * kRows);
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(s.data(), ds, s.size() * sizeof(float), cudaMemcpyDeviceToHost));

  // S = Q K^T in double from the same bf16 values; fp32 accumulation of 64 products of
  // numbers below 1 stays within 1e-4 of it
  int bad = 0;
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kRows; ++j) {
      double ref = 0;
      for (int d = 0; d < kRows; ++d)
        ref += double(__bfloat162float(q[i * kRows + d])) * double(__bfloat162float(k[j * kRows + d]));
      const float got = s[i * kRows + j];
      if (!(std::fabs(got - ref) <= 1e-4 + 1e-4 * std::fabs(ref))) {
        if (bad < 5) std::printf("  S[%d][%d]: got %g, expected %g\n", i, j, got, ref);
        ++bad;
      }
    }
  cudaFree(dq);
  cudaFree(dk);
  cudaFree(ds);
  std::printf("%s: %d of %d elements of S = Q K^T wrong\n", bad ? "FAIL" : "PASS", bad, kRows * kRows);
  return bad ? 1 : 0;
}
