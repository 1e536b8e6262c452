// Timing on the device, by the benchmark policy: CUDA events around the region, the L2
// flushed before every repeat, warm-up first; Google Benchmark takes the per-iteration
// times (manual time) and reports the median over repetitions.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <vector>

#include "harness/device.hpp"

namespace flashstep::bench {

/// CUDA events and an L2-sized scratch buffer for one stream.
class GpuTimer {
 public:
  explicit GpuTimer(cudaStream_t stream = nullptr);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  /// Evicts the L2 (writes a buffer twice its size), then times one call of `body`,
  /// which must only enqueue work on stream(). Returns milliseconds.
  float time_once(const std::function<void()>& body);
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  stages::harness::DeviceBuffer flush_;
  unsigned flush_count_ = 0;
};

/// Median of `values` (by copy).
double median(std::vector<double> values);

/// The body of a benchmark: `warmup` untimed calls, then one timed call per iteration
/// (manual time). Sets counters "GB/s" (bytes / time) or "TFLOP/s" (flops / time) and
/// "pct_of_ceiling" against `ceiling` (same unit); 0 for bytes or flops skips that counter.
/// A row that counts bytes also gets "pct_of_read_ceiling" against `read_ceiling` (GB/s of
/// a kernel that only reads; 0 skips it).
void run_timed(benchmark::State& state, GpuTimer& timer, const std::function<void()>& body, double bytes, double flops,
               double ceiling, double read_ceiling = 0, int warmup = 3);

}  // namespace flashstep::bench
