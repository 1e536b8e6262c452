/// \file naive.hpp
/// \brief Stage 01 — naive batch attention: ragged queries over ragged contiguous KV,
/// prefill and decode, causal, GQA, fp32. Scores are materialized in the workspace and
/// three kernels make three passes over them.
#pragma once

#include <cstdint>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::naive {

/// Everything the three kernels read and write; raw pointers only.
struct NaiveParams {
  const float* q = nullptr;               ///< (nnz_qo, num_qo_heads, head_dim)
  const float* k = nullptr;               ///< (nnz_kv, num_kv_heads, head_dim)
  const float* v = nullptr;               ///< (nnz_kv, num_kv_heads, head_dim)
  const int32_t* qo_indptr = nullptr;     ///< (batch_size + 1)
  const int32_t* kv_indptr = nullptr;     ///< (batch_size + 1)
  const int64_t* score_indptr = nullptr;  ///< (batch_size + 1): request i's scores start at score_indptr[i]
  float* scores = nullptr;                ///< per request (num_qo_heads, qo_len, kv_len): scores, then probabilities
  float* o = nullptr;                     ///< (nnz_qo, num_qo_heads, head_dim)
  float* lse = nullptr;                   ///< (nnz_qo, num_qo_heads), natural log
  int batch_size = 0;                     ///< requests in the batch
  int num_qo_heads = 0;                   ///< query heads, Hq
  int num_kv_heads = 0;                   ///< kv heads, Hkv; query head h reads kv head h / (Hq / Hkv)
  int head_dim = 0;                       ///< elements per head, D
  float sm_scale = 0.f;                   ///< scale applied to q . k before the softmax (natural-log scores)
  bool causal = false;                    ///< bottom-right aligned causal mask (prefill)
};

/// Launches the three passes (scores, softmax, output) on `stream`.
void launch_naive(const NaiveParams& params, cudaStream_t stream);

/// plan/run for stage 01. plan() computes where each request's score block starts and
/// copies that table into the workspace; the scores themselves follow it.
class NaiveRunner : public StageRunner {
 public:
  size_t workspace_bytes(const BatchShape& shape) const override;
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;

  /// After run(): the probabilities (softmax of the scores), the intermediate this stage
  /// materializes. Device pointer; request i's (num_qo_heads, qo_len, kv_len) block
  /// starts at element score_indptr()[i].
  const float* probabilities() const { return scores_; }
  /// Host copy of the table plan() computed, (batch_size + 1).
  const std::vector<int64_t>& score_indptr() const { return score_indptr_; }

 private:
  BatchShape shape_;
  std::vector<int64_t> score_indptr_;
  int64_t* score_indptr_dev_ = nullptr;
  float* scores_ = nullptr;
};

/// Stage 01's registry entry.
StageInfo stage_info();

}  // namespace flashstep::stages::naive
