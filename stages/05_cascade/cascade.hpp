/// \file cascade.hpp
/// \brief Stage 05 — cascade attention: the K/V pages a group of requests shares are read
/// once for the whole group, as one tall query tile, and merged exactly with each
/// request's own keys.
///
/// plan() reads the page table on the host (BatchShape::kv_indices), derives the levels
/// from the page ids requests share (the reference's derive_cascade_level_ends and
/// build_cascade_levels: whole pages, as a radix cache hands prefixes out), or takes
/// levels the caller built (plan_levels, FlashInfer's MultiLevelCascadeAttentionWrapper
/// form). It then prices the flat batch against every choice of shared levels with a
/// bytes-and-flops model and keeps the cheapest: when sharing does not pay, run() is
/// stage 03's (decode) or stage 04's or 07's (prefill, large groups) flat path, unchanged.
///
/// run() of a cascade: one launch of stage 04's tensor-core kernel per level, each over
/// its own CSR view of the same pool, writing fp32 partial states; then merge_levels
/// folds every level's states into o and lse. Only launches: CUDA-graph safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashstep/reference/cascade.hpp"
#include "stage.hpp"

namespace flashstep::stages::cascade {

/// Most levels one run folds (a system prompt, a document, ..., the request's own keys).
constexpr int kMaxLevels = 8;

/// Which path run() takes.
enum class Path {
  automatic,  ///< the cheaper one by the cost model (the registry entry's choice)
  cascade,    ///< the levels, even where the model says flat is cheaper (tests, bench)
  flat,       ///< stage 03 or 04 on the flat page table
};
/// "automatic", "cascade" or "flat".
const char* to_string(Path path);

/// What the planner assumes of its kernels. The GPU's side is a DeviceModel
/// (kernels/device_model.hpp, no stage's own): the rate stage 03's decode streams K/V at,
/// and the cost of one more kernel in a CUDA-graph replay. The numbers here are an H100's,
/// measured with flashstep's own bench (docs/results): the share of that rate stage 04's
/// kernel reaches when memory-bound (its group-32 decode, 2.0 of 2.9 TB/s); its
/// tensor-core rate on long prefill, and stage 07's (sm_90a).
struct CostModel {
  double tensor_core_read_fraction = 2.0 / 2.9;  ///< stage 04's kernel streaming K/V, of the device's read rate
  double flops_per_second = 2.5e14;              ///< what stage 04's kernel sustains on full tiles
  double hopper_flops_per_second = 4.5e14;       ///< stage 07's paged kernel on full tiles (340-385 TFLOP/s
                                                 ///< over pages of 16 causal, more on long ones)
  double margin = 0.9;                           ///< the cascade must cost under margin x flat to be chosen
};

/// How the runner plans.
struct CascadeOptions {
  Path path = Path::automatic;  ///< see Path
  int max_levels = 3;           ///< levels plan() derives at most (1 = flat), 1..kMaxLevels
  /// Blocks a level's launch should reach before its KV is not split further; 0: every
  /// multiprocessor times the blocks of stage 04's kernel that fit on one.
  int target_blocks = 0;
  /// Run a level on stage 07's kernel where it takes the level (sm_90a, head_dim 128, a
  /// group dividing 128) and the model prices it below stage 04's; false: stage 04 only.
  bool hopper = true;
  /// Under BatchShape::cuda_graph, plan() (derived levels) makes a launch fixed by
  /// batch_size, nnz_qo and num_pages, whatever the pages share, so one captured graph
  /// replays every later plan of that size: always the cascade path, exactly two levels
  /// (the longest run of whole pages each group shares, empty where none, then each
  /// request's own pages), both on stage 04's kernel without a KV split (one chunk per
  /// query tile), each grid padded to the most work items such a batch can need, and the
  /// workspace laid out for the most pages (batch_size x num_pages ids a level). The cost
  /// model is not asked: the caller chose the cascade (stage 09 does where decode rows
  /// share pages). false: the launch follows the levels, and a re-plan that changes them
  /// after a capture is refused.
  bool fixed_graph_launch = false;
  CostModel cost;  ///< the planner's prices
  /// The GPU the planner prices (read rate, launch cost) and fills (its SMs, where
  /// target_blocks is 0); not given: device_model(), the current device's.
  std::optional<DeviceModel> device;
};

/// One level as planned: its CSR view and how stage 04's (or 07's) kernel is cut over it.
struct LevelPlan {
  std::string stage;         ///< the level's kernel: "04_tensor_core" or "07_hopper"
  int64_t num_groups = 0;    ///< groups (one "request" each for the kernel)
  int64_t num_pages = 0;     ///< pages the level reads
  int64_t max_kv_len = 0;    ///< longest group's keys
  int kv_chunk_size = 0;     ///< keys per chunk of the level's launch (one chunk: >= max_kv_len)
  int64_t num_items = 0;     ///< work items (group, query tile, chunk) of the launch
  int64_t partial_rows = 0;  ///< partial states the level writes (per query head)
  double seconds = 0;        ///< the cost model's estimate
};

/// The last plan, for tests, the bench and the chapter.
struct CascadePlan {
  Path path = Path::flat;              ///< cascade or flat (never automatic after plan())
  std::string flat_stage;              ///< the flat path's stage: "03_split_kv", "07_hopper" or "04_tensor_core"
  ref::CascadeLevels levels;           ///< the levels run() launches (cascade only)
  std::vector<LevelPlan> level_plans;  ///< one per level (cascade only)
  double flat_seconds = 0;             ///< the model's flat estimate
  double cascade_seconds = 0;          ///< the model's estimate for the levels chosen
  int64_t partial_rows = 0;            ///< partial states of all levels (per query head)
  bool fixed_launch = false;           ///< planned by CascadeOptions::fixed_graph_launch
};

/// plan/run for stage 05 over a paged pool.
class CascadeRunner : public StageRunner {
 public:
  /// \param options planning knobs (defaults: the registry entry's)
  explicit CascadeRunner(CascadeOptions options = {});
  ~CascadeRunner() override;
  CascadeRunner(const CascadeRunner&) = delete;
  CascadeRunner& operator=(const CascadeRunner&) = delete;

  /// Prepares the plan of `shape` (levels, prices, schedules) and keeps it: a plan() of
  /// the same batch next (equal in every field) commits it without preparing again. Not
  /// for concurrent calls on one runner.
  size_t workspace_bytes(const BatchShape& shape) const override;
  /// Derives the levels from shape.kv_indices (pages several requests hold), prices them
  /// and plans the cheaper path.
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  /// Plans the given levels (FlashInfer's multi-level form) instead of deriving them; the
  /// flat path, when the model prefers it (or options.path asks), runs the flat batch.
  /// \param levels from ref::build_cascade_levels over shape's page table (or built the
  ///        same way by hand); levels.page_size must equal shape.page_size
  /// \param bytes_needed when not null, receives the workspace the plan needs, also when
  ///        workspace_size is too small and the plan is refused (one call sizes and plans)
  /// The levels are taken by value: a caller that hands them over with std::move pays no
  /// copy of its page ids (plan() runs every step; its host time is O(batch + pages)).
  void plan_levels(const BatchShape& shape, ref::CascadeLevels levels, void* workspace, size_t workspace_size,
                   cudaStream_t stream, size_t* bytes_needed = nullptr);
  /// Workspace for plan_levels(shape, levels, ...).
  size_t workspace_bytes_levels(const BatchShape& shape, ref::CascadeLevels levels) const;
  /// The planned launches. The page ids the levels read are the ones plan() copied: a
  /// changed page table needs a new plan(). Under a CUDA graph the launches depend on the
  /// levels (their count, sizes and schedules): after a capture, a plan() whose launches
  /// differ is refused (CapturedLaunch), and the flat path runs stage 03 or stage 04
  /// planned for graphs (BatchShape::cuda_graph).
  void run(const DeviceBatch& batch, cudaStream_t stream) override;
  /// After run() of a cascade: level `level`'s own state (its chunks merged) as fp32, for
  /// checking the intermediates against the reference's per-level results.
  /// \param o (nnz_qo, num_qo_heads, head_dim) fp32 device buffer
  /// \param lse (nnz_qo, num_qo_heads) fp32 device buffer, natural log
  void level_state(int level, float* o, float* lse, cudaStream_t stream) const;
  /// The last plan.
  const CascadePlan& cascade_plan() const { return plan_; }
  /// Bytes the last plan() of a cascade copied to the workspace (its levels' arrays and
  /// schedules; a fixed launch's unused room is not copied). 0 after a flat plan.
  size_t uploaded_bytes() const { return uploaded_bytes_; }

 private:
  /// run()'s launches for q's element type T (fp16, bf16; any other is refused).
  template <typename T>
  void launch_levels(const DeviceBatch& batch, cudaStream_t stream) const;

  struct Prepared;  // the plan, the staged schedule and the workspace layout
  // `given` (the caller's levels, or null to derive them) is moved from when planned.
  std::unique_ptr<Prepared> prepare(const BatchShape& shape, ref::CascadeLevels* given) const;
  void commit(const BatchShape& shape, std::unique_ptr<Prepared> p, void* workspace, size_t workspace_size,
              cudaStream_t stream);

  CascadeOptions options_;
  BatchShape shape_;
  CascadePlan plan_;
  std::unique_ptr<Prepared> prepared_;
  std::unique_ptr<StageRunner> flat_;
  uint8_t* workspace_ = nullptr;
  CapturedLaunch captured_;  // the levels' launches (the flat runner guards its own)
  // The levels' arrays and schedules, staged in pinned memory and copied to the workspace
  // in one copy; the next plan() waits for the event before it writes the buffer again.
  ScheduleStaging staging_;
  // workspace_bytes()' prepared plan, for a plan() of the same batch on the same device
  mutable std::unique_ptr<Prepared> sized_;
  mutable BatchShape sized_shape_;
  mutable int sized_device_ = -1;
  std::vector<std::pair<size_t, size_t>> upload_ranges_;  // commit()'s byte ranges, reused
  size_t uploaded_bytes_ = 0;
};

/// Stage 05's registry entry.
StageInfo stage_info();

}  // namespace flashstep::stages::cascade
