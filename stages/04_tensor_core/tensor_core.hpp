/// \file tensor_core.hpp
/// \brief Stage 04 — prefill/append and large-group decode on tensor cores (mma.sync
/// m16n8k16, ldmatrix from swizzled shared memory, cp.async K/V pipeline). plan() lists
/// the (request, query tile, kv chunk) work items, longest first, and splits the KV when
/// there are too few of them to fill the chip; run() launches the attention kernel and,
/// after a split, stage 03's merge kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::tensor_core {

/// Largest GQA group (num_qo_heads / num_kv_heads) the registry entries declare; the
/// kernel packs any group into the rows of its query tile.
constexpr int kMaxGroupSize = 32;
/// Largest page_size the entries declare (any positive page_size works).
constexpr int kMaxPageSize = 64;
/// Shortest KV chunk plan() makes when it splits, in keys: below it the partial states
/// cost more to write and merge than the extra blocks gain.
constexpr int kMinChunkKeys = 128;

/// Keys of chunk [chunk_begin, chunk_end) that packed rows [row_begin, row_begin + rows)
/// of a request can see: a block's work, as the kernel cuts it (stage 07 cuts the same).
inline int64_t visible_keys(const BatchShape& s, int64_t qo_len, int64_t kv_len, int64_t row_begin, int64_t rows,
                            int64_t chunk_begin, int64_t chunk_end) {
  const int64_t group = s.group_size(), delta = kv_len - qo_len;
  int64_t lo = chunk_begin, hi = chunk_end;
  if (s.causal) hi = std::min(hi, (row_begin + rows - 1) / group + delta + 1);
  if (s.window_left >= 0) lo = std::max(lo, row_begin / group + delta - s.window_left);
  return std::max<int64_t>(hi - lo, 0);
}

/// How the runner plans. The defaults are what the registry entries use; tests change
/// them to force splits.
struct TensorCoreOptions {
  /// Blocks the planner wants in the grid before it stops splitting the KV; 0: every
  /// multiprocessor times the blocks that fit on one.
  int target_blocks = 0;
  /// Keys per KV chunk, forcing a split (a multiple of 64); 0: plan() decides.
  int kv_chunk_size = 0;
};

/// The host-side schedule plan() computes (kept for inspection and tests).
struct Schedule {
  int Br = 0;                             ///< packed query rows per tile
  int kv_chunk_size = 0;                  ///< keys per chunk; 0: no split
  std::vector<int32_t> request_indices;   ///< work item -> request
  std::vector<int32_t> qo_tile_indices;   ///< work item -> query tile of the request
  std::vector<int32_t> kv_chunk_indices;  ///< work item -> kv chunk of the request
  std::vector<int32_t> partial_indptr;    ///< split only: (nnz_qo + 1) partial rows per query row
  /// Rows of the split's partial o and lse (0 without a split).
  int64_t partial_rows() const { return partial_indptr.empty() ? 0 : partial_indptr.back(); }
  /// Work items of the plan (the grid is num_items() x num_kv_heads blocks).
  int64_t num_items() const { return static_cast<int64_t>(request_indices.size()); }
};

/// Where each array of a schedule and the split's scratch lives in the workspace: the four
/// int32 arrays of the schedule ([0, schedule_bytes), what plan() copies), then the
/// partial o and lse of a split. Stage 07 lays out its workspace the same way.
struct WorkspaceLayout {
  size_t request_indices = 0, qo_tile_indices = 0, kv_chunk_indices = 0, partial_indptr = 0;
  size_t schedule_bytes = 0;  ///< [0, schedule_bytes): what plan() copies
  size_t partial_o = 0, partial_lse = 0, bytes = 0;
};

/// The layout of schedule `s` for num_qo_heads heads of head_dim (host only).
WorkspaceLayout layout_of(const Schedule& s, int num_qo_heads, int head_dim);

/// Copies the schedule's arrays into [0, w.schedule_bytes) of `workspace` on `stream`:
/// written into the runner's pinned staging, then one asynchronous copy (plan() work, not
/// a run(); the staging waits for the copy before the next plan writes it).
void upload_schedule(const Schedule& s, const WorkspaceLayout& w, ScheduleStaging& staging, void* workspace,
                     cudaStream_t stream);
/// The same through a staging of its own, which it waits for before returning (for a
/// runner without one).
void upload_schedule(const Schedule& s, const WorkspaceLayout& w, void* workspace, cudaStream_t stream);

/// plan/run for stage 04, over the storage its registry entry names.
class TensorCoreRunner : public StageRunner {
 public:
  /// \param storage paged pool or ragged k/v
  /// \param options planning knobs (defaults: plan() decides)
  explicit TensorCoreRunner(KVStorage storage, TensorCoreOptions options = {});
  size_t workspace_bytes(const BatchShape& shape) const override;
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;
  /// The last plan's schedule.
  const Schedule& schedule() const { return schedule_; }
  /// The schedule plan() would make for `shape` (host only when options.target_blocks or
  /// options.kv_chunk_size is set; otherwise it asks the device for its size).
  Schedule make_schedule(const BatchShape& shape) const;

 private:
  KVStorage storage_;
  TensorCoreOptions options_;
  BatchShape shape_;
  Schedule schedule_;
  uint8_t* workspace_ = nullptr;
  CapturedLaunch captured_;
  ScheduleStaging staging_;     // the schedule's pinned staging, one copy per plan
  DeviceRopeTurns rope_turns_;  // ROPE_LLAMA: the kernel's turns
  const double* rope_turns_ptr_ = nullptr;
};

/// Stage 04's registry entry for the paged pool (NHD and HND).
StageInfo stage_info();
/// Stage 04's registry entry for ragged (contiguous, NHD) k/v.
StageInfo ragged_stage_info();

/// Empty when the current GPU lets one block of stage 04's kernel for `shape` have the
/// shared memory it asks (PrefillTraits::smem_bytes: 192 KB at head_dim 256, more than an
/// A100's 163 KB or sm_86/89's 99 KB); otherwise why not, naming `name`, the bytes needed
/// and the bytes the GPU allows. Empty too where no GPU can be asked (a launch then fails
/// on its own). The entries' rules, and stage 05's, whose levels run this kernel.
/// \param name the registry entry the reason names ("04_tensor_core", "05_cascade")
/// \param shape the batch (its dtype, K/V dtype and head_dim pick the kernel)
std::string shared_memory_rule(const std::string& name, const BatchShape& shape);

}  // namespace flashstep::stages::tensor_core
