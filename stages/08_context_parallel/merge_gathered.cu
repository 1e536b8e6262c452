// Stage 08 — the launcher of the merge of gathered states (merge_gathered.cuh), for
// f32, f16 and bf16 outputs x head_dim 64, 128, 256.
#include "08_context_parallel/merge_gathered.hpp"

#include <cstdint>
#include <string>

#include "08_context_parallel/merge_gathered.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::context_parallel {

void merge_gathered_states(const float* states_o, const float* states_lse, int states_per_request, int batch_size,
                           int num_qo_heads, int head_dim, DType dtype, void* o, float* lse, cudaStream_t stream) {
  const char* fn = "merge_gathered_states";
  ref::require(states_per_request >= 1, fn,
               "states_per_request must be >= 1, got " + std::to_string(states_per_request));
  ref::require(batch_size >= 1 && batch_size <= 65535, fn,
               "batch_size must be 1..65535 (grid.y of the merge kernel), got " + std::to_string(batch_size));
  ref::require(num_qo_heads >= 1, fn, "num_qo_heads must be >= 1, got " + std::to_string(num_qo_heads));
  ref::require(head_dim == 64 || head_dim == 128 || head_dim == 256, fn,
               "head_dim must be 64, 128 or 256, got " + std::to_string(head_dim));
  ref::require(states_o != nullptr && states_lse != nullptr && o != nullptr, fn,
               "states_o, states_lse and o must not be null");
  ref::require(reinterpret_cast<uintptr_t>(states_o) % 16 == 0, fn, "states_o must be 16-byte aligned");
  FLASHSTEP_DISPATCH_DTYPE(dtype, OutT, {
    FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
      MergeGatheredParams<OutT> p;
      p.states_o = states_o;
      p.states_lse = states_lse;
      p.states_per_request = states_per_request;
      p.o = static_cast<OutT*>(o);
      p.lse = lse;
      p.num_qo_heads = num_qo_heads;
      merge_gathered_kernel<OutT, HEAD_DIM><<<dim3(num_qo_heads, batch_size), split_kv::kMergeThreads, 0, stream>>>(p);
      kernels::check_launch("merge_gathered_kernel");
    });
  });
}

}  // namespace flashstep::stages::context_parallel
