/// \file paged.hpp
/// \brief Stage 02 — batch decode through the CSR page table: one pass, online softmax,
/// cp.async-pipelined 16-byte loads, one K/V read shared by the query heads of a GQA group.
#pragma once

#include <cstdint>

#include "stage.hpp"

namespace flashstep::stages::paged {

/// Tuning knobs of the decode kernel (the kernel's shapes are fixed by dtype and head_dim).
struct PagedConfig {
  /// Pipeline depth: K/V tiles (32 KB each) in shared memory, S - 1 of them in flight
  /// while one is consumed. 0 chooses in plan() (2).
  int num_stages = 0;
  /// Threads per block: 256, or 512 = two 256-thread halves, each with its own pipeline
  /// over every other tile. 0 chooses in plan(): 512 when the grid has fewer than two
  /// blocks per SM (a lone block per SM), else 256.
  int threads = 0;
};

/// Largest GQA group the kernel takes (num_qo_heads / num_kv_heads).
constexpr int kMaxGroupSize = 8;
/// Largest page_size it is tested for (any positive page_size works).
constexpr int kMaxPageSize = 64;

/// plan/run for stage 02. plan() checks the shape, picks the pipeline depth and the
/// thread-block shape, and raises the kernel's shared-memory limit; run() launches one
/// kernel of (num_kv_heads, batch_size) blocks.
class PagedRunner : public StageRunner {
 public:
  /// A runner with the given knobs; plan() checks them (0 leaves each choice to plan()).
  explicit PagedRunner(PagedConfig config = {}) : config_(config) {}
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;
  /// The pipeline depth plan() chose.
  int num_stages() const { return num_stages_; }
  /// The threads per block plan() chose.
  int threads() const { return threads_; }

 private:
  PagedConfig config_;
  BatchShape shape_;
  int num_stages_ = 0;
  int threads_ = 0;
  size_t smem_bytes_ = 0;
};

/// Stage 02's registry entry.
StageInfo stage_info();

}  // namespace flashstep::stages::paged
