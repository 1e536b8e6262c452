// Host-side helpers of the stage interface: names of the enums, batch arithmetic and the
// capability check every caller runs before handing a batch to a stage.
#include "stage.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/rope_fp32.hpp"

namespace flashstep::stages {

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "f16" || name == "float16") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "e4m3" || name == "float8_e4m3fn") return DType::e4m3;
  if (name == "e5m2" || name == "float8_e5m2") return DType::e5m2;
  throw ref::InvalidArgument("parse_dtype: dtype must be f32, f16, bf16, e4m3 or e5m2 (got \"" + name + "\")");
}

int device_sm_count() {
  // launches size persistent grids by it: each device is asked once (0: not yet)
  static std::array<std::atomic<int>, 64> known{};
  int device = 0, sms = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  const bool cached = device >= 0 && device < static_cast<int>(known.size());
  if (cached) sms = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (sms == 0) {
    FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (cached) known[static_cast<size_t>(device)].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

size_t device_smem_optin() {
  // rules ask it at every plan(), so each device is asked once (0: not yet)
  static std::array<std::atomic<int>, 64> known{};
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  const bool cached = device >= 0 && device < static_cast<int>(known.size());
  if (cached) bytes = known[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (bytes == 0) {
    if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    if (cached) known[static_cast<size_t>(device)].store(bytes, std::memory_order_relaxed);
  }
  return static_cast<size_t>(bytes);
}

namespace {

/// Each device's model, once asked or recorded (planners ask at every plan()).
struct DeviceModels {
  std::mutex mutex;
  std::map<int, DeviceModel> by_device;
};
DeviceModels& device_models() {
  static DeviceModels models;
  return models;
}

}  // namespace

DeviceModel device_model() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return kernels::kFallbackDeviceModel;
  }
  DeviceModels& m = device_models();
  const std::lock_guard<std::mutex> lock(m.mutex);
  auto known = m.by_device.find(device);
  if (known == m.by_device.end())
    known = m.by_device.emplace(device, kernels::device_model_from_attributes(device)).first;
  return known->second;
}

void use_device_model(const DeviceModel& model) {
  ref::require(std::isfinite(model.read_bytes_per_second) && model.read_bytes_per_second > 0 && model.num_sm >= 1 &&
                   std::isfinite(model.launch_seconds) && model.launch_seconds >= 0,
               "use_device_model",
               "the read rate must be positive and finite, num_sm >= 1 and launch_seconds >= 0, got " +
                   std::to_string(model.read_bytes_per_second) + " B/s, " + std::to_string(model.num_sm) + " SMs, " +
                   std::to_string(model.launch_seconds) + " s");
  int device = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  DeviceModels& m = device_models();
  const std::lock_guard<std::mutex> lock(m.mutex);
  m.by_device[device] = model;
}

ScheduleStaging::~ScheduleStaging() {
  // No throw from a destructor: a failure here is reported by the next CUDA call.
  if (copy_done_) {
    cudaEventSynchronize(copy_done_);
    cudaEventDestroy(copy_done_);
  }
  if (host_) cudaFreeHost(host_);
}

uint8_t* ScheduleStaging::begin(size_t bytes, bool zeroed) {
  if (copy_done_) FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(copy_done_));  // the last copy may still read host_
  else FLASHSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
  if (capacity_ < bytes) {
    const size_t grown = std::max(bytes, capacity_ + capacity_ / 2);
    if (host_) FLASHSTEP_CUDA_CHECK(cudaFreeHost(host_));
    host_ = nullptr;
    capacity_ = 0;
    FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), grown));
    capacity_ = grown;
  }
  if (bytes && zeroed) std::memset(host_, 0, bytes);
  return host_;
}

void ScheduleStaging::upload(void* device, size_t bytes, cudaStream_t stream) {
  if (bytes) FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(device, host_, bytes, cudaMemcpyHostToDevice, stream));
  FLASHSTEP_CUDA_CHECK(cudaEventRecord(copy_done_, stream));
}

void ScheduleStaging::upload_ranges(void* device, const std::vector<std::pair<size_t, size_t>>& ranges,
                                    cudaStream_t stream) {
  for (const auto& [first, last] : ranges)
    if (last > first)
      FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(device) + first, host_ + first, last - first,
                                           cudaMemcpyHostToDevice, stream));
  FLASHSTEP_CUDA_CHECK(cudaEventRecord(copy_done_, stream));
}

size_t dtype_bytes(DType dtype) { return dtype == DType::f32 ? 4 : is_fp8(dtype) ? 1 : 2; }

bool is_fp8(DType dtype) { return dtype == DType::e4m3 || dtype == DType::e5m2; }

const char* to_string(Mode mode) { return mode == Mode::decode ? "decode" : "prefill"; }

const char* to_string(KVStorage storage) { return storage == KVStorage::paged ? "paged" : "ragged"; }

const char* to_string(PosEncoding encoding) { return encoding == PosEncoding::rope_llama ? "rope_llama" : "none"; }

int64_t BatchShape::kv_len(int i) const {
  if (storage == KVStorage::ragged) return kv_indptr[i + 1] - kv_indptr[i];
  const int64_t pages = kv_indptr[i + 1] - kv_indptr[i];
  return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[i];
}

int64_t BatchShape::total_kv_len() const {
  int64_t total = 0;
  for (int i = 0; i < batch_size; ++i) total += kv_len(i);
  return total;
}

float BatchShape::resolved_sm_scale() const {
  return sm_scale ? *sm_scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

std::string BatchShape::describe() const {
  std::ostringstream s;
  s << to_string(mode) << ' ' << to_string(storage) << ' ' << to_string(dtype);
  if (resolved_kv_dtype() != dtype) s << " kv=" << to_string(resolved_kv_dtype());
  if (k_scale != 1.f || v_scale != 1.f) s << " k_scale=" << k_scale << " v_scale=" << v_scale;
  s << ' ' << ref::to_string(kv_layout) << " batch=" << batch_size << " heads=" << num_qo_heads << '/' << num_kv_heads
    << " head_dim=" << head_dim;
  if (resolved_head_dim_vo() != head_dim) s << " head_dim_vo=" << head_dim_vo;
  if (storage == KVStorage::paged) s << " page=" << page_size;
  if (mode == Mode::prefill) s << (causal ? " causal" : " non-causal");
  if (window_left >= 0) s << " window_left=" << window_left;
  if (logits_soft_cap > 0.f) s << " soft_cap=" << logits_soft_cap;
  if (pos_encoding != PosEncoding::none)
    s << ' ' << to_string(pos_encoding) << " rope_scale=" << rope_scale << " rope_theta=" << rope_theta;
  return s.str();
}

size_t StageRunner::workspace_bytes(const BatchShape&) const { return 0; }

bool StageInfo::supports(Mode mode) const { return std::find(modes.begin(), modes.end(), mode) != modes.end(); }

bool StageInfo::supports(DType dtype) const { return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end(); }

std::string StageInfo::kv_dtype_reason(const BatchShape& shape) const {
  if (!(std::isfinite(shape.k_scale) && shape.k_scale > 0) || !(std::isfinite(shape.v_scale) && shape.v_scale > 0))
    return "k_scale and v_scale must be positive finite numbers";
  const DType kv = shape.resolved_kv_dtype();
  if (kv != shape.dtype) {
    if (!is_fp8(kv))
      return std::string("K/V must be in q's dtype (") + to_string(shape.dtype) + ") or an FP8 format, not " +
             to_string(kv);
    if (shape.dtype == DType::f32) return "FP8 K/V is read with fp16 or bf16 queries, not f32";
    if (std::find(kv_dtypes.begin(), kv_dtypes.end(), kv) == kv_dtypes.end())
      return name + " reads K/V in q's dtype only, not " + to_string(kv) + " (an FP8 cache)";
  }
  if ((shape.k_scale != 1.f || shape.v_scale != 1.f) && kv_dtypes.empty())
    return name + " does not apply k_scale or v_scale (both must be 1)";
  return {};
}

std::string StageInfo::pos_encoding_reason(const BatchShape& shape) const {
  if (shape.pos_encoding == PosEncoding::none) return {};
  if (std::find(pos_encodings.begin(), pos_encodings.end(), shape.pos_encoding) == pos_encodings.end())
    return name + " does not implement pos_encoding " + to_string(shape.pos_encoding) +
           " (apply RoPE before the append, or pick a stage that rotates q and k itself)";
  if (!(std::isfinite(shape.rope_scale) && shape.rope_scale > 0) ||
      !(std::isfinite(shape.rope_theta) && shape.rope_theta > 0))
    return "rope_scale and rope_theta must be positive finite numbers";
  if (shape.resolved_kv_dtype() != shape.dtype)
    return name + " rotates keys in q's dtype only, not an FP8 cache (" + to_string(shape.resolved_kv_dtype()) + ")";
  return {};
}

std::string StageInfo::unsupported_run_reason(const DeviceBatch& batch) const {
  for (float s : {batch.k_scale, batch.v_scale})
    if (s != 0.f && !(std::isfinite(s) && s > 0))
      return "the run's k_scale and v_scale must be positive finite numbers (0: the plan's)";
  const bool scaled = (batch.k_scale != 0.f && batch.k_scale != 1.f) || (batch.v_scale != 0.f && batch.v_scale != 1.f);
  if (scaled && kv_dtypes.empty()) return name + " does not apply k_scale or v_scale (both must be 1)";
  if (batch.sinks != nullptr && !sinks) return name + " does not implement attention sinks";
  return {};
}

std::string StageInfo::unsupported_reason(const BatchShape& shape) const {
  auto contains = [](const auto& list, const auto& x) { return std::find(list.begin(), list.end(), x) != list.end(); };
  if (!supports(shape.mode)) return name + " does not do " + to_string(shape.mode);
  if (shape.sm_scale && !(std::isfinite(*shape.sm_scale) && *shape.sm_scale > 0))
    return "sm_scale must be a positive finite number when given";
  if (shape.storage != storage) return name + " reads " + to_string(storage) + " KV, not " + to_string(shape.storage);
  if (!supports(shape.dtype)) return name + " is not built for dtype " + to_string(shape.dtype);
  if (const std::string kv = kv_dtype_reason(shape); !kv.empty()) return kv;
  if (shape.head_dim_vo < 0)
    return "head_dim_vo must be 0 (as head_dim) or positive, got " + std::to_string(shape.head_dim_vo);
  if (shape.resolved_head_dim_vo() != shape.head_dim) {
    if (!contains(head_dim_pairs, std::pair<int, int>{shape.head_dim, shape.head_dim_vo}))
      return name + " is not built for head_dim " + std::to_string(shape.head_dim) + " with head_dim_vo " +
             std::to_string(shape.head_dim_vo) +
             (head_dim_pairs.empty() ? std::string(" (v and o as wide as q and k only)") : std::string());
  } else if (!contains(head_dims, shape.head_dim)) {
    return name + " is not built for head_dim " + std::to_string(shape.head_dim);
  }
  if (!contains(kv_layouts, shape.kv_layout))
    return name + " does not read the " + ref::to_string(shape.kv_layout) + " layout";
  if (shape.num_kv_heads <= 0 || shape.num_qo_heads % shape.num_kv_heads != 0)
    return "num_qo_heads must be a positive multiple of num_kv_heads";
  if (shape.group_size() > max_group_size) return name + " supports GQA groups up to " + std::to_string(max_group_size);
  if (shape.storage == KVStorage::paged && (shape.page_size < 1 || shape.page_size > max_page_size))
    return name + " supports page_size 1.." + std::to_string(max_page_size);
  if (shape.mode == Mode::prefill && shape.causal && !causal) return name + " does not implement the causal mask";
  if (shape.window_left >= 0 && !window_left) return name + " does not implement window_left";
  if (shape.logits_soft_cap > 0.f && !logits_soft_cap) return name + " does not implement logits_soft_cap";
  if (const std::string pos = pos_encoding_reason(shape); !pos.empty()) return pos;
  if (shape.cuda_graph && !cuda_graph)
    return name +
           " plans its launch from the request lengths, so a CUDA graph captured after one plan() "
           "would replay a stale schedule after the next: it does not plan for CUDA graphs";
  if (needs_host_page_table && shape.storage == KVStorage::paged &&
      (shape.kv_indptr.empty() || static_cast<int64_t>(shape.kv_indices.size()) != shape.kv_indptr.back()))
    return name + " plans from the page ids: BatchShape::kv_indices must hold kv_indptr[batch_size] entries";
  if (rules) return rules(shape);
  return {};
}

std::string StageInfo::capabilities() const {
  std::ostringstream s;
  s << to_string(storage);
  for (Mode m : modes) s << ' ' << to_string(m);
  s << "; dtypes";
  for (DType d : dtypes) s << ' ' << to_string(d);
  if (!kv_dtypes.empty()) {
    s << "; FP8 K/V";
    for (DType d : kv_dtypes) s << ' ' << to_string(d);
    s << " (k_scale, v_scale)";
  }
  s << "; head_dim";
  for (int d : head_dims) s << ' ' << d;
  for (const auto& [qk, vo] : head_dim_pairs) s << ' ' << qk << '/' << vo;
  s << "; layouts";
  for (KVLayout l : kv_layouts) s << ' ' << ref::to_string(l);
  s << "; GQA groups 1.." << max_group_size;
  if (storage == KVStorage::paged) s << "; page_size 1.." << max_page_size;
  if (causal) s << "; causal";
  if (window_left) s << "; window_left";
  if (logits_soft_cap) s << "; logits_soft_cap";
  if (sinks) s << "; sinks";
  if (needs_host_page_table) s << "; plans from the host page table";
  for (PosEncoding e : pos_encodings)
    if (e != PosEncoding::none)
      s << "; pos_encoding " << to_string(e) << (rope_rounds_to_dtype ? " (rotated q, k rounded to the dtype)" : "");
  if (cuda_graph) s << "; cuda_graph (the launch depends on batch_size and nnz_qo only)";
  return s.str();
}

DeviceRopeTurns::~DeviceRopeTurns() {
  if (device_ != nullptr) cudaFree(device_);
}

const double* DeviceRopeTurns::update(const BatchShape& shape, cudaStream_t stream) {
  if (shape.pos_encoding == PosEncoding::none) return nullptr;
  std::vector<double> turns = ref::rope_llama_turns(shape.head_dim, shape.rope_scale, shape.rope_theta);
  if (turns == host_ && device_ != nullptr) return device_;
  if (turns.size() > capacity_) {
    if (device_ != nullptr) FLASHSTEP_CUDA_CHECK(cudaFree(device_));
    device_ = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&device_, turns.size() * sizeof(double)));
    capacity_ = turns.size();
  }
  host_ = std::move(turns);
  // From pageable memory: the call returns once host_ has been read, so host_ may change after.
  FLASHSTEP_CUDA_CHECK(
      cudaMemcpyAsync(device_, host_.data(), host_.size() * sizeof(double), cudaMemcpyHostToDevice, stream));
  return device_;
}

void CapturedLaunch::check_plan(const char* fn, const std::string& launch) const {
  ref::require(captured_.empty() || captured_ == launch, fn,
               "run() was captured into a CUDA graph with the launch [" + captured_ + "]; this plan needs [" + launch +
                   "], which that graph cannot replay. Plan with BatchShape::cuda_graph on a stage that supports "
                   "it (the launch then depends on batch_size and nnz_qo only), or use one runner per captured graph.");
}

bool CapturedLaunch::capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive;
}

}  // namespace flashstep::stages
