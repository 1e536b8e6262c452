// Stage 09's GPU engine: the tiny decoder on cuBLAS, the attention stages through the
// registry, stage 06's samplers, driven by the Scheduler. See engine.hpp for one step.
#include "09_engine/engine.hpp"
#include "09_engine/grow_buffer.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <stdexcept>

#include "05_cascade/cascade.hpp"
#include "06_sampling/sampling.hpp"
#include "09_engine/pod_attention.hpp"
#include "09_engine/step_arrays.hpp"
#include "09_engine/tuned_gemm.hpp"
#include "flashstep/kernels/append_paged.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/rope.hpp"
#include "flashstep/reference/sampling.hpp"
#include "registry.hpp"
#include "rope/rope_gpu.hpp"

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

// X[t] = embedding[tokens[t]] (+ the sinusoid of positions[t], in double as the reference),
// and xh[t] = X[t] rounded to T: the rows entering the first layer's projection.
template <typename T>
__global__ void embed_kernel(const T* __restrict__ embedding, const int32_t* __restrict__ tokens,
                             const int32_t* __restrict__ positions, int d, bool sinusoidal, float* __restrict__ x,
                             T* __restrict__ xh) {
  const int64_t t = blockIdx.x;
  const int64_t token = tokens[t];
  const double pos = positions[t];
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    const float e = load_float(embedding[token * d + j]);
    float v = e;
    if (sinusoidal) {
      const double angle = pos / pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(d));
      v = static_cast<float>(static_cast<double>(e) + (j % 2 == 0 ? sin(angle) : cos(angle)));
    }
    x[t * d + j] = v;
    xh[t * d + j] = store_rounded<T>(v);
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

using DeviceBuffer = GrowBuffer;

bool is_cascade(const StageInfo& s) { return s.needs_host_page_table; }

// Stage 05 plans a captured decode step with a launch fixed by the padded batch
// (CascadeOptions::fixed_graph_launch), which its registry entry does not declare: its
// other rules still apply.
std::string unsupported_reason(const StageInfo& info, const BatchShape& shape) {
  if (!is_cascade(info) || !shape.cuda_graph) return info.unsupported_reason(shape);
  BatchShape eager = shape;
  eager.cuda_graph = false;
  return info.unsupported_reason(eager);
}
std::unique_ptr<StageRunner> make_runner(const StageInfo& info, const BatchShape& shape) {
  if (!is_cascade(info) || !shape.cuda_graph) return info.make_runner();
  cascade::CascadeOptions options;
  options.fixed_graph_launch = true;
  return std::make_unique<cascade::CascadeRunner>(options);
}

// The kernel and memset nodes of a captured graph: the launches a replay pays for.
int64_t count_launch_nodes(cudaGraph_t g) {
  size_t n = 0;
  FLASHSTEP_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) FLASHSTEP_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  int64_t launches = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    FLASHSTEP_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    launches += type == cudaGraphNodeTypeKernel || type == cudaGraphNodeTypeMemset;
  }
  return launches;
}

}  // namespace

const char* to_string(SamplingMode mode) { return mode == SamplingMode::sample ? "sample" : "greedy"; }

SamplingMode parse_sampling_mode(const std::string& name) {
  if (name == "greedy") return SamplingMode::greedy;
  if (name == "sample") return SamplingMode::sample;
  throw ref::InvalidArgument("parse_sampling_mode: sampling mode must be \"greedy\" or \"sample\", got \"" + name +
                             "\"");
}

namespace {

/// EngineConfig::fused_rope's conditions, each refused by name.
void check_fused_rope(const EngineConfig& c) {
  if (!c.fused_rope) return;
  const char* fn = "Engine";
  ref::require(c.model.position_encoding == ref::PositionEncoding::rope, fn,
               "fused_rope needs model.position_encoding rope (there is nothing to rotate)");
  ref::require(!c.model.rope_interleave, fn,
               "fused_rope rotates the rotate-half pairs (ROPE_LLAMA); model.rope_interleave must be false");
  ref::require(static_cast<double>(static_cast<float>(c.model.rope_theta)) == c.model.rope_theta, fn,
               "fused_rope: model.rope_theta must be an fp32 value (BatchShape::rope_theta), got " +
                   std::to_string(c.model.rope_theta));
  ref::require(!c.cascade_when_shared, fn,
               "fused_rope: cascade_when_shared must be off (stage 05 does not rotate q and k)");
  ref::require(!c.one_launch, fn, "fused_rope: one_launch must be off (POD attention does not rotate q and k)");
}

}  // namespace

struct Engine::Impl {
  EngineConfig cfg;
  int64_t d = 0, hd = 0, hq = 0, hkv = 0, layers = 0, vocab = 0;
  int64_t max_nnz = 0, max_rows = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudaDataType_t cuda_type = CUDA_R_16F;
  std::vector<double> rope_freqs;

  // weights (storage dtype): embedding, per layer W_QKV = [W_Q | W_K | W_V] (d x (Hq + 2 Hkv) D,
  // each row the three rows side by side: one GEMM computes Q, K and V) and W_O, then W_vocab
  DeviceBuffer weights;
  size_t off_embedding = 0, off_vocab = 0;
  std::vector<size_t> off_wqkv, off_wo;
  DeviceBuffer pools;  // layers x (num_pages, 2, page_size, Hkv, D)
  int64_t pool_elems = 0;
  // activations
  // qkv: (nnz, (Hq + 2 Hkv) D), each row Q | K | V as the fused GEMM writes it; q: Q alone,
  // contiguous (nnz, Hq, D), as the attention stages read it
  DeviceBuffer x, xh, qkv, q, o, lse, logits, probs, tokens_out, status, sample_ws;
  // metadata: one pinned host buffer, one device buffer, the same layout
  int32_t* meta_pinned = nullptr;
  size_t meta_pinned_count = 0;
  DeviceBuffer meta_dev;
  int32_t* tokens_pinned = nullptr;
  // Each sampling row's Philox key and offset (seeds, then offsets), uploaded per step so
  // that one sampler launch serves every request (SamplingOptions::seed_per_output).
  DeviceBuffer sample_keys;
  uint64_t* keys_pinned = nullptr;

  struct Role {
    Mode mode;
    std::string name;
    std::unique_ptr<StageRunner> runner;
    DeviceBuffer workspace;
  };
  Role decode{Mode::decode, {}, {}, {}}, prefill{Mode::prefill, {}, {}, {}};
  PodAttention pod;  // one_launch: a mixed step's attention in one launch
  // cascade_when_shared: per pool page, the stamp of the last step whose decode rows held
  // it (a page held twice in one step is shared)
  std::vector<uint32_t> page_seen;
  uint32_t page_stamp = 0;
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
    if (cfg.fused_rope) {  // the stage rotates q and the keys it reads (ROPE_LLAMA)
      s.pos_encoding = PosEncoding::rope_llama;
      s.rope_theta = static_cast<float>(cfg.model.rope_theta);
    }
    return s;
  }

  // Picks (or checks) the role's stage for `shape` and plans it. Returns false when the
  // workspace had to move (a captured graph that read the old one is stale).
  bool plan(Role& role, const BatchShape& shape, const std::string& chosen = {}) {
    const std::string& asked = role.mode == Mode::decode ? cfg.decode_stage : cfg.prefill_stage;
    std::string name = chosen.empty() ? asked : chosen;
    if (name.empty()) {
      name = default_stage(shape);
    } else {
      const StageInfo& info = find_stage(name);
      const std::string why = unsupported_reason(info, shape);
      if (!why.empty())
        throw ref::InvalidArgument(std::string("Engine: ") +
                                   (role.mode == Mode::decode ? "decode_stage" : "prefill_stage") + " " + info.name +
                                   " cannot run this step (" + shape.describe() + "): " + why);
      name = info.name;
    }
    if (name != role.name || !role.runner) {
      role.runner = make_runner(find_stage(name), shape);
      role.name = name;
    }
    const void* before = role.workspace.ptr;
    role.workspace.reserve(std::max<size_t>(role.runner->workspace_bytes(shape), 256), stream);
    role.runner->plan(shape, role.workspace.ptr, role.workspace.bytes, stream);
    return before == nullptr || before == role.workspace.ptr;
  }

  // Where each array of a step sits in the uploaded int32 metadata; kv_indices last, so
  // that every offset depends only on (nnz, rows, samples) and a padded decode step's
  // offsets are the same at every replay of its graph.
  struct Layout {
    size_t tokens, pos, bidx, qo, kvp, last, rows, pqo, pkv, idx, count;
  };
  // One step as the model launches see it.
  struct Launch {
    int64_t nnz, rows, nd, np, samples;
    int32_t q0, p0;
    const int32_t* dm;  // device metadata
    Layout at;
    Role* dec;
    Role* pre;
    bool one_call;      // a mixed step's attention as one call over every row:
    PodAttention* pod;  // POD attention, or (null) the prefill stage `pre`
  };
  // A decode step padded to `padded` rows, captured once and replayed (CUDA graphs).
  struct GraphEntry {
    Role decode{Mode::decode, {}, {}, {}};
    DeviceBuffer meta;
    int32_t* pinned = nullptr;
    size_t capacity = 0;  // int32 entries of meta and pinned
    cudaGraphExec_t exec = nullptr;
    int64_t replays = 0;
    int64_t launches = 0;  // kernel and memset nodes of the graph (StepOutput::graph_launches)
    ~GraphEntry() {
      if (exec) cudaGraphExecDestroy(exec);
      if (pinned) cudaFreeHost(pinned);
    }
  };
  // by (padded rows, whether the decode rows run stage 05's cascade)
  std::map<std::pair<int64_t, bool>, std::unique_ptr<GraphEntry>> graphs;
  DeviceBuffer cublas_workspace;
  std::unique_ptr<TunedGemm> tuned;  // tuned_gemms: each decode-size shape's measured algorithm

  void launch_model(const Launch& s);

  // C (m x n, row-major) = A (m x k) B (k x n) [+ C]: A, B in the storage dtype, C in
  // `c_type`, fp32 accumulation. Row-major C = A B is column-major C^T = B^T A^T.
  void gemm(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t c_type,
            bool accumulate) {
    if (tuned) return tuned->run(m, n, k, a, b, c, cuda_type, c_type, accumulate);
    const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
    cublas_check(cublasGemmEx(cublas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                              static_cast<int>(k), &alpha, b, cuda_type, static_cast<int>(n), a, cuda_type,
                              static_cast<int>(k), &beta, c, c_type, static_cast<int>(n), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  // Inside a graph's capture an event becomes an event-record node (external), so that
  // every replay records it and the phases of a graph step are timed like an eager one's.
  void event(size_t i) {
    if (!cfg.profile) return;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    FLASHSTEP_CUDA_CHECK(cudaEventRecordWithFlags(
        events[i], stream, capturing == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : 0));
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
  check_fused_rope(c);
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
  // a workspace of its own, so that cuBLAS allocates nothing while a graph is captured
  m.cublas_workspace.reserve(size_t{32} << 20, m.stream);
  cublas_check(cublasSetWorkspace(m.cublas, m.cublas_workspace.ptr, m.cublas_workspace.bytes), "cublasSetWorkspace");
  if (c.tuned_gemms)
    m.tuned = std::make_unique<TunedGemm>(m.cublas, m.stream, m.cublas_workspace.ptr, m.cublas_workspace.bytes);

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
  // Each layer's W_Q, W_K, W_V (consecutive) become W_QKV in the same place: row r of it
  // is row r of W_Q, then of W_K, then of W_V.
  {
    const size_t d = static_cast<size_t>(c.model.d_model), qw = static_cast<size_t>(m.hq * m.hd),
                 kw = static_cast<size_t>(m.hkv * m.hd), width = qw + 2 * kw;
    std::vector<uint16_t> fused(d * width);
    for (size_t l = 0; l < static_cast<size_t>(m.layers); ++l) {
      const size_t wq = offsets[1 + 4 * l], wk = offsets[2 + 4 * l], wv = offsets[3 + 4 * l];
      for (size_t r = 0; r < d; ++r) {
        std::memcpy(&fused[r * width], &host[wq + r * qw], qw * 2);
        std::memcpy(&fused[r * width + qw], &host[wk + r * kw], kw * 2);
        std::memcpy(&fused[r * width + qw + kw], &host[wv + r * kw], kw * 2);
      }
      std::memcpy(&host[wq], fused.data(), fused.size() * 2);
    }
  }
  m.weights.reserve(std::max<size_t>(total * 2, 2), m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(m.weights.ptr, host.data(), total * 2, cudaMemcpyHostToDevice));
  size_t t = 0;
  m.off_embedding = offsets[t++];
  for (int64_t l = 0; l < m.layers; ++l) {
    m.off_wqkv.push_back(offsets[t]);  // W_Q's place, W_K's and W_V's after it
    t += 3;
    m.off_wo.push_back(offsets[t++]);
  }
  m.off_vocab = offsets[t];

  m.pool_elems = sc.num_pages * 2 * sc.page_size * m.hkv * m.hd;
  m.pools.reserve(static_cast<size_t>(m.layers * m.pool_elems) * m.elem(), m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMemset(m.pools.ptr, 0, m.pools.bytes));
  const size_t e = m.elem();
  m.x.reserve(static_cast<size_t>(m.max_nnz * m.d) * 4, m.stream);
  m.xh.reserve(static_cast<size_t>(m.max_nnz * std::max(m.d, m.hq * m.hd)) * e, m.stream);
  m.qkv.reserve(static_cast<size_t>(m.max_nnz * (m.hq + 2 * m.hkv) * m.hd) * e, m.stream);
  m.q.reserve(static_cast<size_t>(m.max_nnz * m.hq * m.hd) * e, m.stream);
  m.o.reserve(static_cast<size_t>(m.max_nnz * m.hq * m.hd) * e, m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMemset(m.o.ptr, 0, m.o.bytes));  // padding rows of a graph step read it
  m.lse.reserve(static_cast<size_t>(m.max_nnz * m.hq) * 4, m.stream);
  m.logits.reserve(static_cast<size_t>(m.max_rows * m.vocab) * 4, m.stream);
  m.probs.reserve(static_cast<size_t>(m.max_rows * m.vocab) * 4, m.stream);
  m.tokens_out.reserve(static_cast<size_t>(m.max_rows) * 4, m.stream);
  m.status.reserve(static_cast<size_t>(m.max_rows) * 4, m.stream);
  m.sample_ws.reserve(
      std::max<size_t>(sampling::workspace_bytes("top_k_top_p_sampling_from_probs", m.max_rows, m.max_rows, m.vocab,
                                                 ref::FilterApplyOrder::top_k_first),
                       256),
      m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.tokens_pinned), m.max_rows * sizeof(int32_t)));
  m.sample_keys.reserve(static_cast<size_t>(2 * m.max_rows) * sizeof(uint64_t), m.stream);
  FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.keys_pinned), 2 * m.max_rows * sizeof(uint64_t)));
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
  if (m.keys_pinned) cudaFreeHost(m.keys_pinned);
  m.tuned.reset();
  if (m.cublas) cublasDestroy(m.cublas);
  // runners and buffers go before the stream
  m.graphs.clear();
  m.decode.runner.reset();
  m.prefill.runner.reset();
  if (m.stream) cudaStreamDestroy(m.stream);
}

const EngineConfig& Engine::config() const { return impl_->cfg; }

void Engine::Impl::launch_model(const Launch& s) {
  const size_t e = elem();
  const int64_t qw = hq * hd, kw = hkv * hd;
  const SchedulerConfig& sc = cfg.scheduler;
  const bool bf16 = cfg.dtype == DType::bf16;
  const int32_t* dm = s.dm;
  const Layout& at = s.at;
  char* qp = q.as<char>();
  char* op = o.as<char>();
  size_t ev = 0;
  event(ev++);
  const bool sinusoidal = cfg.model.position_encoding == ref::PositionEncoding::sinusoidal;
  if (bf16)
    embed_kernel<__nv_bfloat16><<<static_cast<unsigned>(s.nnz), kThreads, 0, stream>>>(
        reinterpret_cast<const __nv_bfloat16*>(wptr(off_embedding)), dm + at.tokens, dm + at.pos, static_cast<int>(d),
        sinusoidal, x.as<float>(), xh.as<__nv_bfloat16>());
  else
    embed_kernel<__half><<<static_cast<unsigned>(s.nnz), kThreads, 0, stream>>>(
        reinterpret_cast<const __half*>(wptr(off_embedding)), dm + at.tokens, dm + at.pos, static_cast<int>(d),
        sinusoidal, x.as<float>(), xh.as<__half>());
  kernels::check_launch("embed_kernel");
  event(ev++);
  auto round_rows = [&](const int32_t* rows_idx, int64_t n) {
    if (bf16)
      round_rows_kernel<__nv_bfloat16><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          x.as<float>(), rows_idx, static_cast<int>(d), xh.as<__nv_bfloat16>());
    else
      round_rows_kernel<__half><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
          x.as<float>(), rows_idx, static_cast<int>(d), xh.as<__half>());
    kernels::check_launch("round_rows_kernel");
  };
  const int64_t qkv_w = qw + 2 * kw;  // a row of qkv: Q | K | V
  char* kp = qkv.as<char>() + static_cast<size_t>(qw) * e;
  char* vp = kp + static_cast<size_t>(kw) * e;
  for (int64_t l = 0; l < layers; ++l) {
    if (l > 0) round_rows(nullptr, s.nnz);  // layer 0's rows: the embedding kernel rounded them
    gemm(s.nnz, qkv_w, d, xh.ptr, wptr(off_wqkv[l]), qkv.ptr, cuda_type, false);  // Q, K, V in one GEMM
    if (rope_freqs.empty() || cfg.fused_rope) {
      // Q out of the fused rows, contiguous for the attention stages (fused RoPE: the
      // attention stages rotate q and k as they load them; K goes to the pool un-rotated)
      FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(q.ptr, static_cast<size_t>(qw) * e, qkv.ptr,
                                             static_cast<size_t>(qkv_w) * e, static_cast<size_t>(qw) * e,
                                             static_cast<size_t>(s.nnz), cudaMemcpyDeviceToDevice, stream));
    } else {
      // Q rotated out of the fused rows into q (contiguous), K rotated in place
      RopeLaunch r;
      r.dtype = cfg.dtype;
      r.q = qkv.ptr;
      r.q_stride = qkv_w;
      r.q_out = q.ptr;
      r.k = r.k_out = kp;
      r.k_stride = r.k_out_stride = qkv_w;
      r.nnz = s.nnz;
      r.num_q_heads = static_cast<int>(hq);
      r.num_k_heads = static_cast<int>(hkv);
      r.head_dim = static_cast<int>(hd);
      r.rotary_dim = static_cast<int>(hd);
      r.interleave = cfg.model.rope_interleave;
      r.pos_ids = dm + at.pos;
      launch_rope(r, rope_freqs, stream);
    }
    kernels::AppendPagedKVParams a;
    a.append_key = kp;
    a.append_value = vp;
    a.key_row_stride = a.value_row_stride = qkv_w;
    a.nnz = s.nnz;
    a.batch_indices = dm + at.bidx;
    a.positions = dm + at.pos;
    char* pool = pools.as<char>() + static_cast<size_t>(l * pool_elems) * e;
    a.k_cache = pool;
    a.v_cache = pool + static_cast<size_t>(sc.page_size * kw) * e;
    a.page_stride = 2 * sc.page_size * kw;
    a.hnd = false;
    a.num_kv_heads = static_cast<int>(hkv);
    a.head_dim = static_cast<int>(hd);
    a.page_size = static_cast<int>(sc.page_size);
    a.num_pages = sc.num_pages;
    a.kv_indices = dm + at.idx;
    a.kv_indptr = dm + at.kvp;
    a.batch_size = static_cast<int>(s.rows);
    if (bf16) kernels::launch_append_paged_kv_cache<__nv_bfloat16>(a, stream);
    else kernels::launch_append_paged_kv_cache<__half>(a, stream);
    kernels::check_launch("append_paged_kv_cache_kernel");
    event(ev++);
    if (s.one_call) {
      // every row, decodes as one-query requests, causal (a decode row sees all its keys)
      DeviceBatch db;
      db.q = qp;
      db.qo_indptr = dm + at.qo;
      db.kv_indptr = dm + at.kvp;
      db.kv_pool = pool;
      db.kv_indices = dm + at.idx;
      db.kv_last_page_len = dm + at.last;
      db.o = op;
      db.lse = lse.as<float>();
      if (s.pod) s.pod->run(db, stream);
      else s.pre->runner->run(db, stream);
    }
    if (s.nd > 0 && !s.one_call) {
      DeviceBatch db;
      db.q = qp;
      db.qo_indptr = dm + at.qo;
      db.kv_indptr = dm + at.kvp;
      db.kv_pool = pool;
      db.kv_indices = dm + at.idx;
      db.kv_last_page_len = dm + at.last;
      db.o = op;
      db.lse = lse.as<float>();
      s.dec->runner->run(db, stream);
    }
    if (s.np > 0 && !s.one_call) {
      DeviceBatch db;
      db.q = qp + static_cast<size_t>(s.q0 * qw) * e;
      db.qo_indptr = dm + at.pqo;
      db.kv_indptr = dm + at.pkv;
      db.kv_pool = pool;
      db.kv_indices = dm + at.idx + s.p0;
      db.kv_last_page_len = dm + at.last + s.nd;
      db.o = op + static_cast<size_t>(s.q0 * qw) * e;
      db.lse = lse.as<float>() + s.q0 * hq;
      s.pre->runner->run(db, stream);
    }
    event(ev++);
    if (cfg.model.output_projection) {
      gemm(s.nnz, d, qw, o.ptr, wptr(off_wo[l]), x.ptr, CUDA_R_32F, true);  // X += O W_O
    } else if (bf16) {
      residual_kernel<__nv_bfloat16><<<static_cast<unsigned>(s.nnz), kThreads, 0, stream>>>(
          o.as<__nv_bfloat16>(), static_cast<int>(d), x.as<float>());
    } else {
      residual_kernel<__half>
          <<<static_cast<unsigned>(s.nnz), kThreads, 0, stream>>>(o.as<__half>(), static_cast<int>(d), x.as<float>());
    }
    kernels::check_launch("residual");
    event(ev++);
  }
  // logits of the rows that sample
  if (s.samples > 0) {
    round_rows(dm + at.rows, s.samples);
    gemm(s.samples, vocab, d, xh.ptr, wptr(off_vocab), logits.ptr, CUDA_R_32F, false);
  }
  event(ev++);
}

StepOutput Engine::run_step(const StepBatch& b, const Scheduler& scheduler) {
  const char* fn = "Engine::run_step";
  Impl& m = *impl_;
  const auto host_start = std::chrono::steady_clock::now();
  StepOutput out;
  const int64_t nnz = b.nnz(), rows = b.batch_size(), nd = b.num_decodes, np = rows - nd;
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

  // A decode-only step runs as a CUDA graph captured at the next power of two of its
  // batch (padding rows: no pages, token 0, never appended, never sampled).
  // Decode rows that share pages (a cached prefix) go to stage 05 when asked
  // (cascade_when_shared): eagerly, its planner prices the cascade against a flat pass;
  // in a graph, its launch is fixed by the padded batch (two levels, see cascade.hpp),
  // in a graph of its own.
  std::string decode_choice;
  if (m.cfg.cascade_when_shared && m.cfg.decode_stage.empty() && nd > 1) {
    // A page id seen twice, in one pass: each page's stamp is the step that last saw it
    // (no sort, no clearing between steps).
    std::vector<uint32_t>& seen = m.page_seen;
    seen.resize(static_cast<size_t>(m.cfg.scheduler.num_pages), 0);
    if (++m.page_stamp == 0) {  // wrapped: old stamps could match again
      std::fill(seen.begin(), seen.end(), 0);
      m.page_stamp = 1;
    }
    for (int32_t n = 0; n < b.kv_indptr[nd]; ++n) {
      const int32_t page = b.kv_indices[static_cast<size_t>(n)];
      ref::require_lazy(page >= 0 && page < m.cfg.scheduler.num_pages, fn, [&] {
        return "kv_indices[" + str(n) + "] = " + str(page) + " is not a page of the pool (0.." +
               str(m.cfg.scheduler.num_pages - 1) + ")";
      });
      uint32_t& stamp = seen[static_cast<size_t>(page)];
      if (stamp == m.page_stamp) {
        decode_choice = "05_cascade";
        break;
      }
      stamp = m.page_stamp;
    }
  }
  int64_t padded = 0;
  if (m.cfg.cuda_graphs && np == 0) {
    padded = 1;
    while (padded < nd) padded *= 2;
    if (padded > m.max_rows || padded > m.max_nnz) padded = 0;
  }
  const bool graph = padded > 0;
  const int64_t n_tok = graph ? padded : nnz, n_rows = graph ? padded : rows, n_samp = graph ? padded : samples;
  const int64_t npages = b.kv_indptr[rows];
  const int32_t q0 = b.qo_indptr[nd], p0 = b.kv_indptr[nd];

  // ---- metadata: one upload (step_arrays.hpp: the layout and the padding) -----------
  const StepArrays arrays = pack_step(b, padded);
  const std::vector<int32_t>& meta = arrays.data;
  Impl::Layout at{arrays.tokens,
                  arrays.positions,
                  arrays.batch_indices,
                  arrays.qo_indptr,
                  arrays.kv_indptr,
                  arrays.kv_last_page_len,
                  arrays.sample_token_rows,
                  arrays.prefill_qo_indptr,
                  arrays.prefill_kv_indptr,
                  arrays.kv_indices,
                  meta.size()};
  const std::vector<int32_t> p_qo = arrays.slice(at.pqo, np + 1), p_kv = arrays.slice(at.pkv, np + 1);

  Impl::GraphEntry* entry = nullptr;
  int32_t* pinned = nullptr;
  DeviceBuffer* dev = nullptr;
  if (graph) {
    auto& slot = m.graphs[{padded, !decode_choice.empty()}];
    if (!slot) {
      slot = std::make_unique<Impl::GraphEntry>();
      slot->capacity = at.idx + static_cast<size_t>(padded * m.cfg.scheduler.num_pages);
      FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot->pinned), slot->capacity * 4));
      slot->meta.reserve(slot->capacity * 4, m.stream);
    }
    entry = slot.get();
    require(at.count <= entry->capacity, fn, "a padded decode step's page table outgrew its graph's buffer");
    pinned = entry->pinned;
    dev = &entry->meta;
  } else {
    if (meta.size() > m.meta_pinned_count) {
      if (m.meta_pinned) FLASHSTEP_CUDA_CHECK(cudaFreeHost(m.meta_pinned));
      m.meta_pinned_count = meta.size() * 2;
      FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&m.meta_pinned), m.meta_pinned_count * 4));
    }
    m.meta_dev.reserve(m.meta_pinned_count * 4, m.stream);
    pinned = m.meta_pinned;
    dev = &m.meta_dev;
  }
  std::memcpy(pinned, meta.data(), meta.size() * 4);
  FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(dev->ptr, pinned, meta.size() * 4, cudaMemcpyHostToDevice, m.stream));

  // ---- plan (outside any graph): decode rows and prefill rows, two calls -------------
  Impl::Role* dec = graph ? &entry->decode : &m.decode;
  // one_launch: a mixed step's rows in one launch of POD attention (pod_attention.cuh),
  // or, where it cannot run the step, one call of the prefill stage
  const bool one_call = m.cfg.one_launch && nd > 0 && np > 0;
  bool pod = false;
  if (one_call) {
    BatchShape s = m.base_shape(Mode::prefill);
    s.batch_size = static_cast<int>(rows);
    s.qo_indptr = arrays.slice(at.qo, rows + 1);
    s.kv_indptr = arrays.slice(at.kvp, rows + 1);
    s.kv_last_page_len = b.kv_last_page_len;
    s.kv_indices = b.kv_indices;
    pod = m.cfg.prefill_stage.empty() && pod_unsupported_reason(s, static_cast<int>(nd)).empty();
    if (pod) {
      m.pod.plan(s, static_cast<int>(nd), m.stream);
      out.decode_stage = out.prefill_stage = "pod_attention";
    } else {
      m.plan(m.prefill, s);
      out.decode_stage = out.prefill_stage = m.prefill.name;
    }
    out.one_call = true;
  }
  if (nd > 0 && !one_call) {
    BatchShape s = m.base_shape(Mode::decode);
    const int64_t dec_rows = graph ? padded : nd;  // the decode call's rows (padding included)
    s.batch_size = static_cast<int>(dec_rows);
    s.qo_indptr = arrays.slice(at.qo, dec_rows + 1);
    s.kv_indptr = arrays.slice(at.kvp, dec_rows + 1);
    s.kv_last_page_len = arrays.slice(at.last, dec_rows);
    s.kv_indices.assign(b.kv_indices.begin(), b.kv_indices.begin() + p0);
    s.cuda_graph = graph;
    if (graph && entry->exec != nullptr && dec->runner && dec->workspace.bytes < dec->runner->workspace_bytes(s)) {
      // the workspace must move: the graph read the old one, so capture afresh
      FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(entry->exec));
      entry->exec = nullptr;
      dec->runner.reset();
    }
    if (!decode_choice.empty() && !unsupported_reason(find_stage(decode_choice), s).empty()) decode_choice.clear();
    m.plan(*dec, s, decode_choice);
    out.decode_stage = dec->name;
  }
  if (np > 0 && !one_call) {
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

  // ---- the model: eager, or the step's graph (captured on first use) ----------------
  const Impl::Launch launch{
      n_tok, n_rows, nd, np, n_samp, q0, p0, dev->as<int32_t>(), at, dec, &m.prefill, one_call, pod ? &m.pod : nullptr};
  if (graph) {
    if (entry->exec == nullptr) {
      // One eager pass first: kernels load and cuBLAS picks its algorithms outside the
      // capture. The step is idempotent (X restarts from the embedding, the append
      // writes the same K/V), so the replay below recomputes the same values.
      m.launch_model(launch);
      cudaGraph_t g = nullptr;
      FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
      try {
        m.launch_model(launch);
      } catch (...) {
        cudaStreamEndCapture(m.stream, &g);
        if (g) cudaGraphDestroy(g);
        throw;
      }
      FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(m.stream, &g));
      entry->launches = count_launch_nodes(g);
      FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&entry->exec, g, 0));
      FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(g));
    }
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(entry->exec, m.stream));
    ++entry->replays;
    out.graph_batch = padded;
    out.graph_launches = entry->launches;
  } else {
    m.launch_model(launch);
  }

  // ---- sampling (outside the graph: each request's seed and offset change per step) -
  int32_t* tokens = m.tokens_out.as<int32_t>();
  const SamplingParams& sp = m.cfg.sampling;
  if (samples > 0 && sp.mode == SamplingMode::greedy) {
    argmax_kernel<<<static_cast<unsigned>(samples), kThreads, 0, m.stream>>>(m.logits.as<float>(),
                                                                             static_cast<int>(m.vocab), tokens);
    kernels::check_launch("argmax_kernel");
  } else if (samples > 0) {
    // One launch for every sampling row: row i draws with request r's key seed + r and
    // offset (its token index) * kSamplingOffsetStride, read from device arrays.
    namespace smp = sampling;
    for (int64_t i = 0; i < samples; ++i) {
      const int32_t r = b.request_ids[static_cast<size_t>(b.sample_rows[static_cast<size_t>(i)])];
      m.keys_pinned[i] = sp.seed + static_cast<uint64_t>(r);
      m.keys_pinned[samples + i] = static_cast<uint64_t>(scheduler.state(r).generated.size()) *
                                   ref::kSamplingOffsetStride;
    }
    FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(m.sample_keys.ptr, m.keys_pinned, static_cast<size_t>(2 * samples) * 8,
                                         cudaMemcpyHostToDevice, m.stream));
    smp::DeviceRows lg{m.logits.ptr, samples, m.vocab, smp::ElementType::f32};
    smp::softmax(lg, smp::RowParam<double, float>(sp.temperature), m.probs.as<float>(), nullptr, m.stream);
    const smp::DeviceRows rows{m.probs.as<float>(), samples, m.vocab, smp::ElementType::f32};
    smp::SamplingOutputs so;
    so.samples = tokens;
    so.status = m.status.as<int32_t>();
    smp::SamplingOptions opt;
    opt.seed_per_output = m.sample_keys.as<uint64_t>();
    opt.offset_per_output = m.sample_keys.as<uint64_t>() + samples;
    if (sp.top_k > 0 && sp.top_p < 1.0)
      smp::top_k_top_p_sampling_from_probs(rows, smp::TopK(sp.top_k), smp::Fraction(sp.top_p),
                                           ref::FilterApplyOrder::top_k_first, so,
                                           smp::Workspace{m.sample_ws.ptr, m.sample_ws.bytes}, opt, m.stream);
    else if (sp.top_k > 0) smp::top_k_sampling_from_probs(rows, smp::TopK(sp.top_k), so, opt, m.stream);
    else if (sp.top_p < 1.0) smp::top_p_sampling_from_probs(rows, smp::Fraction(sp.top_p), so, opt, m.stream);
    else smp::sampling_from_probs(rows, so, opt, m.stream);
  }
  const size_t sampled_event = static_cast<size_t>(3 + 3 * m.layers);
  m.event(sampled_event);
  // ---- only token ids come back (logits and probs too when a test asks) -------------
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
    size_t e = 1;
    for (int64_t l = 0; l < m.layers; ++l, e += 3) {
      t.projection_ms += ms(e, e + 1) + ms(e + 2, e + 3);
      t.attention_ms += ms(e + 1, e + 2);
    }
    t.logits_ms = ms(e, e + 1);
    t.sampling_ms = ms(e + 1, e + 2);
    t.total_ms = ms(0, e + 2) + t.host_ms;
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
