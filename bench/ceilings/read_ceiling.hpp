// The read ceiling: how fast this device streams a buffer far larger than its L2 into
// registers with 16-byte loads, the way a decode reads its K/V. Decode moves almost only
// reads, so this rate, not the copy's, is the most it can reach (a copy reads and writes
// every byte and pays for turning the bus around between the two): a decode near it takes
// the least time its bytes allow.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashstep::bench {

/// A launch of the read kernel: `threads` per block, `blocks_per_sm` blocks on every SM
/// (capped at what the SM can hold at once, so the whole grid is resident: one wave, no
/// tail of late blocks).
struct ReadConfig {
  int threads = 256;
  int blocks_per_sm = 8;
};

/// "256 threads x 8 blocks/SM" (the words the results' context and the row label use).
std::string to_string(const ReadConfig& config);

/// Blocks of the grid `config` launches on the current device (SMs x resident blocks).
int read_grid_blocks(const ReadConfig& config);

/// Reads `bytes` (a multiple of 16) at `buffer` once with `blocks` x `threads` threads
/// (read_grid_blocks(config), computed once: no host work between the timer's events): each
/// walks the buffer with a grid-stride loop of 16-byte loads, kReadLoadsInFlight of them
/// issued before any is used, folded into a register; each block writes one word to
/// `sink` (`blocks` words), so the compiler must keep every load.
void read_only(const void* buffer, size_t bytes, uint32_t* sink, int blocks, int threads, cudaStream_t stream);

/// Independent 16-byte loads each thread has in flight (the unroll of the loop).
constexpr int kReadLoadsInFlight = 4;

}  // namespace flashstep::bench
