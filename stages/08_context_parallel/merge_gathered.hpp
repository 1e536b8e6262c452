/// \file merge_gathered.hpp
/// \brief The host launcher of stage 08's merge of gathered states (merge_gathered.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "stage.hpp"

namespace flashstep::stages::context_parallel {

/// Merges several fp32 attention states of every request into its output, exactly
/// (grid (num_qo_heads, batch_size); capturable in a CUDA graph). State j of request r is
/// row j * batch_size + r of states_o (states_per_request * batch_size, num_qo_heads,
/// head_dim) and states_lse (same rows, num_qo_heads): the layout an all-gather of per-GPU
/// (batch_size, ...) states produces. A request whose states all have lse = -inf gets
/// o = 0, lse = -inf. Throws ref::InvalidArgument on bad sizes.
/// \param states_o fp32 normalized outputs \param states_lse natural-log LSEs
/// \param states_per_request states of each request, >= 1
/// \param batch_size requests \param num_qo_heads query heads \param head_dim 64, 128 or 256
/// \param dtype element type of o (f32, f16 or bf16)
/// \param o (batch_size, num_qo_heads, head_dim) output \param lse (batch_size,
///        num_qo_heads) natural-log output, or null
/// \param stream the stream to launch on
void merge_gathered_states(const float* states_o, const float* states_lse, int states_per_request, int batch_size,
                           int num_qo_heads, int head_dim, DType dtype, void* o, float* lse, cudaStream_t stream);

}  // namespace flashstep::stages::context_parallel
