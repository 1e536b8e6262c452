// Stage 09's GPU engine: the tiny decoder on cuBLAS, the attention stages through the
// registry, stage 06's samplers, driven by the Scheduler. See engine.hpp for one step.
#include "09_engine/engine.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "06_sampling/sampling.hpp"
#include "09_engine/rope_gpu.hpp"
#include "flashstep/kernels/append_paged.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/rope.hpp"
#include "flashstep/reference/sampling.hpp"
#include "registry.hpp"

namespace flashstep::stages::engine {

using ref::require;

namespace {

constexpr int kThreads = 256;

std::string str(int64_t v) { return std::to_string(v); }

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + what + " failed with status " + str(static_cast<int>(s)));
}

template <typename T>
__device__ __forceinline__ float load_float(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T store_rounded(float x) {
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

// X[t] = embedding[tokens[t]] (+ the sinusoid of positions[t], in double as the reference).
template <typename T>
__global__ void embed_kernel(const T* __restrict__ embedding, const int32_t* __restrict__ tokens,
                             const int32_t* __restrict__ positions, int d, bool sinusoidal, float* __restrict__ x) {
  const int64_t t = blockIdx.x;
  const int64_t token = tokens[t];
  const double pos = positions[t];
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float e = load_float(embedding[token * d + j]);
    if (!sinusoidal) {
      x[t * d + j] = e;
      continue;
    }
    const double angle = pos / pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(d));
    x[t * d + j] = static_cast<float>(static_cast<double>(e) + (j % 2 == 0 ? sin(angle) : cos(angle)));
  }
}

// out[i] = X[rows ? rows[i] : i] rounded to T: the rows entering a projection.
template <typename T>
__global__ void round_rows_kernel(const float* __restrict__ x, const int32_t* __restrict__ rows, int d,
                                  T* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const int64_t src = rows != nullptr ? rows[i] : i;
  for (int j = threadIdx.x; j < d; j += blockDim.x) out[i * d + j] = store_rounded<T>(x[src * d + j]);
}

// X += O (no output projection: O is (n, d_model)).
template <typename T>
__global__ void residual_kernel(const T* __restrict__ o, int d, float* __restrict__ x) {
  const int64_t i = blockIdx.x;
  for (int j = threadIdx.x; j < d; j += blockDim.x) x[i * d + j] += load_float(o[i * d + j]);
}

// tokens[i] = argmax of logits row i, the lowest id on ties (std::max_element's rule).
__global__ void argmax_kernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ tokens) {
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int arg = vocab;  // larger than any id: loses every tie
  for (int j = threadIdx.x; j < vocab; j += blockDim.x)
    if (row[j] > best) best = row[j], arg = j;  // ascending j: the first max of this thread
  __shared__ float s_val[kThreads];
  __shared__ int s_arg[kThreads];
  s_val[threadIdx.x] = best;
  s_arg[threadIdx.x] = arg;
  __syncthreads();
  for (int step = blockDim.x / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) {
      const float v = s_val[threadIdx.x + step];
      const int a = s_arg[threadIdx.x + step];
      if (v > s_val[threadIdx.x] || (v == s_val[threadIdx.x] && a < s_arg[threadIdx.x]))
        s_val[threadIdx.x] = v, s_arg[threadIdx.x] = a;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) tokens[blockIdx.x] = s_arg[0] < vocab ? s_arg[0] : 0;  // an all -inf/NaN row: 0
}

// A device buffer that only grows (its contents are not kept).
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void reserve(size_t want, cudaStream_t stream) {
    if (want <= bytes) return;
    if (ptr) {
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
      FLASHSTEP_CUDA_CHECK(cudaFree(ptr));
      ptr = nullptr;
    }
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&ptr, want));
    bytes = want;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

bool is_cascade(const StageInfo& s) { return s.needs_host_page_table; }

}  // namespace

const char* to_string(SamplingMode mode) { return mode == SamplingMode::sample ? "sample" : "greedy"; }

SamplingMode parse_sampling_mode(const std::string& name) {
  if (name == "greedy") return SamplingMode::greedy;
  if (name == "sample") return SamplingMode::sample;
  throw ref::InvalidArgument("parse_sampling_mode: sampling mode must be \"greedy\" or \"sample\", got \"" + name +
                             "\"");
}

std::string default_stage(const BatchShape& shape) {
  std::vector<std::string> supporting;
  std::string reasons;
  for (const StageInfo& s : registry()) {
    const std::string why = s.unsupported_reason(shape);
    if (why.empty() && !is_cascade(s)) supporting.push_back(s.name);
    if (!why.empty()) reasons += "\n  " + s.name + ": " + why;
  }
  if (supporting.empty())
    throw ref::InvalidArgument("default_stage: no stage runs " + shape.describe() + ":" + reasons);
  const bool decode_stage_fits = shape.mode == Mode::decode && shape.group_size() <= 8 &&
                                 std::find(supporting.begin(), supporting.end(), "03_split_kv") != supporting.end();
  return decode_stage_fits ? "03_split_kv" : supporting.back();
}

struct Engine::Impl {
  EngineConfig cfg;
  int64_t d = 0, hd = 0, hq = 0, hkv = 0, layers = 0, vocab = 0;
  int64_t max_nnz = 0, max_rows = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaDataType_t cuda_type = CUDA_R_16F;
  std::vector<double> rope_freqs;

  // weights (storage dtype): embedding, per layer W_Q, W_K, W_V, W_O, then W_vocab
  DeviceBuffer weights;
  size_t off_embedding = 0, off_vocab = 0;
  std::vector<size_t> off_wq, off_wk, off_wv, off_wo;
  DeviceBuffer pools;  // layers x (num_pages, 2, page_size, Hkv, D)
  int64_t pool_elems = 0;
  // activations
  DeviceBuffer x, xh, q, k, v, o, lse, logits, probs, tokens_out, status, sample_ws;
  // metadata: one pinned host buffer, one device buffer, the same layout
  std::vector<int32_t> meta;
  int32_t* meta_pinned = nullptr;
  size_t meta_pinned_count = 0;
  DeviceBuffer meta_dev;
  int32_t* tokens_pinned = nullptr;

  struct Role {
    Mode mode;
    std::string name;
    std::unique_ptr<StageRunner> runner;
    DeviceBuffer workspace;
  };
  Role decode{Mode::decode, {}, {}, {}}, prefill{Mode::prefill, {}, {}, {}};
  std::vector<cudaEvent_t> events;

  size_t elem() const { return dtype_bytes(cfg.dtype); }
  char* wptr(size_t off) const { return weights.as<char>() + off * elem(); }

  BatchShape base_shape(Mode mode) const {
    BatchShape s;
    s.mode = mode;
    s.storage = KVStorage::paged;
    s.dtype = cfg.dtype;
    s.kv_layout = KVLayout::NHD;
    s.num_qo_heads = static_cast<int>(hq);
    s.num_kv_heads = static_cast<int>(hkv);
    s.head_dim = static_cast<int>(hd);
    s.page_size = static_cast<int>(cfg.scheduler.page_size);
    s.num_pages = cfg.scheduler.num_pages;
    s.causal = mode == Mode::prefill;
    return s;
  }

  // Picks (or checks) the role's stage for `shape` and plans it.
  void plan(Role& role, const BatchShape& shape) {
    const std::string& asked = role.mode == Mode::decode ? cfg.decode_stage : cfg.prefill_stage;
    std::string name = asked;
    if (name.empty()) {
      name = default_stage(shape);
    } else {
      const StageInfo& info = find_stage(name);
      const std::string why = info.unsupported_reason(shape);
      if (!why.empty())
        throw ref::InvalidArgument(std::string("Engine: ") +
                                   (role.mode == Mode::decode ? "decode_stage" : "prefill_stage") + " " + info.name +
                                   " cannot run this step (" + shape.describe() + "): " + why);
      name = info.name;
    }
    if (name != role.name || !role.runner) {
      role.runner = find_stage(name).make_runner();
      role.name = name;
    }
    role.workspace.reserve(std::max<size_t>(role.runner->workspace_bytes(shape), 256), stream);
    role.runner->plan(shape, role.workspace.ptr, role.workspace.bytes, stream);
  }

  // C (m x n, row-major) = A (m x k) B (k x n) [+ C]: A, B in the storage dtype, C in
  // `c_type`, fp32 accumulation. Row-major C = A B is column-major C^T = B^T A^T.
  void gemm(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t c_type,
            bool accumulate) {
    const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
    cublas_check(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                              static_cast<int>(k), &alpha, b, cuda_type, static_cast<int>(n), a, cuda_type,
                              static_cast<int>(k), &beta, c, c_type, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  void event(size_t i) {
    if (cfg.profile) FLASHSTEP_CUDA_CHECK(cudaEventRecord(events[i], stream));
  }
};

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>()) {
  const char* fn = "Engine";
  Impl& m = *impl_;
  m.cfg = config;
  EngineConfig& c = m.cfg;
  require(c.dtype == DType::f16 || c.dtype == DType::bf16, fn,
          std::string("dtype must be f16 or bf16 (the storage of weights, Q/K/V and the page pool), got ") +
              to_string(c.dtype));
  c.model.rounding = c.dtype == DType::f16 ? ref::StorageRounding::f16 : ref::StorageRounding::bf16;
  const SchedulerConfig& sc = c.scheduler;
  require(sc.num_pages >= 1 && sc.page_size >= 1 && sc.max_running >= 1 && sc.max_tokens_per_step >= 1, fn,
          "scheduler num_pages, page_size, max_running and max_tokens_per_step must be >= 1");
  const SamplingParams& sp = c.sampling;
  require(sp.mode == SamplingMode::greedy || sp.mode == SamplingMode::sample, fn,
          "sampling mode must be greedy or sample (got the value " + str(static_cast<int>(sp.mode)) + ")");
  if (sp.mode == SamplingMode::sample) {
    require(std::isfinite(sp.temperature) && sp.temperature > 0, fn,
            "sampling temperature must be finite and > 0, got " + std::to_string(sp.temperature));
    require(sp.top_k >= 0, fn, "sampling top_k must be >= 0 (0 turns it off), got " + str(sp.top_k));
    require(sp.top_p > 0 && sp.top_p <= 1, fn, "sampling top_p must be in (0, 1], got " + std::to_string(sp.top_p));
  }
  const ref::TinyDecoder model(c.model);  // checks the shape, draws (and rounds) the weights
  m.d = c.model.d_model;
  m.hq = c.model.num_qo_heads;
  m.hkv = c.model.num_kv_heads;
  m.hd = model.head_dim();
  m.layers = c.model.num_layers;
  m.vocab = c.model.vocab_size;
  m.max_nnz = sc.max_tokens_per_step;
  m.max_rows = std::min(sc.max_running, sc.max_tokens_per_step);
  m.cuda_type = c.dtype == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
  if (c.model.position_encoding == ref::PositionEncoding::rope)
    m.rope_freqs = ref::rope_frequencies(m.hd, 1.0, c.model.rope_theta);

  // The stages must take the model's heads: ask the registry for a one-request step now.
  for (Mode mode : {Mode::decode, Mode::prefill}) {
    BatchShape s = m.base_shape(mode);
    s.batch_size = 1;
    s.qo_indptr = {0, 1};
    s.kv_indptr = {0, 1};
    s.kv_last_page_len = {1};
    s.kv_indices = {0};
    const std::string& asked = mode == Mode::decode ? c.decode_stage : c.prefill_stage;
    if (asked.empty()) {
      (void)default_stage(s);
    } else {
      const StageInfo& info = find_stage(asked);
      require(info.supports(mode), fn,
              std::string(mode == Mode::decode ? "decode_stage " : "prefill_stage ") + info.name + " has no " +
                  to_string(mode) + " mode");
    }
  }

  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  cublas_check(cublasCreate(&m.cublas), "cublasCreate");
  cublas_check(cublasSetStream(m.cublas, m.stream), "cublasSetStream");

  // Weights: rounded by the reference already, so the conversion below is exact.
  std::vector<const ref::Tensor*> tensors{&model.embedding()};
  for (const auto& layer : model.layers()) {
    tensors.push_back(&layer.w_q);
    tensors.push_back(&layer.w_k);
    tensors.push_back(&layer.w_v);
    tensors.push_back(&layer.w_o);
  }
  tensors.push_back(&model.w_vocab());
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const ref::Tensor* t : tensors) offsets.push_back(total), total += t->data.size();
  std::vector<uint16_t> host(total);
  for (size_t i = 0; i < tensors.size(); ++i)
    for (size_t j = 0; j < tensors[i]->data.size(); ++j) {
      const float f = static_cast<float>(tensors[i]->data[j]);  // exact: a 16-bit value
      uint32_t u;
      std::memcpy(&u, &f, sizeof u);
      if (c.dtype == DType::bf16) {
        host[offsets[i] + j] = static_cast<uint16_t>(u >> 16);
      } else {
        host[offsets[i] + j] = __half_as_ushort(__float2half_rn(f));
      }
    }
  m.weights.reserve(std::max<size_t>(total * 2, 2), m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(m.weights.ptr, host.data(), total * 2, cudaMemcpyHostToDevice));
  size_t t = 0;
  m.off_embedding = offsets[t++];
  for (int64_t l = 0; l < m.layers; ++l) {
    m.off_wq.push_back(offsets[t++]);
    m.off_wk.push_back(offsets[t++]);
    m.off_wv.push_back(offsets[t++]);
    m.off_wo.push_back(offsets[t++]);
  }
  m.off_vocab = offsets[t];

  m.pool_elems = sc.num_pages * 2 * sc.page_size * m.hkv * m.hd;
  m.pools.reserve(static_cast<size_t>(m.layers * m.pool_elems) * m.elem(), m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMemset(m.pools.ptr, 0, m.pools.bytes));
  const size_t e = m.elem();
  m.x.reserve(static_cast<size_t>(m.max_nnz * m.d) * 4, m.stream);
  m.xh.reserve(static_cast<size_t>(m.max_nnz * std::max(m.d, m.hq * m.hd)) * e, m.stream);
  m.q.reserve(static_cast<size_t>(m.max_nnz * m.hq * m.hd) * e, m.stream);
  m.k.reserve(static_cast<size_t>(m.max_nnz * m.hkv * m.hd) * e, m.stream);
  m.v.reserve(static_cast<size_t>(m.max_nnz * m.hkv * m.hd) * e, m.stream);
  m.o.reserve(static_cast<size_t>(m.max_nnz * m.hq * m.hd) * e, m.stream);
  m.lse.reserve(static_cast<size_t>(m.max_nnz * m.hq) * 4, m.stream);
  m.logits.reserve(static_cast<size_t>(m.max_rows * m.vocab) * 4, m.stream);
  m.probs.reserve(static_cast<size_t>(m.max_rows * m.vocab) * 4, m.stream);
  m.tokens_out.reserve(static_cast<size_t>(m.max_rows) * 4, m.stream);
  m.status.reserve(static_cast<size_t>(m.max_rows) * 4, m.stream);
  m.sample_ws.reserve(std::max<size_t>(sampling::workspace_bytes("top_k_top_p_sampling_from_probs", 1, 1, m.vocab,
                                                                 ref::FilterApplyOrder::top_k_first),
                                       256),
                      m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.tokens_pinned), m.max_rows * sizeof(int32_t)));
  if (c.profile) {
    m.events.resize(static_cast<size_t>(5 + 3 * m.layers));
    for (auto& ev : m.events) FLASHSTEP_CUDA_CHECK(cudaEventCreate(&ev));
  }
}

Engine::~Engine() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (auto& ev : m.events) cudaEventDestroy(ev);
  if (m.meta_pinned) cudaFreeHost(m.meta_pinned);
  if (m.tokens_pinned) cudaFreeHost(m.tokens_pinned);
  if (m.cublas) cublasDestroy(m.cublas);
  // runners and buffers go before the stream
  m.decode.runner.reset();
  m.prefill.runner.reset();
  if (m.stream) cudaStreamDestroy(m.stream);
}

const EngineConfig& Engine::config() const { return impl_->cfg; }

StepOutput Engine::run_step(const StepBatch& b, const Scheduler& scheduler) {
  const char* fn = "Engine::run_step";
  Impl& m = *impl_;
  const auto host_start = std::chrono::steady_clock::now();
  StepOutput out;
  const int64_t nnz = b.nnz(), rows = b.batch_size(), nd = b.num_decodes;
  const int64_t samples = static_cast<int64_t>(b.sample_rows.size());
  if (rows == 0) return out;
  require(nnz <= m.max_nnz && rows <= m.max_rows, fn,
          "the step has " + str(nnz) + " tokens in " + str(rows) + " rows, more than the engine was sized for (" +
              str(m.max_nnz) + ", " + str(m.max_rows) + ")");
  require(scheduler.config().page_size == m.cfg.scheduler.page_size &&
              scheduler.config().num_pages == m.cfg.scheduler.num_pages,
          fn, "scheduler's pool (num_pages, page_size) must be the engine's");
  require(b.page_copies.empty(), fn, "the step asks for copy-on-write page copies, which the engine does not run");
  for (int64_t t = 0; t < nnz; ++t)
    ref::require_lazy(b.tokens[t] >= 0 && b.tokens[t] < m.vocab, fn, [&] {
      return "tokens[" + str(t) + "] = " + str(b.tokens[t]) + " is not in [0, vocab_size = " + str(m.vocab) + ")";
    });

  // ---- metadata: one upload --------------------------------------------------------------
  const int64_t npages = b.kv_indptr[rows];
  const int64_t np = rows - nd;
  const int32_t q0 = b.qo_indptr[nd], p0 = b.kv_indptr[nd];
  std::vector<int32_t>& meta = m.meta;
  meta.clear();
  auto put = [&](const int32_t* p, int64_t n) {
    const size_t at = meta.size();
    meta.insert(meta.end(), p, p + n);
    return at;
  };
  const size_t o_tokens = put(b.tokens.data(), nnz), o_pos = put(b.positions.data(), nnz),
               o_bidx = put(b.batch_indices.data(), nnz), o_qo = put(b.qo_indptr.data(), rows + 1),
               o_kvp = put(b.kv_indptr.data(), rows + 1), o_idx = put(b.kv_indices.data(), npages),
               o_last = put(b.kv_last_page_len.data(), rows), o_rows = put(b.sample_token_rows.data(), samples);
  std::vector<int32_t> p_qo(static_cast<size_t>(np + 1)), p_kv(static_cast<size_t>(np + 1));
  for (int64_t i = 0; i <= np; ++i) {
    p_qo[i] = b.qo_indptr[nd + i] - q0;
    p_kv[i] = b.kv_indptr[nd + i] - p0;
  }
  const size_t o_pqo = put(p_qo.data(), np + 1), o_pkv = put(p_kv.data(), np + 1);
  if (meta.size() > m.meta_pinned_count) {
    if (m.meta_pinned) FLASHSTEP_CUDA_CHECK(cudaFreeHost(m.meta_pinned));
    m.meta_pinned_count = meta.size() * 2;
    FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.meta_pinned), m.meta_pinned_count * 4));
  }
  std::memcpy(m.meta_pinned, meta.data(), meta.size() * 4);
  m.meta_dev.reserve(m.meta_pinned_count * 4, m.stream);
  FLASHSTEP_CUDA_CHECK(
      cudaMemcpyAsync(m.meta_dev.ptr, m.meta_pinned, meta.size() * 4, cudaMemcpyHostToDevice, m.stream));
  const int32_t* dm = m.meta_dev.as<int32_t>();

  // ---- plan: decode rows and prefill rows, two calls ------------------------------------
  if (nd > 0) {
    BatchShape s = m.base_shape(Mode::decode);
    s.batch_size = static_cast<int>(nd);
    s.qo_indptr.assign(b.qo_indptr.begin(), b.qo_indptr.begin() + nd + 1);
    s.kv_indptr.assign(b.kv_indptr.begin(), b.kv_indptr.begin() + nd + 1);
    s.kv_last_page_len.assign(b.kv_last_page_len.begin(), b.kv_last_page_len.begin() + nd);
    s.kv_indices.assign(b.kv_indices.begin(), b.kv_indices.begin() + p0);
    m.plan(m.decode, s);
    out.decode_stage = m.decode.name;
  }
  if (np > 0) {
    BatchShape s = m.base_shape(Mode::prefill);
    s.batch_size = static_cast<int>(np);
    s.qo_indptr = p_qo;
    s.kv_indptr = p_kv;
    s.kv_last_page_len.assign(b.kv_last_page_len.begin() + nd, b.kv_last_page_len.end());
    s.kv_indices.assign(b.kv_indices.begin() + p0, b.kv_indices.begin() + npages);
    m.plan(m.prefill, s);
    out.prefill_stage = m.prefill.name;
  }
  const auto host_end = std::chrono::steady_clock::now();

  // ---- the model ----------------------------------------------------------------------
  const size_t e = m.elem();
  const int64_t d = m.d, hd = m.hd, qw = m.hq * hd, kw = m.hkv * hd;
  const SchedulerConfig& sc = m.cfg.scheduler;
  const bool bf16 = m.cfg.dtype == DType::bf16;
  char* q = m.q.as<char>();
  char* o = m.o.as<char>();
  size_t ev = 0;
  m.event(ev++);
  if (bf16) {
    embed_kernel<__nv_bfloat16><<<static_cast<unsigned>(nnz), kThreads, 0, m.stream>>>(
        reinterpret_cast<const __nv_bfloat16*>(m.wptr(m.off_embedding)), dm + o_tokens, dm + o_pos, static_cast<int>(d),
        m.cfg.model.position_encoding == ref::PositionEncoding::sinusoidal, m.x.as<float>());
  } else {
    embed_kernel<__half><<<static_cast<unsigned>(nnz), kThreads, 0, m.stream>>>(
        reinterpret_cast<const __half*>(m.wptr(m.off_embedding)), dm + o_tokens, dm + o_pos, static_cast<int>(d),
        m.cfg.model.position_encoding == ref::PositionEncoding::sinusoidal, m.x.as<float>());
  }
  kernels::check_launch("embed_kernel");
  m.event(ev++);
  auto round_rows = [&](const int32_t* rows_idx, int64_t n) {
    if (bf16)
      round_rows_kernel<__nv_bfloat16><<<static_cast<unsigned>(n), kThreads, 0, m.stream>>>(
          m.x.as<float>(), rows_idx, static_cast<int>(d), m.xh.as<__nv_bfloat16>());
    else
      round_rows_kernel<__half><<<static_cast<unsigned>(n), kThreads, 0, m.stream>>>(
          m.x.as<float>(), rows_idx, static_cast<int>(d), m.xh.as<__half>());
    kernels::check_launch("round_rows_kernel");
  };
  for (int64_t l = 0; l < m.layers; ++l) {
    round_rows(nullptr, nnz);
    m.gemm(nnz, qw, d, m.xh.ptr, m.wptr(m.off_wq[l]), m.q.ptr, m.cuda_type, false);
    m.gemm(nnz, kw, d, m.xh.ptr, m.wptr(m.off_wk[l]), m.k.ptr, m.cuda_type, false);
    m.gemm(nnz, kw, d, m.xh.ptr, m.wptr(m.off_wv[l]), m.v.ptr, m.cuda_type, false);
    if (!m.rope_freqs.empty()) {
      RopeLaunch r;
      r.dtype = m.cfg.dtype;
      r.q = r.q_out = m.q.ptr;
      r.k = r.k_out = m.k.ptr;
      r.nnz = nnz;
      r.num_q_heads = static_cast<int>(m.hq);
      r.num_k_heads = static_cast<int>(m.hkv);
      r.head_dim = static_cast<int>(hd);
      r.rotary_dim = static_cast<int>(hd);
      r.interleave = m.cfg.model.rope_interleave;
      r.pos_ids = dm + o_pos;
      launch_rope(r, m.rope_freqs, m.stream);
    }
    kernels::AppendPagedKVParams a;
    a.append_key = m.k.ptr;
    a.append_value = m.v.ptr;
    a.key_row_stride = a.value_row_stride = kw;
    a.nnz = nnz;
    a.batch_indices = dm + o_bidx;
    a.positions = dm + o_pos;
    char* pool = m.pools.as<char>() + static_cast<size_t>(l * m.pool_elems) * e;
    a.k_cache = pool;
    a.v_cache = pool + static_cast<size_t>(sc.page_size * kw) * e;
    a.page_stride = 2 * sc.page_size * kw;
    a.hnd = false;
    a.num_kv_heads = static_cast<int>(m.hkv);
    a.head_dim = static_cast<int>(hd);
    a.page_size = static_cast<int>(sc.page_size);
    a.num_pages = sc.num_pages;
    a.kv_indices = dm + o_idx;
    a.kv_indptr = dm + o_kvp;
    a.batch_size = static_cast<int>(rows);
    if (bf16) kernels::launch_append_paged_kv_cache<__nv_bfloat16>(a, m.stream);
    else kernels::launch_append_paged_kv_cache<__half>(a, m.stream);
    kernels::check_launch("append_paged_kv_cache_kernel");
    m.event(ev++);
    if (nd > 0) {
      DeviceBatch db;
      db.q = q;
      db.qo_indptr = dm + o_qo;
      db.kv_indptr = dm + o_kvp;
      db.kv_pool = pool;
      db.kv_indices = dm + o_idx;
      db.kv_last_page_len = dm + o_last;
      db.o = o;
      db.lse = m.lse.as<float>();
      m.decode.runner->run(db, m.stream);
    }
    if (np > 0) {
      DeviceBatch db;
      db.q = q + static_cast<size_t>(q0 * qw) * e;
      db.qo_indptr = dm + o_pqo;
      db.kv_indptr = dm + o_pkv;
      db.kv_pool = pool;
      db.kv_indices = dm + o_idx + p0;
      db.kv_last_page_len = dm + o_last + nd;
      db.o = o + static_cast<size_t>(q0 * qw) * e;
      db.lse = m.lse.as<float>() + q0 * m.hq;
      m.prefill.runner->run(db, m.stream);
    }
    m.event(ev++);
    if (m.cfg.model.output_projection) {
      m.gemm(nnz, d, qw, m.o.ptr, m.wptr(m.off_wo[l]), m.x.ptr, CUDA_R_32F, true);  // X += O W_O
    } else if (bf16) {
      residual_kernel<__nv_bfloat16><<<static_cast<unsigned>(nnz), kThreads, 0, m.stream>>>(
          m.o.as<__nv_bfloat16>(), static_cast<int>(d), m.x.as<float>());
    } else {
      residual_kernel<__half><<<static_cast<unsigned>(nnz), kThreads, 0, m.stream>>>(
          m.o.as<__half>(), static_cast<int>(d), m.x.as<float>());
    }
    kernels::check_launch("residual");
    m.event(ev++);
  }
  // logits of the rows that sample
  if (samples > 0) {
    round_rows(dm + o_rows, samples);
    m.gemm(samples, m.vocab, d, m.xh.ptr, m.wptr(m.off_vocab), m.logits.ptr, CUDA_R_32F, false);
  }
  m.event(ev++);
  int32_t* tokens = m.tokens_out.as<int32_t>();
  const SamplingParams& sp = m.cfg.sampling;
  if (samples > 0 && sp.mode == SamplingMode::greedy) {
    argmax_kernel<<<static_cast<unsigned>(samples), kThreads, 0, m.stream>>>(m.logits.as<float>(),
                                                                             static_cast<int>(m.vocab), tokens);
    kernels::check_launch("argmax_kernel");
  } else if (samples > 0) {
    namespace smp = sampling;
    smp::DeviceRows lg{m.logits.ptr, samples, m.vocab, smp::ElementType::f32};
    smp::softmax(lg, smp::RowParam<double, float>(sp.temperature), m.probs.as<float>(), nullptr, m.stream);
    for (int64_t i = 0; i < samples; ++i) {
      const int32_t r = b.request_ids[static_cast<size_t>(b.sample_rows[static_cast<size_t>(i)])];
      smp::DeviceRows row{m.probs.as<float>() + i * m.vocab, 1, m.vocab, smp::ElementType::f32};
      smp::SamplingOutputs so;
      so.samples = tokens + i;
      so.status = m.status.as<int32_t>() + i;
      smp::SamplingOptions opt;
      opt.seed = sp.seed + static_cast<uint64_t>(r);
      opt.offset = static_cast<uint64_t>(scheduler.state(r).generated.size()) * ref::kSamplingOffsetStride;
      if (sp.top_k > 0 && sp.top_p < 1.0)
        smp::top_k_top_p_sampling_from_probs(row, smp::TopK(sp.top_k), smp::Fraction(sp.top_p),
                                             ref::FilterApplyOrder::top_k_first, so,
                                             smp::Workspace{m.sample_ws.ptr, m.sample_ws.bytes}, opt, m.stream);
      else if (sp.top_k > 0) smp::top_k_sampling_from_probs(row, smp::TopK(sp.top_k), so, opt, m.stream);
      else if (sp.top_p < 1.0) smp::top_p_sampling_from_probs(row, smp::Fraction(sp.top_p), so, opt, m.stream);
      else smp::sampling_from_probs(row, so, opt, m.stream);
    }
  }
  m.event(ev++);
  // ---- only token ids come back (logits and probs too when a test asks) ---------------
  if (samples > 0)
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpyAsync(m.tokens_pinned, tokens, static_cast<size_t>(samples) * 4, cudaMemcpyDeviceToHost, m.stream));
  if (m.cfg.record_logits && samples > 0) {
    out.logits.resize(static_cast<size_t>(samples * m.vocab));
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpyAsync(out.logits.data(), m.logits.ptr, out.logits.size() * 4, cudaMemcpyDeviceToHost, m.stream));
    if (sp.mode == SamplingMode::sample) {
      out.probs.resize(out.logits.size());
      FLASHSTEP_CUDA_CHECK(
          cudaMemcpyAsync(out.probs.data(), m.probs.ptr, out.probs.size() * 4, cudaMemcpyDeviceToHost, m.stream));
    }
  }
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(m.stream));
  out.tokens.assign(m.tokens_pinned, m.tokens_pinned + samples);
  for (int64_t i = 0; i < samples; ++i)
    if (out.tokens[i] < 0) {
      int32_t st = 0;
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(&st, m.status.as<int32_t>() + i, 4, cudaMemcpyDeviceToHost));
      throw std::runtime_error(std::string(fn) + ": the sampler returned no token for request " +
                               str(b.request_ids[static_cast<size_t>(b.sample_rows[static_cast<size_t>(i)])]) +
                               " (status " + sampling::to_string(static_cast<sampling::Status>(st)) + ")");
    }
  if (m.cfg.profile) {
    auto ms = [&](size_t a, size_t z) {
      float t = 0;
      FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&t, m.events[a], m.events[z]));
      return static_cast<double>(t);
    };
    StepTiming& t = out.timing;
    t.host_ms = std::chrono::duration<double, std::milli>(host_end - host_start).count();
    t.embed_ms = ms(0, 1);
    size_t at = 1;
    for (int64_t l = 0; l < m.layers; ++l, at += 3) {
      t.projection_ms += ms(at, at + 1) + ms(at + 2, at + 3);
      t.attention_ms += ms(at + 1, at + 2);
    }
    t.logits_ms = ms(at, at + 1);
    t.sampling_ms = ms(at + 1, at + 2);
    t.total_ms = ms(0, at + 2) + t.host_ms;
  }
  return out;
}

GenerationRun Engine::generate(const std::vector<Request>& requests) {
  for (size_t r = 0; r < requests.size(); ++r)
    for (size_t t = 0; t < requests[r].prompt.size(); ++t)
      ref::require_lazy(requests[r].prompt[t] < impl_->vocab, "Engine::generate", [&] {
        return "request " + str(static_cast<int64_t>(r)) + ": prompt[" + str(static_cast<int64_t>(t)) +
               "] = " + str(requests[r].prompt[t]) + " is not a token of vocab_size " + str(impl_->vocab);
      });
  Scheduler scheduler(impl_->cfg.scheduler, requests);
  GenerationRun run;
  while (!scheduler.done()) {
    const StepBatch b = scheduler.next_step();
    if (b.batch_size() == 0) {
      scheduler.complete_step({});
      continue;
    }
    StepOutput out = run_step(b, scheduler);
    if (impl_->cfg.profile) run.timing.push_back(out.timing);
    scheduler.complete_step(out.tokens);
  }
  run.steps = scheduler.steps();
  run.peak_pages = scheduler.peak_used_pages();
  run.pages_allocated = scheduler.pages_allocated();
  for (size_t r = 0; r < requests.size(); ++r) run.tokens.push_back(scheduler.state(static_cast<int32_t>(r)).generated);
  return run;
}

}  // namespace flashstep::stages::engine
