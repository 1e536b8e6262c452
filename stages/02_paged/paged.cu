// Stage 02 — paged decode: the launcher, plan/run, and the registry entry.
//
// The kernel (paged_decode.cuh, around the decode loop of kernels/decode_loop.cuh) is
// instantiated for fp32, fp16 and bf16 x head_dim 64, 128 and 256 (the combinations the
// registry declares) x one or two 256-thread halves.
//
// How to run it: `ctest -L gpu` validates it over the decode grid;
// `flashstep_bench --benchmark_filter=02_paged` times it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "02_paged/paged.hpp"
#include "02_paged/paged_decode.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::paged {

namespace {

/// What plan() needs to know of one instantiation, and how run() launches it.
struct KernelEntry {
  size_t (*smem_bytes)(int num_stages, int group_size);
  void (*set_smem_limit)(size_t bytes);
  void (*launch)(const BatchShape&, const DeviceBatch&, int num_stages, size_t smem, cudaStream_t);
};

template <typename T, int HEAD_DIM, int SPLITS>
KernelEntry kernel_entry() {
  KernelEntry e;
  e.smem_bytes = [](int num_stages, int group_size) {
    const kernels::DecodeBlockShape bs = kernels::DecodeTraits<T, HEAD_DIM>::block_shape(group_size);
    return paged_decode_smem_bytes<T, HEAD_DIM>(SPLITS, num_stages, bs.bdy, bs.bdz);
  };
  e.set_smem_limit = [](size_t bytes) {
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(paged_decode_kernel<T, HEAD_DIM, SPLITS>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(bytes)));
  };
  e.launch = [](const BatchShape& s, const DeviceBatch& batch, int num_stages, size_t smem,
                cudaStream_t stream) {
    PagedDecodeParams<T> p;
    p.q = static_cast<const T*>(batch.q);
    p.kv = kernels::make_paged_kv(static_cast<const T*>(batch.kv_pool), batch.kv_indptr,
                                  batch.kv_indices, batch.kv_last_page_len, s.page_size,
                                  s.num_kv_heads, HEAD_DIM, s.kv_layout == KVLayout::HND);
    p.o = static_cast<T*>(batch.o);
    p.lse = batch.lse;
    p.num_qo_heads = s.num_qo_heads;
    p.group_size = s.group_size();
    const kernels::DecodeBlockShape bs = kernels::DecodeTraits<T, HEAD_DIM>::block_shape(p.group_size);
    p.bdy = bs.bdy;
    p.bdz = bs.bdz;
    p.num_stages = num_stages;
    p.sm_scale_log2 = s.resolved_sm_scale() * kernels::kLog2e;
    const dim3 grid(s.num_kv_heads, s.batch_size);
    paged_decode_kernel<T, HEAD_DIM, SPLITS><<<grid, 256 * SPLITS, smem, stream>>>(p);
    kernels::check_launch("paged_decode_kernel");
  };
  return e;
}

template <typename T, int SPLITS>
KernelEntry kernel_entry_for_dim(int head_dim) {
  switch (head_dim) {
    case 64: return kernel_entry<T, 64, SPLITS>();
    case 128: return kernel_entry<T, 128, SPLITS>();
    case 256: return kernel_entry<T, 256, SPLITS>();
  }
  throw ref::InvalidArgument("PagedRunner::plan: head_dim must be 64, 128 or 256 (got " +
                             std::to_string(head_dim) + ")");
}

template <int SPLITS>
KernelEntry kernel_entry_for_splits(DType dtype, int head_dim) {
  switch (dtype) {
    case DType::f32: return kernel_entry_for_dim<float, SPLITS>(head_dim);
    case DType::f16: return kernel_entry_for_dim<__half, SPLITS>(head_dim);
    case DType::bf16: return kernel_entry_for_dim<__nv_bfloat16, SPLITS>(head_dim);
  }
  throw ref::InvalidArgument("PagedRunner::plan: unknown dtype");
}

/// 256 threads: one half; 512: two halves splitting the tiles of each (request, kv head).
KernelEntry kernel_entry_for(DType dtype, int head_dim, int threads) {
  return threads == 512 ? kernel_entry_for_splits<2>(dtype, head_dim)
                        : kernel_entry_for_splits<1>(dtype, head_dim);
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
  int device = 0, sms = 0, smem_optin = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // Fewer blocks than two per SM: then a block is alone on its SM, so it gets two
  // 256-thread halves that split its tiles and never wait for each other, as two
  // blocks on one SM would.
  const bool small_grid = int64_t{shape.batch_size} * shape.num_kv_heads < 2 * int64_t{sms};
  threads_ = config_.threads ? config_.threads : (small_grid ? 512 : 256);
  num_stages_ = config_.num_stages ? config_.num_stages : 2;
  const KernelEntry entry = kernel_entry_for(shape.dtype, shape.head_dim, threads_);
  smem_bytes_ = entry.smem_bytes(num_stages_, shape.group_size());
  ref::require(smem_bytes_ <= static_cast<size_t>(smem_optin), fn,
               std::to_string(num_stages_) + " stages of " + std::to_string(threads_) + " threads need " +
                   std::to_string(smem_bytes_) + " bytes of shared memory, more than the " +
                   std::to_string(smem_optin) + " a block may have");
  entry.set_smem_limit(smem_bytes_);  // a host call, so plan() makes it and run() does not
}

void PagedRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  if (shape_.batch_size == 0) return;
  kernel_entry_for(shape_.dtype, shape_.head_dim, threads_).launch(shape_, batch, num_stages_, smem_bytes_, stream);
}

StageInfo stage_info() {
  StageInfo s;
  s.name = "02_paged";
  s.summary = "paged decode: online softmax in one pass, cp.async 16-byte loads, GQA heads share one K/V read";
  s.modes = {Mode::decode};
  s.storage = KVStorage::paged;
  s.dtypes = {DType::f32, DType::f16, DType::bf16};
  s.head_dims = {64, 128, 256};
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = kMaxPageSize;
  s.max_group_size = kMaxGroupSize;
  s.causal = false;
  s.make_runner = [] { return std::make_unique<PagedRunner>(); };
  return s;
}

}  // namespace flashstep::stages::paged
