/// \file block_sparse.hpp
/// \brief FlashInfer's view of a paged batch as a block-sparse matrix (BSR), for a
/// given (Br, Bc), and attention computed by walking it.
///
/// Rows of the matrix are the packed query positions of the batch (qo_indptr); columns
/// are the token slots of the page pool, grouped into column blocks of Bc = page_size
/// slots, so column block c *is* page c. Rows are grouped into row blocks of Br queries,
/// never across requests (request B with 4 queries and Br = 3 gives blocks [pos 0-2] and
/// [pos 3]). Block (row block, page) is non-zero iff some query of the row block may see
/// some key of that page under the mask (causal, window): with Br = 1 the table itself
/// encodes causality; with Br > 1 the mask must still be applied inside the block.
///
/// The course's first table (Br = 1, Bc = 1), as draw_block_sparse_lookup() prints it:
/// ```
///   A, pos 0 → pages [P0]
///   A, pos 1 → pages [P0, P1]
///   A, pos 2 → pages [P0, P1, P2]
///   B, pos 0 → pages [P0]
///   ...
/// ```
/// Query positions are positions in the request's sequence: query i of a request with
/// qo_len queries and kv_len keys sits at kv_len - qo_len + i (bottom-right alignment).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// A paged batch as a block-sparse row (BSR) matrix of (Br x Bc) blocks.
struct BlockSparseView {
  int64_t Br = 1;                    ///< query rows per row block (the query tile)
  int64_t Bc = 1;                    ///< key slots per column block, == page_size
  int64_t num_pages = 0;             ///< column blocks: pages of the pool
  bool causal = false;               ///< mask the view was built for
  int window_left = -1;              ///< mask the view was built for (-1 = off)
  std::vector<int32_t> qo_indptr;    ///< (batch + 1) the batch's packed query layout
  std::vector<int32_t> kv_len;       ///< (batch) keys of each request
  std::vector<int32_t> row_indptr;   ///< (num_row_blocks + 1) packed query rows of each row block
  std::vector<int32_t> row_request;  ///< (num_row_blocks) request that owns each row block
  std::vector<int32_t> indptr;       ///< (num_row_blocks + 1) CSR: blocks of row block b are [indptr[b], indptr[b+1])
  std::vector<int32_t> indices;      ///< (nnz_blocks) column block (= page id) of each block, in KV order
  std::vector<int32_t> block_kv_start;  ///< (nnz_blocks) KV position of the page's first slot in its request
  std::vector<int32_t> block_kv_len;    ///< (nnz_blocks) slots of the page in use: Bc, or last_page_len

  /// Requests in the batch.
  int64_t batch_size() const { return static_cast<int64_t>(qo_indptr.size()) - 1; }
  /// Row blocks (query tiles) of the whole batch.
  int64_t num_row_blocks() const { return static_cast<int64_t>(row_request.size()); }
  /// Non-zero (row block, page) blocks.
  int64_t nnz_blocks() const { return static_cast<int64_t>(indices.size()); }
};

/// Builds the BSR view of a paged batch.
/// \param qo_indptr (batch + 1) packed query rows per request
/// \param kv_indptr (batch + 1) CSR page table offsets
/// \param kv_indices (kv_indptr[batch]) page ids in [0, num_pages)
/// \param kv_last_page_len (batch) 1..page_size (0 for a request with no pages)
/// \param page_size slots per page, which is Bc; >= 1
/// \param num_pages pages in the pool (the number of column blocks); >= 1
/// \param Br query rows per row block; >= 1
/// \param causal bottom-right aligned causal mask
/// \param window_left -1, or keep the last window_left + 1 keys
BlockSparseView build_block_sparse(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                                   const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                                   int64_t page_size, int64_t num_pages, int64_t Br, bool causal = false,
                                   int window_left = -1);

/// The same for a PagedKVCache (page table, page_size and pool size taken from it).
BlockSparseView build_block_sparse(const std::vector<int32_t>& qo_indptr, const PagedKVCache& cache, int64_t Br,
                                   bool causal = false, int window_left = -1);

/// Attention computed the way a block-sparse kernel does it: for each row block, walk its
/// non-zero blocks in order, load the page's K/V once for all Br queries, apply the mask
/// inside the block, and fold the scores into a running (max, sum, output) per query
/// (online softmax). It reads only the view and the pool, never the page table, so it
/// checks the view: it must equal batch_prefill_with_paged_kv_cache on the same batch.
/// \param q (qo_indptr[batch], num_qo_heads, head_dim)
/// \param cache the pool the view indexes (its page table is not read); the view's Bc
///        and num_pages must match it
/// \param view built for the same batch; opt.causal and opt.window_left must equal the
///        view's (the view's blocks depend on them)
/// \param opt sm_scale (not given: 1/sqrt(head_dim)) and logits_soft_cap as for
///        batch_prefill_with_paged_kv_cache; causal and window_left as the view was built
/// \return o (nnz_qo, num_qo_heads, head_dim), lse (nnz_qo, num_qo_heads)
AttentionResult block_sparse_attention(const Tensor& q, const PagedKVCache& cache, const BlockSparseView& view,
                                       const AttentionOptions& opt = {});

/// Options of the block-sparse printers.
struct BlockSparseDrawOptions {
  /// Name of each request; default "A", "B", ... (then "R26", "R27", ...).
  std::vector<std::string> request_names;
  /// Text of each pool page (e.g. its tokens), printed as "(text)" under "Pk"; optional.
  std::vector<std::string> page_labels;
  /// Print "shared" or "<request>-only" under each page (from the blocks that use it).
  bool show_sharing = true;
  /// One line per query instead of per row block, the block drawn once on the block's
  /// middle line (the course's Br = 7 shared-prefix picture).
  bool one_line_per_query = false;
  /// Leave out row blocks with no non-zero block (the course's unique-suffix picture).
  bool skip_empty_rows = false;
  /// Name of each packed query row (size nnz_qo); default "<request>, pos <position>".
  std::vector<std::string> row_names;
};

/// Draws the view as the course's box table: one column per page in use, one row per row
/// block ("A, pos 0-2"), "Pk" in a cell where the block is non-zero.
std::string draw_block_sparse(const BlockSparseView& view, const BlockSparseDrawOptions& options = {});

/// The view as the course's lookup table, one line per row block:
/// "A, pos 2 → pages [P0, P1, P2]".
std::string draw_block_sparse_lookup(const BlockSparseView& view, const BlockSparseDrawOptions& options = {});

}  // namespace flashstep::ref
