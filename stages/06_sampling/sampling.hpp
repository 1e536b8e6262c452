/// \file sampling.hpp
/// \brief Stage 06 — token sampling on the GPU under the reference's names
/// (reference/sampling.hpp, speculative.hpp), drawing the same tokens as the reference,
/// draw for draw.
///
/// Sampling is not attention, so it has its own small interface instead of StageRunner:
/// every operator is a function of device pointers that only launches kernels (no host
/// decision after its arguments are checked, no allocation, no synchronization), so
/// a call can be captured in a CUDA graph. What a plan() does for attention — sizing the
/// buffers a call needs — is workspace_bytes() here: the operators that chain kernels
/// (top_k_first) take a caller-allocated workspace; the from-logits samplers fuse their
/// softmax and need none. The registry at the end
/// lists the operators for the tests, the benchmark and the CLI.
///
/// ## Errors a kernel cannot throw
///
/// Host-side checks (shapes, scalar top_k / top_p / min_p, workspace size) throw
/// ref::InvalidArgument naming the argument, as the reference does. What only the device
/// can see — the values in a row, per-output parameters in device memory, `indices` — is
/// reported per output through the optional `status` buffer (a Status code), and the
/// output gets a defined sentinel: token kInvalidToken (-1) for a sampler, a row of NaN
/// for softmax and the renorm/mask operators. A bad row never causes an out-of-range
/// read or an endless loop, and never affects another output.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/sampling.hpp"

namespace flashstep::stages::sampling {

using ref::FilterApplyOrder;
using ref::FilterKind;

/// The token written for an output whose status is not ok.
constexpr int32_t kInvalidToken = -1;

/// Per-output (or per-row) outcome, written to the optional `status` buffer. When several
/// apply, the first in this list is reported; in a chained operator (the top_k_first
/// orders) the first kernel's status is passed on unchanged.
enum class Status : int32_t {
  ok = 0,
  bad_index = 1,         ///< indices[i] is not a row of the input
  bad_top_k = 2,         ///< a per-output top_k < 1
  bad_top_p = 3,         ///< a per-output top_p outside (0, 1] (NaN included)
  bad_min_p = 4,         ///< a per-output min_p outside [0, 1] (NaN included)
  bad_temperature = 5,   ///< a per-row temperature that is not finite and > 0
  not_finite = 6,        ///< probs: NaN or +-inf; logits: NaN or +inf
  negative = 7,          ///< probs: an entry < 0
  above_one = 8,         ///< probs: an entry > 1
  zero_row = 9,          ///< no mass to draw from (all zeros, all -inf logits, masses < 2^-96)
  bad_draft_token = 10,  ///< speculative: a draft token id outside [0, vocab)
  internal_error = 11,   ///< the sampler's loop ended without a token (a bug: please report)
};
/// "ok", "bad_index", ... (the enumerator's name).
const char* to_string(Status status);

/// Element type of an input row buffer. Probabilities are always f32; logits may also be
/// bf16 (the operators read them as float, exactly, and compute in float).
enum class ElementType : int32_t {
  f32 = 0,   ///< float32
  bf16 = 1,  ///< bfloat16 (the upper 16 bits of a float32); logits only
};

/// Probability (or logit) rows in device memory, row-major (rows, vocab).
struct DeviceRows {
  const void* data = nullptr;            ///< (rows, vocab) entries of type `dtype`
  int64_t rows = 0;                      ///< number of rows
  int64_t vocab = 0;                     ///< entries per row, 1 .. 2^30
  ElementType dtype = ElementType::f32;  ///< bf16 only where an operator takes logits
};

/// A per-output parameter: one host scalar for every output, or a device array of one
/// value per output (FlashInfer's `Union[torch.Tensor, float]`).
template <typename Scalar, typename PerOutput = Scalar>
struct RowParam {
  Scalar scalar{};                        ///< used when per_output is null
  const PerOutput* per_output = nullptr;  ///< (batch) device values, or null
  /// One value for every output. \param s the value
  RowParam(Scalar s) : scalar(s) {}  // NOLINT(google-explicit-constructor)
  /// One device value per output. \param device_values (batch) device array
  static RowParam per_row(const PerOutput* device_values) {
    RowParam p(Scalar{});
    p.per_output = device_values;
    return p;
  }
};
/// top_k: a host int64 scalar (k >= vocab keeps all) or a device int32 array.
using TopK = RowParam<int64_t, int32_t>;
/// top_p or min_p: a host scalar (checked in double, used as float32) or a device float array.
using Fraction = RowParam<double, float>;

/// FlashInfer's keyword arguments of the samplers.
struct SamplingOptions {
  const int32_t* indices = nullptr;  ///< (batch) device: output i samples row indices[i]; null: row i
  int64_t batch = -1;                ///< outputs; -1 means rows (required when indices is set)
  uint64_t seed = 0;                 ///< Philox key
  uint64_t offset = 0;               ///< stream word of round 0 (output i, round j reads offset + j)
  /// (batch) device, or null: output i's own Philox key, in place of `seed`. An output
  /// with its own key is the first output of its own stream (subsequence 0, not i): it
  /// draws the token a one-output call with that key would. One launch then serves a
  /// batch whose requests each own a seed, as an engine's step needs (FlashInfer's
  /// per-request seed and offset tensors).
  const uint64_t* seed_per_output = nullptr;
  /// (batch) device, or null: output i's stream word of round 0, in place of `offset`.
  const uint64_t* offset_per_output = nullptr;
};

/// Where a sampler writes, one entry per output; rounds and status are optional.
struct SamplingOutputs {
  int32_t* samples = nullptr;  ///< (batch) token ids, kInvalidToken where status != ok
  int32_t* rounds = nullptr;   ///< (batch) rejection rounds used (>= 1), 0 where status != ok; may be null
  int32_t* status = nullptr;   ///< (batch) Status codes; may be null
  /// (batch, vocab) float, optional, from-logits samplers only: row i gets the
  /// probabilities output i drew from (its softmax, computed inside the sampler), so a
  /// caller can replay the draw with the reference; a row of NaN where status != ok
  /// because of its input. Null (the default): nothing written.
  float* probs = nullptr;
};

/// A caller-allocated device buffer (size from workspace_bytes).
struct Workspace {
  void* data = nullptr;  ///< device memory, 256-byte aligned (cudaMalloc is)
  size_t bytes = 0;      ///< its size
};

// ---- Samplers ---------------------------------------------------------------------------
//
// Every sampler takes \p out (samples, optional rounds and status, one per output), \p opt
// (indices, batch, seed, offset) and \p stream (where its kernels are launched).

/// Draw from each row in proportion to its probabilities.
/// \param probs (rows, vocab), entries in [0, 1]
/// \param out (batch) samples, rounds, status \param opt indices, batch, seed, offset
/// \param stream where the kernel is launched
void sampling_from_probs(DeviceRows probs, SamplingOutputs out, const SamplingOptions& opt = {},
                         cudaStream_t stream = nullptr);

/// sampling_from_probs(softmax(logits)) in one kernel: the softmax is fused (each block
/// finds its row's max and sum, then evaluates p_j on the fly in every pass; nothing is
/// written unless out.probs is set).
/// \param logits (rows, vocab), f32 or bf16, finite or -inf
/// \param out (batch) samples, rounds, status, optional probs
/// \param workspace unused (workspace_bytes is 0); kept so every sampler has one signature
/// \param opt indices, batch, seed, offset \param stream where the kernels are launched
void sampling_from_logits(DeviceRows logits, SamplingOutputs out, Workspace workspace, const SamplingOptions& opt = {},
                          cudaStream_t stream = nullptr);

/// Top-k by rejection.
/// \param probs (rows, vocab) \param top_k each >= 1 (k >= vocab keeps all)
/// \param out (batch) samples, rounds, status \param opt indices, batch, seed, offset
/// \param stream where the kernel is launched
void top_k_sampling_from_probs(DeviceRows probs, TopK top_k, SamplingOutputs out, const SamplingOptions& opt = {},
                               cudaStream_t stream = nullptr);

/// Top-p by rejection.
/// \param probs (rows, vocab) \param top_p each in (0, 1]
/// \param out (batch) samples, rounds, status \param opt indices, batch, seed, offset
/// \param stream where the kernel is launched
void top_p_sampling_from_probs(DeviceRows probs, Fraction top_p, SamplingOutputs out, const SamplingOptions& opt = {},
                               cudaStream_t stream = nullptr);

/// Min-p: one draw among p >= max_p * min_p.
/// \param probs (rows, vocab) \param min_p each in [0, 1]
/// \param out (batch) samples, rounds, status \param opt indices, batch, seed, offset
/// \param stream where the kernels are launched
void min_p_sampling_from_probs(DeviceRows probs, Fraction min_p, SamplingOutputs out, const SamplingOptions& opt = {},
                               cudaStream_t stream = nullptr);

/// Top-k and top-p. joint: one rejection loop testing both rules on the original row
/// (no workspace); top_k_first: top_k_renorm_probs of each output's row into the
/// workspace, then top-p sampling on it.
/// \param probs (rows, vocab) \param top_k each >= 1 \param top_p each in (0, 1]
/// \param order joint or top_k_first \param out (batch) samples, rounds, status
/// \param workspace workspace_bytes("top_k_top_p_sampling_from_probs", rows, batch, vocab,
///        order); empty for joint; for top_k_first starts with the (batch, vocab) renormalized rows
/// \param opt indices, batch, seed, offset \param stream where the kernels are launched
void top_k_top_p_sampling_from_probs(DeviceRows probs, TopK top_k, Fraction top_p, FilterApplyOrder order,
                                     SamplingOutputs out, Workspace workspace, const SamplingOptions& opt = {},
                                     cudaStream_t stream = nullptr);

/// Top-k and top-p from logits. joint: the joint loop with the softmax fused (one
/// kernel, no workspace); top_k_first: top_k_mask_logits into the workspace, then top-p
/// sampling with the softmax fused on the masked rows.
/// \param logits (rows, vocab), f32 or bf16, finite or -inf \param top_k each >= 1
/// \param top_p each in (0, 1] \param order joint or top_k_first
/// \param out (batch) samples, rounds, status, optional probs (the softmax rows sampled from)
/// \param workspace workspace_bytes("top_k_top_p_sampling_from_logits", rows, batch, vocab,
///        order); empty for joint; for top_k_first starts with the (batch, vocab) masked logits (f32)
/// \param opt indices, batch, seed, offset \param stream where the kernels are launched
void top_k_top_p_sampling_from_logits(DeviceRows logits, TopK top_k, Fraction top_p, FilterApplyOrder order,
                                      SamplingOutputs out, Workspace workspace, const SamplingOptions& opt = {},
                                      cudaStream_t stream = nullptr);

// ---- Row transforms (one output row per input row) ----------------------------------------

/// Softmax of logits / temperature, in float: the same device function as the fused
/// softmax of the from-logits samplers (bit for bit the probabilities they draw from).
/// \param logits (rows, vocab), f32 or bf16, finite or -inf
/// \param temperature host scalar or (rows) device array, finite and > 0
/// \param probs_out (rows, vocab) device \param status (rows) optional
/// \param stream where the kernel is launched
void softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, int32_t* status = nullptr,
             cudaStream_t stream = nullptr);

/// Keep the top-k of each row (ties kept), zero the rest, renormalize.
/// \param probs (rows, vocab) \param top_k scalar or (rows) device
/// \param probs_out (rows, vocab) \param status (rows) optional \param stream where the kernel is launched
void top_k_renorm_probs(DeviceRows probs, TopK top_k, float* probs_out, int32_t* status = nullptr,
                        cudaStream_t stream = nullptr);

/// Keep the top-p head of each row, zero the rest, renormalize.
/// \param probs (rows, vocab) \param top_p scalar or (rows) device
/// \param probs_out (rows, vocab) \param status (rows) optional \param stream where the kernel is launched
void top_p_renorm_probs(DeviceRows probs, Fraction top_p, float* probs_out, int32_t* status = nullptr,
                        cudaStream_t stream = nullptr);

/// Keep the top-k logits of each row (ties kept), set the rest to -inf.
/// \param logits (rows, vocab), f32 or bf16 \param top_k scalar or (rows) device
/// \param logits_out (rows, vocab) float (bf16 values are exact in it) \param status (rows) optional \param stream where the kernel is launched
void top_k_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, int32_t* status = nullptr,
                       cudaStream_t stream = nullptr);

// ---- Speculative decoding ------------------------------------------------------------------

/// Outputs of chain_speculative_sampling (ref::ChainSpeculativeResult), device buffers.
struct SpeculativeOutputs {
  int32_t* output_token_ids = nullptr;                ///< (batch, n + 1), -1 padded
  int32_t* output_accepted_token_num = nullptr;       ///< (batch)
  int32_t* output_emitted_draft_token_num = nullptr;  ///< (batch)
  int32_t* status = nullptr;                          ///< (batch) optional; token ids all -1 where not ok
};

/// Chain speculative sampling, one block per request (ref::chain_speculative_sampling).
/// \param draft_probs (batch, n, vocab) \param draft_token_ids (batch, n)
/// \param target_probs (batch, n + 1, vocab) \param batch requests \param n draft tokens per request
/// \param vocab entries per row \param out the result arrays and optional status
/// \param seed Philox key \param offset stream word of draft position 0 (request b reads subsequence b)
/// \param stream where the kernel is launched
void chain_speculative_sampling(const float* draft_probs, const int32_t* draft_token_ids, const float* target_probs,
                                int64_t batch, int64_t n, int64_t vocab, SpeculativeOutputs out, uint64_t seed,
                                uint64_t offset, cudaStream_t stream = nullptr);

// ---- Registry ------------------------------------------------------------------------------

/// One operator of the stage, as the CLI, the tests and the benchmark list it.
struct OperatorInfo {
  std::string name;     ///< the reference's (and FlashInfer's) name
  std::string input;    ///< "probs", "logits" or "draft/target probs"
  std::string output;   ///< "tokens", "probs" or "logits"
  std::string summary;  ///< one line: how the GPU computes it
};

/// Every operator of stage 06, in the order of the chapter.
const std::vector<OperatorInfo>& operators();

/// Workspace bytes that operator `name` needs; 0 for most. Throws ref::InvalidArgument
/// for an unknown name. \param name an OperatorInfo::name \param rows input rows
/// \param batch outputs \param vocab entries per row \param order for the top_k_top_p operators
size_t workspace_bytes(const std::string& name, int64_t rows, int64_t batch, int64_t vocab,
                       FilterApplyOrder order = FilterApplyOrder::top_k_first);

}  // namespace flashstep::stages::sampling
