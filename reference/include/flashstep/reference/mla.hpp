/// \file mla.hpp
/// \brief Multi-head latent attention (MLA, DeepSeek-V2/V3), in its two forms, over a
/// contiguous or a paged latent cache.
///
/// MLA caches, per token, one shared latent c (kv_lora_rank wide, 512 in DeepSeek-V3) and
/// one rotary key k_pe (rope_dim wide, 64), instead of a key and a value per head. Head h
/// recovers its key and value through two up-projections (DeepSeek-AI, "DeepSeek-V2: A
/// Strong, Economical, and Efficient Mixture-of-Experts Language Model", section 2.1,
/// <https://arxiv.org/abs/2405.04434>):
///
///     k_h = [ W_UK[h] c ; k_pe ]    (head_dim_nope + rope_dim)      v_h = W_UV[h] c   (head_dim_vo)
///     q_h = [ q_nope_h ; q_pe_h ]   s_hj = sm_scale (q_h . k_hj)    o_h = softmax_j(s_hj) v_hj
///
/// That is the **naive form** (mla_naive): ordinary attention after the up-projection,
/// with a query/key head dim (head_dim_nope + rope_dim, 192) unlike the value's (128).
/// Because q_nope_h . (W_UK[h] c) = (W_UK[h]^T q_nope_h) . c, and the softmax weights are
/// the same for every column of v, both projections move off the keys:
///
///     q_lat_h = W_UK[h]^T q_nope_h                      (kv_lora_rank)   mla_absorb_query
///     s_hj   = sm_scale (q_lat_h . c_j + q_pe_h . k_pe_j)
///     o_lat_h = softmax_j(s_hj) c_j                     (kv_lora_rank)   mla_attention
///     o_h    = W_UV[h] o_lat_h                          (head_dim_vo)    mla_project_output
///
/// That is the **absorbed form**, the one FlashInfer's MLA kernels run (its q_nope is
/// q_lat, its output o_lat): every head attends to the same latents, so decode with H
/// heads is a product of an (H x 576) query block with the (576 x kv_len) cache, not H
/// dot products per key. sm_scale is 1/sqrt(head_dim_nope + rope_dim), the query/key head
/// dim *before* absorption: the latent shapes do not tell it, so mla_attention asks for it.
///
/// Masks follow attention.hpp (causal bottom-right aligned; a row that sees no key gets
/// o = 0, lse = -inf); lse is natural-log. Every function computes in double.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// The up-projections of one MLA layer.
struct MlaWeights {
  Tensor w_uk;  ///< (num_heads, head_dim_nope, kv_lora_rank): head h's key is W_UK[h] c
  Tensor w_uv;  ///< (num_heads, head_dim_vo, kv_lora_rank): head h's value is W_UV[h] c
};

/// Options of the MLA calls: a causal mask (bottom-right aligned) and the scale.
struct MlaOptions {
  bool causal = false;  ///< bottom-right aligned causal mask (append: query i sees keys up to i + kv_len - qo_len)
  /// Scale of the scores. mla_naive: not given means 1/sqrt(head_dim_nope + rope_dim).
  /// mla_attention and the batch calls: required (the absorbed shapes do not carry
  /// head_dim_nope).
  std::optional<double> sm_scale;
};

/// MLA over one request, naive form: up-project the latents into per-head keys and values,
/// then attend.
/// \param q_nope (qo_len, num_heads, head_dim_nope)
/// \param q_pe (qo_len, num_heads, rope_dim)
/// \param ckv (kv_len, kv_lora_rank) the latents
/// \param kpe (kv_len, rope_dim) the rotary keys
/// \param w W_UK (num_heads, head_dim_nope, kv_lora_rank), W_UV (num_heads, head_dim_vo, kv_lora_rank)
/// \param opt causal, and sm_scale (default 1/sqrt(head_dim_nope + rope_dim))
/// \return o (qo_len, num_heads, head_dim_vo), lse (qo_len, num_heads)
AttentionResult mla_naive(const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                          const MlaWeights& w, const MlaOptions& opt = {});

/// q_lat_h = W_UK[h]^T q_nope_h for every query token and head.
/// \param q_nope (n, num_heads, head_dim_nope) \param w_uk (num_heads, head_dim_nope, kv_lora_rank)
/// \return (n, num_heads, kv_lora_rank)
Tensor mla_absorb_query(const Tensor& q_nope, const Tensor& w_uk);

/// o_h = W_UV[h] o_lat_h for every query token and head.
/// \param o_lat (n, num_heads, kv_lora_rank) \param w_uv (num_heads, head_dim_vo, kv_lora_rank)
/// \return (n, num_heads, head_dim_vo)
Tensor mla_project_output(const Tensor& o_lat, const Tensor& w_uv);

/// MLA over one request, absorbed form: every head attends to the shared latents.
/// \param q_lat (qo_len, num_heads, kv_lora_rank) the absorbed queries (FlashInfer's q_nope)
/// \param q_pe (qo_len, num_heads, rope_dim)
/// \param ckv (kv_len, kv_lora_rank) \param kpe (kv_len, rope_dim)
/// \param opt causal; sm_scale required (1/sqrt(head_dim_nope + rope_dim) for a model)
/// \return o_lat (qo_len, num_heads, kv_lora_rank), lse (qo_len, num_heads)
AttentionResult mla_attention(const Tensor& q_lat, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                              const MlaOptions& opt);

/// A paged latent cache, as FlashInfer's MLA wrapper takes it: two pools sharing one page
/// table, and each request's length given directly (kv_len_arr) rather than as a last
/// page's fill.
struct PagedLatentCache {
  Tensor ckv_pages;                 ///< (num_pages, page_size, kv_lora_rank)
  Tensor kpe_pages;                 ///< (num_pages, page_size, rope_dim)
  std::vector<int32_t> kv_indptr;   ///< (batch + 1): request i owns kv_indices[kv_indptr[i]:kv_indptr[i+1]]
  std::vector<int32_t> kv_indices;  ///< (kv_indptr[batch]) page ids in [0, num_pages)
  std::vector<int32_t> kv_len;      ///< (batch) keys of each request, within its pages

  /// Requests described by the page table (kv_indptr.size() - 1).
  int64_t batch_size() const { return static_cast<int64_t>(kv_indptr.size()) - 1; }
  /// Tokens per page.
  int64_t page_size() const { return ckv_pages.dim(1); }
};

/// Validates a paged latent cache: pool ranks, the two pools' agreement (pages, page size),
/// the CSR table, page ids in range, and every kv_len within its pages (more than the
/// pages before the last, at most all of them). Throws InvalidArgument naming `fn`.
void check_paged_latent_cache(const char* fn, const PagedLatentCache& cache);

/// Request `request`'s latents and rotary keys, gathered from the pages.
/// \return (ckv (kv_len, kv_lora_rank), kpe (kv_len, rope_dim))
std::pair<Tensor, Tensor> gather_latents(const PagedLatentCache& cache, int64_t request);

/// Batch MLA, absorbed form, over a paged latent cache: decode (one query per request) or
/// causal append (several, as speculative decoding and chunked prefill use).
/// \param q_lat (nnz_qo, num_heads, kv_lora_rank) \param q_pe (nnz_qo, num_heads, rope_dim)
/// \param qo_indptr (batch + 1) \param cache the latent pools and their page table
/// \param opt causal; sm_scale required
/// \return o_lat (nnz_qo, num_heads, kv_lora_rank), lse (nnz_qo, num_heads)
AttentionResult batch_mla_paged_attention(const Tensor& q_lat, const Tensor& q_pe,
                                          const std::vector<int32_t>& qo_indptr, const PagedLatentCache& cache,
                                          const MlaOptions& opt);

/// Batch MLA, absorbed form, over ragged contiguous latents.
/// \param q_lat (nnz_qo, num_heads, kv_lora_rank) \param q_pe (nnz_qo, num_heads, rope_dim)
/// \param qo_indptr (batch + 1)
/// \param ckv (nnz_kv, kv_lora_rank) \param kpe (nnz_kv, rope_dim) \param kv_indptr (batch + 1)
/// \param opt causal; sm_scale required
/// \return o_lat (nnz_qo, num_heads, kv_lora_rank), lse (nnz_qo, num_heads)
AttentionResult batch_mla_ragged_attention(const Tensor& q_lat, const Tensor& q_pe,
                                           const std::vector<int32_t>& qo_indptr, const Tensor& ckv, const Tensor& kpe,
                                           const std::vector<int32_t>& kv_indptr, const MlaOptions& opt);

}  // namespace flashstep::ref
