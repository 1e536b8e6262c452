/// \file grow_buffer.hpp
/// \brief A device buffer that only grows (its contents are not kept across a growth): the
/// engine's and the mixed step's scratch arrays, sized by the largest step seen so far.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "flashstep/kernels/cuda_check.cuh"

namespace flashstep::stages::engine {

/// Device memory of at least `bytes` after reserve(); freed with the object. Not copyable.
struct GrowBuffer {
  void* ptr = nullptr;  ///< the allocation (null before the first reserve)
  size_t bytes = 0;     ///< its size
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() {
    if (ptr) cudaFree(ptr);
  }
  /// At least `want` bytes; a growth waits for `stream` before freeing the old allocation
  /// (work queued on it may still read it).
  void reserve(size_t want, cudaStream_t stream) {
    if (want <= bytes) return;
    if (ptr) {
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
      FLASHSTEP_CUDA_CHECK(cudaFree(ptr));
      ptr = nullptr;
    }
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&ptr, want));
    bytes = want;
  }
  /// The allocation as T*.
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

}  // namespace flashstep::stages::engine
