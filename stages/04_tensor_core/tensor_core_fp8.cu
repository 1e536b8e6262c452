// Stage 04 over an FP8 cache: the kernel's instantiations for fp16/bf16 q and o with e4m3
// or e5m2 K/V (prefill_attention.cuh, "FP8 K/V"), in their own translation unit so that
// they compile beside tensor_core.cu's. tensor_core.cu's runner launches them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "04_tensor_core/prefill_launch.cuh"

namespace flashstep::stages::tensor_core {

template int prepare_prefill_attention<__half, __nv_fp8_e4m3>(int);
template int prepare_prefill_attention<__half, __nv_fp8_e5m2>(int);
template int prepare_prefill_attention<__nv_bfloat16, __nv_fp8_e4m3>(int);
template int prepare_prefill_attention<__nv_bfloat16, __nv_fp8_e5m2>(int);
template void launch_prefill_attention<__half, __nv_fp8_e4m3>(const PrefillParams<__half, __nv_fp8_e4m3>&, int,
                                                              int64_t, cudaStream_t);
template void launch_prefill_attention<__half, __nv_fp8_e5m2>(const PrefillParams<__half, __nv_fp8_e5m2>&, int,
                                                              int64_t, cudaStream_t);
template void launch_prefill_attention<__nv_bfloat16, __nv_fp8_e4m3>(
    const PrefillParams<__nv_bfloat16, __nv_fp8_e4m3>&, int, int64_t, cudaStream_t);
template void launch_prefill_attention<__nv_bfloat16, __nv_fp8_e5m2>(
    const PrefillParams<__nv_bfloat16, __nv_fp8_e5m2>&, int, int64_t, cudaStream_t);

}  // namespace flashstep::stages::tensor_core
