/// \file stage.hpp
/// \brief What every CUDA stage looks like from outside: the batch it is given (host
/// shape + device pointers), the plan/run runner it provides, and the capabilities it
/// declares. Tests, the benchmark, the CLI and the docs see stages only through this.
///
/// The split into plan() and run() is FlashInfer's (the FlashInfer paper, arXiv
/// 2501.01005, section 4.1; docs/concepts/09_plan_run.md): plan() runs on the host once
/// per batch composition, may read the index arrays on the host and writes whatever
/// schedule it needs into the caller's workspace; run() is the per-layer call and makes
/// no host decisions, so it can be timed alone and captured in a CUDA graph. Stages 01
/// and 02 need almost no planning; stage 03 (split-KV) is where plan() earns its keep.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashstep/kernels/device_model.hpp"
#include "flashstep/reference/attention.hpp"

namespace flashstep::stages {

using ref::KVLayout;

/// Element type of q, k, v and o. LSE is always fp32 and every stage accumulates in fp32.
/// e4m3 and e5m2 (reference/fp8.hpp) are K/V types only: an FP8 cache read with fp16 or
/// bf16 queries and outputs.
enum class DType { f32, f16, bf16, e4m3, e5m2 };

/// "f32", "f16", "bf16", "e4m3" or "e5m2".
const char* to_string(DType dtype);
/// Parses "f32"/"float32", "f16"/"float16", "bf16"/"bfloat16", "e4m3"/"float8_e4m3fn",
/// "e5m2"/"float8_e5m2"; throws ref::InvalidArgument naming `dtype` otherwise.
DType parse_dtype(const std::string& name);
/// Bytes per element: 4, 2, 2, 1, 1.
size_t dtype_bytes(DType dtype);
/// Whether `dtype` is one of the FP8 formats (e4m3, e5m2).
bool is_fp8(DType dtype);

/// Decode (one query token per request) or prefill/append (qo_len >= 1 per request).
enum class Mode { decode, prefill };
/// "decode" or "prefill".
const char* to_string(Mode mode);

/// Where the keys and values of a batch live.
enum class KVStorage {
  ragged,  ///< contiguous per request: k, v (nnz_kv, num_kv_heads, head_dim); request i owns rows kv_indptr[i]..kv_indptr[i+1]
  paged,  ///< a page pool and its CSR page table (kv_indptr counts pages)
};
/// "ragged" or "paged".
const char* to_string(KVStorage storage);

/// Where a stage puts the tokens' positions (FlashInfer's `pos_encoding_mode`).
enum class PosEncoding {
  none,        ///< q and k are used as given ("NONE"): any RoPE was applied before the append
  rope_llama,  ///< "ROPE_LLAMA": the pool holds un-rotated keys; the stage rotates q and each key as it loads them
};
/// "none" or "rope_llama".
const char* to_string(PosEncoding encoding);

/// The host-side description of a batch: sizes, options and host copies of the index
/// arrays. This is all plan() may look at (FlashInfer's plan() also takes indptr on the
/// host), so a plan never waits for the device.
struct BatchShape {
  Mode mode = Mode::decode;              ///< decode (qo_len 1 per request) or prefill
  KVStorage storage = KVStorage::paged;  ///< paged pool + page table, or ragged k/v
  DType dtype = DType::bf16;             ///< element type of q, k, v and o
  /// Element type of K and V when it differs from q's: e4m3 or e5m2 for an FP8 cache.
  /// Not given (the default): dtype. Stages read it through resolved_kv_dtype().
  std::optional<DType> kv_dtype;
  float k_scale = 1.f;                 ///< attention reads k * k_scale (FlashInfer's run() argument); positive, finite
  float v_scale = 1.f;                 ///< attention reads v * v_scale; positive, finite
  KVLayout kv_layout = KVLayout::NHD;  ///< page layout: NHD or HND (ragged k/v are NHD)
  int batch_size = 0;                  ///< requests in the batch
  int num_qo_heads = 0;                ///< query (and output) heads, Hq
  int num_kv_heads = 0;                ///< key/value heads, Hkv; divides num_qo_heads (GQA)
  int head_dim = 0;                    ///< elements per head of q and k, D
  /// Elements per head of v and o when they differ from head_dim (DeepSeek's MLA prefill:
  /// head_dim 192, head_dim_vo 128; FlashInfer's `head_dim_vo`). 0 (the default):
  /// head_dim. Stages read it through resolved_head_dim_vo().
  int head_dim_vo = 0;
  int page_size = 0;            ///< paged only: tokens per page
  int64_t num_pages = 0;        ///< paged only: pages in the pool
  bool causal = false;          ///< prefill only; bottom-right aligned
  int window_left = -1;         ///< keep the last window_left + 1 keys of each query's causal range; -1 = off
  float logits_soft_cap = 0.f;  ///< c > 0: scores s -> c * tanh(s / c) before the softmax; 0 = off
  /// Softmax scale applied to q.k. Not given (the default): 1/sqrt(head_dim). Stages
  /// read it through resolved_sm_scale(); a given value must be positive and finite.
  std::optional<float> sm_scale;
  /// RoPE inside the stage (FlashInfer's pos_encoding_mode="ROPE_LLAMA"): every head's
  /// rotate-half pairs (x[i], x[i + head_dim/2]) turn by position * theta_i, theta_i =
  /// rope_theta^(-2i/head_dim) / rope_scale (flashstep/reference/rope.hpp); query row i of a
  /// request sits at position kv_len - qo_len + i, key j at position j.
  PosEncoding pos_encoding = PosEncoding::none;
  float rope_scale = 1.f;                 ///< rope_llama: divides every frequency; positive, finite
  float rope_theta = 1e4f;                ///< rope_llama: base of the frequencies; positive, finite
  std::vector<int32_t> qo_indptr;         ///< (batch_size + 1); decode: 0, 1, ..., batch_size
  std::vector<int32_t> kv_indptr;         ///< (batch_size + 1); paged: page offsets, ragged: token offsets
  std::vector<int32_t> kv_last_page_len;  ///< (batch_size), paged only
  /// Paged only, optional: a host copy of the page ids (kv_indptr[batch_size]). Stages
  /// that plan from which pages requests share (stage 05's cascade) need it; the others
  /// ignore it.
  std::vector<int32_t> kv_indices;
  /// Plan for a captured CUDA graph: the launch (grid, kernel arguments, workspace
  /// offsets) may depend on batch_size and nnz_qo but never on the lengths, so a graph
  /// captured after one plan() replays correctly after a later plan() of the same
  /// batch_size and nnz_qo with any lengths. Only stages whose StageInfo::cuda_graph is
  /// set accept it (FlashInfer's use_cuda_graph=True).
  bool cuda_graph = false;

  /// Query rows of the batch: qo_indptr[batch_size].
  int64_t nnz_qo() const { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
  /// Keys of request i (through the page table when paged).
  int64_t kv_len(int i) const;
  /// Keys of the whole batch.
  int64_t total_kv_len() const;
  /// The scale the stages apply: sm_scale when given, else 1/sqrt(head_dim).
  float resolved_sm_scale() const;
  /// The element type of K and V: kv_dtype when given, else dtype.
  DType resolved_kv_dtype() const { return kv_dtype.value_or(dtype); }
  /// Elements per head of v and o: head_dim_vo when given, else head_dim.
  int resolved_head_dim_vo() const { return head_dim_vo > 0 ? head_dim_vo : head_dim; }
  /// Query heads per kv head (GQA group size).
  int group_size() const { return num_kv_heads > 0 ? num_qo_heads / num_kv_heads : 0; }
  /// One line, e.g. "decode paged bf16 NHD batch=16 heads=32/8 head_dim=128 page=16".
  std::string describe() const;
};

/// Device pointers of a batch. Shapes follow BatchShape; every pointer is device memory.
struct DeviceBatch {
  const void* q = nullptr;             ///< (nnz_qo, num_qo_heads, head_dim), dtype
  const int32_t* qo_indptr = nullptr;  ///< (batch_size + 1)
  const int32_t* kv_indptr = nullptr;  ///< (batch_size + 1), as in BatchShape
  // paged storage
  const void* kv_pool =
      nullptr;  ///< (num_pages, 2, page_size, Hkv, D) NHD or (num_pages, 2, Hkv, page_size, D) HND, kv dtype
  const int32_t* kv_indices = nullptr;        ///< (kv_indptr[batch_size]) page ids
  const int32_t* kv_last_page_len = nullptr;  ///< (batch_size)
  // ragged storage
  const void* k = nullptr;  ///< (nnz_kv, num_kv_heads, head_dim), NHD, kv dtype
  const void* v = nullptr;  ///< (nnz_kv, num_kv_heads, head_dim_vo), NHD, kv dtype
  // outputs
  void* o = nullptr;     ///< (nnz_qo, num_qo_heads, head_dim_vo), dtype
  float* lse = nullptr;  ///< (nnz_qo, num_qo_heads), natural log
  // scales of this run (FlashInfer's run(k_scale=, v_scale=))
  /// Attention reads k * k_scale in this run; 0 (the default): BatchShape::k_scale, the
  /// plan's. A stage whose StageInfo lists kv_dtypes applies it without planning again,
  /// so one plan serves every layer of a model, each with its own scales; a CUDA graph
  /// keeps the value of the run it captured. Positive and finite when given: run() does
  /// not check, its callers do (StageInfo::unsupported_run_reason).
  float k_scale = 0.f;
  float v_scale = 0.f;  ///< as k_scale, for v (0: BatchShape::v_scale)
  /// Attention sinks of this run (FlashInfer's run(sinks=)): (num_qo_heads) natural-log
  /// logits, fp32, each joining its head's softmax denominator with no value
  /// (stages/sinks/); null: none. Only stages whose StageInfo::sinks is set take them.
  const float* sinks = nullptr;
  /// Paged storage with head_dim_vo != head_dim (MLA's prefill): V's own pool,
  /// (num_pages, 1, page_size, Hkv, head_dim_vo) NHD or (num_pages, 1, Hkv, page_size,
  /// head_dim_vo) HND, and kv_pool then holds K alone, (num_pages, 1, ...) (FlashInfer's
  /// separate k_cache and v_cache). Null otherwise: V is kv_pool[:, 1]. (Last, so that
  /// positional initialisers of the fields above keep their meaning.)
  const void* v_pool = nullptr;
};

/// The k_scale a run applies: batch.k_scale when given (non-zero), else shape.k_scale.
inline float run_k_scale(const BatchShape& shape, const DeviceBatch& batch) {
  return batch.k_scale != 0.f ? batch.k_scale : shape.k_scale;
}
/// The v_scale a run applies: batch.v_scale when given (non-zero), else shape.v_scale.
inline float run_v_scale(const BatchShape& shape, const DeviceBatch& batch) {
  return batch.v_scale != 0.f ? batch.v_scale : shape.v_scale;
}

/// Every stage's workspace sections start at a multiple of this many bytes.
constexpr size_t kWorkspaceAlignment = 256;
/// `bytes` rounded up to a multiple of kWorkspaceAlignment: where the next section starts.
constexpr size_t align_up(size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}
/// Multiprocessors of the current CUDA device (a host query, made once per device; plans
/// and stage 07's persistent launch size grids by it).
int device_sm_count();
/// Bytes of shared memory one block may opt into on the current CUDA device
/// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KB on an H100, 163 KB on an A100, 99 KB
/// on sm_86 and sm_89), asked once per device; 0 where no device can be asked.
size_t device_smem_optin();

/// What the planners' cost models assume of a GPU (kernels/device_model.hpp).
using kernels::DeviceModel;
/// The model of the current CUDA device that a planner prices with unless it was given
/// one (SplitKVOptions::device, ...): what use_device_model() recorded for the device,
/// else kernels::device_model_from_attributes, asked once per device;
/// kernels::kFallbackDeviceModel where no device answers.
DeviceModel device_model();
/// Records `model` as the current device's for the rest of the process: the benchmark and
/// `flashstep serve --json` pass what bench/ceilings measured on it (the read ceiling, the
/// launch floor), so the plans they time price with the rates they report. Throws
/// ref::InvalidArgument unless the read rate is positive, num_sm >= 1 and the launch >= 0.
void use_device_model(const DeviceModel& model);

/// What a CUDA stage's plan() needs of one kernel instantiation (dtype x head_dim x ...),
/// and how its run() launches it. Each stage fills one per instantiation through the
/// dispatch macros (kernels/dispatch.cuh) and keeps the runner's launch arguments in its
/// own `Args`; the host functions are plain function pointers, so an entry is a value.
template <typename Args>
struct KernelEntry {
  /// Dynamic shared memory of a launch, by pipeline depth and GQA group size (an
  /// instantiation whose size is fixed ignores both).
  size_t (*smem_bytes)(int num_stages, int group_size) = nullptr;
  /// Raises the instantiation's dynamic shared-memory limit to `bytes` (a host call:
  /// plan() makes it, run() does not).
  void (*set_smem_limit)(size_t bytes) = nullptr;
  /// Blocks of `bytes` of shared memory that fit on one multiprocessor (the occupancy
  /// calculator's answer; call set_smem_limit first).
  int (*blocks_per_sm)(size_t bytes) = nullptr;
  /// Launches on `stream`: launches only, so that a CUDA graph may capture it.
  void (*launch)(const Args& args, cudaStream_t stream) = nullptr;
};

/// One stage's implementation of a batch attention call, FlashInfer's plan/run wrapper.
/// Make one per batch composition (or reuse it: plan() may be called again).
class StageRunner {
 public:
  virtual ~StageRunner() = default;
  /// Device workspace (bytes) that plan() and run() need for `shape`; the caller
  /// allocates it once and passes it to plan(). Default: none.
  virtual size_t workspace_bytes(const BatchShape& shape) const;
  /// Host-side scheduling for `shape`. May write into the workspace, ordered on `stream`.
  /// \param shape the batch to plan for; run() must then get pointers of this shape
  /// \param workspace device buffer of at least workspace_bytes(shape) bytes (may be null when 0)
  /// \param workspace_size bytes of `workspace`; a stage that needs a workspace throws
  ///        ref::InvalidArgument when this is below workspace_bytes(shape)
  /// \param stream where any copy into the workspace is ordered
  virtual void plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) = 0;
  /// The per-layer device work: only kernel launches on `stream`, no host decisions.
  /// \param batch pointers matching the planned shape
  /// \param stream where the kernels are launched (and may be captured in a CUDA graph)
  virtual void run(const DeviceBatch& batch, cudaStream_t stream) = 0;
};

/// What a CUDA graph froze of a runner: it replays the launches it captured (grids,
/// kernel arguments, workspace offsets), not the host code of run(). A runner keeps one
/// of these and describes its launch as a string; once run() has been captured, a plan()
/// whose launch reads differently is refused instead of leaving the graph to replay a
/// stale schedule over new lengths (FlashInfer's bug class: a silently wrong replay).
class CapturedLaunch {
 public:
  /// From plan(), before anything is written: throws ref::InvalidArgument (from `fn`)
  /// when a graph captured a launch other than `launch`.
  void check_plan(const char* fn, const std::string& launch) const;
  /// From run(): remembers the launch `describe()` returns when `stream` is being
  /// captured. run() is the per-layer call, so the description is built only then.
  template <typename Describe>
  void on_run(cudaStream_t stream, const Describe& describe) {
    if (capturing(stream)) captured_ = describe();
  }

 private:
  static bool capturing(cudaStream_t stream);
  std::string captured_;  // empty: nothing captured yet
};

/// Where a plan() writes its schedule on the host, and the one copy that ships it to the
/// workspace: pinned memory (so the copy is asynchronous) and an event that says when
/// the last copy out of it is done. The next plan() waits for that event before it
/// writes again, so a plan made while the previous run() is still queued is safe.
class ScheduleStaging {
 public:
  ScheduleStaging() = default;
  ~ScheduleStaging();
  ScheduleStaging(const ScheduleStaging&) = delete;
  ScheduleStaging& operator=(const ScheduleStaging&) = delete;
  /// `bytes` bytes of pinned host memory, once the previous copy out of it is done;
  /// zeroed unless `zeroed` is false (then the caller writes every byte it uploads).
  uint8_t* begin(size_t bytes, bool zeroed = true);
  /// Copies the first `bytes` written since begin() to `device` on `stream` (one
  /// cudaMemcpyAsync) and records when it is done.
  void upload(void* device, size_t bytes, cudaStream_t stream);
  /// Copies each [first, second) byte range of the staged memory to the same offsets of
  /// `device` on `stream` (one cudaMemcpyAsync each) and records when they are done: for
  /// a layout whose arrays are sized for the most entries but hold far fewer.
  void upload_ranges(void* device, const std::vector<std::pair<size_t, size_t>>& ranges, cudaStream_t stream);

 private:
  uint8_t* host_ = nullptr;
  size_t capacity_ = 0;
  cudaEvent_t copy_done_ = nullptr;
};

/// A runner's device copy of the RoPE turns f_i = theta_i / (2 pi) (ref::rope_llama_turns)
/// of the shape it last planned, for the kernels that rotate q and k as they load them.
/// plan() calls update(); the copy is made only when head_dim, rope_scale or rope_theta
/// change, and the pointer stays the same unless a longer head_dim needs more room (so a
/// captured graph keeps reading the right turns while those stay the same).
class DeviceRopeTurns {
 public:
  DeviceRopeTurns() = default;
  ~DeviceRopeTurns();
  DeviceRopeTurns(const DeviceRopeTurns&) = delete;
  DeviceRopeTurns& operator=(const DeviceRopeTurns&) = delete;
  /// The turns of `shape` in device memory (copied on `stream` when they changed); null
  /// when shape.pos_encoding is none.
  const double* update(const BatchShape& shape, cudaStream_t stream);

 private:
  double* device_ = nullptr;
  size_t capacity_ = 0;
  std::vector<double> host_;  // what device_ holds
};

/// What a stage declares about itself: one registry entry.
struct StageInfo {
  std::string name;                      ///< folder name, e.g. "02_paged"
  std::string summary;                   ///< one line: what the stage teaches
  std::vector<Mode> modes;               ///< decode and/or prefill
  KVStorage storage = KVStorage::paged;  ///< where it expects K/V
  std::vector<DType> dtypes;             ///< element types of q/k/v/o it accepts
  /// FP8 K/V types it reads with fp16/bf16 q and o (e4m3, e5m2), applying k_scale and
  /// v_scale; empty: K/V in q's dtype only, and both scales must be 1.
  std::vector<DType> kv_dtypes;
  std::vector<int> head_dims;  ///< head_dim values it is built for (v and o as wide)
  /// (head_dim, head_dim_vo) pairs of unequal widths it is also built for (MLA's prefill,
  /// (192, 128)); empty: v and o as wide as q and k only.
  std::vector<std::pair<int, int>> head_dim_pairs;
  std::vector<KVLayout> kv_layouts;  ///< page (or ragged) layouts it reads
  int max_page_size = 0;             ///< paged only: largest page_size it accepts
  int max_group_size = 0;            ///< largest num_qo_heads / num_kv_heads
  bool causal = false;               ///< whether it implements the causal mask (prefill)
  bool window_left = false;          ///< whether it implements window_left >= 0
  bool logits_soft_cap = false;      ///< whether it implements logits_soft_cap > 0
  bool sinks = false;                ///< whether a run may give DeviceBatch::sinks (run() names the shapes it refuses)
  bool needs_host_page_table = false;  ///< whether plan() reads BatchShape::kv_indices
  /// Position encodings it implements; PosEncoding::rope_llama only with q's dtype K/V.
  std::vector<PosEncoding> pos_encodings = {PosEncoding::none};
  /// rope_llama: whether the rotated q and k are rounded to the dtype before q . k (a
  /// tensor-core stage rotates the tiles in shared memory, where its MMAs read them), or
  /// kept in fp32 (a stage that rotates in registers). Either way the rotation itself is
  /// ref::rope_fp32's, bit for bit, so the harness's reference computes the same values.
  bool rope_rounds_to_dtype = false;
  /// Whether plan() honours BatchShape::cuda_graph: a launch that depends only on
  /// batch_size and nnz_qo. Every stage also refuses, through CapturedLaunch, a plan()
  /// whose launch differs from the one a CUDA graph captured.
  bool cuda_graph = false;
  /// The stage's own rules beyond the fields above (the GPU it needs, shapes its tiles
  /// cannot cut): empty, or a function returning the first rule `shape` breaks ("" if none).
  std::function<std::string(const BatchShape&)> rules;
  std::function<std::unique_ptr<StageRunner>()> make_runner;  ///< a fresh runner

  /// Empty when the stage can run `shape`; otherwise the first rule it breaks.
  std::string unsupported_reason(const BatchShape& shape) const;
  /// The part of unsupported_reason about K/V's element type and scales (kv_dtypes).
  std::string kv_dtype_reason(const BatchShape& shape) const;
  /// The part of unsupported_reason about pos_encoding (and rope_scale, rope_theta).
  std::string pos_encoding_reason(const BatchShape& shape) const;
  /// Empty when a run() may take `batch`'s scales (DeviceBatch::k_scale / v_scale):
  /// none given (0), or positive finite ones for a stage that applies scales (kv_dtypes
  /// not empty), or 1 for any stage; and its sinks only where `sinks` is set; otherwise
  /// why not. run() itself does not check the scales.
  std::string unsupported_run_reason(const DeviceBatch& batch) const;
  /// Whether the stage can run `shape`: unsupported_reason(shape) is empty.
  bool supports(const BatchShape& shape) const { return unsupported_reason(shape).empty(); }
  /// Whether `mode` is one of the stage's modes.
  bool supports(Mode mode) const;
  /// Whether the stage is built for element type `dtype`.
  bool supports(DType dtype) const;
  /// One line listing the capabilities, for `flashstep` and the docs.
  std::string capabilities() const;
};

}  // namespace flashstep::stages
