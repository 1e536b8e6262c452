/// \file pod_attention.hpp
/// \brief plan/run of POD attention (pod_attention.cuh): a mixed step's decode rows and
/// prefill rows in one launch.
///
/// plan() makes stage 04's schedule for the prefill rows (no KV split: their merge would
/// be a launch after) and stage 03's work items for the decode rows, split into chunks
/// only as far as the blocks the prefill rows leave free in one wave need (the last
/// block of a row merges its chunks: fused_merge.cuh), and uploads both, with the
/// prefill rows' qo_indptr and kv_indptr rebased to 0, in one copy. run() is one launch.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "stage.hpp"

namespace flashstep::stages::engine {

/// Which kind block `b` of a POD grid of `total` blocks, `decode` of them decode blocks,
/// runs (true: decode), and its index among the blocks of its kind: the kinds interleaved
/// in proportion, decode block j being the first block b with floor((b + 1) decode / total) > j.
__host__ __device__ inline bool pod_is_decode(int64_t b, int64_t total, int64_t decode, int& index) {
  const int64_t before = b * decode / total, after = (b + 1) * decode / total;
  index = static_cast<int>(after > before ? before : b - before);
  return after > before;
}

/// Why POD attention cannot run `step` with `num_decodes` decode rows ("" when it can):
/// fp16/bf16, head_dim 64/128/256, a paged pool (NHD or HND) of the q dtype, pages of up
/// to 64, a GQA group of at most 32 (stage 04's limits), causal, no window or soft cap.
std::string pod_unsupported_reason(const BatchShape& step, int num_decodes);

/// The last plan, for tests and the chapter.
struct PodPlan {
  int64_t prefill_blocks = 0;      ///< stage 04 work items x kv heads
  int64_t decode_blocks = 0;       ///< decode work items (chunks of the decode rows' KV) x kv heads
  int64_t decode_chunk_pages = 0;  ///< pages per decode chunk (a row's pages or fewer)
  size_t smem_bytes = 0;           ///< dynamic shared memory of every block
};

/// POD attention over one mixed step.
class PodAttention {
 public:
  PodAttention();
  ~PodAttention();
  PodAttention(const PodAttention&) = delete;
  PodAttention& operator=(const PodAttention&) = delete;

  /// Plans the step: `step` is the whole step as a causal prefill batch over a paged pool,
  /// rows 0 .. num_decodes-1 with one query each (host arrays qo_indptr, kv_indptr,
  /// kv_last_page_len set). Refuses (InvalidArgument, with pod_unsupported_reason) a step
  /// it cannot run. \param stream where the one upload is queued
  void plan(const BatchShape& step, int num_decodes, cudaStream_t stream);
  /// One launch over `step`'s device arrays (the whole step, as planned).
  void run(const DeviceBatch& step, cudaStream_t stream);
  /// The last plan.
  const PodPlan& pod_plan() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashstep::stages::engine
