// Stage 05 — cascade: the planner (levels, cost model, chunks), the workspace, the
// per-level launches of stage 04's kernel (or, on sm_90a, stage 07's where the model
// prices it cheaper: a shared level is a tall prefill tile), and the registry entry.
// Stage 07 comes later, so this file does not include it: stage 07 lends its kernel
// through the registry (LevelKernel, registry.hpp), found here by name.
//
// How to run it: `ctest -L gpu` validates it (tests/stages/test_cascade.cpp);
// `flashstep_bench --shapes=bench/shapes_cascade.csv` times it against the flat stages.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "04_tensor_core/prefill_attention.cuh"
#include "04_tensor_core/tensor_core.hpp"
#include "05_cascade/cascade.hpp"
#include "05_cascade/merge_levels.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"
#include "registry.hpp"  // find_level_kernel: stage 07's kernel, lent

namespace flashstep::stages::cascade {

const char* to_string(Path path) {
  switch (path) {
    case Path::automatic: return "automatic";
    case Path::cascade: return "cascade";
    case Path::flat: return "flat";
  }
  return "?";
}

namespace {

constexpr int kBc = 64;   // stage 04's key tile
constexpr int kBr = 128;  // stage 04's packed query rows per tile
constexpr int kMinChunkKeys = 128;
constexpr int64_t kMaxMergeTokens = 65535;  // the merge grid's y dimension
// fixed_graph_launch: one chunk per query tile, of more keys than any request holds (a
// multiple of kBc, so that stage 04's kernel writes partial rows and splits nothing)
constexpr int kWholeChunk = 1 << 30;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The batch stage 04 sees for one level: its groups are the "requests".
BatchShape level_shape(const BatchShape& s, const ref::CascadeLevel& lv) {
  BatchShape b;
  b.mode = Mode::prefill;
  b.storage = KVStorage::paged;
  b.dtype = s.dtype;
  b.kv_layout = s.kv_layout;
  b.batch_size = static_cast<int>(lv.kv_last_page_len.size());
  b.num_qo_heads = s.num_qo_heads;
  b.num_kv_heads = s.num_kv_heads;
  b.head_dim = s.head_dim;
  b.page_size = s.page_size;
  b.num_pages = s.num_pages;
  b.causal = lv.causal;
  b.logits_soft_cap = s.logits_soft_cap;
  b.sm_scale = s.sm_scale;
  b.qo_indptr = lv.qo_indptr;
  b.kv_indptr = lv.kv_indptr;
  b.kv_last_page_len = lv.kv_last_page_len;
  return b;
}

/// Seconds stage 04's kernel (hopper = false) or stage 07's needs for batch `b` (a flat
/// batch, or one level with its groups as requests): every query tile of a request reads
/// all its (visible) keys, K and V; stage 04's warps with rows compute 16 rows x keys x
/// Hkv x 4 D flops (a warp's padded rows cost as much as real ones; a warp with none
/// skips the arithmetic), stage 07's two consumer warp groups always compute all 128
/// rows of a tile, at its own rate; the launch costs whichever of the two is larger.
double tensor_core_seconds(const BatchShape& b, const CascadeOptions& o, bool hopper = false) {
  const CostModel& c = o.cost;
  const double elt = static_cast<double>(dtype_bytes(b.dtype)), D = b.head_dim, Hkv = b.num_kv_heads;
  double flops = 0, bytes = 0;
  for (int g = 0; g < b.batch_size; ++g) {
    const int64_t qo_len = b.qo_indptr[g + 1] - b.qo_indptr[g], kv_len = b.kv_len(g);
    const int64_t tiles = ceil_div(qo_len * b.group_size(), kBr);
    // causal: a tile sees on average the keys before its middle row
    const double keys = b.causal ? std::max(0.0, kv_len - qo_len / 2.0) : static_cast<double>(kv_len);
    const int64_t padded_rows = hopper ? tiles * kBr : ceil_div(qo_len * b.group_size(), 16) * 16;
    flops += double(padded_rows) * keys * Hkv * 4.0 * D;
    bytes += tiles * keys * Hkv * D * 2.0 * elt + qo_len * double(b.num_qo_heads) * D * 2.0 * elt;
  }
  return std::max(flops / (hopper ? c.hopper_flops_per_second : c.flops_per_second),
                  bytes / (c.tensor_core_read_fraction * o.device->read_bytes_per_second));
}

/// Stage 07's kernel as the registry lends it, and stage 07's registry entry (which
/// batches it takes, a runner for the flat path); both null where none is registered.
struct LentKernel {
  const LevelKernel* kernel = nullptr;
  const StageInfo* info = nullptr;
};
const LentKernel& hopper_kernel() {
  static const LentKernel lent = [] {
    LentKernel l;
    l.kernel = find_level_kernel("07_hopper");
    if (l.kernel != nullptr) l.info = &find_stage(l.kernel->stage);
    return l;
  }();
  return lent;
}

/// Whether stage 07's kernel can run this level (an sm_90a build and GPU, head_dim 128, a
/// group dividing its 128-row tile) and the options allow it.
bool hopper_takes(const BatchShape& level, const CascadeOptions& o) {
  return o.hopper && hopper_kernel().kernel != nullptr && hopper_kernel().info->unsupported_reason(level).empty();
}

/// The flat path: stage 03 for the decode it can run (CUDA cores, memory-bound: groups up
/// to 8, no soft cap); otherwise stage 07 where it takes the batch and the model prices it
/// lower (never under a CUDA graph: its grid follows the lengths), else stage 04.
bool flat_is_split_kv(const BatchShape& s) {
  return s.mode == Mode::decode && split_kv::stage_info().unsupported_reason(s).empty();
}
bool flat_on_hopper(const BatchShape& s, const CascadeOptions& o) {
  return !flat_is_split_kv(s) && !s.cuda_graph && hopper_takes(s, o) &&
         tensor_core_seconds(s, o, true) < tensor_core_seconds(s, o);
}
const char* flat_stage_of(const BatchShape& s, const CascadeOptions& o) {
  return flat_is_split_kv(s) ? "03_split_kv" : flat_on_hopper(s, o) ? "07_hopper" : "04_tensor_core";
}

/// The flat path's seconds on `stage` (flat_stage_of's answer).
double flat_seconds(const BatchShape& s, const std::string& stage, const CascadeOptions& o) {
  const DeviceModel& gpu = *o.device;
  if (stage == "03_split_kv") {
    const double kv_bytes = double(s.total_kv_len()) * s.num_kv_heads * s.head_dim * 2.0 * dtype_bytes(s.dtype);
    return kv_bytes / gpu.read_bytes_per_second + 2 * gpu.launch_seconds;
  }
  return tensor_core_seconds(s, o, stage == "07_hopper") + 2 * gpu.launch_seconds;
}

/// One level's launch over the level's batch (level_shape): stage 04's kernel, or stage
/// 07's where it takes the level and the model prices it lower (uses_hopper says which).
double level_seconds(const BatchShape& level, const CascadeOptions& o, bool* uses_hopper = nullptr) {
  double t = tensor_core_seconds(level, o);
  bool hopper = false;
  if (hopper_takes(level, o)) {
    const double h = tensor_core_seconds(level, o, true);
    hopper = h < t;
    t = std::min(t, h);
  }
  if (uses_hopper) *uses_hopper = hopper;
  return t + o.device->launch_seconds;
}

/// Keys per chunk of one level's launch: none when the level already fills the chip,
/// else as many chunks as it takes to fill one wave (never more: a second, part-empty
/// wave costs as much as the first). Chunks are whole key tiles of the kernel (64 keys
/// for stage 04, 128 for stage 07).
int level_chunk(const BatchShape& ls, int64_t target_blocks, int key_tile = kBc) {
  int64_t blocks = 0, max_kv = 0;
  for (int g = 0; g < ls.batch_size; ++g) {
    blocks += ceil_div(int64_t{ls.qo_indptr[g + 1] - ls.qo_indptr[g]} * ls.group_size(), kBr) * ls.num_kv_heads;
    max_kv = std::max(max_kv, ls.kv_len(g));
  }
  const int64_t whole = std::max<int64_t>(key_tile, ceil_div(max_kv, key_tile) * key_tile);  // one chunk
  if (blocks == 0 || blocks >= target_blocks) return static_cast<int>(whole);
  const int64_t splits = std::max<int64_t>(1, target_blocks / blocks);
  const int64_t chunk = std::max<int64_t>(kMinChunkKeys, ceil_div(ceil_div(max_kv, splits), key_tile) * key_tile);
  return static_cast<int>(std::min(chunk, whole));
}

/// Refuses a q dtype stage 04's kernel has no instantiation for (fp16 and bf16 only).
[[noreturn]] void refuse_dtype(DType dtype) {
  throw ref::InvalidArgument(std::string("CascadeRunner: no kernel for dtype ") + to_string(dtype) +
                             " (stage 04's kernel takes f16 and bf16)");
}

template <typename T>
int prefill_blocks_per_sm_of(DType dtype, int head_dim) {
  if constexpr (sizeof(T) != 2) refuse_dtype(dtype);
  else return tensor_core::prepare_prefill_attention<T>(head_dim);
}

int prefill_blocks_per_sm(DType dtype, int head_dim) {
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, { return prefill_blocks_per_sm_of<T>(dtype, head_dim); });
}

/// A hand-built CascadeLevels' consistency with the batch it is planned for.
void check_given_levels(const char* fn, const BatchShape& s, const ref::CascadeLevels& c) {
  ref::require(!c.levels.empty() && static_cast<int>(c.levels.size()) <= kMaxLevels, fn,
               "levels must hold 1.." + std::to_string(kMaxLevels) + " levels (got " + std::to_string(c.levels.size()) +
                   ")");
  ref::require(c.page_size == s.page_size, fn,
               "levels.page_size (" + std::to_string(c.page_size) + ") must equal the pool's page_size (" +
                   std::to_string(s.page_size) + ")");
  ref::require(c.qo_indptr == s.qo_indptr, fn, "levels.qo_indptr must equal the batch's qo_indptr");
  ref::require(s.nnz_qo() <= kMaxMergeTokens, fn,
               "a cascade takes at most " + std::to_string(kMaxMergeTokens) + " query tokens (the merge grid)");
  for (size_t l = 0; l < c.levels.size(); ++l) {
    const ref::CascadeLevel& lv = c.levels[l];
    const std::string at = "level " + std::to_string(l) + ": ";
    const size_t groups = lv.kv_last_page_len.size();
    ref::require(groups >= 1 && lv.qo_indptr.size() == groups + 1 && lv.kv_indptr.size() == groups + 1, fn,
                 at + "qo_indptr and kv_indptr must have num_groups + 1 entries, kv_last_page_len num_groups >= 1");
    ref::require(lv.qo_indptr.front() == 0 && lv.qo_indptr.back() == s.nnz_qo() && lv.kv_indptr.front() == 0 &&
                     lv.kv_indptr.back() == static_cast<int64_t>(lv.kv_indices.size()),
                 fn, at + "qo_indptr must run 0..nnz_qo and kv_indptr 0..len(kv_indices)");
    // (each message is built only for the element that fails: plan() runs every step, and
    // a string per page id cost more than the rest of the plan)
    for (size_t g = 0; g < groups; ++g) {
      const int64_t pages = lv.kv_indptr[g + 1] - lv.kv_indptr[g];
      if (lv.qo_indptr[g + 1] < lv.qo_indptr[g] || pages < 0) ref::require(false, fn, at + "indptr must not decrease");
      const int32_t lpl = lv.kv_last_page_len[g];
      if (!(pages > 0 ? lpl >= 1 && lpl <= s.page_size : lpl == 0))
        ref::require(false, fn,
                     at + "kv_last_page_len[" + std::to_string(g) + "] = " + std::to_string(lpl) +
                         " does not fit its " + std::to_string(pages) + " pages");
    }
    // num_pages 0: the pool's size is not known at plan time (FlashInfer's plan does not
    // take it); the caller then checks the page ids against the pool it runs on.
    // (the smallest and largest id first, a loop the compiler vectorises; the message names
    // the first id that fails)
    int32_t low = 0, high = 0;
    if (!lv.kv_indices.empty()) {
      low = high = lv.kv_indices.front();
      for (int32_t page : lv.kv_indices) {
        low = std::min(low, page);
        high = std::max(high, page);
      }
    }
    if (low < 0 || (s.num_pages != 0 && high >= s.num_pages))
      for (int32_t page : lv.kv_indices)
        if (page < 0 || (s.num_pages != 0 && page >= s.num_pages))
          ref::require(false, fn,
                       at + "page id " + std::to_string(page) + " outside the pool of " + std::to_string(s.num_pages));
    ref::require(lv.causal == (l + 1 == c.levels.size() && s.mode == Mode::prefill && s.causal), fn,
                 at + "causal must be set on the last level exactly when the batch is causal prefill");
  }
}

/// Whether two batches are the same in every field plan() reads, i.e. every field.
bool same_batch(const BatchShape& a, const BatchShape& b) {
  // A field added to BatchShape changes its size: compare it below, then update the size.
  static_assert(sizeof(void*) != 8 || sizeof(BatchShape) == 200,
                "BatchShape changed: compare its new field in same_batch()");
  auto fields = [](const BatchShape& s) {
    return std::tie(s.mode, s.storage, s.dtype, s.kv_dtype, s.k_scale, s.v_scale, s.kv_layout, s.batch_size,
                    s.num_qo_heads, s.num_kv_heads, s.head_dim, s.page_size, s.num_pages, s.causal, s.window_left,
                    s.logits_soft_cap, s.sm_scale, s.pos_encoding, s.rope_scale, s.rope_theta, s.qo_indptr, s.kv_indptr,
                    s.kv_last_page_len, s.kv_indices, s.cuda_graph);
  };
  return fields(a) == fields(b);
}

/// The current device, or -1 where none can be asked (a host-only caller).
int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    device = -1;
  }
  return device;
}

/// Drops the shared levels that hold no page at all (nothing shared there).
std::vector<std::vector<int32_t>> nonempty_ends(const BatchShape& s, std::vector<std::vector<int32_t>> ends) {
  std::vector<std::vector<int32_t>> kept;
  for (size_t l = 0; l < ends.size(); ++l) {
    bool grows = false;
    for (int b = 0; b < s.batch_size && !grows; ++b) grows = ends[l][b] > (kept.empty() ? 0 : kept.back()[b]);
    if (grows) kept.push_back(std::move(ends[l]));
  }
  return kept;
}

}  // namespace

/// Everything plan() computes before it touches the device: the plan, the per-level
/// stage 04 schedules, the workspace layout and the staged index arrays.
struct CascadeRunner::Prepared {
  CascadePlan plan;
  std::unique_ptr<StageRunner> flat;  // flat path: stage 03 or 04's runner
  size_t flat_bytes = 0;              // its workspace
  struct Level {
    BatchShape shape;                     // the kernel's view of the level
    bool hopper = false;                  // stage 07's kernel, else stage 04's
    tensor_core::Schedule schedule;       // (stage 07 plans the same arrays)
    std::vector<int32_t> partial_indptr;  // (nnz_qo + 1) absolute rows in the partial buffer
    size_t qo_indptr, kv_indptr, kv_indices, last_page_len, request, tile, chunk, rows;  // byte offsets
  };
  std::vector<Level> levels;
  size_t staged_bytes = 0;  // [0, staged_bytes) of the workspace: the levels' arrays
  size_t partial_o = 0, partial_lse = 0, bytes = 0;
};

CascadeRunner::CascadeRunner(CascadeOptions options) : options_(options) {}
CascadeRunner::~CascadeRunner() = default;

std::unique_ptr<CascadeRunner::Prepared> CascadeRunner::prepare(const BatchShape& s, ref::CascadeLevels* given) const {
  const char* fn = given ? "CascadeRunner::plan_levels" : "CascadeRunner::plan";
  StageInfo info = stage_info();
  if (given) info.needs_host_page_table = false;  // the levels carry the page ids
  // A graph replays the levels' launches as captured: commit() refuses a plan that
  // changes them, and the flat path plans for graphs.
  info.cuda_graph = true;
  const std::string reason = info.unsupported_reason(s);
  ref::require(reason.empty(), fn, reason);
  ref::require(static_cast<int>(s.qo_indptr.size()) == s.batch_size + 1 &&
                   static_cast<int>(s.kv_indptr.size()) == s.batch_size + 1 &&
                   static_cast<int>(s.kv_last_page_len.size()) == s.batch_size,
               fn, "qo_indptr and kv_indptr must have batch_size + 1 entries, kv_last_page_len batch_size");
  ref::require(options_.max_levels >= 1 && options_.max_levels <= kMaxLevels, fn,
               "options.max_levels must be in 1.." + std::to_string(kMaxLevels));
  ref::require(s.mode == Mode::prefill || s.nnz_qo() == s.batch_size, fn, "decode needs one query per request");
  // The options with the GPU they price: options_.device, else the current device's model.
  CascadeOptions o = options_;
  if (!o.device) o.device = device_model();
  const DeviceModel& gpu = *o.device;
  ref::require(gpu.read_bytes_per_second > 0 && gpu.num_sm >= 1 && gpu.launch_seconds >= 0, fn,
               "options.device must have a positive read_bytes_per_second, num_sm >= 1 and launch_seconds >= 0");
  const CostModel& cost = o.cost;

  auto out = std::make_unique<Prepared>();
  CascadePlan& plan = out->plan;
  plan.flat_stage = flat_stage_of(s, o);  // the flat path's stage, whichever path runs
  plan.flat_seconds = flat_seconds(s, plan.flat_stage, o);
  // A launch fixed by (batch_size, nnz_qo, num_pages) for a captured graph: two levels,
  // whatever is shared (CascadeOptions::fixed_graph_launch).
  const bool fixed = s.cuda_graph && options_.fixed_graph_launch && given == nullptr;
  plan.fixed_launch = fixed;

  // Candidate level sets: the given ones (priced in place, never copied: they hold every
  // page id), or every subset of the derived shared levels (a shared level that does not
  // pay is folded into the next one).
  std::vector<ref::CascadeLevels> candidates;
  if (fixed) {
    ref::require(s.num_pages > 0, fn, "fixed_graph_launch needs the pool's num_pages (it sizes the workspace)");
    ref::require(s.nnz_qo() <= kMaxMergeTokens, fn,
                 "a cascade takes at most " + std::to_string(kMaxMergeTokens) + " query tokens (the merge grid)");
    candidates.push_back(
        ref::build_cascade_levels(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_last_page_len, s.page_size,
                                  ref::derive_cascade_level_ends(s.qo_indptr, s.kv_indptr, s.kv_indices,
                                                                 s.kv_last_page_len, s.page_size, 2, s.causal),
                                  s.causal));
  } else if (given) {
    check_given_levels(fn, s, *given);
  } else if (options_.path != Path::flat && s.nnz_qo() <= kMaxMergeTokens) {
    const auto ends = nonempty_ends(s, ref::derive_cascade_level_ends(s.qo_indptr, s.kv_indptr, s.kv_indices,
                                                                      s.kv_last_page_len, s.page_size,
                                                                      options_.max_levels, s.causal));
    const int shared = static_cast<int>(ends.size());
    for (int mask = (options_.path == Path::cascade ? 0 : 1); mask < (1 << shared); ++mask) {
      std::vector<std::vector<int32_t>> kept;
      for (int l = 0; l < shared; ++l)
        if (mask & (1 << l)) kept.push_back(ends[static_cast<size_t>(l)]);
      candidates.push_back(ref::build_cascade_levels(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_last_page_len,
                                                     s.page_size, kept, s.causal));
    }
  }
  // the levels, then the merge kernel: a launch, and at least one fp32 state per level and
  // query row written by the levels and read back (chunks add a few more)
  auto seconds_of = [&](const ref::CascadeLevels& c) {
    double t = gpu.launch_seconds;
    for (const ref::CascadeLevel& lv : c.levels) t += level_seconds(level_shape(s, lv), o);
    return t + double(s.nnz_qo()) * static_cast<double>(c.levels.size()) * s.num_qo_heads * (s.head_dim + 1) * 4.0 * 2 /
                   gpu.read_bytes_per_second;
  };
  double best = std::numeric_limits<double>::infinity();
  ref::CascadeLevels* chosen = nullptr;
  if (given) {
    best = seconds_of(*given);
    chosen = given;
  }
  for (ref::CascadeLevels& c : candidates) {
    const double t = seconds_of(c);
    if (t < best) {
      best = t;
      chosen = &c;
    }
  }
  plan.cascade_seconds = chosen == nullptr ? 0 : best;
  const bool cascade = fixed || (chosen != nullptr &&
                                 (given ? options_.path != Path::flat
                                        : options_.path == Path::cascade || (options_.path == Path::automatic &&
                                                                             best < cost.margin * plan.flat_seconds)));
  if (!cascade) {
    plan.path = Path::flat;
    plan.levels = {};
    if (plan.flat_stage == "03_split_kv") {
      out->flat = split_kv::stage_info().make_runner();  // planned for CUDA graphs, as this stage is
    } else if (plan.flat_stage == "07_hopper") {
      out->flat = hopper_kernel().info->make_runner();  // stage 07's runner, from its registry entry
    } else {
      out->flat = std::make_unique<tensor_core::TensorCoreRunner>(KVStorage::paged);
    }
    out->flat_bytes = out->flat->workspace_bytes(s);
    out->bytes = out->flat_bytes;
    return out;
  }

  // ---- the cascade: per level, stage 04's schedule with this stage's chunk choice.
  plan.path = Path::cascade;
  plan.levels = std::move(*chosen);
  int64_t target = options_.target_blocks;
  if (target == 0) target = int64_t{gpu.num_sm} * std::max(1, prefill_blocks_per_sm(s.dtype, s.head_dim));
  // stage 07's kernel fills a multiprocessor with one block
  const int64_t hopper_target = options_.target_blocks ? options_.target_blocks : int64_t{gpu.num_sm};
  size_t offset = 0;
  auto take = [&](size_t n_int32) {
    const size_t at = offset;
    offset = align_up(offset + n_int32 * sizeof(int32_t));
    return at;
  };
  int64_t rows = 0;
  for (const ref::CascadeLevel& lv : plan.levels.levels) {
    Prepared::Level L;
    L.shape = level_shape(s, lv);
    LevelPlan lp;
    lp.seconds = level_seconds(L.shape, o, &L.hopper);
    if (fixed) {
      // stage 04 (stage 07's tensor maps follow the lengths), no split, the grid padded
      // as stage 04 pads its own graph plans: sum over groups of ceil(rows * group / Br)
      // <= ceil(nnz_qo * group / Br) + batch_size - 1, the rest padding (request -1)
      L.hopper = false;
      CascadeOptions on_stage_04 = o;
      on_stage_04.hopper = false;
      lp.seconds = level_seconds(L.shape, on_stage_04);
      tensor_core::TensorCoreOptions topt;
      topt.kv_chunk_size = kWholeChunk;
      L.schedule = tensor_core::TensorCoreRunner(KVStorage::paged, topt).make_schedule(L.shape);
      const size_t capacity = static_cast<size_t>(ceil_div(s.nnz_qo() * s.group_size(), kBr) +
                                                  std::max(0, s.batch_size - 1));
      ref::require(L.schedule.request_indices.size() <= capacity, fn, "a level's work items outgrew the fixed grid");
      L.schedule.request_indices.resize(capacity, -1);
      L.schedule.qo_tile_indices.resize(capacity, 0);
      L.schedule.kv_chunk_indices.resize(capacity, 0);
    } else if (L.hopper) {
      const LevelKernel& lent = *hopper_kernel().kernel;
      L.schedule = lent.make_schedule(L.shape, level_chunk(L.shape, hopper_target, lent.key_tile));
    } else {
      tensor_core::TensorCoreOptions topt;
      topt.kv_chunk_size = level_chunk(L.shape, target);
      L.schedule = tensor_core::TensorCoreRunner(KVStorage::paged, topt).make_schedule(L.shape);
    }
    lp.stage = L.hopper ? "07_hopper" : "04_tensor_core";
    L.partial_indptr = L.schedule.partial_indptr;
    for (int32_t& r : L.partial_indptr) r += static_cast<int32_t>(rows);
    lp.num_groups = L.shape.batch_size;
    lp.num_pages = static_cast<int64_t>(lv.kv_indices.size());
    for (int g = 0; g < L.shape.batch_size; ++g) lp.max_kv_len = std::max(lp.max_kv_len, L.shape.kv_len(g));
    lp.kv_chunk_size = L.schedule.kv_chunk_size;
    lp.num_items = L.schedule.num_items();
    lp.partial_rows = L.schedule.partial_rows();
    plan.level_plans.push_back(lp);
    rows += L.schedule.partial_rows();
    // fixed: every array at its most entries, so no offset depends on the levels. The page
    // ids come last in each level: commit() uploads a level's arrays and the ids it holds
    // as one range, not the batch_size x num_pages entries laid out for them.
    const size_t groups_cap = static_cast<size_t>(s.batch_size);
    L.qo_indptr = take(fixed ? groups_cap + 1 : lv.qo_indptr.size());
    L.kv_indptr = take(fixed ? groups_cap + 1 : lv.kv_indptr.size());
    L.last_page_len = take(fixed ? groups_cap : lv.kv_last_page_len.size());
    L.request = take(L.schedule.request_indices.size());
    L.tile = take(L.schedule.qo_tile_indices.size());
    L.chunk = take(L.schedule.kv_chunk_indices.size());
    L.rows = take(L.partial_indptr.size());
    L.kv_indices = take(fixed ? groups_cap * static_cast<size_t>(s.num_pages) : lv.kv_indices.size());
    out->levels.push_back(std::move(L));
  }
  ref::require(rows * s.num_qo_heads * s.head_dim < (int64_t{1} << 40) && rows < (int64_t{1} << 31), fn,
               "too many partial states for one workspace");
  plan.partial_rows = rows;
  out->staged_bytes = offset;  // commit() stages the arrays
  const size_t states = static_cast<size_t>(rows) * static_cast<size_t>(s.num_qo_heads);
  out->partial_o = offset;
  out->partial_lse = out->partial_o + align_up(states * static_cast<size_t>(s.head_dim) * sizeof(float));
  out->bytes = out->partial_lse + align_up(states * sizeof(float));
  return out;
}

size_t CascadeRunner::workspace_bytes(const BatchShape& shape) const {
  // A caller sizes the workspace, then plans the same batch (stage 09 does every step):
  // the prepared plan is kept for that plan(), so the levels are derived once a step.
  const int device = current_device();
  if (sized_ == nullptr || sized_device_ != device || !same_batch(sized_shape_, shape)) {
    sized_ = prepare(shape, nullptr);
    sized_shape_ = shape;
    sized_device_ = device;
  }
  return sized_->bytes;
}

size_t CascadeRunner::workspace_bytes_levels(const BatchShape& shape, ref::CascadeLevels levels) const {
  return prepare(shape, &levels)->bytes;
}

void CascadeRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  std::unique_ptr<Prepared> p;
  if (sized_ != nullptr && sized_device_ == current_device() && same_batch(sized_shape_, shape)) p = std::move(sized_);
  sized_.reset();  // used or stale: the next workspace_bytes() prepares afresh
  commit(shape, p ? std::move(p) : prepare(shape, nullptr), workspace, workspace_size, stream);
}

void CascadeRunner::plan_levels(const BatchShape& shape, ref::CascadeLevels levels, void* workspace,
                                size_t workspace_size, cudaStream_t stream, size_t* bytes_needed) {
  std::unique_ptr<Prepared> p = prepare(shape, &levels);
  if (bytes_needed) *bytes_needed = p->bytes;
  commit(shape, std::move(p), workspace, workspace_size, stream);
}

namespace {

/// What a captured graph freezes of the cascade's run(): the path, and per level the
/// grid, the split and the workspace offsets.
std::string launch_of(const CascadePlan& plan, size_t bytes) {
  if (plan.path == Path::flat) return "stage 05: flat on " + plan.flat_stage;
  if (plan.fixed_launch)  // the groups and pages are device data; the grids are not
    return "stage 05: 2 levels fixed for a graph (" + std::to_string(plan.level_plans[0].num_items) + " items each, " +
           std::to_string(plan.partial_rows) + " partial rows, workspace " + std::to_string(bytes) + " bytes)";
  std::string d = "stage 05: " + std::to_string(plan.level_plans.size()) + " levels (";
  for (const LevelPlan& lp : plan.level_plans)
    d += lp.stage + " " + std::to_string(lp.num_items) + " items, chunk " + std::to_string(lp.kv_chunk_size) + ", " +
         std::to_string(lp.num_groups) + " groups, " + std::to_string(lp.num_pages) + " pages; ";
  return d + std::to_string(plan.partial_rows) + " partial rows, workspace " + std::to_string(bytes) + " bytes)";
}

}  // namespace

void CascadeRunner::commit(const BatchShape& shape, std::unique_ptr<Prepared> p, void* workspace, size_t workspace_size,
                           cudaStream_t stream) {
  captured_.check_plan("CascadeRunner::plan", launch_of(p->plan, p->bytes));
  // The same flat stage as the last plan: keep its runner, whose own CapturedLaunch
  // knows what a graph captured of it.
  if (p->plan.path == Path::flat && flat_ != nullptr && plan_.path == Path::flat &&
      plan_.flat_stage == p->plan.flat_stage)
    p->flat = std::move(flat_);
  ref::require(workspace_size >= p->bytes && (workspace != nullptr || p->bytes == 0), "CascadeRunner::plan",
               "workspace holds " + std::to_string(workspace_size) + " bytes, the plan needs " +
                   std::to_string(p->bytes));
  shape_ = shape;
  workspace_ = static_cast<uint8_t*>(workspace);
  if (p->plan.path == Path::flat) {
    p->flat->plan(shape, workspace, workspace_size, stream);
  } else {
    // the levels' kernels need more dynamic shared memory than a launch gets by default
    prefill_blocks_per_sm(shape.dtype, shape.head_dim);
    for (const Prepared::Level& L : p->levels)
      if (L.hopper) hopper_kernel().kernel->prepare(L.shape);
  }
  uploaded_bytes_ = 0;
  if (p->plan.path == Path::cascade && p->staged_bytes > 0) {
    // Every level's arrays and schedule, written once into pinned memory in the
    // workspace's layout and copied in one transfer. The copy is queued behind whatever
    // the stream runs (a run() still in flight keeps its arrays until it is done); the
    // next plan() waits for this copy, not for the stream, before it writes the buffer.
    // Only the bytes the arrays hold are written and copied: a fixed launch lays out
    // batch_size x num_pages page ids a level (megabytes) and fills a few thousand. The
    // alignment gaps between arrays are zeroed and copied with them; a gap larger than
    // kSkipGap (the unused room of a fixed layout) is neither written nor copied, and no
    // kernel reads it (the indptr arrays bound every read).
    constexpr size_t kSkipGap = 4096;
    uint8_t* staged = staging_.begin(p->staged_bytes, /*zeroed=*/false);
    std::vector<std::pair<size_t, size_t>>& ranges = upload_ranges_;
    ranges.clear();
    size_t written = 0;
    auto put = [&](size_t at, const std::vector<int32_t>& v) {
      ref::require(at >= written, "CascadeRunner::plan",
                   "the staged arrays' offsets must increase");  // prepare()'s layout
      const size_t end = at + v.size() * sizeof(int32_t);
      if (!ranges.empty() && at - ranges.back().second <= kSkipGap) {
        std::memset(staged + ranges.back().second, 0, at - ranges.back().second);
        ranges.back().second = end;
      } else if (!v.empty()) {
        ranges.push_back({at, end});
      }
      if (!v.empty()) std::memcpy(staged + at, v.data(), v.size() * sizeof(int32_t));
      written = end;
    };
    for (size_t l = 0; l < p->levels.size(); ++l) {
      const Prepared::Level& L = p->levels[l];
      const ref::CascadeLevel& lv = p->plan.levels.levels[l];
      put(L.qo_indptr, lv.qo_indptr);
      put(L.kv_indptr, lv.kv_indptr);
      put(L.last_page_len, lv.kv_last_page_len);
      put(L.request, L.schedule.request_indices);
      put(L.tile, L.schedule.qo_tile_indices);
      put(L.chunk, L.schedule.kv_chunk_indices);
      put(L.rows, L.partial_indptr);
      put(L.kv_indices, lv.kv_indices);
    }
    staging_.upload_ranges(workspace_, ranges, stream);
    for (const auto& [first, last] : ranges) uploaded_bytes_ += last - first;
  }
  plan_ = std::move(p->plan);
  flat_ = std::move(p->flat);
  prepared_ = std::move(p);
}

void CascadeRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  ref::require(prepared_ != nullptr, "CascadeRunner::run", "plan() must come first");
  captured_.on_run(stream, [&] { return launch_of(plan_, prepared_->bytes); });
  if (plan_.path == Path::flat) {
    flat_->run(batch, stream);
    return;
  }
  FLASHSTEP_DISPATCH_DTYPE(shape_.dtype, T, { launch_levels<T>(batch, stream); });
}

template <typename T>
void CascadeRunner::launch_levels(const DeviceBatch& batch, cudaStream_t stream) const {
  if constexpr (sizeof(T) != 2) {
    refuse_dtype(shape_.dtype);
  } else {
    const BatchShape& s = shape_;
    const float sm_scale = s.resolved_sm_scale();
    for (const Prepared::Level& L : prepared_->levels) {
      if (L.hopper) {
        // stage 07's kernel over the same view: the level's CSR table, schedule and rows
        LevelLaunch h;
        h.q = batch.q;
        h.kv_pool = batch.kv_pool;
        h.qo_indptr = reinterpret_cast<const int32_t*>(workspace_ + L.qo_indptr);
        h.kv_indptr = reinterpret_cast<const int32_t*>(workspace_ + L.kv_indptr);
        h.kv_indices = reinterpret_cast<const int32_t*>(workspace_ + L.kv_indices);
        h.kv_last_page_len = reinterpret_cast<const int32_t*>(workspace_ + L.last_page_len);
        h.num_items = L.schedule.num_items();
        h.request_indices = reinterpret_cast<const int32_t*>(workspace_ + L.request);
        h.qo_tile_indices = reinterpret_cast<const int32_t*>(workspace_ + L.tile);
        h.kv_chunk_indices = reinterpret_cast<const int32_t*>(workspace_ + L.chunk);
        h.kv_chunk_size = L.schedule.kv_chunk_size;  // > 0 here too: partial rows
        h.partial_indptr = reinterpret_cast<const int32_t*>(workspace_ + L.rows);
        h.partial_o = reinterpret_cast<float*>(workspace_ + prepared_->partial_o);
        h.partial_lse = reinterpret_cast<float*>(workspace_ + prepared_->partial_lse);
        hopper_kernel().kernel->launch(L.shape, h, stream);
        continue;
      }
      tensor_core::PrefillParams<T> p;
      p.q = static_cast<const T*>(batch.q);
      p.qo_indptr = reinterpret_cast<const int32_t*>(workspace_ + L.qo_indptr);
      p.paged_kv = true;
      p.paged = kernels::make_paged_kv(static_cast<const T*>(batch.kv_pool),
                                       reinterpret_cast<const int32_t*>(workspace_ + L.kv_indptr),
                                       reinterpret_cast<const int32_t*>(workspace_ + L.kv_indices),
                                       reinterpret_cast<const int32_t*>(workspace_ + L.last_page_len), s.page_size,
                                       s.num_kv_heads, s.head_dim, s.kv_layout == KVLayout::HND);
      p.request_indices = reinterpret_cast<const int32_t*>(workspace_ + L.request);
      p.qo_tile_indices = reinterpret_cast<const int32_t*>(workspace_ + L.tile);
      p.kv_chunk_indices = reinterpret_cast<const int32_t*>(workspace_ + L.chunk);
      p.kv_chunk_size = L.schedule.kv_chunk_size;  // always > 0 here: every level writes partial rows
      p.partial_indptr = reinterpret_cast<const int32_t*>(workspace_ + L.rows);
      p.partial_o = reinterpret_cast<float*>(workspace_ + prepared_->partial_o);
      p.partial_lse = reinterpret_cast<float*>(workspace_ + prepared_->partial_lse);
      p.num_qo_heads = s.num_qo_heads;
      p.num_kv_heads = s.num_kv_heads;
      p.group_size = s.group_size();
      p.causal = L.shape.causal;
      p.window_left = -1;
      p.set_score_transform(sm_scale, s.logits_soft_cap);
      tensor_core::launch_prefill_attention<T>(p, s.head_dim, L.schedule.num_items(), stream);
    }
    MergeLevelsParams<T> m;
    m.partial_o = reinterpret_cast<const float*>(workspace_ + prepared_->partial_o);
    m.partial_lse = reinterpret_cast<const float*>(workspace_ + prepared_->partial_lse);
    for (size_t l = 0; l < prepared_->levels.size(); ++l)
      m.level_indptr[l] = reinterpret_cast<const int32_t*>(workspace_ + prepared_->levels[l].rows);
    m.num_levels = static_cast<int>(prepared_->levels.size());
    m.o = static_cast<T*>(batch.o);
    m.lse = batch.lse;
    m.num_qo_heads = s.num_qo_heads;
    const dim3 grid(static_cast<unsigned>(s.num_qo_heads), static_cast<unsigned>(s.nnz_qo()));
    if (s.nnz_qo() == 0) return;
    FLASHSTEP_DISPATCH_HEAD_DIM(s.head_dim, HEAD_DIM, {
      merge_levels_kernel<T, HEAD_DIM><<<grid, kMergeThreads, 0, stream>>>(m);
      kernels::check_launch("merge_levels_kernel");
    });
  }
}

void CascadeRunner::level_state(int level, float* o, float* lse, cudaStream_t stream) const {
  const char* fn = "CascadeRunner::level_state";
  ref::require(prepared_ != nullptr && plan_.path == Path::cascade, fn, "the last plan is not a cascade");
  ref::require(level >= 0 && level < static_cast<int>(prepared_->levels.size()), fn,
               "level must be in 0.." + std::to_string(prepared_->levels.size() - 1));
  if (shape_.nnz_qo() == 0) return;
  MergeLevelsParams<float> m;
  m.partial_o = reinterpret_cast<const float*>(workspace_ + prepared_->partial_o);
  m.partial_lse = reinterpret_cast<const float*>(workspace_ + prepared_->partial_lse);
  m.level_indptr[0] = reinterpret_cast<const int32_t*>(workspace_ + prepared_->levels[static_cast<size_t>(level)].rows);
  m.num_levels = 1;
  m.o = o;
  m.lse = lse;
  m.num_qo_heads = shape_.num_qo_heads;
  const dim3 grid(static_cast<unsigned>(shape_.num_qo_heads), static_cast<unsigned>(shape_.nnz_qo()));
  FLASHSTEP_DISPATCH_HEAD_DIM(shape_.head_dim, HEAD_DIM, {
    merge_levels_kernel<float, HEAD_DIM><<<grid, kMergeThreads, 0, stream>>>(m);
    kernels::check_launch("merge_levels_kernel");
  });
}

StageInfo stage_info() {
  StageInfo s;
  s.name = "05_cascade";
  s.summary = "shared prefix pages read once per group as a tall tile, levels merged exactly";
  s.modes = {Mode::decode, Mode::prefill};
  s.storage = KVStorage::paged;
  s.dtypes = {DType::f16, DType::bf16};
  s.head_dims = {64, 128, 256};
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = tensor_core::kMaxPageSize;
  s.max_group_size = tensor_core::kMaxGroupSize;
  s.causal = true;
  s.window_left = false;  // a window needs key positions, which shared levels do not carry
  s.logits_soft_cap = true;
  s.needs_host_page_table = true;
  // its levels run stage 04's kernel, whose tiles must fit the GPU's shared memory
  s.rules = [](const BatchShape& shape) { return tensor_core::shared_memory_rule("05_cascade", shape); };
  s.make_runner = [] { return std::make_unique<CascadeRunner>(); };
  return s;
}

}  // namespace flashstep::stages::cascade
