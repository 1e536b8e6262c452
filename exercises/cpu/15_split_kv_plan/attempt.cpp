// Exercise 15 (chapter 9, "Plan once, run every layer"): plan split-KV decode.
//
// Fill in plan_split() below: decide whether to split the requests' KV into chunks, pick
// the chunk size, and lay out the work items, exactly as the reference planner (and
// stage 03's plan()) does. The grader compares every field of your plan with the
// reference's plan_split_kv over random batches and devices, with and without CUDA graphs.
//
//     cmake --build build --target flashstep_exercise_cpu_15_split_kv_plan
//     flashstep exercise check 15         (or run build/bin/flashstep_exercise_cpu_15_split_kv_plan)
//
// Stuck? `flashstep exercise hint 15`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::SplitKVConfig;
using flashstep::ref::SplitKVPlan;

/// The split-KV plan (every field of SplitKVPlan in flashstep/reference/split_plan.hpp).
/// With G = num_sm * ctas_per_sm blocks the device runs at once, H = num_kv_heads blocks
/// per work item, n_i = max(pages_i, 1) and items(c) = sum_i ceil(n_i / c):
/// - if batch_size * H >= G the batch fills the device: no split, c = max_i n_i;
/// - else c is the smallest chunk in [c_min, max(c_min, max_i n_i)] with items(c) * H <= G,
///   where c_min = max(min_kv_chunk_tokens / page_size, 1), and split_kv is
///   items(c) > batch_size (always true under enable_cuda_graph);
/// - padded_batch_size is items(c), or under enable_cuda_graph G / H when split
///   (batch_size when not);
/// - work items go request by request, chunk by chunk; padding slots are (0, 0) and
///   have block_valid_mask 0.
/// \param kv_page_counts (batch_size >= 1) pages of each request, >= 0
/// \param config page_size, num_kv_heads, num_sm, ctas_per_sm, enable_cuda_graph, min_kv_chunk_tokens
SplitKVPlan plan_split(const std::vector<int32_t>& kv_page_counts, const SplitKVConfig& config) {
  SplitKVPlan plan;
  // TODO(exercise): fill every field of plan.
  return plan;
}
