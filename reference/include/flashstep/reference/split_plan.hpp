/// \file split_plan.hpp
/// \brief The split-KV planner (FlashInfer's DecodePlan idea) as a pure function over
/// plain vectors, and the reference split-attend-merge that checks a plan.
///
/// Decode gives one CTA per (request, kv head). A small batch cannot fill the GPU, so the
/// planner cuts each request's KV into chunks of `kv_chunk_size_in_pages` pages; every
/// (request, chunk) pair is a *work item* that writes a partial state (o, lse), and a
/// merge pass combines each request's partial states (merge.hpp) into its output.
/// plan() runs on the CPU once per batch composition; run() launches with the plan.
/// The GPU split-KV stage calls plan_split_kv() itself, so the planner is plain C++ over
/// std::vector (no Eigen; the headers it includes hold only standard-library types).
///
/// **The rule** (all integer arithmetic):
/// ```
///   G   = num_sm * ctas_per_sm          CTAs the device holds at once (max_grid_size)
///   H   = num_kv_heads                  each work item is launched once per kv head
///   n_i = max(num_pages_i, 1)           an empty request still gets one item (it writes
///                                       the empty state o = 0, lse = -inf)
///   items(c) = sum_i ceil(n_i / c)      work items for chunk size c pages
///
///   if batch_size * H >= G:             the batch alone fills the device: no split,
///       split_kv = false                c = max_i n_i (one chunk per request)
///   else:
///       c_min = max(min_kv_chunk_tokens / page_size, 1)        (floor division)
///       c = the smallest c in [c_min, max(c_min, max_i n_i)] with items(c) * H <= G,
///           found by binary search (items(c) never grows with c, and the upper end
///           fits because it gives batch_size items)
///       split_kv = items(c) > batch_size or enable_cuda_graph
///   padded_batch_size = enable_cuda_graph ? (split_kv ? G / H : batch_size) : items(c)
/// ```
/// c_min keeps chunks from getting so short that the merge costs more than it saves
/// (FlashInfer uses 128 tokens). Under CUDA graphs the captured kernel (split or not) and
/// its grid must not depend on the lengths, only on batch_size: the choice above depends
/// on batch_size alone, and the grid is padded to G / H items, which always holds items(c).
#pragma once

#include <cstdint>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// What the planner needs to know about the device and the kernel.
struct SplitKVConfig {
  int64_t page_size = 16;             ///< tokens per page, >= 1 (sets c_min with min_kv_chunk_tokens)
  int64_t num_kv_heads = 1;           ///< H: CTAs per work item (grid.y), >= 1
  int64_t num_sm = 1;                 ///< streaming multiprocessors, >= 1
  int64_t ctas_per_sm = 1;            ///< resident CTAs per SM for the decode kernel, >= 1
  bool enable_cuda_graph = false;     ///< plan for a captured graph (fixed grid)
  int64_t min_kv_chunk_tokens = 128;  ///< c_min = max(min_kv_chunk_tokens / page_size, 1) pages, >= 0
};

/// The schedule. Work item k is (request_indices[k], kv_tile_indices[k]); it reads pages
/// [t * c, min((t + 1) * c, num_pages_r)) of request r = request_indices[k], where
/// t = kv_tile_indices[k] and c = kv_chunk_size_in_pages, and writes partial state row
/// k = o_indptr[r] + t of the workspace.
struct SplitKVPlan {
  /// Whether the split kernel runs (partial states + merge). false: each request is one
  /// work item and the kernel writes outputs directly.
  bool split_kv = false;
  /// c: pages per chunk (>= 1). Without a split, max_i n_i: every request is one chunk.
  int32_t kv_chunk_size_in_pages = 1;
  /// items(c): the real work items (FlashInfer's new_batch_size).
  int32_t num_work_items = 0;
  /// grid.x of the decode launch: num_work_items, or the fixed CUDA-graph size.
  int32_t padded_batch_size = 0;
  /// G = num_sm * ctas_per_sm, as used by the rule.
  int32_t max_grid_size = 0;
  /// Copied from the config: the plan was made for a captured graph.
  bool enable_cuda_graph = false;
  /// (padded_batch_size) request of each work item; 0 in padding slots.
  std::vector<int32_t> request_indices;
  /// (padded_batch_size) chunk index of each work item within its request; 0 in padding.
  std::vector<int32_t> kv_tile_indices;
  /// (batch_size + 1) request r's partial states are rows o_indptr[r] .. o_indptr[r+1]
  /// of the workspace (one per chunk); o_indptr[batch_size] == num_work_items.
  std::vector<int32_t> o_indptr;
  /// (padded_batch_size) 1 for k < num_work_items, 0 for padding: a padded CTA exits
  /// early (FlashInfer's block_valid_mask).
  std::vector<uint8_t> block_valid_mask;
};

/// Plans split-KV decode (see the file comment for the exact rule).
/// \param kv_page_counts (batch_size) pages of each request, each >= 0; batch_size >= 1
/// \param config device and kernel parameters, each >= 1 (min_kv_chunk_tokens >= 0)
SplitKVPlan plan_split_kv(const std::vector<int32_t>& kv_page_counts, const SplitKVConfig& config);

/// Page counts from a CSR kv_indptr: kv_indptr[i + 1] - kv_indptr[i].
/// \param kv_indptr (batch_size + 1), starts at 0, non-decreasing
std::vector<int32_t> kv_page_counts_from_indptr(const std::vector<int32_t>& kv_indptr);

/// The partial states of a plan, one row per work item (FlashInfer's tmp_v / tmp_s).
struct SplitKVPartials {
  Tensor v;  ///< (num_work_items, num_qo_heads, head_dim) chunk outputs
  Tensor s;  ///< (num_work_items, num_qo_heads) chunk natural-log LSEs (-inf: no visible key)
};

/// Reference split phase: attention of each work item's query over its chunk only, in
/// double, with the mask evaluated at the keys' positions in the whole request.
/// \param q (batch_size, num_qo_heads, head_dim) one decode query per request
/// \param cache paged cache whose page counts are the ones the plan was made for
/// \param plan from plan_split_kv for those page counts: its chunks and o_indptr give
///        the rows of the result
/// \param opt causal is ignored (decode); window_left, soft cap and sm_scale apply
SplitKVPartials split_kv_partials(const Tensor& q, const PagedKVCache& cache, const SplitKVPlan& plan,
                                  const AttentionOptions& opt = {});

/// Reference merge phase: each request's rows o_indptr[r] .. o_indptr[r+1] merged
/// (FlashInfer's VariableLengthMergeStates).
/// \return o (batch_size, num_qo_heads, head_dim), lse (batch_size, num_qo_heads)
AttentionResult merge_split_kv(const SplitKVPartials& partials, const SplitKVPlan& plan);

/// split_kv_partials then merge_split_kv: must equal batch_decode_with_paged_kv_cache.
AttentionResult split_kv_decode(const Tensor& q, const PagedKVCache& cache, const SplitKVPlan& plan,
                                const AttentionOptions& opt = {});

}  // namespace flashstep::ref
