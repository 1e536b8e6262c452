/// \file attention.hpp
/// \brief Reference attention: single and batch, decode and prefill, paged and ragged.
///
/// Conventions (FlashInfer's; see ARCHITECTURE.md and docs/concepts/05_paging.md):
/// - `q` rows are packed without padding; request i owns rows `qo_indptr[i]..qo_indptr[i+1]`.
/// - Causal masking is bottom-right aligned: query i of a request with `qo_len` queries
///   and `kv_len` keys sees key j iff `j <= i + (kv_len - qo_len)`.
/// - `window_left = w >= 0` additionally hides keys `j < i + (kv_len - qo_len) - w`
///   (the last w + 1 keys stay visible); -1 disables it. It applies with or without causal.
/// - `logits_soft_cap = c > 0` maps the scaled score s to `c * tanh(s / c)`.
/// - GQA: query head h reads kv head `h / (num_qo_heads / num_kv_heads)`.
/// - LSE is natural-log: `lse = log(sum_j exp(s_j))` over the visible keys (plus
///   `exp(sinks[h])` when AttentionOptions::sinks is given).
///
/// **Fully masked rows.** A query row that sees no key at all (kv_len 0, or a causal
/// request with more queries than keys, or a window that excludes everything) gets
/// output 0 and lse = -inf. That is the attention state of the empty set: it is the
/// identity of merge_state, so merging it with anything changes nothing.
///
/// Every function computes in double and returns double tensors.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <optional>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Order of the two inner axes of a KV tensor or page.
enum class KVLayout {
  NHD,  ///< (tokens, num_kv_heads, head_dim): a token's heads are adjacent
  HND,  ///< (num_kv_heads, tokens, head_dim): a head's tokens are adjacent
};

/// Parses "NHD" / "HND" (throws InvalidArgument naming `kv_layout` otherwise).
KVLayout parse_kv_layout(const std::string& name);
/// "NHD" or "HND".
const char* to_string(KVLayout layout);

/// Options shared by every attention entry point (FlashInfer's keyword arguments).
struct AttentionOptions {
  bool causal = false;  ///< bottom-right aligned causal mask
  /// Scale applied to q.k. Not given (the default): 1/sqrt(head_dim). When given it must
  /// be positive and finite (NaN is rejected, never read as "not given").
  std::optional<double> sm_scale;
  int window_left = -1;                ///< keep the last window_left + 1 keys; -1 = off
  double logits_soft_cap = 0.0;        ///< c > 0: s -> c * tanh(s / c); 0 = off
  KVLayout kv_layout = KVLayout::NHD;  ///< layout of k/v (single, ragged) or of each page
  /// Attention sinks (FlashInfer's run(sinks=)): empty = off, else one finite natural-log
  /// logit per query head. sinks[h] joins head h's softmax denominator and carries no
  /// value: o = sum_j e^{s_j} v_j / (e^{sinks[h]} + sum_j e^{s_j}), and lse is the log of
  /// that denominator. A row that sees no key then gets o = 0 and lse = sinks[h].
  std::vector<double> sinks;
};

/// The scale an attention call uses: `opt.sm_scale` when given, else 1/sqrt(head_dim).
double resolved_sm_scale(const AttentionOptions& opt, int64_t head_dim);

/// Throws InvalidArgument from `fn` when an option is out of range: a given sm_scale that
/// is not positive and finite, window_left below -1, a negative or non-finite soft cap.
void check_attention_options(const char* fn, const AttentionOptions& opt);

/// Output and natural-log LSE of an attention call.
struct AttentionResult {
  Tensor o;    ///< output, same leading shape as q: (..., num_qo_heads, head_dim)
  Tensor lse;  ///< log-sum-exp of the scaled (and capped) scores: (..., num_qo_heads)
};

/// A paged KV cache: the page pool plus its CSR page table.
///
/// `kv_len` of request i is `(pages_i - 1) * page_size + kv_last_page_len[i]`, where
/// `pages_i = kv_indptr[i+1] - kv_indptr[i]`. A request with zero pages has kv_len 0
/// (its last_page_len must then be 0).
struct PagedKVCache {
  /// Pool of shape (num_pages, 2, page_size, num_kv_heads, head_dim) for NHD or
  /// (num_pages, 2, num_kv_heads, page_size, head_dim) for HND; [:,0] is K, [:,1] is V.
  /// With v_pages given: K alone, (num_pages, 1, ...).
  Tensor pages;
  /// Not given (rank 0, the usual case): V is pages[:,1]. Given: V's own pool, for a V of
  /// another width than K's (FlashInfer's separate k_cache and v_cache; MLA's prefill, K
  /// 192 wide and V 128): (num_pages, 1, page_size, num_kv_heads, head_dim_vo) for NHD or
  /// (num_pages, 1, num_kv_heads, page_size, head_dim_vo) for HND.
  Tensor v_pages;
  KVLayout layout = KVLayout::NHD;        ///< layout of each page
  std::vector<int32_t> kv_indptr;         ///< (batch + 1): request i owns kv_indices[kv_indptr[i]:kv_indptr[i+1]]
  std::vector<int32_t> kv_indices;        ///< (kv_indptr[batch]): page ids in [0, num_pages)
  std::vector<int32_t> kv_last_page_len;  ///< (batch): tokens in each request's last page, 1..page_size

  /// Requests described by the page table (kv_indptr.size() - 1).
  int64_t batch_size() const { return static_cast<int64_t>(kv_indptr.size()) - 1; }
  /// Pages in the pool.
  int64_t num_pages() const { return pages.dim(0); }
  /// Tokens per page.
  int64_t page_size() const { return layout == KVLayout::NHD ? pages.dim(2) : pages.dim(3); }
  /// KV heads per token.
  int64_t num_kv_heads() const { return layout == KVLayout::NHD ? pages.dim(3) : pages.dim(2); }
  /// Elements per head of K.
  int64_t head_dim() const { return pages.dim(4); }
  /// Elements per head of V: head_dim() unless v_pages is given.
  int64_t head_dim_vo() const { return v_pages.rank() > 0 ? v_pages.dim(4) : head_dim(); }
  /// Keys held by request `i`.
  int64_t kv_len(int64_t i) const;
  /// Element (page, k_or_v, token-in-page, head, dim) whatever the layout.
  double at(int64_t page, int k_or_v, int64_t token, int64_t head, int64_t d) const;
  /// Writable element (page, k_or_v, token-in-page, head, dim) whatever the layout.
  /// \param page page id in [0, num_pages)
  /// \param k_or_v 0 for K, 1 for V
  /// \param token slot in the page, in [0, page_size)
  /// \param head KV head
  /// \param d element of the head, in [0, head_dim) (V: [0, head_dim_vo))
  double& at(int64_t page, int k_or_v, int64_t token, int64_t head, int64_t d);
};

/// Validates a paged cache (pool rank, CSR, page ids in range, last_page_len range).
/// Throws InvalidArgument naming `fn` and the offending field.
void check_paged_kv_cache(const char* fn, const PagedKVCache& cache);
/// The part of check_paged_kv_cache about the pools' shapes: pages (and v_pages, when
/// given) of rank 5 with K and V where the layout says, V's pool matching K's but for its
/// last dimension. Throws InvalidArgument naming `fn`.
void check_paged_kv_pools(const char* fn, const PagedKVCache& cache);

/// Decode one request: one query token per head against a contiguous KV.
/// \param q (num_qo_heads, head_dim)
/// \param k (kv_len, num_kv_heads, head_dim) for NHD, (num_kv_heads, kv_len, head_dim) for HND
/// \param v k's shape but for the last dimension, head_dim_vo (as single_prefill_with_kv_cache)
/// \param opt causal is ignored for decode (the one query is the last token)
/// \return o (num_qo_heads, head_dim_vo), lse (num_qo_heads)
AttentionResult single_decode_with_kv_cache(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& opt = {});

/// Prefill/append for one request.
/// \param q (qo_len, num_qo_heads, head_dim)
/// \param k (kv_len, num_kv_heads, head_dim) for NHD, (num_kv_heads, kv_len, head_dim) for HND
/// \param v k's shape but for the last dimension, head_dim_vo (head_dim, or another width:
///        DeepSeek's MLA prefill has head_dim 192 and head_dim_vo 128)
/// \param opt mask, scale (default 1/sqrt(head_dim)), window, soft cap and the layout of k and v
/// \return o (qo_len, num_qo_heads, head_dim_vo), lse (qo_len, num_qo_heads)
AttentionResult single_prefill_with_kv_cache(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt = {});

/// Batch decode through a paged KV cache: one query token per request.
/// \param q (batch_size, num_qo_heads, head_dim)
/// \param cache paged cache with `cache.batch_size() == batch_size`
/// \param opt causal is ignored (decode); opt.kv_layout is ignored (cache.layout rules)
/// \return o (batch_size, num_qo_heads, head_dim_vo), lse (batch_size, num_qo_heads)
AttentionResult batch_decode_with_paged_kv_cache(const Tensor& q, const PagedKVCache& cache,
                                                 const AttentionOptions& opt = {});

/// Batch prefill/append over ragged queries and a paged KV cache.
/// \param q (nnz_qo, num_qo_heads, head_dim), nnz_qo = qo_indptr[batch_size]
/// \param qo_indptr (batch_size + 1)
/// \param cache paged cache with the same batch size (V may have a width of its own: v_pages)
/// \param opt mask, scale, window and soft cap; opt.kv_layout is ignored (cache.layout rules)
/// \return o (nnz_qo, num_qo_heads, head_dim_vo), lse (nnz_qo, num_qo_heads)
AttentionResult batch_prefill_with_paged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                  const PagedKVCache& cache, const AttentionOptions& opt = {});

/// Batch prefill/append over ragged queries and ragged contiguous KV.
/// \param q (nnz_qo, num_qo_heads, head_dim)
/// \param qo_indptr (batch_size + 1)
/// \param k (nnz_kv, num_kv_heads, head_dim) for NHD, (num_kv_heads, nnz_kv, head_dim) for HND
/// \param v k's shape but for the last dimension, head_dim_vo (as single_prefill_with_kv_cache)
/// \param kv_indptr (batch_size + 1), kv_indptr[batch_size] == nnz_kv
/// \param opt mask, scale (default 1/sqrt(head_dim)), window, soft cap and the layout of k and v
/// \return o (nnz_qo, num_qo_heads, head_dim_vo), lse (nnz_qo, num_qo_heads)
AttentionResult batch_prefill_with_ragged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                   const Tensor& k, const Tensor& v,
                                                   const std::vector<int32_t>& kv_indptr,
                                                   const AttentionOptions& opt = {});

/// The visibility rule of the mask, exposed so that tests, stages and the block-sparse
/// view share one definition: may query `i` (0-based within its request) see key `j`?
bool key_visible(int64_t i, int64_t j, int64_t qo_len, int64_t kv_len, bool causal, int window_left);

/// The scaled, soft-capped, masked score matrix of one request and one query head,
/// shape (qo_len, kv_len); masked entries are -inf. Used to teach (the course's Br=3
/// table) and to check stages that materialize scores.
/// \param q (qo_len, num_qo_heads, head_dim)
/// \param k (kv_len, num_kv_heads, head_dim) (NHD) or HND per opt.kv_layout
/// \param qo_head the query head whose scores are returned (its kv head follows GQA)
/// \param opt mask, scale, window, soft cap and the layout of k
Tensor attention_scores(const Tensor& q, const Tensor& k, int64_t qo_head, const AttentionOptions& opt = {});

}  // namespace flashstep::ref
