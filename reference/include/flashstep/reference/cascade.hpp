/// \file cascade.hpp
/// \brief Cascade (multi-level) attention: the description FlashInfer's
/// MultiLevelCascadeAttentionWrapper consumes, built from a batch whose requests share
/// prefix pages, and attention over it merged level by level.
///
/// The batch's KV is a tree: level 0 holds the prefix pages shared by the most requests,
/// each next level the pages shared by fewer, and the last level each request's own
/// pages. Every level views the same query array and the same page pool through its own
/// CSR arrays, in which a *group* (a subtree) is one "request":
///
/// ```
///   3 requests, R0 and R1 share P0 P1, all three share P0:
///     R0 = P0 P1 P2    R1 = P0 P1 P3 P4    R2 = P0 P5
///
///   level 0  qo_indptr [0, q0+q1+q2]        kv pages [P0]         one group: all queries
///   level 1  qo_indptr [0, q0+q1, +q2]      kv pages [P1] []      {R0, R1} and {R2}
///   level 2  qo_indptr [0, q0, q0+q1, +q2]  kv pages [P2] [P3 P4] [P5]   one per request
/// ```
///
/// A shared level treats all queries of its group as one row block (one tall query tile
/// that reads the shared pages once); it is not masked. The causal mask applies to the
/// last level only, which is exact only if every query sits after all shared pages of its
/// request: qo_len <= the request's last-level kv_len. That holds for decode and for
/// append after a cached prefix; build_cascade_levels checks it. (The course's Br = 7
/// picture groups the prefill queries of the prefix tokens themselves; "A, pos 0" would
/// then see "cat", so that picture is a sketch, not an exact cascade.)
///
/// The states of the levels are merged with merge_state, exactly as FlashInfer does:
/// start from the last level, merge in each shared level.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/block_sparse.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// One level: a batch of groups, each a contiguous run of requests and their queries.
struct CascadeLevel {
  std::vector<int32_t> qo_indptr;         ///< (num_groups + 1) query rows of each group
  std::vector<int32_t> kv_indptr;         ///< (num_groups + 1) CSR offsets into kv_indices
  std::vector<int32_t> kv_indices;        ///< (kv_indptr[num_groups]) the group's pages at this level
  std::vector<int32_t> kv_last_page_len;  ///< (num_groups) page_size for shared levels, 0 for no pages
  std::vector<int32_t> request_indptr;    ///< (num_groups + 1) requests of each group
  bool causal = false;                    ///< true only for the last level of a causal cascade
};

/// The multi-level description of a batch (FlashInfer's plan() arguments, per level).
struct CascadeLevels {
  int64_t page_size = 1;             ///< tokens per page of the shared pool
  std::vector<int32_t> qo_indptr;    ///< (batch + 1) the batch's own query layout
  std::vector<CascadeLevel> levels;  ///< levels[0] most shared ... levels.back() per request
};

/// Builds the levels from the batch's flat page table and where each level ends.
/// \param qo_indptr (batch + 1) query rows of each request
/// \param kv_indptr (batch + 1) the flat CSR page table: request r owns
///        kv_indices[kv_indptr[r] : kv_indptr[r+1]]
/// \param kv_indices (kv_indptr[batch]) page ids; each level takes a prefix of a
///        request's list, so its shared pages come first
/// \param kv_last_page_len (batch) 1..page_size, 0 for a request with no pages
/// \param page_size >= 1
/// \param level_page_ends (num_levels - 1) x (batch): level_page_ends[l][r] = pages of
///        request r in levels 0..l. Non-decreasing in l, and only whole pages may be shared
///        (at most the request's full pages). Empty for a single level. Adjacent requests
///        whose pages at a level are identical (and that share every earlier level) form
///        one group; an empty segment is an empty shared prefix (kv_len 0: the level
///        contributes the empty state, the identity of the merge).
/// \param causal mask the last level; then every request needs qo_len <= its last-level
///        kv_len (its queries after all its shared pages)
CascadeLevels build_cascade_levels(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                                   const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                                   int64_t page_size, const std::vector<std::vector<int32_t>>& level_page_ends,
                                   bool causal);

/// Derives level_page_ends from shared page ids, e.g. page tables assembled from
/// RadixCache::match_prefix results (requests that reuse a cached prefix hold the same
/// page ids). The rule, level by level: within each group of the level above (the whole
/// batch for level 0), maximal runs of adjacent requests whose next shareable page is the
/// same page form a group, which takes the longest run of pages all its requests share;
/// a request alone takes nothing at that level. A page is shareable if it is a full page
/// and, when causal, lies wholly before the request's first query (so the cascade stays
/// exact).
/// \param qo_indptr (batch + 1) query rows of each request
/// \param kv_indptr (batch + 1) CSR offsets into kv_indices
/// \param kv_indices (kv_indptr[batch]) page ids; a page id held by several requests is
///        a page they share
/// \param kv_last_page_len (batch) 1..page_size, 0 for a request with no pages
/// \param page_size tokens per page, >= 1 (only full pages are shareable)
/// \param num_levels >= 1
/// \param causal the cascade will be causal: a page is shareable only if it lies wholly
///        before the request's first query
/// \return (num_levels - 1) x (batch) cumulative page counts for build_cascade_levels
std::vector<std::vector<int32_t>> derive_cascade_level_ends(const std::vector<int32_t>& qo_indptr,
                                                            const std::vector<int32_t>& kv_indptr,
                                                            const std::vector<int32_t>& kv_indices,
                                                            const std::vector<int32_t>& kv_last_page_len,
                                                            int64_t page_size, int64_t num_levels, bool causal);

/// Output of cascade_attention, with every level's state (for teaching and for checking
/// a cascade kernel's intermediates).
struct CascadeResult {
  Tensor o;                            ///< (nnz_qo, num_qo_heads, head_dim) merged output
  Tensor lse;                          ///< (nnz_qo, num_qo_heads) merged natural-log LSE
  std::vector<AttentionResult> level;  ///< per level: that level's (o, lse) alone
};

/// Attention through the levels, merged level by level (FlashInfer's order: the last
/// level's state, then each shared level merged into it). Each level runs
/// batch_prefill_with_paged_kv_cache on its own CSR view of the same pool.
/// \param q (qo_indptr[batch], num_qo_heads, head_dim)
/// \param levels from build_cascade_levels; levels.page_size must be the pool's page_size
/// \param paged_kv_cache pool (num_pages, 2, page_size, H, D) for NHD or (..., H, page_size, D) for HND
/// \param layout NHD or HND, the layout of paged_kv_cache
/// \param opt opt.causal must equal the last level's causal; window_left must be -1 (a
///        window needs key positions, which shared levels do not carry)
CascadeResult cascade_attention(const Tensor& q, const CascadeLevels& levels, const Tensor& paged_kv_cache,
                                KVLayout layout, const AttentionOptions& opt = {});

/// Draws each level as a block-sparse table (draw_block_sparse): a shared level as one
/// row block per group drawn one line per query, the last level with Br = 1. Rows are
/// named "<request>, pos <position in the whole sequence>".
/// \param levels from build_cascade_levels
/// \param options request_names and page_labels are used; the rest is set per level
std::string draw_cascade(const CascadeLevels& levels, const BlockSparseDrawOptions& options = {});

}  // namespace flashstep::ref
