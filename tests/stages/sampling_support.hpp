// Device buffers and test rows for the stage 06 suites (token equality in tests/stages,
// distributions in tests/statistics). Host code only: the operators take device pointers.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::test {

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// An owning device array of T.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n) cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)), "cudaMalloc");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
    if (n_) cuda_ok(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) { o.ptr_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  /// Fills every byte with 0x5A, so an entry the kernel never writes cannot pass as a token.
  void poison() {
    if (n_) cuda_ok(cudaMemset(ptr_, 0x5A, n_ * sizeof(T)), "poison");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda_ok(cudaDeviceSynchronize(), "kernel");
    if (n_) cuda_ok(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

/// Rows of float32 probabilities: softmax of N(0, scale^2) logits, a few exact zeros,
/// and (quantized logits) ties, as the samplers meet them after a decode step.
inline std::vector<float> random_prob_rows(std::mt19937_64& rng, int64_t rows, int64_t vocab, double scale = 2.0,
                                           bool ties = true, double zero_fraction = 0.03) {
  std::normal_distribution<double> normal(0.0, scale);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> out(static_cast<size_t>(rows * vocab));
  std::vector<double> w(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (auto& x : w) {
      x = normal(rng);
      if (ties) x = std::round(4.0 * x) / 4.0;
      m = std::max(m, x);
    }
    double sum = 0.0;
    for (auto& x : w) sum += (x = unit(rng) < zero_fraction ? 0.0 : std::exp(x - m));
    if (sum == 0.0) w[0] = sum = 1.0;
    for (int64_t i = 0; i < vocab; ++i)
      out[static_cast<size_t>(r * vocab + i)] = static_cast<float>(w[static_cast<size_t>(i)] / sum);
  }
  return out;
}

/// Float rows as a reference Tensor (rows, vocab); exact (float -> double).
inline ref::Tensor as_tensor(const std::vector<float>& rows, int64_t vocab) {
  ref::Tensor t({static_cast<int64_t>(rows.size()) / vocab, vocab});
  for (size_t i = 0; i < rows.size(); ++i) t.data[i] = rows[i];
  return t;
}

/// A float rounded to bfloat16 (nearest, ties to even; NaN stays NaN) as its 16 bits.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if (std::isnan(x)) return 0x7FC0;
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
/// The float value of bfloat16 bits (exact).
inline float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

}  // namespace flashstep::test
