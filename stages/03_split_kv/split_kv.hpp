/// \file split_kv.hpp
/// \brief Stage 03 — split-KV decode: FlashInfer's plan/run wrapper. plan() cuts long
/// requests into chunks (the reference planner, ref::plan_split_kv) so that a small batch
/// still fills every SM, prices that split against not splitting (stage 02's kernel) with
/// a cost model, lays every scratch array out in one caller-owned workspace and ships the
/// schedule with one host-to-device copy; run() launches what plan() chose and decides
/// nothing. run() can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "02_paged/paged.hpp"
#include "flashstep/reference/split_plan.hpp"
#include "stage.hpp"

namespace flashstep::stages::split_kv {

/// Largest GQA group the chunk kernel takes (num_qo_heads / num_kv_heads), as stage 02.
constexpr int kMaxGroupSize = 8;
/// Largest page_size it is tested for (any positive page_size works), as stage 02.
constexpr int kMaxPageSize = 64;
/// Pipeline depth of the tensor-core kernel (mma_decode.cuh) when SplitKVOptions::num_stages
/// is 0 and its grid fits one wave, for an FP8 cache (16 KB stages of 64 keys) as for K/V in
/// q's dtype (32 KB).
constexpr int kMmaStages = 2;
/// Its depth when SplitKVOptions::num_stages is 0 and the grid runs over one wave
/// (mma_num_stages, which also says when not).
constexpr int kMmaWaveStages = 3;
/// Smallest page (tokens) on which the tensor-core kernel runs (split_kv.cu, uses_mma).
constexpr int kMmaMinPageSize = 16;
/// What run() computes with; plan() chooses.
enum class DecodePath : int32_t {
  unsplit = 0,  ///< stage 02's runner: one block per (request, kv head), its two halves on small grids
  split = 1,    ///< the chunk kernel into fp32 partial rows, then the merge kernel
};
/// "unsplit" or "split".
const char* to_string(DecodePath path);

/// Which paths plan() may take.
enum class PathChoice {
  automatic,  ///< the cost model picks (DecodeCostModel)
  unsplit,    ///< always stage 02's kernel
  split,      ///< always the planner's chunks (split or, when it splits nothing, the chunk kernel alone)
};

/// The constants of the model plan() prices the two paths with (the chapter, "Split or
/// not: the cost model"). Decode reads every key once, so time is bytes over bandwidth; what
/// decides is how evenly the bytes spread over the SMs, and what the split adds. The GPU's
/// side, num_sm and the read rate R, is a DeviceModel (kernels/device_model.hpp) that no
/// stage owns:
///
///     unsplit  = LPT(blocks' bytes over num_sm SMs) / (R / num_sm)
///     split    = LPT(chunks' bytes over num_sm SMs) / (R / num_sm)
///                + partial rows written and read / R + merge_kernel_seconds
///
/// LPT: the longest-first greedy schedule's busiest SM (the GPU hands blocks to SMs as they
/// free up; the one-wave grids here make that a bin packing). Under a CUDA graph the path
/// cannot change between replays, so plan() prices a batch of graph_kv_len keys per request:
/// the choice depends on the batch size alone.
struct DecodeCostModel {
  double merge_kernel_seconds = 4.0e-6;  ///< what the second kernel adds beyond its bytes (H100, batch 16)
  double split_margin = 0.95;            ///< split only when estimated below this fraction of unsplit
  int graph_kv_len = 4096;               ///< keys per request the graph plan prices
};

/// The model's two estimates for one batch, and the path they choose.
struct PathEstimate {
  double unsplit_seconds = 0;
  double split_seconds = 0;
  DecodePath path = DecodePath::unsplit;
};

/// How the runner plans. The defaults are what the registry entry (and so the tests, the
/// benchmark and the CLI) use; the tests change them to force splits on short requests.
struct SplitKVOptions {
  /// Plan for a captured CUDA graph: the grid is padded to a size fixed by batch_size
  /// alone (surplus blocks exit through block_valid_mask), so a graph captured after one
  /// plan() replays correctly after a later plan() for other lengths, same batch size.
  bool enable_cuda_graph = false;
  /// The planner's shortest chunk, in tokens (c_min = this / page_size pages, at least 1):
  /// below it a chunk costs more to merge than it saves. FlashInfer uses 128.
  int min_kv_chunk_tokens = 128;
  /// Pipeline depth of the chunk kernel (32 KB stages), 2..8; 0 chooses 2 (stage 02's).
  int num_stages = 0;
  /// Multiprocessors the planner assumes; 0: the device model's (`device`). Tests set it to
  /// force many or few chunks; the kernels are correct for any value.
  int num_sm = 0;
  /// Resident blocks per multiprocessor the planner assumes; 0: the occupancy calculator's
  /// answer for the chunk kernel at the chosen depth.
  int ctas_per_sm = 0;
  /// Launch the merge kernel with programmatic dependent launch (sm_90+), so that its
  /// launch overlaps the chunk kernel's tail. Off, or before sm_90: an ordinary launch.
  bool programmatic_launch = true;
  /// run() writes every request's attention state in fp32 instead of the output dtype:
  /// DeviceBatch::o is then a float array (batch_size, num_qo_heads, head_dim) and
  /// DeviceBatch::lse (batch_size, num_qo_heads), natural log, is required. A request with
  /// no keys gets o = 0, lse = -inf. The states can be merged exactly with other states of
  /// the same requests (other keys, computed elsewhere), as stage 08 merges those of its
  /// GPUs. Every work item then writes a partial row, split or not, and the merge kernel
  /// writes fp32.
  bool fp32_states = false;
  /// Which paths plan() may take; automatic: the cost model's choice.
  PathChoice path = PathChoice::automatic;
  /// fp16/bf16 q with head_dim 128 and a GQA group of at most 8, over K/V in q's dtype
  /// (no RoPE, no soft cap) or an FP8 pool (e4m3 / e5m2), runs mma_decode.cuh's kernel:
  /// q . k and p v on the tensor cores, the same work items and merge. Its own launch
  /// serves both a split and an unsplit plan (stage 02's kernel runs only when `path` is
  /// PathChoice::unsplit). A run given sinks takes the chunk kernel under sinks/'s policy.
  /// false: the CUDA-core loop of chunk_decode.cuh / stage 02 for every shape (the tests
  /// keep it right; the chapter compares the two).
  bool tensor_cores = true;
  /// The cost model's constants.
  DecodeCostModel cost;
  /// The GPU the cost model prices (its read rate, and its SMs where num_sm is 0); not
  /// given: device_model(), the current device's: what the benchmark or `flashstep serve
  /// --json` measured, else its attributes'.
  std::optional<DeviceModel> device;
};

/// The cost model (DecodeCostModel) for one batch, given the split the planner made for
/// it. A pure host function. \param kv_lens keys of each request
/// \param plan ref::plan_split_kv's plan for those lengths \param page_size tokens per page
/// \param num_kv_heads Hkv \param num_qo_heads Hq \param head_dim D
/// \param elem_bytes bytes of one K or V element
/// \param device the GPU: its read rate, and num_sm, the SMs the blocks spread over
/// \param model the constants
PathEstimate estimate_paths(const std::vector<int64_t>& kv_lens, const ref::SplitKVPlan& plan, int page_size,
                            int num_kv_heads, int num_qo_heads, int head_dim, int elem_bytes, const DeviceModel& device,
                            const DecodeCostModel& model);

/// Where each scratch array lives in the workspace, in bytes from its start. A pure
/// function of the batch size, heads, head_dim and the planner's grid limit, never of
/// the lengths: a graph captured after one plan() keeps pointing at the right places
/// after every later plan() of the same batch size.
///
///      offset 0 +---------------------------------------------+ -.
///               | header: kv_chunk_size_in_pages, items, ...  |  |
///               | request_indices   int32 [capacity]          |  |  the schedule: staged in
///               | kv_tile_indices   int32 [capacity]          |  |  pinned host memory and
///               | o_indptr          int32 [batch_size + 1]    |  |  copied by ONE H2D copy
///               | kv_page_begin     int32 [capacity]          |  |  per plan()
///               | kv_chunk_len      int32 [capacity]          |  |
///               | block_valid_mask  uint8 [capacity]          |  |
///    partial_o  +---------------------------------------------+ -'
///               | partial_o   fp32 [partial_rows][Hq][D]      |  |  written by the chunk
///               | partial_lse fp32 [partial_rows][Hq]         |  |  kernel, read by the merge
///         bytes +---------------------------------------------+ -'
///
///     (each section starts at a multiple of kWorkspaceAlignment bytes)
///
/// capacity = max(batch_size, G / Hkv) (the largest padded grid any plan of this batch
/// size can ask for); partial_rows = G / Hkv when batch_size * Hkv < G (the only case in
/// which the planner may split), else 0; with fp32 states, capacity (every item a row).
struct WorkspaceLayout {
  int32_t batch_size = 0;       ///< requests the layout was made for (o_indptr has batch_size + 1)
  int32_t capacity = 0;         ///< entries of request_indices, kv_tile_indices, block_valid_mask
  int32_t partial_rows = 0;     ///< rows of partial_o / partial_lse (work items that may split)
  size_t header = 0;            ///< SplitKVHeader
  size_t request_indices = 0;   ///< int32 [capacity]
  size_t kv_tile_indices = 0;   ///< int32 [capacity]
  size_t o_indptr = 0;          ///< int32 [batch_size + 1]
  size_t kv_page_begin = 0;     ///< int32 [capacity]: work item k's first page, an index into kv_indices
  size_t kv_chunk_len = 0;      ///< int32 [capacity]: work item k's tokens
  size_t block_valid_mask = 0;  ///< uint8 [capacity]
  size_t schedule_bytes = 0;    ///< bytes [0, schedule_bytes): what plan() copies
  size_t partial_o = 0;         ///< fp32 [partial_rows][num_qo_heads][head_dim]
  size_t partial_lse = 0;       ///< fp32 [partial_rows][num_qo_heads]
  size_t bytes = 0;             ///< total workspace the runner needs
};

/// The schedule's scalars, at offset 0 of the workspace (for inspection and tests: the
/// kernels read the per-item arrays, which each plan() rewrites in place, so a replayed
/// graph runs the newest plan).
struct SplitKVHeader {
  int32_t kv_chunk_size_in_pages;  ///< c of the plan
  int32_t num_work_items;          ///< real work items (the rest of the grid is padding)
  int32_t split_kv;                ///< 1: partial states + merge; 0: outputs written directly
  int32_t padded_batch_size;       ///< grid.y of the chunk kernel
  int32_t path;                    ///< DecodePath run() takes
};

/// Lays out the workspace (see WorkspaceLayout). Throws ref::InvalidArgument on sizes < 1.
/// \param batch_size requests in the batch
/// \param num_qo_heads query heads, Hq (partial rows hold all of them)
/// \param num_kv_heads kv heads, Hkv (a work item is one chunk for one kv head's group)
/// \param head_dim elements per head, D
/// \param max_grid_size G = num_sm * ctas_per_sm, the planner's grid limit
/// \param fp32_states SplitKVOptions::fp32_states: a partial row for every work item
WorkspaceLayout make_workspace_layout(int batch_size, int num_qo_heads, int num_kv_heads, int head_dim,
                                      int max_grid_size, bool fp32_states = false);

/// Whether mma_decode.cuh's tensor-core kernel takes `shape` (plan() runs it when
/// SplitKVOptions::tensor_cores is on and the path is not forced unsplit): fp16/bf16 q,
/// head_dim 128, a group that fits the n8 operand, K/V either FP8 or in q's dtype with no
/// policy the kernel lacks (RoPE in the loads, the soft cap: the chunk kernel's), and pages
/// of kMmaMinPageSize tokens or more (a copy thread's keys lie in at most two pages). For
/// 16-bit K/V that is also where it pays: on an H200 at batch 128 x 8192 keys
/// the tensor-core kernel ran pages of 1 at 0.87x the CUDA-core loop (a development run),
/// pages of 16 and 64 at 1.25x and 1.30x (docs/results/03_split_kv/h200_decode_2026-11-29_1a47ddb.json;
/// the chapter, "On an H200: instructions, not bytes").
bool tensor_core_decode_takes(const BatchShape& shape);

/// Blocks an SM the planner is told of (ref::SplitKVConfig::ctas_per_sm) for the tensor-core
/// kernel, which fits `kernel_blocks` at once. A grid of batch_size x num_kv_heads blocks that
/// is over one wave of num_sm x kernel_blocks slots ends in a partial wave; cut into k chunks a
/// request it is k times as many blocks, and keeps blocks / (waves x slots) of the slots' time
/// busy. The fewest k (up to kMaxWaveChunks) that keeps 95% busy, else the busiest k, is
/// planned as ceil(k x grid / num_sm) blocks an SM; k = 1 keeps `planned_blocks` (the least of
/// the kernel's fit and the chunk kernel's under sinks/'s policy, so that a run given sinks
/// fits the same grid). A grid of one wave or less keeps `planned_blocks` too. Depends on the
/// batch size, not the lengths, so a CUDA graph replays it. On an H200, batch 64 x 4096 and
/// 128 x 8192 read 1.17x and 1.04x as fast with it (the chapter, "On an H200").
int mma_planned_ctas_per_sm(int planned_blocks, int kernel_blocks, int num_sm, int batch_size, int num_kv_heads);
/// The most chunks a request mma_planned_ctas_per_sm cuts a grid of over one wave into.
constexpr int kMaxWaveChunks = 8;

/// The chunks a request mma_planned_ctas_per_sm cuts the grid into for a kernel that fits
/// `kernel_blocks` an SM (1: one wave or less, or the whole requests already keep 95% busy).
int mma_wave_chunks(int kernel_blocks, int num_sm, int batch_size, int num_kv_heads);

/// The tensor-core kernel's pipeline depth when SplitKVOptions::num_stages is 0. A grid of
/// one wave or less of the kMmaStages kernel's slots (`kernel_blocks` an SM) runs at
/// kMmaStages. A grid over one wave runs at kMmaWaveStages (it fits `deeper_blocks` an SM)
/// unless that depth's plan cuts the requests into more chunks (mma_wave_chunks) than two
/// stages' does. Over one wave every SM is full, and two blocks of three stages (two tiles
/// in flight each) read faster than three of two, unless more chunks add a merge. At one
/// wave or less, where the plan fills the SMs with two blocks each whatever the depth, two
/// stages were faster. Measured on an H200 (the chapter, "On an H200").
int mma_num_stages(int kernel_blocks, int deeper_blocks, int num_sm, int batch_size, int num_kv_heads);

/// plan/run for stage 03.
///
/// plan() (host, once per batch composition): checks the shape, picks the kernel's depth
/// and occupancy, calls ref::plan_split_kv with the device's G, writes the schedule into
/// pinned memory in the workspace's layout and copies it with one cudaMemcpyAsync.
/// Then it chooses the path (DecodePath): stage 02's kernel, or the chunks and the merge
/// kernel (PathChoice, DecodeCostModel).
/// run() (per layer): stage 02's kernel, grid (num_kv_heads, batch_size); or the chunk
/// kernel, grid (num_kv_heads, padded_batch_size), then, when the plan split, the merge
/// kernel, grid (num_qo_heads, batch_size). No host decisions: it
/// refuses to be captured into a graph unless the plan was made for one.
class SplitKVRunner : public StageRunner {
 public:
  /// A runner that plans with `options`; workspace_bytes() and plan() check them.
  explicit SplitKVRunner(SplitKVOptions options = {});
  ~SplitKVRunner() override;
  SplitKVRunner(const SplitKVRunner&) = delete;
  SplitKVRunner& operator=(const SplitKVRunner&) = delete;

  size_t workspace_bytes(const BatchShape& shape) const override;
  void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) override;
  void run(const DeviceBatch& batch, cudaStream_t stream) override;

  /// The last plan, exactly as ref::plan_split_kv returned it.
  const ref::SplitKVPlan& split_plan() const { return plan_; }
  /// The planner configuration plan() used (num_sm, ctas_per_sm, ... as resolved).
  const ref::SplitKVConfig& planner_config() const { return planner_config_; }
  /// The workspace layout of the last plan.
  const WorkspaceLayout& layout() const { return layout_; }
  /// What run() computes with, as the last plan() chose.
  DecodePath path() const { return path_; }
  /// Whether the last plan runs mma_decode.cuh's tensor-core kernel.
  bool tensor_cores() const { return mma_; }
  /// The cost model's estimates of the last plan (zero when the path was not automatic).
  const PathEstimate& estimate() const { return estimate_; }
  /// Pipeline depth the chunk kernel runs with.
  int num_stages() const { return num_stages_; }
  /// Device pointer to the partial outputs, fp32 (layout().partial_rows, num_qo_heads,
  /// head_dim); row k belongs to work item k. Valid after run() when split_plan().split_kv.
  const float* partial_o() const;
  /// Device pointer to the partial natural-log LSEs, fp32 (layout().partial_rows, num_qo_heads).
  const float* partial_lse() const;

 private:
  SplitKVOptions options_;
  BatchShape shape_;
  bool planned_ = false;
  ref::SplitKVConfig planner_config_;
  ref::SplitKVPlan plan_;
  WorkspaceLayout layout_;
  uint8_t* workspace_ = nullptr;
  int num_stages_ = 0;
  DecodePath path_ = DecodePath::split;
  bool mma_ = false;
  PathEstimate estimate_;
  // The unsplit path: stage 02's runner, planned by plan() when it chooses that path.
  paged::PagedRunner unsplit_;
  // The two launches, bound by plan() to this dtype and head_dim's kernels and to the
  // workspace; run() only calls it.
  std::function<void(const DeviceBatch&, cudaStream_t)> launch_;
  // Pinned staging for the schedule, and its one copy per plan.
  ScheduleStaging staging_;
  DeviceRopeTurns rope_turns_;  // ROPE_LLAMA: the chunk kernel's turns
  // Set when run() was captured: later plans must keep the captured launch shape.
  bool captured_ = false;
  int32_t captured_batch_size_ = 0;
  int32_t captured_padded_batch_size_ = 0;
  bool captured_split_kv_ = false;
  DecodePath captured_path_ = DecodePath::split;
};

/// Stage 03's registry entry.
StageInfo stage_info();

}  // namespace flashstep::stages::split_kv
