// Stage 02 — paged decode: the launcher, plan/run, and the registry entry.
//
// Kernels: paged_decode_kernel (paged_decode.cuh) and, for grids of fewer than two blocks
// per SM, paged_decode_two_halves_kernel (two_halves.cuh), each for fp32, fp16 and bf16
// x head_dim 64, 128 and 256, picked by kernels/dispatch.cuh. The same kernels over an
// FP8 pool are fp8/'s lesson, instantiated in paged_fp8.cu.
//
// How to run it: `ctest -L gpu` validates it over the decode grid;
// `flashstep_bench --benchmark_filter=02_paged` times it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "02_paged/paged.hpp"
#include "02_paged/paged_launch.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::paged {

namespace {

/// 256 threads: paged_decode_kernel; 512: paged_decode_two_halves_kernel. K/V in q's
/// dtype here; an FP8 pool takes paged_fp8.cu's instantiations.
Entry kernel_entry_for(DType dtype, DType kv_dtype, int head_dim, int threads) {
  if (kv_dtype != dtype) return fp8_kernel_entry_for(dtype, kv_dtype, head_dim, threads);
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, {
    FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
      FLASHSTEP_DISPATCH_BOOL(threads == 512, TWO_HALVES, { return kernel_entry<T, HEAD_DIM, TWO_HALVES, T>(); });
    });
  });
  return {};
}

}  // namespace

void PagedRunner::plan(const BatchShape& shape, void*, size_t, cudaStream_t) {
  const char* fn = "PagedRunner::plan";
  const std::string reason = stage_info().unsupported_reason(shape);
  ref::require(reason.empty(), fn, reason);
  ref::require(config_.num_stages == 0 || (config_.num_stages >= 2 && config_.num_stages <= 8), fn,
               "num_stages must be 0 (auto) or 2..8 (got " + std::to_string(config_.num_stages) + ")");
  ref::require(config_.threads == 0 || config_.threads == 256 || config_.threads == 512, fn,
               "threads must be 0 (auto), 256 or 512 (got " + std::to_string(config_.threads) + ")");
  shape_ = shape;
  int device = 0, smem_optin = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int sms = device_sm_count();
  // Fewer blocks than two per SM: a block would be alone on its SM (two_halves.cuh).
  const bool small_grid = int64_t{shape.batch_size} * shape.num_kv_heads < 2 * int64_t{sms};
  threads_ = config_.threads ? config_.threads : (small_grid ? 512 : 256);
  num_stages_ = config_.num_stages ? config_.num_stages : 2;
  const Entry entry = kernel_entry_for(shape.dtype, shape.resolved_kv_dtype(), shape.head_dim, threads_);
  smem_bytes_ = entry.smem_bytes(num_stages_, shape.group_size());
  ref::require(smem_bytes_ <= static_cast<size_t>(smem_optin), fn,
               std::to_string(num_stages_) + " stages of " + std::to_string(threads_) + " threads need " +
                   std::to_string(smem_bytes_) + " bytes of shared memory, more than the " +
                   std::to_string(smem_optin) + " a block may have");
  entry.set_smem_limit(smem_bytes_);  // a host call, so plan() makes it and run() does not
}

void PagedRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  if (shape_.batch_size == 0) return;
  kernel_entry_for(shape_.dtype, shape_.resolved_kv_dtype(), shape_.head_dim, threads_)
      .launch(LaunchArgs{&shape_, &batch, num_stages_, smem_bytes_}, stream);
}

StageInfo stage_info() {
  StageInfo s;
  s.name = "02_paged";
  s.summary = "paged decode: online softmax in one pass, cp.async 16-byte loads, GQA heads share one K/V read";
  s.modes = {Mode::decode};
  s.storage = KVStorage::paged;
  s.dtypes = {DType::f32, DType::f16, DType::bf16};
  s.kv_dtypes = {DType::e4m3, DType::e5m2};
  s.head_dims = {64, 128, 256};
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = kMaxPageSize;
  s.max_group_size = kMaxGroupSize;
  s.causal = false;
  s.cuda_graph = true;  // grid (heads, batch_size); lengths are read on the device
  s.make_runner = [] { return std::make_unique<PagedRunner>(); };
  return s;
}

}  // namespace flashstep::stages::paged
