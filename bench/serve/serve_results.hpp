/// \file serve_results.hpp
/// \brief What `flashstep serve --json FILE` records of a measured run, the goals it
/// judges, and the results file it writes (bench/reports/results.py's one shape, so the
/// docs' results page and bench/reports/engine_report.py read it like any other run).
///
/// Plain C++ (no CUDA): the serve command fills a ServeRecord on the GPU, the CPU tests
/// fill one by hand and check the arithmetic and the file's fields.
///
/// The file: `format` ("flashstep results 1"), `stage` ("09_engine"), `what` (the
/// workload's name), device, commit, tree, command, date, note; `ceilings` (the read
/// ceiling and the launch floor of one empty kernel, measured in the same process);
/// `config` (the model, scheduler, workload and sampling); `model_bytes` (weight bytes of
/// a decode step, K/V bytes per token slot); `variants` (each configuration run on the
/// same workload: its totals, its pages and KV bytes, and one row per step in
/// `step_columns` order); `summary` (per variant, the decode steps at the goal's batch:
/// their median time, floor and ratio, and the mean split of a step into its phases);
/// `rows` (a few of those numbers as named rows, for the results page); `targets` (the
/// goals, met or missed); `shown_step` (with --show-step: one step printed, its stages,
/// and its sampled tokens).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flashstep::bench {

/// One step of a measured run. Times in microseconds.
struct StepRecord {
  int64_t step = 0, decodes = 0, prefills = 0, tokens = 0;
  int64_t kv_flat = 0, kv_unique = 0;           ///< KV slots the decode rows attend (step_floor.hpp)
  int64_t graph_batch = 0, graph_launches = 0;  ///< the CUDA graph that ran it (0: eager)
  double wall_us = 0;                           ///< run_step on the host's clock, in the run without events
  /// The phases from the run with CUDA events (the same schedule, so the same step):
  /// host (metadata, upload, plan), embed, projections, attention, logits, sampling; total
  /// is the events' span plus host. Negative: not profiled.
  double host_us = -1, embed_us = -1, projection_us = -1, attention_us = -1, logits_us = -1, sampling_us = -1,
         total_us = -1;
  double floor_us = -1;  ///< the step's floor (step_floor.hpp); negative: none (a step with prefill rows)
  std::string decode_stage, prefill_stage;
};

/// One configuration run on the workload.
struct VariantRecord {
  std::string name;  ///< "eager", "graphs", "sharing_cascade", ... (a row name's part)
  bool cuda_graphs = false, prefix_sharing = true, cascade = false;
  int64_t steps = 0, tokens = 0;  ///< of the run without events
  double seconds = 0;             ///< that run's wall time
  int64_t peak_pages = 0, pages_allocated = 0;
  double launch_floor_us = -1;  ///< the launch floor of its decode graphs' launches (+1: the sampler)
  std::vector<StepRecord> steps_recorded;
};

/// One step printed (serve --show-step N): describe(), the stages and why, the tokens.
struct ShownStep {
  int64_t step = -1;   ///< < 0: none
  std::string arrays;  ///< StepBatch::describe()
  std::string decode_stage, prefill_stage;
  int64_t graph_batch = 0;
  int64_t group_size = 0;       ///< query heads per KV head (default_stage's decode rule)
  int64_t shared_pages = 0;     ///< page ids that two or more decode rows read
  bool cascade_option = false;  ///< cascade_when_shared was on
  std::vector<int32_t> sampled_requests, sampled_tokens;
  /// The step's arrays as the two attention calls' plan() get them (step_arrays.hpp): the
  /// decode call takes rows 0 .. num_decodes-1, the prefill call the rest, rebased.
  int64_t num_decodes = 0;
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

/// A measured serve run.
struct ServeRecord {
  std::string what;  ///< the workload's name: the `what` part of the results file's name, the rows' prefix
  std::string device, commit, tree, command, date, note;
  double read_gbps = 0;          ///< the read ceiling, GB/s
  double read_buffer_bytes = 0;  ///< the buffer it streamed
  double launch_floor_1_us = 0;  ///< a graph of one empty kernel
  /// The configuration as (key, JSON value) pairs, in order: json_string(), json_number().
  std::vector<std::pair<std::string, std::string>> config;
  int64_t weight_bytes = 0;  ///< of a decode step at goal_batch (step_weight_bytes)
  int64_t slot_bytes = 0;    ///< K/V bytes per token slot, all layers
  int64_t page_size = 0;
  int64_t goal_batch = 64;  ///< the batch the goals are judged at
  std::vector<VariantRecord> variants;
  ShownStep shown;
};

/// The decode steps of a variant at a batch: steps with no prefill row and `batch` decode
/// rows. Medians over those steps (of the run without events); means of the split (of the
/// run with events); ratio = wall / floor per step.
struct DecodeSummary {
  int64_t steps = 0;
  double wall_us = -1, floor_us = -1, ratio = -1, ratio_max = -1;  ///< medians; ratio_max the largest
  double host_us = -1, embed_us = -1, projection_us = -1, attention_us = -1, logits_us = -1, sampling_us = -1,
         total_us = -1;                             ///< means
  double kv_bytes_flat = -1, kv_bytes_unique = -1;  ///< medians
};
DecodeSummary summarize_decode(const VariantRecord& v, int64_t batch, int64_t slot_bytes);

/// A goal, judged: what, the measured ratio, the goal in words, met (-1: not measured).
struct Goal {
  std::string what, goal;
  double ratio = -1;
  int met = -1;
};
/// The two goals on the variant named "graphs" at goal_batch: decode step time
/// over its floor <= 1.5 (the median over the steps), and host time (metadata, upload,
/// plan) over the step's total <= 0.10 (means). None where there is no such variant
/// (a file of other variants judges no goal); not measured (met -1) where it ran no such
/// step.
std::vector<Goal> evaluate_goals(const ServeRecord& r);

/// `s` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s);
/// `x` as a JSON number with 6 significant digits (integers exactly); null if not finite.
std::string json_number(double x);

/// The results file (the file comment's fields), pretty-printed.
std::string to_json(const ServeRecord& r);

}  // namespace flashstep::bench
