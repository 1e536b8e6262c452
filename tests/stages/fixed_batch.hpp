// Device buffers of fixed addresses and capacity for CUDA-graph replays: each new case's
// data is copied into the same buffers, as a serving engine reuses its page pool and its
// index buffers from step to step.
#pragma once

#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"
#include "harness/case.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"

namespace flashstep::test {

struct FixedBatch {
  stages::harness::DeviceBuffer q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, pool, k, v, o, lse;
  stages::DeviceBatch batch;

  /// Buffers for batches of `s`'s batch_size, heads, head_dim, page size and nnz_qo, with
  /// room for `max_pages` pages and `max_indices` page ids (paged; shared pages appear
  /// once in the pool and once per request in the ids; 0: max_pages) or `max_kv_rows`
  /// rows of k and v (ragged).
  FixedBatch(const stages::BatchShape& s, size_t max_pages, size_t max_kv_rows = 0, size_t max_indices = 0) {
    using stages::harness::DeviceBuffer;
    const size_t elem = stages::dtype_bytes(s.dtype);
    const size_t rows = size_t(s.nnz_qo()) * s.num_qo_heads;
    const size_t kv_row = size_t(s.num_kv_heads) * s.head_dim * elem;
    q = DeviceBuffer(rows * s.head_dim * elem);
    qo_indptr = DeviceBuffer((s.batch_size + 1) * sizeof(int32_t));
    kv_indptr = DeviceBuffer((s.batch_size + 1) * sizeof(int32_t));
    if (s.storage == stages::KVStorage::paged) {
      kv_indices = DeviceBuffer((max_indices ? max_indices : max_pages) * sizeof(int32_t));
      kv_last_page_len = DeviceBuffer(s.batch_size * sizeof(int32_t));
      pool = DeviceBuffer(max_pages * 2 * s.page_size * size_t(s.num_kv_heads) * s.head_dim *
                          stages::dtype_bytes(s.resolved_kv_dtype()));
    } else {
      k = DeviceBuffer(max_kv_rows * kv_row);
      v = DeviceBuffer(max_kv_rows * kv_row);
    }
    o = DeviceBuffer(rows * s.head_dim * elem);
    lse = DeviceBuffer(rows * sizeof(float));
    batch = {q.get(),
             qo_indptr.as<int32_t>(),
             kv_indptr.as<int32_t>(),
             pool.get(),
             kv_indices.as<int32_t>(),
             kv_last_page_len.as<int32_t>(),
             k.get(),
             v.get(),
             o.get(),
             lse.as<float>()};
  }

  /// Copies `host`'s inputs into the fixed buffers and poisons the outputs (on `stream`).
  void load(const stages::harness::HostCase& host, cudaStream_t stream) {
    using stages::harness::encode;
    const stages::BatchShape& s = host.layout.shape;
    auto put = [&](const stages::harness::DeviceBuffer& dst, const void* src, size_t bytes) {
      REQUIRE(bytes <= dst.bytes());
      FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src, bytes, cudaMemcpyHostToDevice, stream));
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host vectors are pageable temporaries
    };
    const std::vector<uint8_t> qb = encode(s.dtype, host.q.data);
    put(q, qb.data(), qb.size());
    put(qo_indptr, s.qo_indptr.data(), s.qo_indptr.size() * sizeof(int32_t));
    put(kv_indptr, s.kv_indptr.data(), s.kv_indptr.size() * sizeof(int32_t));
    if (s.storage == stages::KVStorage::paged) {
      const std::vector<uint8_t> pb = encode(s.resolved_kv_dtype(), host.paged.pages.data);
      put(kv_indices, host.layout.kv_indices.data(), host.layout.kv_indices.size() * sizeof(int32_t));
      put(kv_last_page_len, s.kv_last_page_len.data(), s.kv_last_page_len.size() * sizeof(int32_t));
      put(pool, pb.data(), pb.size());
    } else {
      const std::vector<uint8_t> kb = encode(s.dtype, host.k.data), vb = encode(s.dtype, host.v.data);
      put(k, kb.data(), kb.size());
      put(v, vb.data(), vb.size());
    }
    poison(stream);
  }
  /// Fills o and lse with NaN.
  void poison(cudaStream_t stream) const {
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(o.get(), 0xff, o.bytes(), stream));
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xff, lse.bytes(), stream));
  }
  std::vector<double> output(stages::DType dtype) const {
    return stages::harness::decode(dtype, o.download(), o.bytes() / stages::dtype_bytes(dtype));
  }
  std::vector<double> lse_values() const {
    return stages::harness::decode(stages::DType::f32, lse.download(), lse.bytes() / sizeof(float));
  }
};

}  // namespace flashstep::test
