// Exercise 14 (chapter 8, "Cascade levels"): split a batch's page table into a shared
// level and a per-request level.
//
// Fill in two_levels() below. Requests that start with the same pages (a cached prompt
// prefix) form a group; level 0 lists each group's shared pages once, for all the group's
// queries together, and level 1 lists each request's own remaining pages. Both levels are
// ordinary CSR batches over the same page pool and the same packed queries, so stage 05
// (or FlashInfer's MultiLevelCascadeAttentionWrapper) can attend each and merge the
// states. The grader compares your levels with the reference's build_cascade_levels.
//
//     cmake --build build --target flashstep_exercise_cpu_14_cascade_levels
//     flashstep exercise check 14         (or run build/bin/flashstep_exercise_cpu_14_cascade_levels)
//
// Stuck? `flashstep exercise hint 14`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::CascadeLevels;

/// Two cascade levels (see CascadeLevel in flashstep/reference/cascade.hpp for the fields).
/// - The result's page_size and qo_indptr are the batch's.
/// - Level 0: request r's pages there are its first shared_pages[r] pages. Adjacent
///   requests whose level-0 page lists are equal (two empty lists are equal) form one
///   group; a group lists its pages once, owns its requests' queries (qo_indptr per
///   group) and requests (request_indptr), and its last page is full (kv_last_page_len =
///   page_size), or 0 if it has no pages. Not causal.
/// - Level 1: one group per request, holding the request's other pages; its
///   kv_last_page_len is the request's, or 0 if no page is left. Causal if `causal`.
/// \param qo_indptr (batch + 1) \param kv_indptr (batch + 1) \param kv_indices
/// \param kv_last_page_len (batch) the batch's CSR page table
/// \param page_size tokens per page
/// \param shared_pages (batch) pages of each request in level 0, at most its full pages
/// \param causal whether the last level is masked
CascadeLevels two_levels(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                         const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                         int64_t page_size, const std::vector<int32_t>& shared_pages, bool causal) {
  CascadeLevels levels;
  // TODO(exercise): fill levels.page_size, levels.qo_indptr and levels.levels (two of them).
  return levels;
}
