/// \file mbarrier.cuh
/// \brief Waiting on a phase of a shared-memory mbarrier: the one wait of stage 07's
/// pipeline, shared with stage 10's MLA kernel.
///
/// An mbarrier counts arrivals (and, for a TMA copy, bytes) and completes one phase when
/// all have come; its phases alternate in parity. A waiter names the parity of the phase it
/// needs and spins on try_wait, which suspends the thread for a while the hardware chooses
/// before it reports "not yet" (PTX ISA, "mbarrier.test_wait / mbarrier.try_wait").
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace flashstep::stages::hopper {

/// Returns once the phase of `bar` with parity `parity` (0 or 1) has completed.
__device__ __forceinline__ void wait_barrier(uint64_t* bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

}  // namespace flashstep::stages::hopper
