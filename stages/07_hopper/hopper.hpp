/// \file hopper.hpp
/// \brief Stage 07 — prefill on Hopper (sm_90a): TMA loads completing on mbarriers, wgmma
/// from shared memory, a producer warp group and two consumer warp groups (three at
/// head_dim 64). plan() lists the (request, query tile, kv chunk) work items longest first
/// and splits the KV when the grid is short, as stage 04 does; run() encodes the tensor
/// maps of q, k and v, launches the kernel over its (work item, kv head) units (a prefill
/// on one block per multiprocessor, each claiming its next unit; a decode batch a block
/// per unit) and, after a split, stage 03's merge kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "04_tensor_core/tensor_core.hpp"  // Schedule
#include "registry.hpp"                    // LevelLaunch, LevelKernel
#include "stage.hpp"

namespace flashstep::stages::hopper {

/// The host-side schedule plan() computes: stage 04's (work items (request, query tile,
/// kv chunk), longest first; partial rows per query token after a split).
using Schedule = tensor_core::Schedule;

/// How the runner plans. The defaults are what the registry entries use; tests change
/// them to force splits, stage 05 to cut each cascade level its own way.
struct HopperOptions {
  /// Blocks the planner wants in the grid before it stops splitting the KV; 0: one per
  /// multiprocessor (one block fills one).
  int target_blocks = 0;
  /// Keys per KV chunk, forcing a split (a positive multiple of 128); 0: plan() decides.
  int kv_chunk_size = 0;
  /// Blocks of the persistent grid at most (tests force a few, so that every block walks
  /// many units); 0: one per multiprocessor.
  int max_blocks = 0;
};

/// plan/run for stage 07 over paged or ragged (contiguous) K/V; the batch's storage picks
/// the kernel. After a split, stage 03's merge kernel folds the chunks.
class HopperRunner : public StageRunner {
 public:
  explicit HopperRunner(HopperOptions options = {});
  size_t workspace_bytes(const BatchShape& shape) const override;
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;
  /// The last plan's schedule.
  const Schedule& schedule() const { return schedule_; }
  /// The schedule plan() would make for `shape` (host only when options.target_blocks or
  /// options.kv_chunk_size is set; otherwise it asks the device for its size).
  Schedule make_schedule(const BatchShape& shape) const;

 private:
  HopperOptions options_;
  BatchShape shape_;
  Schedule schedule_;
  uint8_t* workspace_ = nullptr;
  CapturedLaunch captured_;
  ScheduleStaging staging_;  // the schedule's pinned staging, one copy per plan
};

/// One launch of the kernel over a view of a batch its caller built: the registry's
/// LevelLaunch, the form in which this stage lends the kernel to stage 05 (level_kernel()).
using HopperLaunch = LevelLaunch;
/// Launches the kernel for `shape` (its dtype, head_dim, storage, heads, mask, scale, and
/// qo_indptr.back() as the size of q) with `l` on `stream`: launches only (the tensor maps
/// are encoded here, a few microseconds of host work). No merge.
void launch_hopper_attention(const BatchShape& shape, const HopperLaunch& l, cudaStream_t stream);
/// Allows the kernel for `shape` its dynamic shared memory (a host call, not a stream
/// operation: in plan(), before launches).
void prepare_hopper_attention(const BatchShape& shape);
/// The key tile of the kernel: stage 07's chunks are multiples of it.
constexpr int kKeyTile = 128;

/// Whether this build holds sm_90a code and the current GPU can run it; otherwise why not.
std::string hopper_unavailable_reason();

/// Stage 07's registry entries: paged K/V (NHD and HND), and ragged K/V.
StageInfo stage_info();
StageInfo ragged_stage_info();

/// The kernel this stage lends to stage 05's cascade levels, through the registry
/// (level_kernels()): schedules of 128-key chunks, prepare_hopper_attention and
/// launch_hopper_attention.
LevelKernel level_kernel();

}  // namespace flashstep::stages::hopper
