// Stage 09's GPU engine: the tiny decoder on cuBLAS, the attention stages through the
// registry, stage 06's samplers, driven by the Scheduler. See engine.hpp for one step.
#include "09_engine/engine.hpp"
#include "09_engine/grow_buffer.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
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
  // One step as run_step's phases hand it on, each filling its part.
  struct Step {
    const StepBatch* batch = nullptr;
    // tokens, rows, decode and prefill rows, sampling rows; the first prefill row's first
    // token (q0) and first entry of kv_indices (p0)
    int64_t nnz = 0, rows = 0, nd = 0, np = 0, samples = 0;
    int32_t q0 = 0, p0 = 0;
    // route_step
    int64_t padded = 0;           // the CUDA graph's batch; 0: eager
    std::string decode_choice;    // "05_cascade" where the decode rows share pages; empty: as configured
    GraphEntry* graph = nullptr;  // the graph (and its metadata buffer) of a padded step
    // upload_metadata: the packed arrays (their nnz, rows and samples are what the model's
    // launches cover: in a graph, the padded batch) and where they went on the device
    StepArrays arrays;
    const int32_t* dm = nullptr;
    // plan_attention
    Role* dec = nullptr;    // the decode rows' call (a graph's own)
    bool one_call = false;  // a mixed step's attention as one call over every row:
    bool use_pod = false;   // POD attention, or (false) the prefill stage
  };

  // run_step's phases, in order (the observer hears each boundary: mark)
  void check_step(const StepBatch& b, const Scheduler& scheduler) const;
  Step route_step(const StepBatch& b);
  void upload_metadata(Step& s);
  void plan_attention(Step& s, StepOutput& out);
  void run_model(const Step& s, StepOutput& out);
  void sample_tokens(const Step& s, const Scheduler& scheduler);
  void read_back(const Step& s, StepOutput& out);
  // run_model's launches, in order: what a decode step's graph holds
  void forward(const Step& s);
  void embed(const Step& s);
  void project_qkv(const Step& s, int64_t layer);
  void append_kv(const Step& s, int64_t layer);
  void attend(const Step& s, int64_t layer);
  void project_output(const Step& s, int64_t layer);
  void compute_logits(const Step& s);
  bool decode_rows_share_pages(const StepBatch& b);
  void round_rows(const int32_t* rows, int64_t n);
  char* pool(int64_t layer) const { return pools.as<char>() + static_cast<size_t>(layer * pool_elems) * elem(); }

  void mark(StepPhase phase, int64_t layer = -1) {
    if (cfg.observer != nullptr) cfg.observer->on_phase(phase, layer, stream);
  }

  DeviceBuffer cublas_workspace;
  std::unique_ptr<TunedGemm> tuned;  // tuned_gemms: each decode-size shape's measured algorithm

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
}

Engine::~Engine() {
  if (!impl_) return;
  Impl& m = *impl_;
  if (m.stream) cudaStreamSynchronize(m.stream);
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

// ---- One step: run_step reads as its phases, one function each (engine.hpp's diagram);
// each boundary is marked for EngineConfig::observer (step_observer.hpp). -----------------

StepOutput Engine::run_step(const StepBatch& b, const Scheduler& scheduler) {
  Impl& m = *impl_;
  StepOutput out;
  if (b.batch_size() == 0) return out;
  m.mark(StepPhase::host);
  m.check_step(b, scheduler);
  Impl::Step s = m.route_step(b);
  m.upload_metadata(s);
  m.plan_attention(s, out);
  m.mark(StepPhase::model);
  m.run_model(s, out);
  m.mark(StepPhase::sampling);
  m.sample_tokens(s, scheduler);
  m.mark(StepPhase::read_back);
  m.read_back(s, out);
  m.mark(StepPhase::done);
  return out;
}

void Engine::Impl::check_step(const StepBatch& b, const Scheduler& scheduler) const {
  const char* fn = "Engine::run_step";
  const int64_t nnz = b.nnz(), rows = b.batch_size();
  require(nnz <= max_nnz && rows <= max_rows, fn,
          "the step has " + str(nnz) + " tokens in " + str(rows) + " rows, more than the engine was sized for (" +
              str(max_nnz) + ", " + str(max_rows) + ")");
  require(scheduler.config().page_size == cfg.scheduler.page_size &&
              scheduler.config().num_pages == cfg.scheduler.num_pages,
          fn, "scheduler's pool (num_pages, page_size) must be the engine's");
  require(b.page_copies.empty(), fn, "the step asks for copy-on-write page copies, which the engine does not run");
  for (int64_t t = 0; t < nnz; ++t)
    ref::require_lazy(b.tokens[t] >= 0 && b.tokens[t] < vocab, fn, [&] {
      return "tokens[" + str(t) + "] = " + str(b.tokens[t]) + " is not in [0, vocab_size = " + str(vocab) + ")";
    });
}

// A page id seen twice among the decode rows' pages, in one pass: each page's stamp is the
// step that last saw it (no sort, no clearing between steps).
bool Engine::Impl::decode_rows_share_pages(const StepBatch& b) {
  const char* fn = "Engine::run_step";
  std::vector<uint32_t>& seen = page_seen;
  seen.resize(static_cast<size_t>(cfg.scheduler.num_pages), 0);
  if (++page_stamp == 0) {  // wrapped: old stamps could match again
    std::fill(seen.begin(), seen.end(), 0);
    page_stamp = 1;
  }
  for (int32_t n = 0; n < b.kv_indptr[b.num_decodes]; ++n) {
    const int32_t page = b.kv_indices[static_cast<size_t>(n)];
    ref::require_lazy(page >= 0 && page < cfg.scheduler.num_pages, fn, [&] {
      return "kv_indices[" + str(n) + "] = " + str(page) + " is not a page of the pool (0.." +
             str(cfg.scheduler.num_pages - 1) + ")";
    });
    uint32_t& stamp = seen[static_cast<size_t>(page)];
    if (stamp == page_stamp) return true;
    stamp = page_stamp;
  }
  return false;
}

// A decode-only step runs as a CUDA graph captured at the next power of two of its batch
// (padding rows: no pages, token 0, never appended, never sampled). Decode rows that share
// pages (a cached prefix) go to stage 05 when asked (cascade_when_shared): eagerly, its
// planner prices the cascade against a flat pass; in a graph, its launch is fixed by the
// padded batch (two levels, see cascade.hpp), in a graph of its own.
Engine::Impl::Step Engine::Impl::route_step(const StepBatch& b) {
  Step s;
  s.batch = &b;
  s.nnz = b.nnz();
  s.rows = b.batch_size();
  s.nd = b.num_decodes;
  s.np = s.rows - s.nd;
  s.samples = static_cast<int64_t>(b.sample_rows.size());
  s.q0 = b.qo_indptr[static_cast<size_t>(s.nd)];
  s.p0 = b.kv_indptr[static_cast<size_t>(s.nd)];
  if (cfg.cascade_when_shared && cfg.decode_stage.empty() && s.nd > 1 && decode_rows_share_pages(b))
    s.decode_choice = "05_cascade";
  if (cfg.cuda_graphs && s.np == 0) {
    s.padded = 1;
    while (s.padded < s.nd) s.padded *= 2;
    if (s.padded > max_rows || s.padded > max_nnz) s.padded = 0;
  }
  return s;
}

// One upload (step_arrays.hpp: the layout and the padding), into the graph's own buffers
// for a padded step (the graph froze their addresses), else the eager ones.
void Engine::Impl::upload_metadata(Step& s) {
  const StepBatch& b = *s.batch;
  s.arrays = pack_step(b, s.padded);
  const StepArrays& a = s.arrays;
  const std::vector<int32_t>& meta = a.data;
  int32_t* pinned = nullptr;
  DeviceBuffer* dev = nullptr;
  if (s.padded > 0) {
    auto& slot = graphs[{s.padded, !s.decode_choice.empty()}];
    if (!slot) {
      slot = std::make_unique<GraphEntry>();
      slot->capacity = a.kv_indices + static_cast<size_t>(s.padded * cfg.scheduler.num_pages);
      FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot->pinned), slot->capacity * 4));
      slot->meta.reserve(slot->capacity * 4, stream);
    }
    s.graph = slot.get();
    require(meta.size() <= s.graph->capacity, "Engine::run_step",
            "a padded decode step's page table outgrew its graph's buffer");
    pinned = s.graph->pinned;
    dev = &s.graph->meta;
  } else {
    if (meta.size() > meta_pinned_count) {
      if (meta_pinned) FLASHSTEP_CUDA_CHECK(cudaFreeHost(meta_pinned));
      meta_pinned_count = meta.size() * 2;
      FLASHSTEP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&meta_pinned), meta_pinned_count * 4));
    }
    meta_dev.reserve(meta_pinned_count * 4, stream);
    pinned = meta_pinned;
    dev = &meta_dev;
  }
  std::memcpy(pinned, meta.data(), meta.size() * 4);
  FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(dev->ptr, pinned, meta.size() * 4, cudaMemcpyHostToDevice, stream));
  s.dm = dev->as<int32_t>();
}

// plan() outside any graph: the decode rows and the prefill rows as two calls, or, with
// one_launch, a mixed step's rows in one launch of POD attention (pod_attention.cuh) or,
// where it cannot run the step, one call of the prefill stage.
void Engine::Impl::plan_attention(Step& s, StepOutput& out) {
  const StepBatch& b = *s.batch;
  const StepArrays& a = s.arrays;
  s.dec = s.graph != nullptr ? &s.graph->decode : &decode;
  s.one_call = cfg.one_launch && s.nd > 0 && s.np > 0;
  if (s.one_call) {
    BatchShape shape = base_shape(Mode::prefill);
    shape.batch_size = static_cast<int>(s.rows);
    shape.qo_indptr = a.slice(a.qo_indptr, s.rows + 1);
    shape.kv_indptr = a.slice(a.kv_indptr, s.rows + 1);
    shape.kv_last_page_len = b.kv_last_page_len;
    shape.kv_indices = b.kv_indices;
    s.use_pod = cfg.prefill_stage.empty() && pod_unsupported_reason(shape, static_cast<int>(s.nd)).empty();
    if (s.use_pod) {
      pod.plan(shape, static_cast<int>(s.nd), stream);
      out.decode_stage = out.prefill_stage = "pod_attention";
    } else {
      plan(prefill, shape);
      out.decode_stage = out.prefill_stage = prefill.name;
    }
    out.one_call = true;
    return;
  }
  if (s.nd > 0) {
    Role& dec = *s.dec;
    BatchShape shape = base_shape(Mode::decode);
    const int64_t dec_rows = s.padded > 0 ? s.padded : s.nd;  // the decode call's rows (padding included)
    shape.batch_size = static_cast<int>(dec_rows);
    shape.qo_indptr = a.slice(a.qo_indptr, dec_rows + 1);
    shape.kv_indptr = a.slice(a.kv_indptr, dec_rows + 1);
    shape.kv_last_page_len = a.slice(a.kv_last_page_len, dec_rows);
    shape.kv_indices.assign(b.kv_indices.begin(), b.kv_indices.begin() + s.p0);
    shape.cuda_graph = s.padded > 0;
    if (s.graph != nullptr && s.graph->exec != nullptr && dec.runner &&
        dec.workspace.bytes < dec.runner->workspace_bytes(shape)) {
      // the workspace must move: the graph read the old one, so capture afresh
      FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(s.graph->exec));
      s.graph->exec = nullptr;
      dec.runner.reset();
    }
    if (!s.decode_choice.empty() && !unsupported_reason(find_stage(s.decode_choice), shape).empty())
      s.decode_choice.clear();
    plan(dec, shape, s.decode_choice);
    out.decode_stage = dec.name;
  }
  if (s.np > 0) {
    BatchShape shape = base_shape(Mode::prefill);
    shape.batch_size = static_cast<int>(s.np);
    shape.qo_indptr = a.slice(a.prefill_qo_indptr, s.np + 1);
    shape.kv_indptr = a.slice(a.prefill_kv_indptr, s.np + 1);
    shape.kv_last_page_len.assign(b.kv_last_page_len.begin() + s.nd, b.kv_last_page_len.end());
    shape.kv_indices.assign(b.kv_indices.begin() + s.p0, b.kv_indices.begin() + b.kv_indptr[s.rows]);
    plan(prefill, shape);
    out.prefill_stage = prefill.name;
  }
}

// The model: eagerly, or the step's graph (captured on first use) replayed.
void Engine::Impl::run_model(const Step& s, StepOutput& out) {
  if (s.graph == nullptr) {
    forward(s);
    return;
  }
  GraphEntry& g = *s.graph;
  if (g.exec == nullptr) {
    // One eager pass first: kernels load and cuBLAS picks its algorithms outside the
    // capture. The step is idempotent (X restarts from the embedding, the append
    // writes the same K/V), so the replay below recomputes the same values.
    forward(s);
    cudaGraph_t captured = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      forward(s);
    } catch (...) {
      cudaStreamEndCapture(stream, &captured);
      if (captured) cudaGraphDestroy(captured);
      throw;
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &captured));
    g.launches = count_launch_nodes(captured);
    FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&g.exec, captured, 0));
    FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(captured));
  }
  FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(g.exec, stream));
  ++g.replays;
  out.graph_batch = s.padded;
  out.graph_launches = g.launches;
}

// What a decode step's graph holds: the embedding, every layer, the logits.
void Engine::Impl::forward(const Step& s) {
  mark(StepPhase::embed);
  embed(s);
  for (int64_t l = 0; l < layers; ++l) {
    mark(StepPhase::projection, l);
    project_qkv(s, l);
    append_kv(s, l);
    mark(StepPhase::attention, l);
    attend(s, l);
    mark(StepPhase::output, l);
    project_output(s, l);
  }
  mark(StepPhase::logits);
  compute_logits(s);
}

// X = embedding[token] (+ the sinusoid), and X rounded: the first layer's rows.
void Engine::Impl::embed(const Step& s) {
  const bool sinusoidal = cfg.model.position_encoding == ref::PositionEncoding::sinusoidal;
  const unsigned blocks = static_cast<unsigned>(s.arrays.nnz);
  const int32_t* tokens = s.dm + s.arrays.tokens;
  const int32_t* positions = s.dm + s.arrays.positions;
  if (cfg.dtype == DType::bf16)
    embed_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(
        reinterpret_cast<const __nv_bfloat16*>(wptr(off_embedding)), tokens, positions, static_cast<int>(d), sinusoidal,
        x.as<float>(), xh.as<__nv_bfloat16>());
  else
    embed_kernel<__half><<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const __half*>(wptr(off_embedding)), tokens,
                                                          positions, static_cast<int>(d), sinusoidal, x.as<float>(),
                                                          xh.as<__half>());
  kernels::check_launch("embed_kernel");
}

// xh[i] = X[rows ? rows[i] : i] rounded to the storage dtype: the rows entering a projection.
void Engine::Impl::round_rows(const int32_t* rows, int64_t n) {
  if (cfg.dtype == DType::bf16)
    round_rows_kernel<__nv_bfloat16><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
        x.as<float>(), rows, static_cast<int>(d), xh.as<__nv_bfloat16>());
  else
    round_rows_kernel<__half>
        <<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x.as<float>(), rows, static_cast<int>(d), xh.as<__half>());
  kernels::check_launch("round_rows_kernel");
}

// Q | K | V = Xh W_QKV in one GEMM, a row per token; then Q into the contiguous q the
// stages read: rotated by RoPE (K rotated in place), or copied as it is (no RoPE, or
// fused_rope: the attention stages rotate q and k as they load them, K goes to the pool
// un-rotated).
void Engine::Impl::project_qkv(const Step& s, int64_t layer) {
  const size_t e = elem();
  const int64_t qw = hq * hd, kw = hkv * hd, qkv_w = qw + 2 * kw;  // a row of qkv: Q | K | V
  const int64_t nnz = s.arrays.nnz;
  if (layer > 0) round_rows(nullptr, nnz);  // layer 0's rows: the embedding kernel rounded them
  gemm(nnz, qkv_w, d, xh.ptr, wptr(off_wqkv[layer]), qkv.ptr, cuda_type, false);
  if (rope_freqs.empty() || cfg.fused_rope) {
    FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(q.ptr, static_cast<size_t>(qw) * e, qkv.ptr, static_cast<size_t>(qkv_w) * e,
                                           static_cast<size_t>(qw) * e, static_cast<size_t>(nnz),
                                           cudaMemcpyDeviceToDevice, stream));
    return;
  }
  RopeLaunch r;
  r.dtype = cfg.dtype;
  r.q = qkv.ptr;
  r.q_stride = qkv_w;
  r.q_out = q.ptr;
  r.k = r.k_out = qkv.as<char>() + static_cast<size_t>(qw) * e;
  r.k_stride = r.k_out_stride = qkv_w;
  r.nnz = nnz;
  r.num_q_heads = static_cast<int>(hq);
  r.num_k_heads = static_cast<int>(hkv);
  r.head_dim = static_cast<int>(hd);
  r.rotary_dim = static_cast<int>(hd);
  r.interleave = cfg.model.rope_interleave;
  r.pos_ids = s.dm + s.arrays.positions;
  launch_rope(r, rope_freqs, stream);
}

// K and V of the step's tokens into layer `layer`'s page pool, read in place from the
// fused rows (kernels/append_paged.cuh).
void Engine::Impl::append_kv(const Step& s, int64_t layer) {
  const size_t e = elem();
  const int64_t qw = hq * hd, kw = hkv * hd, qkv_w = qw + 2 * kw;
  const SchedulerConfig& sc = cfg.scheduler;
  const int32_t* dm = s.dm;
  kernels::AppendPagedKVParams a;
  a.append_key = qkv.as<char>() + static_cast<size_t>(qw) * e;
  a.append_value = qkv.as<char>() + static_cast<size_t>(qw + kw) * e;
  a.key_row_stride = a.value_row_stride = qkv_w;
  a.nnz = s.arrays.nnz;
  a.batch_indices = dm + s.arrays.batch_indices;
  a.positions = dm + s.arrays.positions;
  a.k_cache = pool(layer);
  a.v_cache = pool(layer) + static_cast<size_t>(sc.page_size * kw) * e;
  a.page_stride = 2 * sc.page_size * kw;
  a.hnd = false;
  a.num_kv_heads = static_cast<int>(hkv);
  a.head_dim = static_cast<int>(hd);
  a.page_size = static_cast<int>(sc.page_size);
  a.num_pages = sc.num_pages;
  a.kv_indices = dm + s.arrays.kv_indices;
  a.kv_indptr = dm + s.arrays.kv_indptr;
  a.batch_size = static_cast<int>(s.arrays.rows);
  if (cfg.dtype == DType::bf16) kernels::launch_append_paged_kv_cache<__nv_bfloat16>(a, stream);
  else kernels::launch_append_paged_kv_cache<__half>(a, stream);
  kernels::check_launch("append_paged_kv_cache_kernel");
}

// O = attention over layer `layer`'s pool: every row in one call (one_launch: POD, or the
// prefill stage with decodes as one-query requests, causal, so a decode row sees all its
// keys), else the decode rows' call and the prefill rows' call.
void Engine::Impl::attend(const Step& s, int64_t layer) {
  const size_t row_bytes = static_cast<size_t>(hq * hd) * elem();
  const int32_t* dm = s.dm;
  DeviceBatch all;
  all.q = q.ptr;
  all.qo_indptr = dm + s.arrays.qo_indptr;
  all.kv_indptr = dm + s.arrays.kv_indptr;
  all.kv_pool = pool(layer);
  all.kv_indices = dm + s.arrays.kv_indices;
  all.kv_last_page_len = dm + s.arrays.kv_last_page_len;
  all.o = o.ptr;
  all.lse = lse.as<float>();
  if (s.one_call) {
    if (s.use_pod) pod.run(all, stream);
    else prefill.runner->run(all, stream);
    return;
  }
  if (s.nd > 0) s.dec->runner->run(all, stream);  // rows 0 .. nd-1: prefixes of the step's arrays
  if (s.np > 0) {
    DeviceBatch p = all;  // rows nd ..: their own qo/kv indptr, rebased to 0
    p.q = q.as<char>() + static_cast<size_t>(s.q0) * row_bytes;
    p.qo_indptr = dm + s.arrays.prefill_qo_indptr;
    p.kv_indptr = dm + s.arrays.prefill_kv_indptr;
    p.kv_indices = dm + s.arrays.kv_indices + s.p0;
    p.kv_last_page_len = dm + s.arrays.kv_last_page_len + s.nd;
    p.o = o.as<char>() + static_cast<size_t>(s.q0) * row_bytes;
    p.lse = lse.as<float>() + s.q0 * hq;
    prefill.runner->run(p, stream);
  }
}

// X += O W_O on cuBLAS into the fp32 X (no output projection: X += O).
void Engine::Impl::project_output(const Step& s, int64_t layer) {
  const int64_t nnz = s.arrays.nnz;
  if (cfg.model.output_projection) {
    gemm(nnz, d, hq * hd, o.ptr, wptr(off_wo[layer]), x.ptr, CUDA_R_32F, true);
  } else if (cfg.dtype == DType::bf16) {
    residual_kernel<__nv_bfloat16><<<static_cast<unsigned>(nnz), kThreads, 0, stream>>>(
        o.as<__nv_bfloat16>(), static_cast<int>(d), x.as<float>());
  } else {
    residual_kernel<__half>
        <<<static_cast<unsigned>(nnz), kThreads, 0, stream>>>(o.as<__half>(), static_cast<int>(d), x.as<float>());
  }
  kernels::check_launch("residual");
}

// The logits (fp32) of the rows that sample: their X rounded, times W_vocab.
void Engine::Impl::compute_logits(const Step& s) {
  const int64_t samples = s.arrays.samples;
  if (samples == 0) return;
  round_rows(s.dm + s.arrays.sample_token_rows, samples);
  gemm(samples, vocab, d, xh.ptr, wptr(off_vocab), logits.ptr, CUDA_R_32F, false);
}

// Outside the graph: each request's seed and offset change per step.
void Engine::Impl::sample_tokens(const Step& s, const Scheduler& scheduler) {
  const StepBatch& b = *s.batch;
  const int64_t samples = s.samples;
  if (samples == 0) return;
  int32_t* tokens = tokens_out.as<int32_t>();
  const SamplingParams& sp = cfg.sampling;
  if (sp.mode == SamplingMode::greedy) {
    argmax_kernel<<<static_cast<unsigned>(samples), kThreads, 0, stream>>>(logits.as<float>(), static_cast<int>(vocab),
                                                                           tokens);
    kernels::check_launch("argmax_kernel");
    return;
  }
  // One launch for every sampling row: row i draws with request r's key seed + r and
  // offset (its token index) * kSamplingOffsetStride, read from device arrays.
  namespace smp = sampling;
  for (int64_t i = 0; i < samples; ++i) {
    const int32_t r = b.request_ids[static_cast<size_t>(b.sample_rows[static_cast<size_t>(i)])];
    keys_pinned[i] = sp.seed + static_cast<uint64_t>(r);
    keys_pinned[samples + i] = static_cast<uint64_t>(scheduler.state(r).generated.size()) * ref::kSamplingOffsetStride;
  }
  FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(sample_keys.ptr, keys_pinned, static_cast<size_t>(2 * samples) * 8,
                                       cudaMemcpyHostToDevice, stream));
  smp::DeviceRows lg{logits.ptr, samples, vocab, smp::ElementType::f32};
  smp::softmax(lg, smp::RowParam<double, float>(sp.temperature), probs.as<float>(), nullptr, stream);
  const smp::DeviceRows rows{probs.as<float>(), samples, vocab, smp::ElementType::f32};
  smp::SamplingOutputs so;
  so.samples = tokens;
  so.status = status.as<int32_t>();
  smp::SamplingOptions opt;
  opt.seed_per_output = sample_keys.as<uint64_t>();
  opt.offset_per_output = sample_keys.as<uint64_t>() + samples;
  if (sp.top_k > 0 && sp.top_p < 1.0)
    smp::top_k_top_p_sampling_from_probs(rows, smp::TopK(sp.top_k), smp::Fraction(sp.top_p),
                                         ref::FilterApplyOrder::top_k_first, so,
                                         smp::Workspace{sample_ws.ptr, sample_ws.bytes}, opt, stream);
  else if (sp.top_k > 0) smp::top_k_sampling_from_probs(rows, smp::TopK(sp.top_k), so, opt, stream);
  else if (sp.top_p < 1.0) smp::top_p_sampling_from_probs(rows, smp::Fraction(sp.top_p), so, opt, stream);
  else smp::sampling_from_probs(rows, so, opt, stream);
}

// Only token ids come back (logits and probs too when a test asks); a row the sampler
// could not draw is refused with its status.
void Engine::Impl::read_back(const Step& s, StepOutput& out) {
  const StepBatch& b = *s.batch;
  const int64_t samples = s.samples;
  if (samples > 0)
    FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(tokens_pinned, tokens_out.ptr, static_cast<size_t>(samples) * 4,
                                         cudaMemcpyDeviceToHost, stream));
  if (cfg.record_logits && samples > 0) {
    out.logits.resize(static_cast<size_t>(samples * vocab));
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpyAsync(out.logits.data(), logits.ptr, out.logits.size() * 4, cudaMemcpyDeviceToHost, stream));
    if (cfg.sampling.mode == SamplingMode::sample) {
      out.probs.resize(out.logits.size());
      FLASHSTEP_CUDA_CHECK(
          cudaMemcpyAsync(out.probs.data(), probs.ptr, out.probs.size() * 4, cudaMemcpyDeviceToHost, stream));
    }
  }
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  out.tokens.assign(tokens_pinned, tokens_pinned + samples);
  for (int64_t i = 0; i < samples; ++i)
    if (out.tokens[i] < 0) {
      int32_t st = 0;
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(&st, status.as<int32_t>() + i, 4, cudaMemcpyDeviceToHost));
      throw std::runtime_error("Engine::run_step: the sampler returned no token for request " +
                               str(b.request_ids[static_cast<size_t>(b.sample_rows[static_cast<size_t>(i)])]) +
                               " (status " + sampling::to_string(static_cast<sampling::Status>(st)) + ")");
    }
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
    const StepOutput out = run_step(b, scheduler);
    scheduler.complete_step(out.tokens);
  }
  run.steps = scheduler.steps();
  run.peak_pages = scheduler.peak_used_pages();
  run.pages_allocated = scheduler.pages_allocated();
  for (size_t r = 0; r < requests.size(); ++r) run.tokens.push_back(scheduler.state(static_cast<int32_t>(r)).generated);
  return run;
}

}  // namespace flashstep::stages::engine
