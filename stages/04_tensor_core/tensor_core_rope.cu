// Stage 04 with RoPE in its loads: the kernel's ROPE_LLAMA instantiations for fp16/bf16 q
// and K/V (prefill_attention.cuh, "RoPE in the loads"), in their own translation unit so
// that they compile beside tensor_core.cu's. tensor_core.cu's runner launches them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "04_tensor_core/prefill_launch.cuh"

namespace flashstep::stages::tensor_core {

FLASHSTEP_PREFILL_ROPE_INSTANTIATIONS(template)

}  // namespace flashstep::stages::tensor_core
