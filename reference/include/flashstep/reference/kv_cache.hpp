/// \file kv_cache.hpp
/// \brief KV caches on the host: contiguous append, the paged pool's append, and gather.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// The simplest KV cache: one request's K and V, grown by appending rows (the course's
/// "KV Cache" section). Layout NHD: (kv_len, num_kv_heads, head_dim).
class ContiguousKVCache {
 public:
  /// An empty cache (kv_len 0) for the given head shape.
  /// \param num_kv_heads KV heads of every appended row
  /// \param head_dim elements per head
  ContiguousKVCache(int64_t num_kv_heads, int64_t head_dim);
  /// Append new keys/values.
  /// \param k_new (n, num_kv_heads, head_dim)
  /// \param v_new (n, num_kv_heads, head_dim)
  void append(const Tensor& k_new, const Tensor& v_new);
  /// Tokens held so far.
  int64_t kv_len() const { return k_.dim(0); }
  const Tensor& k() const { return k_; }  ///< (kv_len, num_kv_heads, head_dim)
  const Tensor& v() const { return v_; }  ///< (kv_len, num_kv_heads, head_dim)
  /// Bytes a fp16 cache of this length would hold (K and V), for the course's arithmetic.
  int64_t bytes_fp16() const { return 2 * k_.numel() * 2; }

 private:
  Tensor k_, v_;
};

/// For appended tokens packed by `append_indptr`, the request each token belongs to and
/// its position in that request's KV (FlashInfer's get_batch_indices_positions).
/// \param append_indptr (batch_size + 1) offsets of the appended tokens
/// \param seq_lens (batch_size) KV length of each request *after* the append
/// \param nnz number of appended tokens, == append_indptr[batch_size]
/// \return (batch_indices, positions), each of length nnz; position of the t-th appended
///         token of request i is seq_lens[i] - append_len_i + t
std::pair<std::vector<int32_t>, std::vector<int32_t>> get_batch_indices_positions(
    const std::vector<int32_t>& append_indptr, const std::vector<int32_t>& seq_lens, int64_t nnz);

/// Write appended K/V into the page pool (FlashInfer's append_paged_kv_cache). The page
/// table must already describe the lengths *after* the append (the caller allocated
/// pages and bumped kv_last_page_len first, as FlashInfer requires).
/// \param append_key (nnz, num_kv_heads, head_dim)
/// \param append_value (nnz, num_kv_heads, head_dim)
/// \param batch_indices (nnz) request of each appended token
/// \param positions (nnz) position of each token in its request's KV, < kv_len of that request
/// \param cache pool and page table; the pool is written in place
void append_paged_kv_cache(const Tensor& append_key, const Tensor& append_value,
                           const std::vector<int32_t>& batch_indices, const std::vector<int32_t>& positions,
                           PagedKVCache& cache);

/// Gather request `request`'s K and V back to contiguous tensors.
/// \return (k, v): k (kv_len, num_kv_heads, head_dim), v (kv_len, num_kv_heads, head_dim_vo),
///         NHD whatever the pool layout
std::pair<Tensor, Tensor> gather_paged_kv(const PagedKVCache& cache, int64_t request);

/// Build a paged cache holding the given contiguous per-request K/V (used by tests and
/// the tour): pages are assigned from `page_order` (a permutation or any list of distinct
/// page ids, at least as many as needed), in order.
/// \param k per-request keys, each (kv_len_i, num_kv_heads, head_dim)
/// \param v per-request values, same shapes as k
/// \param page_size tokens per page (>= 1)
/// \param layout NHD or HND layout of the pool
/// \param page_order physical page ids handed out in order, first to request 0's first page
/// \param num_pages pages in the pool (> every id used)
/// \return the pool (num_pages, 2, ...) and its CSR page table
PagedKVCache make_paged_kv_cache(const std::vector<Tensor>& k, const std::vector<Tensor>& v, int64_t page_size,
                                 KVLayout layout, const std::vector<int32_t>& page_order, int64_t num_pages);

}  // namespace flashstep::ref
