/// \file hopper.hpp
/// \brief Stage 07 — prefill on Hopper (sm_90a): TMA loads completing on mbarriers, wgmma
/// from shared memory, a producer warp group and two consumer warp groups. plan() lists
/// the (request, query tile) work items longest first, as stage 04 does; run() encodes
/// the tensor maps of q, k and v and launches a persistent grid (one block per
/// multiprocessor) that takes the (work item, kv head) units in that order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::hopper {

/// The host-side schedule plan() computes.
struct Schedule {
  int Br = 0;                            ///< packed query rows per tile
  std::vector<int32_t> request_indices;  ///< work item -> request
  std::vector<int32_t> qo_tile_indices;  ///< work item -> query tile of the request
  /// Work items of the plan (num_items() x num_kv_heads units of work).
  int64_t num_items() const { return static_cast<int64_t>(request_indices.size()); }
};

/// plan/run for stage 07 over ragged (contiguous) K/V.
class HopperRunner : public StageRunner {
 public:
  size_t workspace_bytes(const BatchShape& shape) const override;
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;
  /// The last plan's schedule.
  const Schedule& schedule() const { return schedule_; }
  /// The schedule plan() makes for `shape` (host only).
  static Schedule make_schedule(const BatchShape& shape);

 private:
  BatchShape shape_;
  Schedule schedule_;
  uint8_t* workspace_ = nullptr;
  int sms_ = 0;  ///< multiprocessors: the persistent grid's size
  CapturedLaunch captured_;
};

/// Whether this build holds sm_90a code and the current GPU can run it; otherwise why not.
std::string hopper_unavailable_reason();

/// Stage 07's registry entry (ragged K/V).
StageInfo ragged_stage_info();

}  // namespace flashstep::stages::hopper
