// Exercise 12 (chapter 7, "One lookup table for both: the block-sparse view"): describe a
// paged batch as a block-sparse matrix of (Br x Bc) blocks.
//
// Fill in build_view() below. Rows of the matrix are the batch's packed queries, cut into
// row blocks of Br queries that never cross into the next request; columns are the pool's
// token slots, one column block per page (Bc = page_size). A block is stored, in CSR form,
// iff some query of the row block may see some key of the page. The grader compares every
// array of your view with the reference's build_block_sparse.
//
//     cmake --build build --target flashstep_exercise_cpu_12_block_sparse_view
//     flashstep exercise check 12         (or run build/bin/flashstep_exercise_cpu_12_block_sparse_view)
//
// Stuck? `flashstep exercise hint 12`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::BlockSparseView;

/// The BSR view of a paged batch (see BlockSparseView in flashstep/reference/block_sparse.hpp
/// for every field). Within a row block, pages come in the request's order.
/// \param qo_indptr (batch + 1) packed query rows of each request
/// \param kv_indptr (batch + 1), kv_indices, kv_last_page_len (batch): the CSR page table
/// \param page_size slots per page, which is Bc
/// \param num_pages pages in the pool: the number of column blocks
/// \param Br queries per row block
/// \param causal, window_left the mask: flashstep::ref::key_visible(i, j, qo_len, kv_len,
///        causal, window_left) says whether query i of a request sees its key j
BlockSparseView build_view(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                           const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                           int64_t page_size, int64_t num_pages, int64_t Br, bool causal, int window_left) {
  BlockSparseView view;
  // TODO(exercise): fill every field of view.
  return view;
}
