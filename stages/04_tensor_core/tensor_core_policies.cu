// Stage 04 under the policies of the features that cross stages: RoPE in the loads
// (stages/rope/) and attention sinks (stages/sinks/), for fp16/bf16 q and K/V, in their
// own translation unit so that they compile beside tensor_core.cu's. tensor_core.cu's
// runner launches them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "04_tensor_core/prefill_launch.cuh"

namespace flashstep::stages::tensor_core {

FLASHSTEP_PREFILL_POLICY_INSTANTIATIONS(template)

}  // namespace flashstep::stages::tensor_core
