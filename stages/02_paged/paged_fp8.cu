// Stage 02 over an FP8 cache (fp8/'s lesson, "The loop"): the same kernels instantiated
// for fp16/bf16 q and o with e4m3 or e5m2 K/V, in their own translation unit so that they
// compile beside paged.cu's. A 16-byte vector then holds 16 FP8 elements, a thread's
// whole share of a row, widened to fp32 in registers by kernels/vec.cuh's Vec16.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "02_paged/paged_launch.cuh"

namespace flashstep::stages::paged {

Entry fp8_kernel_entry_for(DType dtype, DType kv_dtype, int head_dim, int threads) {
  if (dtype != DType::f16 && dtype != DType::bf16)
    kernels::dispatch_failed("dtype", static_cast<long long>(dtype), "f16, bf16 over an FP8 cache");
  const bool f16 = dtype == DType::f16;
  FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
    FLASHSTEP_DISPATCH_BOOL(threads == 512, TWO_HALVES, {
      if (kv_dtype == DType::e4m3)
        return f16 ? kernel_entry<__half, HEAD_DIM, TWO_HALVES, __nv_fp8_e4m3>()
                   : kernel_entry<__nv_bfloat16, HEAD_DIM, TWO_HALVES, __nv_fp8_e4m3>();
      if (kv_dtype == DType::e5m2)
        return f16 ? kernel_entry<__half, HEAD_DIM, TWO_HALVES, __nv_fp8_e5m2>()
                   : kernel_entry<__nv_bfloat16, HEAD_DIM, TWO_HALVES, __nv_fp8_e5m2>();
    });
  });
  kernels::dispatch_failed("kv_dtype", static_cast<long long>(kv_dtype), "e4m3, e5m2");
}

}  // namespace flashstep::stages::paged
