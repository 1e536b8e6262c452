/// \file mixed_step.hpp
/// \brief The attention of one mixed step (decode rows first, then prefill rows, in one
/// causal batch) in each of the forms the engine could give it, held side by side so that
/// the tests and the timing can compare them. The engine itself makes one choice
/// (EngineConfig::one_launch, in stage 09's engine.cu); this class measures the choice.
///
/// ```
///   two calls  decode rows   0 .. nd-1   -> the decode stage (default_stage: 03_split_kv)
///              prefill rows  nd .. rows-1 -> the prefill stage (default_stage: 07 on an
///                                            H100, else 04), qo/kv indptr rebased to 0
///   one call   every row                 -> the prefill stage, a decode row being a
///                                            request of one query (causal: it sees all
///                                            its keys)
///   pod        every row in one launch of POD attention (pod_attention.cuh): stage
///              04's prefill tiles and stage 03's decode items in one grid
/// ```
///
/// The one call puts both kinds of rows in one grid, so no gap separates two launches,
/// but a decode row there is a 128-row tile holding group_size rows, run by the prefill
/// kernel. POD attention (Kamath et al., "POD-Attention: Unlocking Full Prefill-Decode
/// Overlap for Faster LLM Inference", ASPLOS 2025, arXiv 2410.18038) keeps each kind on
/// its own kernel's code inside one grid.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "stage.hpp"

namespace flashstep::bench {

/// How a mixed step's attention runs.
enum class MixedForm {
  two_calls,  ///< the decode stage over the decode rows, the prefill stage over the rest
  one_call,   ///< the prefill stage over every row
  pod,        ///< POD attention over every row (pod_attention.hpp)
};
/// "two_calls", "one_call" or "pod".
const char* to_string(MixedForm form);

/// plan/run of one mixed step's attention. Not itself a registry stage: it holds one or
/// two registry runners and their workspaces, or stage 09's PodAttention.
class MixedStepAttention {
 public:
  /// \param form two calls or one
  /// \param decode_stage registry name for the decode rows; empty: default_stage()
  /// \param prefill_stage registry name for the prefill rows (or every row); empty:
  ///        default_stage()
  explicit MixedStepAttention(MixedForm form, std::string decode_stage = {}, std::string prefill_stage = {});
  ~MixedStepAttention();
  MixedStepAttention(const MixedStepAttention&) = delete;
  MixedStepAttention& operator=(const MixedStepAttention&) = delete;

  /// Plans the step. \param step the whole step as a causal prefill batch over a paged
  /// pool: rows 0 .. num_decodes-1 have one query each, host arrays (qo_indptr, kv_indptr,
  /// kv_last_page_len, kv_indices) set \param num_decodes decode rows, 0..batch_size
  /// \param stream where plan() queues its uploads
  void plan(const stages::BatchShape& step, int num_decodes, cudaStream_t stream);
  /// Runs it over `step` (the whole step's device arrays, as the plan's shape describes).
  void run(const stages::DeviceBatch& step, cudaStream_t stream);
  /// The stage of the decode rows' call ("" when none ran: one call, or no decode rows).
  const std::string& decode_stage() const;
  /// The stage of the prefill rows' call (of every row in one call; "" when none).
  const std::string& prefill_stage() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashstep::bench
