// Stage 04 over an FP8 cache: the kernel's instantiations under fp8/'s K/V format
// (stages/fp8/fp8_prefill.cuh: FP8 tiles staged, then widened in shared memory) for
// fp16/bf16 q and o with e4m3 or e5m2 K/V, in their own translation unit so that they
// compile beside tensor_core.cu's. tensor_core.cu's runner launches them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "04_tensor_core/prefill_launch.cuh"

namespace flashstep::stages::tensor_core {

FLASHSTEP_PREFILL_FP8_INSTANTIATIONS(template)

}  // namespace flashstep::stages::tensor_core
