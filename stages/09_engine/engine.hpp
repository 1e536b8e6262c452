/// \file engine.hpp
/// \brief Stage 09 on the GPU: the reference's tiny decoder served by continuous batching,
/// one Scheduler step at a time, through the earlier stages.
///
/// One step (run_step), everything on one stream, only token ids back to the host; each
/// line is a function of engine.cu, each boundary one an observer hears (step_observer.hpp):
///
/// ```
///   check_step       the step fits the engine's sizes and pool; its tokens, the vocabulary
///   route_step       eager, or the CUDA graph of its padded batch; the decode rows on
///                    stage 05 where they share pages (cascade_when_shared)
///   upload_metadata  one upload of the step's int32 arrays (tokens, positions,
///                    batch_indices, the page table split into its decode and prefill
///                    halves, the rows that sample: step_arrays.hpp)
///   plan_attention   plan() of the decode runner and the prefill runner (or of POD)
///   run_model        forward() eagerly, or the step's graph, captured on first use:
///     embed            X (fp32, nnz x d_model) = embedding[token] (+ the sinusoid in that
///                      mode), Xh = X rounded to the storage dtype
///     layer l:
///     project_qkv      Xh = X rounded (l > 0); Q | K | V = Xh W_QKV, one GEMM
///                      (tuned_gemm.hpp), fp32 accumulation, stored rounded, a row per token;
///                      RoPE: Q out of those rows, K in place (rope_gpu.hpp; no RoPE, or
///                      fused_rope: a strided copy of Q)
///     append_kv        K, V into layer l's page pool (kernels/append_paged.cuh), from the
///                      same rows
///     attend           O[decode rows] = decode stage run() (rows 0 .. num_decodes-1),
///                      O[prefill rows] = prefill stage run() (causal, the rest); one_launch:
///                      O[every row] = POD attention, one launch, for a mixed step
///     project_output   X += O W_O on cuBLAS, beta = 1 into fp32 X
///     compute_logits   X[sample rows] rounded, times W_vocab on cuBLAS, fp32 logits
///   sample_tokens    greedy: argmax; else stage 06: softmax(logits / T), then the sampler
///                    the reference's generate() uses, one launch for every output, output
///                    i with its request's Philox key seed + request and offset (token
///                    index) * kSamplingOffsetStride from device arrays
///                    (SamplingOptions::seed_per_output)
///   read_back        the sampled token ids (one int32 per sampling row) come back
/// ```
///
/// The model is ref::TinyDecoder with `rounding` set to the storage dtype, so the
/// reference computes the same function: weights, the rows entering each projection, and
/// Q/K/V (the page pool) rounded where the engine stores them; X and the logits stay fp32.
///
/// Which stage runs: `decode_stage` / `prefill_stage` when given (refused with the
/// stage's unsupported_reason when it cannot run the step), else the registry's
/// default_stage() (registry.hpp): a decode whose GQA group is at most 8 gets 03_split_kv,
/// anything else the latest stage in teaching order that supports it (stage 05, which
/// plans from the shared pages, only when named); flashstep.cuda asks the same function.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "09_engine/scheduler.hpp"
#include "09_engine/step_observer.hpp"
#include "flashstep/reference/tiny_decoder.hpp"
#include "stage.hpp"

namespace flashstep::stages::engine {

/// How the engine picks each request's next token.
enum class SamplingMode {
  greedy,  ///< argmax of the logits (the lowest id on ties), as the reference at temperature 0
  sample,  ///< a seeded draw from softmax(logits / temperature), top-k / top-p when set
};
/// "greedy" or "sample".
const char* to_string(SamplingMode mode);
/// Parses "greedy" or "sample"; throws ref::InvalidArgument naming `sampling mode` otherwise.
SamplingMode parse_sampling_mode(const std::string& name);

/// Sampling parameters, shared by every request (each request has its own Philox key).
struct SamplingParams {
  SamplingMode mode = SamplingMode::greedy;
  double temperature = 1.0;  ///< sample: finite, > 0
  int64_t top_k = 0;         ///< sample: keep the top-k (0 = off)
  double top_p = 1.0;        ///< sample: keep the top-p head, in (0, 1] (1 = off)
  uint64_t seed = 0;         ///< request r draws with Philox key seed + r (its index in the workload)
};

/// Everything an Engine is built from.
struct EngineConfig {
  /// The model (ref::TinyDecoder's shape and seed). Its `rounding` is overwritten with
  /// the storage dtype's; head_dim = d_model / num_qo_heads must be one the stages take.
  ref::TinyDecoderConfig model;
  DType dtype = DType::f16;   ///< storage of weights, Q/K/V, the page pool and O: f16 or bf16
  SchedulerConfig scheduler;  ///< pool, page size, token budget, max_running, prefix sharing
  SamplingParams sampling;
  std::string decode_stage;   ///< a registry name for the decode rows; empty: default_stage()
  std::string prefill_stage;  ///< a registry name for the prefill rows; empty: default_stage()
  /// Copy each step's logits (and, when sampling, the probabilities drawn from) back to
  /// the host in StepOutput, for tests. Off: only token ids cross to the host.
  bool record_logits = false;
  /// Hears every step's phase boundaries (step_observer.hpp), for profiling: not owned, it
  /// must outlive the Engine. A CUDA graph keeps what the observer queued while it was
  /// captured. Null: none, and each boundary costs one null check.
  StepObserver* observer = nullptr;
  /// Run decode-only steps as CUDA graphs, one per padded batch size (the next power of
  /// two): plan() on the host before the replay, the embedding through the logits
  /// captured, the sampling after it (each request's seed and offset change per step).
  bool cuda_graphs = false;
  /// With no decode_stage named: a step whose decode rows share pages (a cached prefix)
  /// runs them with stage 05's cascade. Eagerly its planner prices the cascade against a
  /// flat pass; with cuda_graphs the step is captured too, in a graph of its own per
  /// padded size, stage 05 planning a launch fixed by that size
  /// (cascade::CascadeOptions::fixed_graph_launch: two levels, no KV split).
  bool cascade_when_shared = false;
  /// A mixed step (decode and prefill rows) computes its attention in one launch instead
  /// of two calls: POD attention (pod_attention.hpp: stage 04's prefill tiles and stage
  /// 03's decode items in one grid). With prefill_stage named, or a step POD cannot run,
  /// one call of the prefill stage over every row instead (a decode row being a request
  /// of one query).
  bool one_launch = false;
  /// Projections at decode sizes (up to 256 rows) by the cuBLASLt algorithm measured
  /// fastest for their shape the first time it runs (tuned_gemm.hpp); off: cublasGemmEx's
  /// default algorithm for every shape.
  bool tuned_gemms = true;
  /// RoPE fused into attention (FlashInfer's pos_encoding_mode="ROPE_LLAMA"), for a
  /// model with rotate-half RoPE: no RoPE kernel; K goes into the pool un-rotated and the
  /// attention stages rotate q and each key as they load them (BatchShape::pos_encoding),
  /// the decode rows on stage 03, the prefill rows on stage 04 (the stages that do). Both
  /// round the rotated q and k to the dtype, as the RoPE kernel's output is, so the
  /// reference's model is the same one.
  bool fused_rope = false;
};

/// What run_step returns.
struct StepOutput {
  std::vector<int32_t> tokens;  ///< one per sample row of the step, in order
  /// (sample rows, vocab) fp32 logits, row-major, when record_logits
  std::vector<float> logits;
  /// (sample rows, vocab) the probabilities each draw used, when record_logits and sampling
  std::vector<float> probs;
  std::string decode_stage;   ///< stage that ran the decode rows ("" when there were none)
  std::string prefill_stage;  ///< stage that ran the prefill rows ("" when there were none)
  int64_t graph_batch = 0;    ///< the padded batch whose CUDA graph ran the step; 0: eager
  bool one_call = false;      ///< the decode and prefill rows ran as one call (one_launch)
  /// Kernel and memset nodes of that graph, the launches a replay pays for (0: eager).
  int64_t graph_launches = 0;
};

/// What generate() returns.
struct GenerationRun {
  std::vector<std::vector<int32_t>> tokens;  ///< per request, the tokens it generated
  int64_t steps = 0;                         ///< scheduler steps
  int64_t peak_pages = 0;                    ///< most pages in use at once
  int64_t pages_allocated = 0;               ///< fresh pages allocated (cache reuse not counted)
};

/// The decoder on the GPU: weights uploaded once, one page pool per layer.
class Engine {
 public:
  /// Checks `config` (InvalidArgument naming the field), builds the model's weights with
  /// the reference's Philox formula and uploads them, allocates the pools and buffers for
  /// the scheduler's limits. Needs a CUDA device.
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// The configuration, with model.rounding set to the storage dtype's.
  const EngineConfig& config() const;
  /// The model config the reference must use to compute the same function.
  const ref::TinyDecoderConfig& model_config() const { return config().model; }

  /// Runs one step of `scheduler` (which produced `batch` and has not completed it):
  /// returns the sampled tokens, one per batch.sample_rows entry. The caller passes them
  /// (or others) to scheduler.complete_step().
  StepOutput run_step(const StepBatch& batch, const Scheduler& scheduler);

  /// Serves `requests` to the end with a Scheduler of config().scheduler.
  GenerationRun generate(const std::vector<Request>& requests);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashstep::stages::engine
