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
void fill_uniform(stages::DType dtype, void* ptr, size_t count, uint64_t seed, float lo, float hi,
                  cudaStream_t stream);

}  // namespace flashstep::bench
