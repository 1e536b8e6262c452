// Device buffers and the upload/download of validation cases.
#include "harness/device.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <sstream>
#include <utility>

#include "flashstep/kernels/cuda_check.cuh"
#include "harness/dtype_convert.hpp"

namespace flashstep::stages::harness {

std::string device_description() {
  int dev = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  FLASHSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  std::ostringstream s;
  s << prop.name << " (sm_" << prop.major << prop.minor << ", " << prop.multiProcessorCount << " SMs)";
  return s.str();
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) FLASHSTEP_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::DeviceBuffer(const void* src, size_t bytes) : DeviceBuffer(bytes) {
  if (bytes > 0) FLASHSTEP_CUDA_CHECK(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);  // no throw from a destructor; a failed free is reported by the next call
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

std::vector<uint8_t> DeviceBuffer::download() const {
  std::vector<uint8_t> host(bytes_);
  if (bytes_ > 0) FLASHSTEP_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
  return host;
}

DeviceCase::DeviceCase(const HostCase& host) : dtype_(host.layout.shape.dtype) {
  const BatchShape& s = host.layout.shape;
  const size_t elem = dtype_bytes(dtype_);
  const DType kv_dtype = s.resolved_kv_dtype();  // the pool (or k, v) in it: an FP8 cache is 1 byte a value
  q_ = upload(encode(dtype_, host.q.data));
  qo_indptr_ = upload(s.qo_indptr);
  kv_indptr_ = upload(s.kv_indptr);
  if (s.storage == KVStorage::paged) {
    kv_indices_ = upload(host.layout.kv_indices);
    kv_last_page_len_ = upload(s.kv_last_page_len);
    pool_ = upload(encode(kv_dtype, host.paged.pages.data));  // NaN slots stay NaN in every dtype
    if (host.paged.v_pages.rank() > 0) v_pool_ = upload(encode(kv_dtype, host.paged.v_pages.data));  // V's own
  } else {
    k_ = upload(encode(kv_dtype, host.k.data));
    v_ = upload(encode(kv_dtype, host.v.data));
  }
  const size_t rows = static_cast<size_t>(s.nnz_qo()) * static_cast<size_t>(s.num_qo_heads);
  o_ = DeviceBuffer(rows * static_cast<size_t>(s.resolved_head_dim_vo()) * elem);
  lse_ = DeviceBuffer(rows * sizeof(float));

  batch_.q = q_.get();
  batch_.qo_indptr = qo_indptr_.as<int32_t>();
  batch_.kv_indptr = kv_indptr_.as<int32_t>();
  batch_.kv_pool = pool_.get();
  batch_.kv_indices = kv_indices_.as<int32_t>();
  batch_.kv_last_page_len = kv_last_page_len_.as<int32_t>();
  batch_.k = k_.get();
  batch_.v = v_.get();
  batch_.o = o_.get();
  batch_.lse = lse_.as<float>();
  batch_.v_pool = v_pool_.get();  // null unless V has a pool of its own
  if (!host.sinks.empty()) {
    sinks_ = upload(host.sinks);
    batch_.sinks = sinks_.as<float>();
  }
}

void DeviceCase::poison_outputs(cudaStream_t stream) const {
  if (o_.bytes()) FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(o_.get(), 0xff, o_.bytes(), stream));
  if (lse_.bytes()) FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(lse_.get(), 0xff, lse_.bytes(), stream));
}

std::vector<double> DeviceCase::output() const {
  return decode(dtype_, o_.download(), o_.bytes() / dtype_bytes(dtype_));
}

std::vector<double> DeviceCase::lse() const {
  return decode(DType::f32, lse_.download(), lse_.bytes() / sizeof(float));
}

}  // namespace flashstep::stages::harness
