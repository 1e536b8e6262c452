// The C interface over the stage registry, the stage runners, MLA's runner and stage 06's operators:
// each function turns its plain-C arguments into the C++ types, calls the stage, and turns
// any exception into a status and a thread-local message (see flashstep_capi.h).
#include "flashstep_capi.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "05_cascade/cascade.hpp"
#include "06_sampling/sampling.hpp"
#include "capi_kernels.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/rope.hpp"
#include "harness/compare.hpp"
#include "harness/gpu_present.hpp"
#include "10_mla/mla.hpp"
#include "registry.hpp"
#include "rope/rope_gpu.hpp"
#include "stage.hpp"

namespace {

using flashstep::ref::InvalidArgument;
namespace ref = flashstep::ref;
namespace st = flashstep::stages;
namespace smp = flashstep::stages::sampling;

thread_local std::string last_error;
thread_local std::string last_reason;

/// Runs `body`; returns 0, or FS_BAD_ARGUMENT / FS_FAILED with the exception's message
/// kept for fs_last_error().
template <typename F>
int guarded(const char* function, F&& body) {
  try {
    last_error.clear();
    body();
    return 0;
  } catch (const std::invalid_argument& e) {  // ref::InvalidArgument, the dispatch's errors
    last_error = e.what();
    return FS_BAD_ARGUMENT;
  } catch (const std::bad_alloc&) {
    last_error = std::string(function) + ": out of host memory";
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = std::string(function) + ": unknown error";
  }
  return FS_FAILED;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw InvalidArgument(message);
}
/// The same for a literal message: no std::string is made unless the check fails (run()'s
/// checks pass once per layer).
void require(bool ok, const char* message) {
  if (!ok) throw InvalidArgument(message);
}
/// The same for a message that is built (concatenated), only when the check fails.
template <typename MakeMessage>
void require_lazy(bool ok, MakeMessage&& make_message) {
  if (!ok) throw InvalidArgument(make_message());
}

void check_cuda(cudaError_t err, const char* function) {
  if (err != cudaSuccess) {
    cudaGetLastError();  // a launch error would otherwise stick to the next call
    throw std::runtime_error(std::string(function) + ": CUDA error: " + cudaGetErrorString(err));
  }
}

st::DType to_dtype(int dtype, const char* function) {
  switch (dtype) {
    case FS_F32: return st::DType::f32;
    case FS_F16: return st::DType::f16;
    case FS_BF16: return st::DType::bf16;
  }
  throw InvalidArgument(std::string(function) + ": dtype must be 0 (f32), 1 (f16) or 2 (bf16), got " +
                        std::to_string(dtype));
}

/// K/V's element type from fs_shape.kv_dtype (0 or `dtype`: the same as q's).
st::DType to_kv_dtype(int kv_dtype, int dtype, const char* function) {
  if (kv_dtype == 0 || kv_dtype == dtype) return to_dtype(dtype, function);
  if (kv_dtype == FS_E4M3) return st::DType::e4m3;
  if (kv_dtype == FS_E5M2) return st::DType::e5m2;
  throw InvalidArgument(std::string(function) + ": kv_dtype must be 0 (dtype), the dtype itself, 3 (e4m3) or " +
                        "4 (e5m2), got " + std::to_string(kv_dtype));
}

/// The BatchShape that `s` describes, after checking what plan() would trust blindly.
st::BatchShape to_shape(const fs_shape* s, const char* function) {
  const std::string fn = function;
  require(s != nullptr, fn + ": shape is null");
  require(s->mode == FS_DECODE || s->mode == FS_PREFILL, fn + ": mode must be 0 (decode) or 1 (prefill)");
  require(s->storage == FS_RAGGED || s->storage == FS_PAGED, fn + ": storage must be 0 (ragged) or 1 (paged)");
  require(s->kv_layout == FS_NHD || s->kv_layout == FS_HND, fn + ": kv_layout must be 0 (NHD) or 1 (HND)");
  // The sizes, each named: flashstep.cuda checks only their type and leaves these to here.
  const std::pair<const char*, int32_t> sizes[] = {{"batch_size", s->batch_size},
                                                   {"num_qo_heads", s->num_qo_heads},
                                                   {"num_kv_heads", s->num_kv_heads},
                                                   {"head_dim", s->head_dim}};
  for (const auto& size : sizes)
    require_lazy(size.second >= 1,
                 [&] { return fn + ": " + size.first + " must be >= 1, got " + std::to_string(size.second); });
  require(s->qo_indptr && s->kv_indptr, fn + ": qo_indptr and kv_indptr are required");
  st::BatchShape b;
  b.mode = s->mode == FS_DECODE ? st::Mode::decode : st::Mode::prefill;
  b.storage = s->storage == FS_PAGED ? st::KVStorage::paged : st::KVStorage::ragged;
  b.dtype = to_dtype(s->dtype, function);
  b.kv_layout = s->kv_layout == FS_HND ? st::KVLayout::HND : st::KVLayout::NHD;
  b.batch_size = s->batch_size;
  b.num_qo_heads = s->num_qo_heads;
  b.num_kv_heads = s->num_kv_heads;
  b.head_dim = s->head_dim;
  require_lazy(s->head_dim_vo >= 0, [&] {
    return fn + ": head_dim_vo must be 0 (head_dim) or >= 1, got " + std::to_string(s->head_dim_vo);
  });
  b.head_dim_vo = s->head_dim_vo == s->head_dim ? 0 : s->head_dim_vo;
  b.page_size = s->page_size;
  b.num_pages = s->num_pages;
  b.causal = s->causal != 0;
  b.window_left = s->window_left;
  b.logits_soft_cap = static_cast<float>(s->logits_soft_cap);
  if (s->has_sm_scale) b.sm_scale = static_cast<float>(s->sm_scale);
  b.cuda_graph = s->cuda_graph != 0;
  const st::DType kv = to_kv_dtype(s->kv_dtype, s->dtype, function);
  if (kv != b.dtype) b.kv_dtype = kv;
  const int n = s->batch_size;
  b.qo_indptr.assign(s->qo_indptr, s->qo_indptr + n + 1);
  b.kv_indptr.assign(s->kv_indptr, s->kv_indptr + n + 1);
  for (const auto* indptr : {&b.qo_indptr, &b.kv_indptr}) {
    const char* name = indptr == &b.qo_indptr ? "qo_indptr" : "kv_indptr";
    ref::require_lazy((*indptr)[0] == 0, fn.c_str(), [&] { return std::string(name) + "[0] must be 0"; });
    for (int i = 0; i < n; ++i)
      ref::require_lazy((*indptr)[i + 1] >= (*indptr)[i], fn.c_str(), [&] {
        return std::string(name) + " must be non-decreasing (at " + std::to_string(i + 1) + ")";
      });
  }
  if (b.mode == st::Mode::decode)
    for (int i = 0; i <= n; ++i)
      ref::require_lazy(b.qo_indptr[i] == i, fn.c_str(),
                        [] { return "decode needs qo_indptr = 0, 1, ..., batch_size"; });
  if (b.storage == st::KVStorage::paged) {
    require(s->kv_last_page_len != nullptr, fn + ": kv_last_page_len is required for paged KV");
    require(s->page_size >= 1, fn + ": page_size must be >= 1, got " + std::to_string(s->page_size));
    b.kv_last_page_len.assign(s->kv_last_page_len, s->kv_last_page_len + n);
    for (int i = 0; i < n; ++i) {
      const bool has_pages = b.kv_indptr[i + 1] > b.kv_indptr[i];
      const int32_t last = b.kv_last_page_len[i];
      ref::require_lazy(
          has_pages ? (last >= 1 && last <= s->page_size) : (last >= 0 && last <= s->page_size), fn.c_str(), [&] {
            return "kv_last_page_len[" + std::to_string(i) + "] = " + std::to_string(last) + " must be in 1..page_size";
          });
    }
  }
  return b;
}

/// A runner and the registry entry it came from.
struct Runner {
  const st::StageInfo* info = nullptr;
  std::unique_ptr<st::StageRunner> runner;
  bool planned = false;
};

Runner* as_runner(void* p, const char* function) {
  require_lazy(p != nullptr, [&] { return std::string(function) + ": runner is null"; });
  return static_cast<Runner*>(p);
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

smp::SamplingOutputs outputs(int32_t* samples, int32_t* rounds, int32_t* status) {
  smp::SamplingOutputs out;
  out.samples = samples;
  out.rounds = rounds;
  out.status = status;
  return out;
}

smp::TopK top_k_of(const fs_sampling_params& p) {
  return p.top_k_arr ? smp::TopK::per_row(p.top_k_arr) : smp::TopK(p.top_k);
}
smp::Fraction top_p_of(const fs_sampling_params& p) {
  return p.top_p_arr ? smp::Fraction::per_row(p.top_p_arr) : smp::Fraction(p.top_p);
}
smp::Fraction min_p_of(const fs_sampling_params& p) {
  return p.min_p_arr ? smp::Fraction::per_row(p.min_p_arr) : smp::Fraction(p.min_p);
}
smp::FilterApplyOrder order_of(int order, const char* function) {
  require(order == FS_TOP_K_FIRST || order == FS_JOINT,
          std::string(function) + ": filter_apply_order must be 0 (top_k_first) or 1 (joint)");
  return order == FS_JOINT ? smp::FilterApplyOrder::joint : smp::FilterApplyOrder::top_k_first;
}

}  // namespace

extern "C" {

const char* fs_last_error(void) { return last_error.c_str(); }

int fs_version(void) { return FLASHSTEP_CAPI_VERSION; }

int fs_stage_count(void) { return static_cast<int>(st::registry().size()); }

int fs_stage_info(int index, const char** name, const char** summary, const char** capabilities) {
  return guarded("fs_stage_info", [&] {
    const auto& reg = st::registry();
    require(index >= 0 && index < static_cast<int>(reg.size()),
            "fs_stage_info: index " + std::to_string(index) + " is not in 0.." + std::to_string(reg.size() - 1));
    // The registry is built once and never changes, so its strings outlive the call;
    // capabilities() makes a new string, kept in a table of the same lifetime.
    static const std::vector<std::string> caps = [] {
      std::vector<std::string> c;
      for (const auto& s : st::registry()) c.push_back(s.capabilities());
      return c;
    }();
    if (name) *name = reg[index].name.c_str();
    if (summary) *summary = reg[index].summary.c_str();
    if (capabilities) *capabilities = caps[index].c_str();
  });
}

int fs_stage_capabilities(int index, fs_stage_caps* caps) {
  return guarded("fs_stage_capabilities", [&] {
    const auto& reg = st::registry();
    require(index >= 0 && index < static_cast<int>(reg.size()), "fs_stage_capabilities: index " +
                                                                    std::to_string(index) + " is not in 0.." +
                                                                    std::to_string(reg.size() - 1));
    require(caps != nullptr, "fs_stage_capabilities: caps is null");
    const st::StageInfo& s = reg[static_cast<size_t>(index)];
    auto dtype_bit = [](st::DType d) -> uint32_t {
      switch (d) {
        case st::DType::f32: return 1u << FS_F32;
        case st::DType::f16: return 1u << FS_F16;
        case st::DType::bf16: return 1u << FS_BF16;
        case st::DType::e4m3: return 1u << FS_E4M3;
        case st::DType::e5m2: return 1u << FS_E5M2;
      }
      return 0;
    };
    fs_stage_caps c{};
    for (st::Mode m : s.modes) c.modes |= 1u << (m == st::Mode::decode ? FS_DECODE : FS_PREFILL);
    c.storage = s.storage == st::KVStorage::paged ? FS_PAGED : FS_RAGGED;
    for (st::DType d : s.dtypes) c.dtypes |= dtype_bit(d);
    for (st::DType d : s.kv_dtypes) c.kv_dtypes |= dtype_bit(d);
    for (st::KVLayout l : s.kv_layouts) c.kv_layouts |= 1u << (l == st::KVLayout::HND ? FS_HND : FS_NHD);
    c.max_page_size = s.max_page_size;
    c.max_group_size = s.max_group_size;
    if (s.causal) c.flags |= FS_CAP_CAUSAL;
    if (s.window_left) c.flags |= FS_CAP_WINDOW_LEFT;
    if (s.logits_soft_cap) c.flags |= FS_CAP_LOGITS_SOFT_CAP;
    if (s.needs_host_page_table) c.flags |= FS_CAP_HOST_PAGE_TABLE;
    if (s.cuda_graph) c.flags |= FS_CAP_CUDA_GRAPH;
    if (s.sinks) c.flags |= FS_CAP_SINKS;
    for (st::PosEncoding e : s.pos_encodings)
      if (e == st::PosEncoding::rope_llama) c.flags |= FS_CAP_ROPE_LLAMA;
    constexpr size_t kMaxHeadDims = sizeof(c.head_dims) / sizeof(c.head_dims[0]);
    require(s.head_dims.size() <= kMaxHeadDims,
            "fs_stage_capabilities: " + s.name + " lists more head_dims than fs_stage_caps holds");
    c.num_head_dims = static_cast<int32_t>(s.head_dims.size());
    for (size_t i = 0; i < s.head_dims.size(); ++i) c.head_dims[i] = s.head_dims[i];
    *caps = c;
  });
}

int fs_stage_unsupported_reason(const char* name, const fs_shape* shape, const char** reason) {
  return guarded("fs_stage_unsupported_reason", [&] {
    require(name != nullptr && reason != nullptr, "fs_stage_unsupported_reason: name and reason are required");
    const st::StageInfo& info = st::find_stage(name);
    last_reason = info.unsupported_reason(to_shape(shape, "plan"));
    *reason = last_reason.c_str();
  });
}

int fs_default_stage(const fs_shape* shape, int device, const char** name) {
  return guarded("fs_default_stage", [&] {
    require(name != nullptr, "fs_default_stage: name is null");
    *name = st::default_stage(to_shape(shape, "fs_default_stage"), device).c_str();
  });
}

int fs_default_stage_among(const char* const* names, int count, int mode, int group_size, int* index) {
  return guarded("fs_default_stage_among", [&] {
    const char* fn = "fs_default_stage_among";
    require(index != nullptr, std::string(fn) + ": index is null");
    require(count >= 0 && (count == 0 || names != nullptr), std::string(fn) + ": names must hold count >= 0 names");
    require(mode == FS_DECODE || mode == FS_PREFILL, std::string(fn) + ": mode must be 0 (decode) or 1 (prefill)");
    std::vector<std::string> supporting;
    for (int i = 0; i < count; ++i) {
      require_lazy(names[i] != nullptr, [&] { return std::string(fn) + ": names[" + std::to_string(i) + "] is null"; });
      supporting.emplace_back(names[i]);
    }
    *index = st::default_stage_among(supporting, mode == FS_DECODE ? st::Mode::decode : st::Mode::prefill, group_size);
  });
}

int fs_tolerance(int dtype, int kv_dtype, int which, double* atol, double* rtol, double* norm) {
  return guarded("fs_tolerance", [&] {
    require(which == 0 || which == 1, "fs_tolerance: which must be 0 (o) or 1 (lse)");
    const auto& row = st::harness::tolerance_for(to_dtype(dtype, "fs_tolerance"),
                                                 to_kv_dtype(kv_dtype, dtype, "fs_tolerance"));
    const auto& t = which == 0 ? row.o : row.lse;
    if (atol) *atol = t.atol;
    if (rtol) *rtol = t.rtol;
    if (norm) *norm = t.norm;
  });
}

int fs_runner_create(const char* name, void** runner) {
  return guarded("fs_runner_create", [&] {
    require(name != nullptr && runner != nullptr, "fs_runner_create: name and runner are required");
    auto r = std::make_unique<Runner>();
    r->info = &st::find_stage(name);
    r->runner = r->info->make_runner();
    *runner = r.release();
  });
}

int fs_runner_destroy(void* runner) {
  return guarded("fs_runner_destroy", [&] { delete static_cast<Runner*>(runner); });
}

namespace {

/// The BatchShape of `shape` once it is known that runner `r`'s stage runs it: to_shape's
/// checks, then the stage's unsupported_reason, refused under the stage's name. The one
/// check of a shape on its way to a runner (flashstep.cuda makes none of its own), so the
/// stage's sizing and planning code sees only shapes it takes.
st::BatchShape runnable_shape(const Runner* r, const fs_shape* shape, const char* fn) {
  st::BatchShape b = to_shape(shape, fn);
  const std::string reason = r->info->unsupported_reason(b);
  require_lazy(reason.empty(), [&] {
    return std::string(fn) + ": stage " + r->info->name + " cannot run this batch (" + b.describe() + "): " + reason;
  });
  return b;
}

}  // namespace

int fs_runner_workspace_bytes(void* runner, const fs_shape* shape, size_t* bytes) {
  return guarded("fs_runner_workspace_bytes", [&] {
    Runner* r = as_runner(runner, "fs_runner_workspace_bytes");
    require(bytes != nullptr, "fs_runner_workspace_bytes: bytes is null");
    *bytes = r->runner->workspace_bytes(runnable_shape(r, shape, "fs_runner_workspace_bytes"));
  });
}

int fs_runner_plan(void* runner, const fs_shape* shape, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("fs_runner_plan", [&] {
    Runner* r = as_runner(runner, "fs_runner_plan");
    r->planned = false;
    const st::BatchShape b = runnable_shape(r, shape, "fs_runner_plan");
    r->runner->plan(b, workspace, workspace_bytes, as_stream(stream));
    check_cuda(cudaGetLastError(), "plan");
    r->planned = true;
  });
}

namespace {

/// Makes `device` current for its lifetime (-1 or the current one: nothing to do) and
/// restores the previous device after, also when the call throws.
class DeviceScope {
 public:
  DeviceScope(int device, const char* fn) {
    if (device < 0) return;
    int current = 0;
    check_cuda(cudaGetDevice(&current), fn);
    if (current == device) return;
    check_cuda(cudaSetDevice(device), fn);
    previous_ = current;
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);  // (a destructor must not throw)
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace

int fs_runner_run(void* runner, const fs_batch* batch, int device, void* stream) {
  return guarded("fs_runner_run", [&] {
    Runner* r = as_runner(runner, "fs_runner_run");
    const DeviceScope scope(device, "fs_runner_run");
    require(batch != nullptr, "fs_runner_run: batch is null");
    require(r->planned, "run: call plan() first (the last plan failed or none was made)");
    // the scales as the kernels take them (float): a double outside float's range is refused
    const float k_scale = batch->k_scale == 0 ? 1.f : static_cast<float>(batch->k_scale);
    const float v_scale = batch->v_scale == 0 ? 1.f : static_cast<float>(batch->v_scale);
    require_lazy(std::isfinite(k_scale) && k_scale > 0 && std::isfinite(v_scale) && v_scale > 0, [&] {
      return "run: k_scale and v_scale must be positive finite numbers (0: 1), got " + std::to_string(batch->k_scale) +
             " and " + std::to_string(batch->v_scale);
    });
    // The run's scales ride on the DeviceBatch: the stages that apply scales take them at
    // launch, so scales that change from run to run (one per layer) need no new plan, and
    // a CUDA graph captures those of the run it records.
    require_lazy((k_scale == 1.f && v_scale == 1.f) || !r->info->kv_dtypes.empty(), [&] {
      return "run: stage " + r->info->name + " reads no FP8 cache and applies no k_scale or v_scale (both must be 1)";
    });
    st::DeviceBatch d;
    d.q = batch->q;
    d.qo_indptr = batch->qo_indptr;
    d.kv_indptr = batch->kv_indptr;
    d.kv_pool = batch->kv_pool;
    d.kv_indices = batch->kv_indices;
    d.kv_last_page_len = batch->kv_last_page_len;
    d.k = batch->k;
    d.v = batch->v;
    d.o = batch->o;
    d.lse = batch->lse;
    d.k_scale = k_scale;
    d.v_scale = v_scale;
    d.sinks = batch->sinks;
    d.v_pool = batch->v_pool;
    // what else the stage takes at run time (sinks), by the stage's own rule
    const std::string why = r->info->unsupported_run_reason(d);
    require_lazy(why.empty(), [&] { return "run: " + why; });
    r->runner->run(d, as_stream(stream));
    check_cuda(cudaGetLastError(), "run");
  });
}

int fs_cascade_plan(void* runner, const fs_shape* shape, int num_levels, const int32_t* num_groups,
                    const int32_t* const* qo_indptr, const int32_t* const* kv_indptr, const int32_t* const* kv_indices,
                    const int32_t* const* kv_last_page_len, void* workspace, size_t workspace_bytes,
                    size_t* bytes_needed, void* stream) {
  return guarded("fs_cascade_plan", [&] {
    const char* fn = "fs_cascade_plan";
    Runner* r = as_runner(runner, fn);
    auto* cascade = dynamic_cast<st::cascade::CascadeRunner*>(r->runner.get());
    require(cascade != nullptr, std::string(fn) + ": the runner must be of stage 05_cascade, not " + r->info->name);
    require(num_levels >= 1 && num_levels <= st::cascade::kMaxLevels, std::string(fn) + ": num_levels must be in 1.." +
                                                                          std::to_string(st::cascade::kMaxLevels) +
                                                                          ", got " + std::to_string(num_levels));
    require(num_groups && qo_indptr && kv_indptr && kv_indices && kv_last_page_len,
            std::string(fn) + ": num_groups and the four level arrays are required");
    require(workspace != nullptr || bytes_needed != nullptr, std::string(fn) + ": give a workspace or bytes_needed");
    r->planned = false;
    st::BatchShape batch = to_shape(shape, fn);  // the last level: one group per request
    require(batch.storage == st::KVStorage::paged, std::string(fn) + ": the cascade reads a paged pool");
    const int n = batch.batch_size;
    require(num_groups[num_levels - 1] == n,
            std::string(fn) + ": the last level must hold one group per request (" + std::to_string(n) + ")");
    flashstep::ref::CascadeLevels levels;
    levels.page_size = batch.page_size;
    levels.qo_indptr = batch.qo_indptr;
    // The flat batch the planner prices the cascade against: each request's page count and
    // last page length over the levels (its pages are never gathered: run() reads the
    // levels' own arrays), in O(levels x (groups + batch)).
    st::BatchShape flat = batch;
    std::vector<int32_t> flat_pages(static_cast<size_t>(n), 0);
    flat.kv_last_page_len.assign(static_cast<size_t>(n), 0);
    for (int l = 0; l < num_levels; ++l) {
      const int g = num_groups[l];
      auto at = [&] { return "level " + std::to_string(l) + ": "; };
      ref::require_lazy(g >= 1 && qo_indptr[l] && kv_indptr[l] && kv_last_page_len[l], fn,
                        [&] { return at() + "needs num_groups >= 1 and its arrays"; });
      flashstep::ref::CascadeLevel lv;
      lv.qo_indptr.assign(qo_indptr[l], qo_indptr[l] + g + 1);
      lv.kv_indptr.assign(kv_indptr[l], kv_indptr[l] + g + 1);
      ref::require_lazy(lv.kv_indptr[0] == 0, fn, [&] { return at() + "kv_indptr[0] must be 0"; });
      for (int i = 0; i < g; ++i)
        ref::require_lazy(lv.kv_indptr[i + 1] >= lv.kv_indptr[i], fn,
                          [&] { return at() + "kv_indptr must not decrease"; });
      ref::require_lazy(lv.kv_indptr[g] == 0 || kv_indices[l] != nullptr, fn,
                        [&] { return at() + "kv_indices is required"; });
      if (lv.kv_indptr[g] > 0) lv.kv_indices.assign(kv_indices[l], kv_indices[l] + lv.kv_indptr[g]);
      lv.kv_last_page_len.assign(kv_last_page_len[l], kv_last_page_len[l] + g);
      lv.causal = l + 1 == num_levels && batch.mode == st::Mode::prefill && batch.causal;
      // The requests of each group: the group's queries must start where a request's do
      // (both arrays ascend, so one walk finds them all).
      lv.request_indptr.reserve(static_cast<size_t>(g) + 1);
      for (int i = 0; i < g; ++i)
        ref::require_lazy(lv.qo_indptr[i + 1] >= lv.qo_indptr[i], fn,
                          [&] { return at() + "qo_indptr must not decrease"; });
      int q = 0;
      for (int i = 0; i <= g; ++i) {
        // (a value repeated for requests with no query falls on the first of them)
        while (q <= n && batch.qo_indptr[q] < lv.qo_indptr[i]) ++q;
        ref::require_lazy(q <= n && batch.qo_indptr[q] == lv.qo_indptr[i], fn, [&] {
          return at() + "qo_indptr[" + std::to_string(i) + "] = " + std::to_string(lv.qo_indptr[i]) +
                 " does not fall on a request's first query";
        });
        lv.request_indptr.push_back(static_cast<int32_t>(i == g ? n : q));
      }
      for (int i = 0; i < g; ++i) {
        const int32_t pages = lv.kv_indptr[i + 1] - lv.kv_indptr[i];
        if (pages == 0) continue;
        for (int req = lv.request_indptr[i]; req < lv.request_indptr[i + 1]; ++req) {
          flat_pages[static_cast<size_t>(req)] += pages;
          flat.kv_last_page_len[static_cast<size_t>(req)] = lv.kv_last_page_len[i];
        }
      }
      levels.levels.push_back(std::move(lv));
    }
    flat.kv_indptr.assign(1, 0);
    for (int req = 0; req < n; ++req)
      flat.kv_indptr.push_back(flat.kv_indptr.back() + flat_pages[static_cast<size_t>(req)]);
    flat.kv_indices.clear();
    if (workspace == nullptr) {
      *bytes_needed = cascade->workspace_bytes_levels(flat, std::move(levels));
      return;
    }
    // One prepare for both: bytes_needed is set also when the workspace is too small.
    cascade->plan_levels(flat, std::move(levels), workspace, workspace_bytes, as_stream(stream), bytes_needed);
    check_cuda(cudaGetLastError(), "plan");
    r->planned = true;
  });
}

namespace {

namespace mla = flashstep::stages::mla;

/// An MLA runner and the device its plan was made on (fs_mla_run makes it current).
struct MlaRunnerHandle {
  mla::MlaRunner runner;
  int device = -1;
  bool planned = false;
};

MlaRunnerHandle* as_mla_runner(void* p, const char* function) {
  require_lazy(p != nullptr, [&] { return std::string(function) + ": runner is null"; });
  return static_cast<MlaRunnerHandle*>(p);
}

/// The MlaShape of `s`: what must hold before its arrays can be read (their lengths come
/// from batch_size) and before sm_scale becomes the kernel's float; the rest (f16/bf16,
/// widths, heads, the arrays' agreement) is the runner's unsupported_reason, each field named.
mla::MlaShape to_mla_shape(const fs_mla_shape* s, const char* function) {
  const std::string fn = function;
  require(s != nullptr, fn + ": shape is null");
  require_lazy(s->batch_size >= 1,
               [&] { return fn + ": batch_size must be >= 1, got " + std::to_string(s->batch_size); });
  require(s->qo_indptr && s->kv_indptr && s->kv_len, fn + ": qo_indptr, kv_indptr and kv_len are required");
  // sm_scale as the kernel takes it (float): required, so 0 is refused, not defaulted
  const float sm_scale = static_cast<float>(s->sm_scale);
  require_lazy(std::isfinite(sm_scale) && sm_scale > 0, [&] {
    return fn + ": sm_scale must be a positive finite number (1/sqrt of the query/key head dim before absorption), " +
           "got " + std::to_string(s->sm_scale);
  });
  mla::MlaShape m;
  m.dtype = to_dtype(s->dtype, function);
  m.batch_size = s->batch_size;
  m.num_heads = s->num_heads;
  m.head_dim_ckv = s->head_dim_ckv;
  m.head_dim_kpe = s->head_dim_kpe;
  m.page_size = s->page_size;
  m.num_pages = s->num_pages;
  m.causal = s->causal != 0;
  m.sm_scale = sm_scale;
  const int n = s->batch_size;
  m.qo_indptr.assign(s->qo_indptr, s->qo_indptr + n + 1);
  m.kv_indptr.assign(s->kv_indptr, s->kv_indptr + n + 1);
  m.kv_len.assign(s->kv_len, s->kv_len + n);
  return m;
}

}  // namespace

int fs_mla_unsupported_reason(const fs_mla_shape* shape, int device, const char** reason) {
  return guarded("fs_mla_unsupported_reason", [&] {
    require(reason != nullptr, "fs_mla_unsupported_reason: reason is null");
    last_reason = mla::unsupported_reason(to_mla_shape(shape, "fs_mla_unsupported_reason"), device);
    *reason = last_reason.c_str();
  });
}

int fs_mla_runner_create(void** runner) {
  return guarded("fs_mla_runner_create", [&] {
    require(runner != nullptr, "fs_mla_runner_create: runner is null");
    *runner = new MlaRunnerHandle();
  });
}

int fs_mla_runner_destroy(void* runner) {
  return guarded("fs_mla_runner_destroy", [&] { delete static_cast<MlaRunnerHandle*>(runner); });
}

int fs_mla_workspace_bytes(void* runner, const fs_mla_shape* shape, size_t* bytes) {
  return guarded("fs_mla_workspace_bytes", [&] {
    MlaRunnerHandle* h = as_mla_runner(runner, "fs_mla_workspace_bytes");
    require(bytes != nullptr, "fs_mla_workspace_bytes: bytes is null");
    *bytes = h->runner.workspace_bytes(to_mla_shape(shape, "fs_mla_workspace_bytes"));
  });
}

int fs_mla_plan(void* runner, const fs_mla_shape* shape, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("fs_mla_plan", [&] {
    MlaRunnerHandle* h = as_mla_runner(runner, "fs_mla_plan");
    h->planned = false;
    const mla::MlaShape m = to_mla_shape(shape, "fs_mla_plan");
    check_cuda(cudaGetDevice(&h->device), "fs_mla_plan");
    h->runner.plan(m, workspace, workspace_bytes, as_stream(stream));
    check_cuda(cudaGetLastError(), "plan");
    h->planned = true;
  });
}

int fs_mla_run(void* runner, const fs_mla_batch* batch, void* stream) {
  return guarded("fs_mla_run", [&] {
    MlaRunnerHandle* h = as_mla_runner(runner, "fs_mla_run");
    require(batch != nullptr, "fs_mla_run: batch is null");
    require(h->planned, "run: call plan() first (the last plan failed or none was made)");
    const DeviceScope scope(h->device, "fs_mla_run");
    mla::MlaBatch b;
    b.q_nope = batch->q_nope;
    b.q_pe = batch->q_pe;
    b.ckv_pages = batch->ckv_pages;
    b.kpe_pages = batch->kpe_pages;
    b.kv_indices = batch->kv_indices;
    b.o = batch->o;
    b.lse = batch->lse;
    h->runner.run(b, as_stream(stream));
    check_cuda(cudaGetLastError(), "run");
  });
}

int fs_merge_state(int dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b, int64_t seq_len,
                   int64_t num_heads, int64_t head_dim, void* v_out, float* s_out, void* stream) {
  return guarded("fs_merge_state", [&] {
    require(seq_len >= 0 && num_heads >= 1 && head_dim >= 1,
            "merge_state: seq_len must be >= 0, num_heads and head_dim >= 1");
    flashstep::capi::launch_merge_state(to_dtype(dtype, "merge_state"), v_a, s_a, v_b, s_b, seq_len, num_heads,
                                        head_dim, v_out, s_out, as_stream(stream));
    check_cuda(cudaGetLastError(), "merge_state");
  });
}

int fs_merge_states(int dtype, const void* v, const float* s, int64_t seq_len, int64_t num_states, int64_t num_heads,
                    int64_t head_dim, void* v_out, float* s_out, void* stream) {
  return guarded("fs_merge_states", [&] {
    require(seq_len >= 0 && num_states >= 0 && num_heads >= 1 && head_dim >= 1,
            "merge_states: seq_len and num_states must be >= 0, num_heads and head_dim >= 1");
    flashstep::capi::launch_merge_states(to_dtype(dtype, "merge_states"), v, s, seq_len, num_states, num_heads,
                                         head_dim, v_out, s_out, as_stream(stream));
    check_cuda(cudaGetLastError(), "merge_states");
  });
}

int fs_append_paged_kv_cache(int dtype, int kv_dtype, const void* append_key, const void* append_value,
                             int64_t key_row_stride, int64_t value_row_stride, int64_t nnz,
                             const int32_t* batch_indices, const int32_t* positions, void* k_cache, void* v_cache,
                             int64_t page_stride, int kv_layout, int num_kv_heads, int head_dim, int page_size,
                             int64_t num_pages, const int32_t* kv_indices, const int32_t* kv_indptr, int batch_size,
                             double k_scale, double v_scale, int32_t* status, void* stream) {
  return guarded("fs_append_paged_kv_cache", [&] {
    const std::string fn = "append_paged_kv_cache";
    require(nnz >= 0 && num_kv_heads >= 1 && head_dim >= 1 && page_size >= 1 && batch_size >= 0 && num_pages >= 0,
            fn + ": nnz, batch_size and num_pages must be >= 0; num_kv_heads, head_dim and page_size >= 1");
    require(kv_layout == FS_NHD || kv_layout == FS_HND, fn + ": kv_layout must be 0 (NHD) or 1 (HND)");
    // The rows' type: q's types, or an FP8 format (rows quantized beforehand, copied).
    const st::DType rows = dtype == FS_E4M3   ? st::DType::e4m3
                           : dtype == FS_E5M2 ? st::DType::e5m2
                                              : to_dtype(dtype, fn.c_str());
    const st::DType cache = kv_dtype == 0 || kv_dtype == dtype ? rows : to_kv_dtype(kv_dtype, dtype, fn.c_str());
    const bool quantize = cache != rows;
    require(!quantize || rows == st::DType::f16 || rows == st::DType::bf16,
            fn + ": rows of dtype " + st::to_string(rows) + " cannot go into a cache of kv_dtype " +
                st::to_string(cache) + ": only f16/bf16 rows are converted (quantized into e4m3/e5m2); " +
                "other rows must have the cache's type");
    const double ks = k_scale == 0 ? 1.0 : k_scale, vs = v_scale == 0 ? 1.0 : v_scale;
    require(std::isfinite(ks) && ks > 0,
            fn + ": k_scale must be a positive finite number (0: 1), got " + std::to_string(k_scale));
    require(std::isfinite(vs) && vs > 0,
            fn + ": v_scale must be a positive finite number (0: 1), got " + std::to_string(v_scale));
    require(quantize || (ks == 1 && vs == 1),
            fn + ": k_scale and v_scale apply only when f16/bf16 rows are quantized into an FP8 cache; rows of " +
                "the cache's own type are copied (both must be 1)");
    flashstep::capi::AppendParams p;
    p.append_key = append_key;
    p.append_value = append_value;
    p.key_row_stride = key_row_stride;
    p.value_row_stride = value_row_stride;
    p.nnz = nnz;
    p.batch_indices = batch_indices;
    p.positions = positions;
    p.k_cache = k_cache;
    p.v_cache = v_cache;
    p.page_stride = page_stride;
    p.hnd = kv_layout == FS_HND;
    p.num_kv_heads = num_kv_heads;
    p.head_dim = head_dim;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.kv_indices = kv_indices;
    p.kv_indptr = kv_indptr;
    p.batch_size = batch_size;
    p.status = status;
    p.k_scale = ks;
    p.v_scale = vs;
    flashstep::capi::launch_append_paged_kv_cache(rows, cache, p, as_stream(stream));
    check_cuda(cudaGetLastError(), fn.c_str());
  });
}

int fs_apply_rope(int dtype, const void* q, const void* k, void* q_out, void* k_out, int64_t nnz, int num_q_heads,
                  int num_k_heads, int head_dim, int rotary_dim, int interleave, const int32_t* pos_ids,
                  const int32_t* indptr, const int32_t* offsets, int batch_size, double rope_scale, double rope_theta,
                  int llama31, double low_freq_factor, double high_freq_factor, double old_context_len, void* stream) {
  return guarded("fs_apply_rope", [&] {
    const char* fn = "apply_rope";
    // the frequencies exactly as the reference computes them (it checks rotary_dim's
    // parity, the scale and theta; launch_rope checks rotary_dim against head_dim)
    std::vector<double> freqs;
    if (llama31) {
      flashstep::ref::Llama31RopeOptions o;
      o.rope_scale = rope_scale;
      o.rope_theta = rope_theta;
      o.low_freq_factor = low_freq_factor;
      o.high_freq_factor = high_freq_factor;
      o.old_context_len = old_context_len;
      freqs = flashstep::ref::llama31_rope_frequencies(rotary_dim, o);
    } else {
      freqs = flashstep::ref::rope_frequencies(rotary_dim, rope_scale, rope_theta);
    }
    st::RopeLaunch l;
    l.dtype = to_dtype(dtype, fn);
    l.q = q;
    l.k = k;
    l.q_out = q_out;
    l.k_out = k_out;
    l.nnz = nnz;
    l.num_q_heads = num_q_heads;
    l.num_k_heads = num_k_heads;
    l.head_dim = head_dim;
    l.rotary_dim = rotary_dim;
    l.interleave = interleave != 0;
    l.pos_ids = pos_ids;
    l.indptr = indptr;
    l.offsets = offsets;
    l.batch_size = batch_size;
    st::launch_rope(l, freqs, as_stream(stream));
    check_cuda(cudaGetLastError(), fn);
  });
}

int fs_sampling_workspace_bytes(const char* name, int64_t rows, int64_t batch, int64_t vocab, int filter_apply_order,
                                size_t* bytes) {
  return guarded("fs_sampling_workspace_bytes", [&] {
    require(name != nullptr && bytes != nullptr, "fs_sampling_workspace_bytes: name and bytes are required");
    *bytes = smp::workspace_bytes(name, rows, batch, vocab, order_of(filter_apply_order, name));
  });
}

namespace {

/// The rows a sampling call reads: fp32, or bf16 where params.input_dtype says so (the
/// operators that take logits accept it; the others refuse it, naming the argument).
smp::DeviceRows rows_of(const void* data, int64_t rows, int64_t vocab, const fs_sampling_params& params,
                        const char* function) {
  require(params.input_dtype == FS_F32 || params.input_dtype == FS_BF16,
          std::string(function) + ": params.input_dtype must be 0 (f32) or 2 (bf16), got " +
              std::to_string(params.input_dtype));
  return {data, rows, vocab, params.input_dtype == FS_BF16 ? smp::ElementType::bf16 : smp::ElementType::f32};
}

}  // namespace

int fs_sample(const char* name, const void* data, int64_t rows, int64_t vocab, const fs_sampling_params* params,
              const int32_t* indices, int64_t batch, uint64_t seed, uint64_t offset, int32_t* samples, int32_t* rounds,
              int32_t* status, void* workspace, size_t workspace_bytes, void* stream) {
  return guarded("fs_sample", [&] {
    require(name != nullptr && params != nullptr, "fs_sample: name and params are required");
    const std::string op = name;
    const smp::DeviceRows in = rows_of(data, rows, vocab, *params, name);
    smp::SamplingOptions opt;
    opt.indices = indices;
    opt.batch = batch;
    opt.seed = seed;
    opt.offset = offset;
    const smp::SamplingOutputs out = outputs(samples, rounds, status);
    const smp::Workspace ws{workspace, workspace_bytes};
    cudaStream_t s = as_stream(stream);
    if (op == "sampling_from_probs") {
      smp::sampling_from_probs(in, out, opt, s);
    } else if (op == "sampling_from_logits") {
      smp::sampling_from_logits(in, out, ws, opt, s);
    } else if (op == "top_k_sampling_from_probs") {
      smp::top_k_sampling_from_probs(in, top_k_of(*params), out, opt, s);
    } else if (op == "top_p_sampling_from_probs") {
      smp::top_p_sampling_from_probs(in, top_p_of(*params), out, opt, s);
    } else if (op == "min_p_sampling_from_probs") {
      smp::min_p_sampling_from_probs(in, min_p_of(*params), out, opt, s);
    } else if (op == "top_k_top_p_sampling_from_probs") {
      smp::top_k_top_p_sampling_from_probs(in, top_k_of(*params), top_p_of(*params),
                                           order_of(params->filter_apply_order, name), out, ws, opt, s);
    } else if (op == "top_k_top_p_sampling_from_logits") {
      smp::top_k_top_p_sampling_from_logits(in, top_k_of(*params), top_p_of(*params),
                                            order_of(params->filter_apply_order, name), out, ws, opt, s);
    } else {
      throw InvalidArgument("fs_sample: no sampler named \"" + op + "\"");
    }
    check_cuda(cudaGetLastError(), name);
  });
}

int fs_row_transform(const char* name, const void* data, int64_t rows, int64_t vocab, const fs_sampling_params* params,
                     float* out, int32_t* status, void* stream) {
  return guarded("fs_row_transform", [&] {
    require(name != nullptr && params != nullptr, "fs_row_transform: name and params are required");
    const std::string op = name;
    const smp::DeviceRows in = rows_of(data, rows, vocab, *params, name);
    cudaStream_t s = as_stream(stream);
    if (op == "softmax") {
      const smp::RowParam<double, float> t = params->temperature_arr
                                                 ? smp::RowParam<double, float>::per_row(params->temperature_arr)
                                                 : smp::RowParam<double, float>(params->temperature);
      smp::softmax(in, t, out, status, s);
    } else if (op == "top_k_renorm_probs") {
      smp::top_k_renorm_probs(in, top_k_of(*params), out, status, s);
    } else if (op == "top_p_renorm_probs") {
      smp::top_p_renorm_probs(in, top_p_of(*params), out, status, s);
    } else if (op == "top_k_mask_logits") {
      smp::top_k_mask_logits(in, top_k_of(*params), out, status, s);
    } else {
      throw InvalidArgument("fs_row_transform: no transform named \"" + op + "\"");
    }
    check_cuda(cudaGetLastError(), name);
  });
}

int fs_chain_speculative_sampling(const float* draft_probs, const int32_t* draft_token_ids, const float* target_probs,
                                  int64_t batch, int64_t n, int64_t vocab, int32_t* output_token_ids, int32_t* accepted,
                                  int32_t* emitted, int32_t* status, uint64_t seed, uint64_t offset, void* stream) {
  return guarded("fs_chain_speculative_sampling", [&] {
    smp::SpeculativeOutputs out;
    out.output_token_ids = output_token_ids;
    out.output_accepted_token_num = accepted;
    out.output_emitted_draft_token_num = emitted;
    out.status = status;
    smp::chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, batch, n, vocab, out, seed, offset,
                                    as_stream(stream));
    check_cuda(cudaGetLastError(), "chain_speculative_sampling");
  });
}

int fs_sampling_status_name(int status, const char** name) {
  return guarded("fs_sampling_status_name", [&] {
    require(name != nullptr, "fs_sampling_status_name: name is null");
    *name = smp::to_string(static_cast<smp::Status>(status));
  });
}

int fs_memcpy(void* dst, const void* src, size_t bytes, void* stream, int synchronize) {
  return guarded("fs_memcpy", [&] {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)), "fs_memcpy");
    if (synchronize) check_cuda(cudaStreamSynchronize(as_stream(stream)), "fs_memcpy");
  });
}

int fs_pointer_device(const void* ptr, int* device, int* memory_type) {
  return guarded("fs_pointer_device", [&] {
    cudaPointerAttributes attr{};
    check_cuda(cudaPointerGetAttributes(&attr, ptr), "fs_pointer_device");
    if (device) *device = attr.device;
    if (memory_type) *memory_type = static_cast<int>(attr.type);
  });
}

int fs_set_device(int device, int* previous) {
  return guarded("fs_set_device", [&] {
    int current = 0, count = 0;
    check_cuda(cudaGetDevice(&current), "fs_set_device");
    if (previous) *previous = current;
    // The first call flashstep.cuda makes on a device: a GPU the stages cannot run on
    // (older than sm_80, or one this build has no code for) is refused here, by name,
    // before any kernel fails with "no kernel image".
    check_cuda(cudaGetDeviceCount(&count), "fs_set_device");
    if (device >= 0 && device < count) {
      const std::string reason = st::harness::device_unsupported_reason(device);
      if (!reason.empty()) throw std::runtime_error("fs_set_device: " + reason);
    }
    if (current != device) check_cuda(cudaSetDevice(device), "fs_set_device");
  });
}

int fs_stream_synchronize(void* stream) {
  return guarded("fs_stream_synchronize",
                 [&] { check_cuda(cudaStreamSynchronize(as_stream(stream)), "fs_stream_synchronize"); });
}

}  // extern "C"
