/// \file device.hpp
/// \brief Device memory for the harness: an owning buffer, the device copy of a
/// HostCase with its NaN-poisoned outputs, and whether a GPU is there at all.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <cstring>
#include <vector>

#include "harness/case.hpp"
#include "harness/gpu_present.hpp"  // gpu_available()
#include "stage.hpp"

namespace flashstep::stages::harness {

/// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)" for the current device.
std::string device_description();

/// An owning device allocation (cudaMalloc/cudaFree), movable, not copyable.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `bytes` (nothing for 0).
  explicit DeviceBuffer(size_t bytes);
  /// Allocates and copies `bytes` bytes from host `src`.
  DeviceBuffer(const void* src, size_t bytes);
  ~DeviceBuffer();
  /// Takes `other`'s allocation; `other` is left empty (null, 0 bytes).
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  /// Frees this buffer's allocation, then takes `other`'s; `other` is left empty.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  /// The device pointer (null for an empty buffer).
  void* get() const { return ptr_; }
  /// Size of the allocation in bytes.
  size_t bytes() const { return bytes_; }
  /// The device pointer as `T*`, e.g. `as<int32_t>()` for an uploaded index array.
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  /// Copies the whole buffer back to the host.
  std::vector<uint8_t> download() const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

/// Uploads a vector (host -> new device buffer).
template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  return DeviceBuffer(v.data(), v.size() * sizeof(T));
}

/// Copies a whole buffer back to the host as elements of `T` (the inverse of upload).
template <typename T>
std::vector<T> download(const DeviceBuffer& buf) {
  const std::vector<uint8_t> bytes = buf.download();
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

/// A HostCase on the device: q in the stage's dtype, K/V in its K/V dtype, index arrays,
/// output buffers.
class DeviceCase {
 public:
  /// Uploads `host` (its storage decides which of pool or k/v is used).
  explicit DeviceCase(const HostCase& host);
  /// The pointers a runner takes.
  const DeviceBatch& batch() const { return batch_; }
  /// Fills o and lse with NaN (all bytes 0xff), so an element the stage never writes
  /// cannot pass by accident.
  void poison_outputs(cudaStream_t stream) const;
  /// Output o as doubles, (nnz_qo, num_qo_heads, head_dim) row-major.
  std::vector<double> output() const;
  /// lse as doubles, (nnz_qo, num_qo_heads).
  std::vector<double> lse() const;

 private:
  DType dtype_;
  DeviceBuffer q_, qo_indptr_, kv_indptr_, kv_indices_, kv_last_page_len_, pool_, v_pool_, k_, v_, o_, lse_, sinks_;
  DeviceBatch batch_;
};

}  // namespace flashstep::stages::harness
