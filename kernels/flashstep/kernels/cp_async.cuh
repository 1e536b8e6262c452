/// \file cp_async.cuh
/// \brief cp.async: copies from global to shared memory that run while the thread computes.
///
/// An ordinary load stalls the thread at the first use of the loaded register. cp.async
/// (sm_80+) instead hands a 16-byte global-to-shared copy to the memory system and
/// returns at once; the thread groups its copies (commit_group) and later waits until
/// all but the newest N groups have landed (wait_group<N>). A kernel that keeps S groups
/// in flight computes on one shared-memory stage while the next S - 1 stream in: that is
/// how a decode kernel keeps enough bytes in flight to saturate HBM.
///
/// The `.cg` variant caches in L2 only: KV is read once, so it should not evict L1.
/// A copy with `valid == false` reads nothing and writes 16 zero bytes, so a partial
/// tile at the end of a sequence needs no branch and leaves no stale data behind.
///
/// PTX rather than the toolkit's __pipeline_memcpy_async: that API takes the zero-fill as
/// a compile-time size (a run-time `valid` becomes a switch per copy), and its commit and
/// wait carry no memory clobber, so the compiler could move shared-memory reads across them.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace flashstep::kernels {

/// Starts a 16-byte copy global -> shared.
/// \param smem destination, 16-byte aligned shared memory
/// \param gmem source, 16-byte aligned global memory (not read when !valid)
/// \param valid false: write 16 zero bytes instead of copying
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
}

/// Closes the group of copies this thread started since the last commit.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most `N` of this thread's committed groups are still in flight.
/// Other threads' copies become visible only after a __syncthreads() that follows.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// cp_async_wait_group with a run-time count (the instruction takes an immediate, so
/// this dispatches; `n` is uniform across the block, so the branch costs nothing).
/// \param n groups allowed to stay in flight, 0..7 (larger values wait for 7)
__device__ __forceinline__ void cp_async_wait_group_dynamic(int n) {
  switch (n) {
    case 0: cp_async_wait_group<0>(); break;
    case 1: cp_async_wait_group<1>(); break;
    case 2: cp_async_wait_group<2>(); break;
    case 3: cp_async_wait_group<3>(); break;
    case 4: cp_async_wait_group<4>(); break;
    case 5: cp_async_wait_group<5>(); break;
    case 6: cp_async_wait_group<6>(); break;
    default: cp_async_wait_group<7>(); break;
  }
}

}  // namespace flashstep::kernels
