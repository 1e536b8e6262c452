/// \file capi_kernels.hpp
/// \brief The two small kernels the C interface adds beside the stages: the merge of
/// attention states over whole tensors (FlashInfer's merge_state / merge_states) and the
/// append of new key/value rows into the paged pool (append_paged_kv_cache).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashstep/kernels/append_paged.cuh"
#include "stage.hpp"

namespace flashstep::capi {

/// Arguments of the append kernel (see fs_append_paged_kv_cache for their meaning).
using AppendParams = kernels::AppendPagedKVParams;

/// Launches the append on `stream`. \param dtype element type of the rows \param kv_dtype
/// element type of the cache: dtype (a copy), or e4m3 / e5m2 for f16/bf16 rows (quantized
/// under p.k_scale / p.v_scale) \param p the arguments \param stream where the kernel runs
void launch_append_paged_kv_cache(stages::DType dtype, stages::DType kv_dtype, const AppendParams& p,
                                  cudaStream_t stream);

/// Merges two states per (row, head). \param dtype element type of v \param v_a (seq_len,
/// num_heads, head_dim) \param s_a (seq_len, num_heads) natural-log lse \param v_b as v_a
/// \param s_b as s_a \param seq_len rows \param num_heads heads \param head_dim D
/// \param v_out merged v \param s_out merged lse \param stream where the kernel runs
void launch_merge_state(stages::DType dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                        int64_t seq_len, int64_t num_heads, int64_t head_dim, void* v_out, float* s_out,
                        cudaStream_t stream);

/// Merges num_states states per (row, head). \param dtype element type of v \param v
/// (seq_len, num_states, num_heads, head_dim) \param s (seq_len, num_states, num_heads)
/// \param seq_len rows \param num_states states per row \param num_heads heads
/// \param head_dim D \param v_out (seq_len, num_heads, head_dim) \param s_out (seq_len,
/// num_heads) \param stream where the kernel runs
void launch_merge_states(stages::DType dtype, const void* v, const float* s, int64_t seq_len, int64_t num_states,
                         int64_t num_heads, int64_t head_dim, void* v_out, float* s_out, cudaStream_t stream);

}  // namespace flashstep::capi
