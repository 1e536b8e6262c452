// Exercise 7 (chapter 4, "Packing without padding: ragged tensors"): batch attention as
// attention request by request, on packed queries and keys.
//
// Fill in batch_attention() below. The batch's queries, keys and values are packed back
// to back with no padding; qo_indptr and kv_indptr say which rows belong to which request.
// Slice each request's rows out, attend them with the reference's
// single_prefill_with_kv_cache, and write its output rows back in place. The grader
// compares your output with the reference's batch_prefill_with_ragged_kv_cache.
//
//     cmake --build build --target flashstep_exercise_cpu_07_ragged_batch_attention
//     flashstep exercise check 7          (or run build/bin/flashstep_exercise_cpu_07_ragged_batch_attention)
//
// Stuck? `flashstep exercise hint 7`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::AttentionOptions;
using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

/// Attention of a ragged batch (FlashInfer's BatchPrefillWithRaggedKVCache).
/// \param q (qo_indptr[batch], num_qo_heads, head_dim) every request's queries, packed
/// \param qo_indptr (batch + 1): request i's queries are rows qo_indptr[i] .. qo_indptr[i+1]
/// \param k (kv_indptr[batch], num_kv_heads, head_dim) every request's keys, packed
/// \param v same shape as k
/// \param kv_indptr (batch + 1): request i's keys and values are rows kv_indptr[i] .. kv_indptr[i+1]
/// \param opt mask and scale, as single_prefill_with_kv_cache takes them
/// \return o (qo_indptr[batch], num_qo_heads, head_dim), lse (qo_indptr[batch], num_qo_heads)
AttentionResult batch_attention(const Tensor& q, const std::vector<int32_t>& qo_indptr, const Tensor& k,
                                const Tensor& v, const std::vector<int32_t>& kv_indptr, const AttentionOptions& opt) {
  AttentionResult result;
  // TODO(exercise): attend each request's slice and place its rows in result.o and result.lse.
  return result;
}
