// Random device buffers for timing: filled on the device (gigabytes in milliseconds),
// never zeros (zeros can run faster than real data and hide unwritten outputs).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "stage.hpp"

namespace flashstep::bench {

/// Fills `count` elements of `dtype` at `ptr` with a uniform draw from [lo, hi), a pure
/// function of (seed, index) so a run is reproducible.
void fill_uniform(stages::DType dtype, void* ptr, size_t count, uint64_t seed, float lo, float hi, cudaStream_t stream);

/// Writes `value` to every byte of `bytes` (a multiple of 16) at `ptr` with a compute
/// kernel: the L2 flush before each timed call, done the way PyTorch's fill_ does it
/// for the peers, so both sides start from the same state after the same kind of work.
void fill_bytes(void* ptr, size_t bytes, uint8_t value, cudaStream_t stream);

}  // namespace flashstep::bench
