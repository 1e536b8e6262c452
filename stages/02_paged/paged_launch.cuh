/// \file paged_launch.cuh
/// \brief Stage 02's kernel entries (kernels/dispatch.cuh's KernelEntry: shared memory,
/// occupancy, launch) for the files that instantiate them: paged.cu (K/V in q's dtype, the
/// lesson) and paged_fp8.cu (an FP8 pool under fp16/bf16 queries, fp8/'s lesson), two
/// translation units so that the build compiles the two sets of kernels side by side.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "02_paged/paged.hpp"
#include "02_paged/paged_decode.cuh"
#include "02_paged/two_halves.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"

namespace flashstep::stages::paged {

/// What a launch needs besides the kernel.
struct LaunchArgs {
  const BatchShape* shape;
  const DeviceBatch* batch;
  int num_stages;
  size_t smem_bytes;
};

/// One instantiation (dtype x head_dim x one or two halves x K/V dtype).
using Entry = KernelEntry<LaunchArgs>;

/// The kernel for element types T (q, o) and KV (the pool), HEAD_DIM and one or two halves.
template <typename T, int HEAD_DIM, bool TWO_HALVES, typename KV>
constexpr auto kernel() {
  if constexpr (TWO_HALVES) return paged_decode_two_halves_kernel<T, HEAD_DIM, KV>;
  else return paged_decode_kernel<T, HEAD_DIM, KV>;
}

template <typename T, int HEAD_DIM, bool TWO_HALVES, typename KV>
Entry kernel_entry() {
  constexpr int kThreads = TWO_HALVES ? 512 : 256;
  Entry e;
  e.smem_bytes = [](int num_stages, int group_size) {
    const DecodeBlockShape bs = DecodeTraits<KV, HEAD_DIM>::block_shape(group_size);
    return TWO_HALVES ? two_halves_smem_bytes<KV, HEAD_DIM>(num_stages, bs.bdy, bs.bdz)
                      : paged_decode_smem_bytes<KV, HEAD_DIM>(num_stages, bs.bdy, bs.bdz);
  };
  e.set_smem_limit = [](size_t bytes) {
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(kernel<T, HEAD_DIM, TWO_HALVES, KV>(),
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  e.blocks_per_sm = [](size_t bytes) {
    int blocks = 0;
    FLASHSTEP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel<T, HEAD_DIM, TWO_HALVES, KV>(), kThreads, bytes));
    return blocks;
  };
  e.launch = [](const LaunchArgs& a, cudaStream_t stream) {
    const BatchShape& s = *a.shape;
    PagedDecodeParams<T, KV> p;
    p.q = static_cast<const T*>(a.batch->q);
    p.kv = kernels::make_paged_kv(static_cast<const KV*>(a.batch->kv_pool), a.batch->kv_indptr, a.batch->kv_indices,
                                  a.batch->kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM,
                                  s.kv_layout == KVLayout::HND);
    p.o = static_cast<T*>(a.batch->o);
    p.lse = a.batch->lse;
    p.num_qo_heads = s.num_qo_heads;
    p.group_size = s.group_size();
    const DecodeBlockShape bs = DecodeTraits<KV, HEAD_DIM>::block_shape(p.group_size);
    p.bdy = bs.bdy;
    p.bdz = bs.bdz;
    p.num_stages = a.num_stages;
    // k_scale rides on q's scale, v_scale on the output's normalisation (scale 1: as before);
    // the run's scales when it gives them, so a new layer's scales need no new plan.
    p.sm_scale_log2 = s.resolved_sm_scale() * run_k_scale(s, *a.batch) * kernels::kLog2e;
    p.v_scale = run_v_scale(s, *a.batch);
    const dim3 grid(s.num_kv_heads, s.batch_size);
    kernel<T, HEAD_DIM, TWO_HALVES, KV>()<<<grid, kThreads, a.smem_bytes, stream>>>(p);
    kernels::check_launch(TWO_HALVES ? "paged_decode_two_halves_kernel" : "paged_decode_kernel");
  };
  return e;
}

/// The entry for q/o in `dtype` (f16 or bf16) over an FP8 pool (`kv_dtype` e4m3 or e5m2):
/// paged_fp8.cu's instantiations. 256 threads: paged_decode_kernel; 512: the two halves.
Entry fp8_kernel_entry_for(DType dtype, DType kv_dtype, int head_dim, int threads);

}  // namespace flashstep::stages::paged
