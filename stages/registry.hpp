/// \file registry.hpp
/// \brief The list of CUDA stages, in teaching order. Tests, the benchmark, the CLI, the
/// Python module and the docs iterate over it; none of them names a stage in code.
///
/// Adding a stage: give its folder a `stage_info()` (see 02_paged/paged.hpp) and add its
/// one line to the table in registry.cpp.
///
/// The registry is also how a later stage lends a kernel to an earlier one. Sharing between
/// stages goes forward only: stage 05 never includes stage 07. Where stage 05's planner can
/// run a cascade level on stage 07's faster kernel, stage 07 lends it as a LevelKernel
/// (plain function pointers over the types below and stage 04's Schedule, which both
/// stages already share), listed in registry.cpp, and stage 05
/// finds it by name at run time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "04_tensor_core/tensor_core.hpp"  // tensor_core::Schedule: the work items a lent kernel plans
#include "stage.hpp"

namespace flashstep::stages {

/// Every stage, in teaching order (01_naive first).
const std::vector<StageInfo>& registry();

/// The stage called `name` (e.g. "02_paged"; the number alone, "02", names the stage's
/// first entry: "04" is "04_tensor_core", not "04_tensor_core_ragged").
/// Throws ref::InvalidArgument listing the known names otherwise.
const StageInfo& find_stage(const std::string& name);

/// The decode stage of the default choice: it splits long requests so that every SM streams
/// keys, and prices stage 02's kernel against the split (its chapter's cost model).
constexpr const char* kDecodeStage = "03_split_kv";
/// The largest GQA group the default choice gives kDecodeStage. Stage 04's tensor-core tile
/// computes 16 query rows per kv head where a decode of group g has g, so for g <= 8 it
/// only adds work to a memory-bound step.
constexpr int kDecodeStageMaxGroup = 8;

/// The default choice among `supporting` (registry names in teaching order, each of which
/// runs the batch): a decode whose GQA group is at most kDecodeStageMaxGroup gets
/// kDecodeStage where it is among them; anything else the latest. Returns an index into
/// `supporting`, or -1 when it is empty.
int default_stage_among(const std::vector<std::string>& supporting, Mode mode, int group_size);

/// The stage that runs `shape` when the caller names none: default_stage_among over the
/// registry's stages that support `shape` on CUDA device `device` (-1: the current one;
/// another is made current for the question and the previous one restored). Stages that
/// plan from the host page table (05_cascade) are left out: they are asked for by name.
/// Throws ref::InvalidArgument listing every stage's reason when none supports it.
const std::string& default_stage(const BatchShape& shape, int device = -1);

/// One launch of a lent kernel over a view of a batch that its caller built (stage 05: one
/// cascade level, its groups as requests, its CSR table and schedule in stage 05's
/// workspace). Device pointers; the batch's are DeviceBatch's (paged: kv_pool and the CSR
/// table; ragged: k, v and kv_indptr as token offsets).
struct LevelLaunch {
  const void* q = nullptr;                    ///< (nnz_qo, num_qo_heads, head_dim)
  const void* k = nullptr;                    ///< ragged: (nnz_kv, num_kv_heads, head_dim)
  const void* v = nullptr;                    ///< ragged: (nnz_kv, num_kv_heads, head_dim)
  const void* kv_pool = nullptr;              ///< paged: the page pool
  const void* v_pool = nullptr;               ///< paged, head_dim_vo != head_dim: V's pool (DeviceBatch)
  const int32_t* qo_indptr = nullptr;         ///< (batch_size + 1)
  const int32_t* kv_indptr = nullptr;         ///< (batch_size + 1): pages, or ragged tokens
  const int32_t* kv_indices = nullptr;        ///< paged: page ids
  const int32_t* kv_last_page_len = nullptr;  ///< paged: (batch_size)
  void* o = nullptr;                          ///< (nnz_qo, num_qo_heads, head_dim), no split
  float* lse = nullptr;                       ///< (nnz_qo, num_qo_heads), no split
  int64_t num_items = 0;                      ///< work items of the schedule
  const int32_t* request_indices = nullptr;   ///< (num_items) work item -> request
  const int32_t* qo_tile_indices = nullptr;   ///< (num_items) work item -> query tile
  const int32_t* kv_chunk_indices = nullptr;  ///< (num_items) work item -> kv chunk; split only
  int kv_chunk_size = 0;                      ///< 0: o and lse; else keys per chunk, partial rows
  const int32_t* partial_indptr = nullptr;    ///< (nnz_qo + 1) partial rows per query row
  float* partial_o = nullptr;                 ///< (partial rows, num_qo_heads, head_dim)
  float* partial_lse = nullptr;               ///< (partial rows, num_qo_heads)
  const float* sinks = nullptr;               ///< (num_qo_heads) sink logits, or null (none)
  /// A persistent grid's claim counter (an int in device memory, zero when the launch
  /// starts; the kernel leaves it zero): the lender may run a grid of fewer blocks than
  /// units, each claiming its next. Null: a block per unit.
  int* unit_counter = nullptr;
  int max_blocks = 0;  ///< with unit_counter: the grid's blocks at most; 0: the lender's choice
};

/// A prefill kernel that a stage lends to an earlier stage's planner: it runs one view of a
/// batch (a cascade level) into fp32 partial rows. Which batches it takes, and a runner for
/// whole batches, are its stage's registry entry (find_stage(stage)).
struct LevelKernel {
  std::string stage;  ///< the lending stage's registry name, e.g. "07_hopper"
  int key_tile = 0;   ///< keys per tile: a kv chunk is a positive multiple of it
  /// The work items for `level` in chunks of `kv_chunk_size` keys (host only), in stage
  /// 04's form, which the lending kernel plans too.
  tensor_core::Schedule (*make_schedule)(const BatchShape& level, int kv_chunk_size) = nullptr;
  /// Allows the kernel for `level` its dynamic shared memory (a host call, in plan()).
  void (*prepare)(const BatchShape& level) = nullptr;
  /// Launches the kernel for `level` on `stream` (launches only; no merge).
  void (*launch)(const BatchShape& level, const LevelLaunch& launch, cudaStream_t stream) = nullptr;
};

/// Every kernel a stage lends, one line per kernel in registry.cpp.
const std::vector<LevelKernel>& level_kernels();

/// The kernel the stage called `stage` lends ("07_hopper"), or nullptr where it lends none.
const LevelKernel* find_level_kernel(const std::string& stage);

}  // namespace flashstep::stages
