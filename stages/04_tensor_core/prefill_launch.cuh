/// \file prefill_launch.cuh
/// \brief The definitions of prepare_prefill_attention and launch_prefill_attention
/// (declared in prefill_attention.cuh), for the files that instantiate them:
/// tensor_core.cu (the lesson's format, K/V in q's dtype), tensor_core_policies.cu (under
/// the features' policies) and tensor_core_fp8.cu (under fp8/'s format), three translation
/// units so that the build compiles the sets of kernels side by side.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "04_tensor_core/prefill_attention.cuh"
#include "fp8/fp8_prefill.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "rope/rope_in_loads.cuh"
#include "sinks/sinks.cuh"

namespace flashstep::stages::tensor_core {

template <typename T, typename Format, typename Policy>
int prepare_prefill_attention(int head_dim) {
  FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
    using Tr = PrefillTraits<T, HEAD_DIM, Format>;
    const auto kernel = prefill_attention_kernel<T, HEAD_DIM, Format, Policy>;
    // The occupancy calculator counts no block whose dynamic shared memory is above the
    // kernel's limit: raise it first, or a query made before the first plan() in a
    // process answers 0 and workspace_bytes() under-counts the split it plans.
    FLASHSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Tr::smem_bytes())));
    int blocks = 0;
    FLASHSTEP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Tr::kThreads, Tr::smem_bytes()));
    return blocks;
  });
  return 0;
}

template <typename T, typename Format, typename Policy>
void launch_prefill_attention(const PrefillParams<T, typename Format::Stored>& p, int head_dim, int64_t num_items,
                              cudaStream_t stream, const typename Policy::Params& pol) {
  if (num_items == 0) return;
  FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
    using Tr = PrefillTraits<T, HEAD_DIM, Format>;
    prefill_attention_kernel<T, HEAD_DIM, Format, Policy>
        <<<static_cast<unsigned>(num_items * p.num_kv_heads), Tr::kThreads, Tr::smem_bytes(), stream>>>(p, pol);
    kernels::check_launch("prefill_attention_kernel");
  });
}

}  // namespace flashstep::stages::tensor_core

/// The instantiations under a policy (q and K/V fp16 or bf16, the default ring): RoPE in
/// the loads (rope::RopeInLoads) and attention sinks (sinks::Sinks), declared `extern
/// template` by tensor_core.cu and defined `template` by tensor_core_policies.cu.
#define FLASHSTEP_PREFILL_POLICY_INSTANTIATION(PREFIX, T, POLICY)                                                     \
  PREFIX int prepare_prefill_attention<T, SameAsQ<T>, POLICY>(int);                                                   \
  PREFIX void launch_prefill_attention<T, SameAsQ<T>, POLICY>(const PrefillParams<T, T>&, int, int64_t, cudaStream_t, \
                                                              const typename POLICY::Params&);
#define FLASHSTEP_PREFILL_POLICY_INSTANTIATIONS(PREFIX)                            \
  FLASHSTEP_PREFILL_POLICY_INSTANTIATION(PREFIX, __half, rope::RopeInLoads)        \
  FLASHSTEP_PREFILL_POLICY_INSTANTIATION(PREFIX, __nv_bfloat16, rope::RopeInLoads) \
  FLASHSTEP_PREFILL_POLICY_INSTANTIATION(PREFIX, __half, sinks::Sinks)             \
  FLASHSTEP_PREFILL_POLICY_INSTANTIATION(PREFIX, __nv_bfloat16, sinks::Sinks)

/// The instantiations under fp8/'s format (q fp16/bf16 x e4m3/e5m2), declared `extern
/// template` by tensor_core.cu and defined `template` by tensor_core_fp8.cu. Use inside
/// namespace flashstep::stages::tensor_core.
#define FLASHSTEP_PREFILL_FP8_INSTANTIATION(PREFIX, T, KV)             \
  PREFIX int prepare_prefill_attention<T, fp8::Fp8Staged<T, KV>>(int); \
  PREFIX void launch_prefill_attention<T, fp8::Fp8Staged<T, KV>>(      \
      const PrefillParams<T, KV>&, int, int64_t, cudaStream_t, const kernels::IdentityPolicy::Params&);
#define FLASHSTEP_PREFILL_FP8_INSTANTIATIONS(PREFIX)                        \
  FLASHSTEP_PREFILL_FP8_INSTANTIATION(PREFIX, __half, __nv_fp8_e4m3)        \
  FLASHSTEP_PREFILL_FP8_INSTANTIATION(PREFIX, __half, __nv_fp8_e5m2)        \
  FLASHSTEP_PREFILL_FP8_INSTANTIATION(PREFIX, __nv_bfloat16, __nv_fp8_e4m3) \
  FLASHSTEP_PREFILL_FP8_INSTANTIATION(PREFIX, __nv_bfloat16, __nv_fp8_e5m2)
