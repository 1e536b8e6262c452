#include "timing.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"

namespace flashstep::bench {

GpuTimer::GpuTimer(cudaStream_t stream) : stream_(stream) {
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start_));
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop_));
  int device = 0, l2 = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  flush_ = stages::harness::DeviceBuffer(2 * static_cast<size_t>(l2));
}

GpuTimer::~GpuTimer() {
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
}

float GpuTimer::time_once(const std::function<void()>& body) {
  // A different byte each time, so no layer can skip a write that changes nothing.
  fill_bytes(flush_.get(), flush_.bytes(), static_cast<uint8_t>(++flush_count_), stream_);
  FLASHSTEP_CUDA_CHECK(cudaEventRecord(start_, stream_));
  body();
  FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop_, stream_));
  FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return ms;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

void run_timed(benchmark::State& state, GpuTimer& timer, const std::function<void()>& body, double bytes, double flops,
               double ceiling, double read_ceiling, int warmup) {
  for (int i = 0; i < warmup; ++i) body();
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(timer.stream()));
  double total_s = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const double s = timer.time_once(body) * 1e-3;
    state.SetIterationTime(s);
    total_s += s;
    ++n;
  }
  // Rates from this repetition's mean time, the same time Google Benchmark reports for
  // it, so the median row's rate and time agree (the median commutes with 1/t).
  const double t = n ? total_s / n : 0;
  if (t <= 0) return;
  if (bytes > 0) {
    state.counters["GB/s"] = bytes / t * 1e-9;
    state.counters["bytes"] = bytes;
    if (ceiling > 0) state.counters["pct_of_ceiling"] = 100.0 * (bytes / t * 1e-9) / ceiling;
    if (read_ceiling > 0) state.counters["pct_of_read_ceiling"] = 100.0 * (bytes / t * 1e-9) / read_ceiling;
  }
  if (flops > 0) {
    state.counters["TFLOP/s"] = flops / t * 1e-12;
    if (ceiling > 0) state.counters["pct_of_ceiling"] = 100.0 * (flops / t * 1e-12) / ceiling;
  }
}

}  // namespace flashstep::bench
