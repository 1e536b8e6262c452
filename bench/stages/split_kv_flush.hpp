// A read-only L2 flush (see split_kv_flush.cu): evicts the L2 without leaving dirty lines.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flashstep::bench {

/// Reads `bytes` (a multiple of 16, at least twice the L2) of `buffer` on `stream`.
/// \param sink one device word, written only in the rare case the checksum hits a constant
void read_flush(const void* buffer, size_t bytes, uint32_t* sink, cudaStream_t stream);

}  // namespace flashstep::bench
