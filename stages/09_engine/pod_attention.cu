// POD attention's plan and launch (pod_attention.hpp; the kernel: pod_attention.cuh).
#include "09_engine/pod_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "04_tensor_core/tensor_core.hpp"
#include "09_engine/pod_attention.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::engine {

namespace {

constexpr int kDecodeStages = 2;            // stage 03's default pipeline depth
constexpr int kMinDecodeChunkTokens = 128;  // stage 03's shortest chunk (SplitKVOptions)

// The workspace: the int32 arrays plan() uploads in one copy ([0, staged)), each at a
// 256-byte boundary, then the decode rows' merge counters and partial states.
struct Layout {
  size_t prefill_qo, prefill_kv, request, tile, chunk, decode_request, decode_page_begin, decode_len, decode_indptr;
  size_t staged, counters, partial_o, partial_lse, bytes;
};

template <typename T, int HEAD_DIM>
size_t smem_bytes_of(int group_size) {
  const paged::DecodeBlockShape bs = paged::DecodeTraits<T, HEAD_DIM>::block_shape(group_size);
  return std::max(tensor_core::PrefillTraits<T, HEAD_DIM>::smem_bytes(),
                  split_kv::chunk_decode_smem_bytes<T, HEAD_DIM>(kDecodeStages, bs.bdy, bs.bdz));
}

}  // namespace

std::string pod_unsupported_reason(const BatchShape& s, int num_decodes) {
  if (s.mode != Mode::prefill || s.storage != KVStorage::paged)
    return "the step must be a prefill batch over a paged pool";
  if (s.dtype != DType::f16 && s.dtype != DType::bf16)
    return std::string("dtype ") + to_string(s.dtype) + " (f16, bf16)";
  if (s.resolved_kv_dtype() != s.dtype) return "the K/V must be in q's dtype";
  if (s.head_dim != 64 && s.head_dim != 128 && s.head_dim != 256)
    return "head_dim " + std::to_string(s.head_dim) + " (64, 128, 256)";
  if (s.num_kv_heads < 1 || s.num_qo_heads % s.num_kv_heads != 0)
    return "num_qo_heads must be a multiple of num_kv_heads";
  if (s.group_size() > tensor_core::kMaxGroupSize)
    return "GQA group " + std::to_string(s.group_size()) + " (at most " + std::to_string(tensor_core::kMaxGroupSize) +
           ")";
  if (s.page_size < 1 || s.page_size > tensor_core::kMaxPageSize)
    return "page_size " + std::to_string(s.page_size) + " (1.." + std::to_string(tensor_core::kMaxPageSize) + ")";
  if (!s.causal) return "the step must be causal";
  if (s.window_left >= 0 || s.logits_soft_cap > 0) return "no sliding window or soft cap";
  if (num_decodes < 0 || num_decodes > s.batch_size)
    return "num_decodes must be in 0..batch_size, got " + std::to_string(num_decodes);
  if (static_cast<int>(s.qo_indptr.size()) != s.batch_size + 1 ||
      static_cast<int>(s.kv_indptr.size()) != s.batch_size + 1 ||
      static_cast<int>(s.kv_last_page_len.size()) != s.batch_size)
    return "qo_indptr and kv_indptr need batch_size + 1 entries, kv_last_page_len batch_size";
  for (int i = 0; i < num_decodes; ++i)
    if (s.qo_indptr[i + 1] - s.qo_indptr[i] != 1) return "decode row " + std::to_string(i) + " must have one query";
  return "";
}

struct PodAttention::Impl {
  BatchShape step;
  int nd = 0;
  PodPlan plan;
  tensor_core::Schedule schedule;
  Layout at{};
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  ScheduleStaging staging;
  ~Impl() {
    if (workspace) cudaFree(workspace);
  }
};

PodAttention::PodAttention() : impl_(std::make_unique<Impl>()) {}
PodAttention::~PodAttention() = default;
const PodPlan& PodAttention::pod_plan() const { return impl_->plan; }

void PodAttention::plan(const BatchShape& step, int num_decodes, cudaStream_t stream) {
  const char* fn = "PodAttention::plan";
  const std::string why = pod_unsupported_reason(step, num_decodes);
  ref::require(why.empty(), fn, why);
  Impl& m = *impl_;
  const int nd = num_decodes, np = step.batch_size - nd;
  const int32_t p0 = step.kv_indptr[nd];

  // prefill rows: stage 04's schedule, never split (target_blocks 1)
  BatchShape p = step;
  p.batch_size = np;
  p.qo_indptr.assign(step.qo_indptr.begin() + nd, step.qo_indptr.end());
  p.kv_indptr.assign(step.kv_indptr.begin() + nd, step.kv_indptr.end());
  for (int32_t& x : p.qo_indptr) x -= step.qo_indptr[nd];
  for (int32_t& x : p.kv_indptr) x -= p0;
  p.kv_last_page_len.assign(step.kv_last_page_len.begin() + nd, step.kv_last_page_len.end());
  p.kv_indices.clear();
  tensor_core::TensorCoreOptions options;
  options.target_blocks = 1;
  m.schedule = np > 0 ? tensor_core::TensorCoreRunner(KVStorage::paged, options).make_schedule(p)
                      : tensor_core::Schedule{};
  const int64_t items = m.schedule.num_items();

  // decode rows: chunks of whole pages, split only as far as the blocks the prefill rows
  // leave free in one wave need (one chunk a row when they fill it)
  const int64_t hkv = step.num_kv_heads, P = step.page_size;
  const int64_t wave = int64_t{device_sm_count()} * (step.head_dim <= 128 ? 2 : 1);
  const int64_t free_blocks = wave - items * hkv;
  int64_t max_pages = 1;
  for (int r = 0; r < nd; ++r) max_pages = std::max<int64_t>(max_pages, step.kv_indptr[r + 1] - step.kv_indptr[r]);
  int64_t chunk_pages = max_pages;
  if (nd > 0 && free_blocks > int64_t{nd} * hkv) {
    const int64_t splits = free_blocks / (int64_t{nd} * hkv);
    chunk_pages = std::max((kMinDecodeChunkTokens + P - 1) / P, (max_pages + splits - 1) / splits);
  }
  std::vector<int32_t> request, page_begin, len, item_indptr{0};
  for (int r = 0; r < nd; ++r) {
    const int64_t pages = step.kv_indptr[r + 1] - step.kv_indptr[r], kv_len = step.kv_len(r);
    const int64_t chunks = std::max<int64_t>(1, (pages + chunk_pages - 1) / chunk_pages);
    for (int64_t t = 0; t < chunks; ++t) {
      request.push_back(r);
      page_begin.push_back(static_cast<int32_t>(step.kv_indptr[r] + t * chunk_pages));
      len.push_back(static_cast<int32_t>(std::min(chunk_pages * P, kv_len - t * chunk_pages * P)));
    }
    item_indptr.push_back(static_cast<int32_t>(request.size()));
  }
  const int64_t decode_items = static_cast<int64_t>(request.size());

  size_t offset = 0;
  auto take = [&](size_t n) {
    const size_t a = offset;
    offset = align_up(offset + n * sizeof(int32_t));
    return a;
  };
  Layout& at = m.at;
  at.prefill_qo = take(p.qo_indptr.size());
  at.prefill_kv = take(p.kv_indptr.size());
  at.request = take(static_cast<size_t>(items));
  at.tile = take(static_cast<size_t>(items));
  at.chunk = take(static_cast<size_t>(items));
  at.decode_request = take(request.size());
  at.decode_page_begin = take(page_begin.size());
  at.decode_len = take(len.size());
  at.decode_indptr = take(item_indptr.size());
  at.staged = offset;
  at.counters = take(static_cast<size_t>(nd * hkv));
  const size_t states = static_cast<size_t>(decode_items) * static_cast<size_t>(step.num_qo_heads);
  at.partial_o = offset;
  offset = align_up(offset + states * static_cast<size_t>(step.head_dim) * sizeof(float));
  at.partial_lse = offset;
  offset = align_up(offset + states * sizeof(float));
  at.bytes = std::max<size_t>(offset, 256);
  if (at.bytes > m.workspace_bytes) {
    if (m.workspace) {
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // a run in flight may read it
      FLASHSTEP_CUDA_CHECK(cudaFree(m.workspace));
    }
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&m.workspace, at.bytes * 2));
    m.workspace_bytes = at.bytes * 2;
  }
  uint8_t* staged = m.staging.begin(std::max<size_t>(at.staged, 4));
  auto put = [&](size_t where, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(staged + where, v.data(), v.size() * sizeof(int32_t));
  };
  put(at.prefill_qo, p.qo_indptr);
  put(at.prefill_kv, p.kv_indptr);
  put(at.request, m.schedule.request_indices);
  put(at.tile, m.schedule.qo_tile_indices);
  put(at.chunk, m.schedule.kv_chunk_indices);
  put(at.decode_request, request);
  put(at.decode_page_begin, page_begin);
  put(at.decode_len, len);
  put(at.decode_indptr, item_indptr);
  m.staging.upload(m.workspace, at.staged, stream);
  // the counters start at 0; the last block of each (row, kv head) puts its own back to 0
  if (nd > 0)
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(m.workspace) + at.counters, 0,
                                         static_cast<size_t>(nd * hkv) * sizeof(int32_t), stream));

  m.step = step;
  m.nd = nd;
  m.plan.prefill_blocks = items * step.num_kv_heads;
  m.plan.decode_blocks = decode_items * hkv;
  m.plan.decode_chunk_pages = chunk_pages;
  ref::require(m.plan.prefill_blocks + m.plan.decode_blocks < (int64_t{1} << 31), fn, "too many blocks for one grid");
  const bool bf16 = step.dtype == DType::bf16;
  FLASHSTEP_DISPATCH_HEAD_DIM(step.head_dim, HEAD_DIM, {
    if (bf16) {
      m.plan.smem_bytes = smem_bytes_of<__nv_bfloat16, HEAD_DIM>(step.group_size());
      FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(pod_attention_kernel<__nv_bfloat16, HEAD_DIM>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(m.plan.smem_bytes)));
    } else {
      m.plan.smem_bytes = smem_bytes_of<__half, HEAD_DIM>(step.group_size());
      FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(pod_attention_kernel<__half, HEAD_DIM>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(m.plan.smem_bytes)));
    }
  });
}

namespace {

template <typename T, int HEAD_DIM>
void launch_pod(const BatchShape& s, int nd, const PodPlan& plan, uint8_t* ws, const Layout& at, const DeviceBatch& b,
                cudaStream_t stream) {
  const int64_t total = plan.prefill_blocks + plan.decode_blocks;
  if (total == 0) return;
  const bool hnd = s.kv_layout == KVLayout::HND;
  const float sm_scale = s.resolved_sm_scale();
  const size_t row = static_cast<size_t>(s.num_qo_heads) * HEAD_DIM;
  const size_t q0 = static_cast<size_t>(s.qo_indptr[nd]);
  const int32_t p0 = s.kv_indptr[nd];
  auto arr = [&](size_t offset) { return reinterpret_cast<const int32_t*>(ws + offset); };
  PodParams<T> p;
  p.prefill_blocks = static_cast<int>(plan.prefill_blocks);
  p.decode_blocks = static_cast<int>(plan.decode_blocks);
  p.num_kv_heads = s.num_kv_heads;

  tensor_core::PrefillParams<T>& f = p.prefill;
  f.q = static_cast<const T*>(b.q) + q0 * row;
  f.qo_indptr = arr(at.prefill_qo);
  f.paged = kernels::make_paged_kv(static_cast<const T*>(b.kv_pool), arr(at.prefill_kv), b.kv_indices + p0,
                                   b.kv_last_page_len + nd, s.page_size, s.num_kv_heads, HEAD_DIM, hnd);
  f.paged_kv = true;
  f.o = static_cast<T*>(b.o) + q0 * row;
  f.lse = b.lse + q0 * static_cast<size_t>(s.num_qo_heads);
  f.request_indices = arr(at.request);
  f.qo_tile_indices = arr(at.tile);
  f.kv_chunk_indices = arr(at.chunk);
  f.kv_chunk_size = 0;
  f.num_qo_heads = s.num_qo_heads;
  f.num_kv_heads = s.num_kv_heads;
  f.group_size = s.group_size();
  f.causal = s.causal;
  f.window_left = -1;
  f.set_score_transform(sm_scale, 0.f);

  FusedChunkDecodeParams<T>& d = p.decode;
  d.q = static_cast<const T*>(b.q);
  d.kv = kernels::make_paged_kv(static_cast<const T*>(b.kv_pool), b.kv_indptr, b.kv_indices, b.kv_last_page_len,
                                s.page_size, s.num_kv_heads, HEAD_DIM, hnd);
  d.request_indices = arr(at.decode_request);
  d.kv_page_begin = arr(at.decode_page_begin);
  d.kv_chunk_len = arr(at.decode_len);
  d.o_indptr = arr(at.decode_indptr);
  d.merge_counters = reinterpret_cast<int32_t*>(ws + at.counters);
  d.partition_kv = true;  // (read by stage 03's own kernel only: here each row's chunk count decides)
  d.partial_o = reinterpret_cast<float*>(ws + at.partial_o);
  d.partial_lse = reinterpret_cast<float*>(ws + at.partial_lse);
  d.o = static_cast<T*>(b.o);
  d.lse = b.lse;
  d.num_qo_heads = s.num_qo_heads;
  d.group_size = s.group_size();
  const paged::DecodeBlockShape bs = paged::DecodeTraits<T, HEAD_DIM>::block_shape(d.group_size);
  d.bdy = bs.bdy;
  d.bdz = bs.bdz;
  d.num_stages = kDecodeStages;
  d.sm_scale_log2 = sm_scale * kernels::kLog2e;

  pod_attention_kernel<T, HEAD_DIM>
      <<<static_cast<unsigned>(total), tensor_core::PrefillTraits<T, HEAD_DIM>::kThreads, plan.smem_bytes, stream>>>(p);
  kernels::check_launch("pod_attention_kernel");
}

}  // namespace

void PodAttention::run(const DeviceBatch& step, cudaStream_t stream) {
  Impl& m = *impl_;
  ref::require(m.workspace != nullptr, "PodAttention::run", "plan() must come first");
  uint8_t* ws = static_cast<uint8_t*>(m.workspace);
  FLASHSTEP_DISPATCH_HEAD_DIM(m.step.head_dim, HEAD_DIM, {
    if (m.step.dtype == DType::bf16) launch_pod<__nv_bfloat16, HEAD_DIM>(m.step, m.nd, m.plan, ws, m.at, step, stream);
    else launch_pod<__half, HEAD_DIM>(m.step, m.nd, m.plan, ws, m.at, step, stream);
  });
}

}  // namespace flashstep::stages::engine
