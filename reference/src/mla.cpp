// Reference MLA. Both forms reduce to one routine, attend_heads(): per head, softmax
// attention of the request's queries over keys and values given as per-head matrices (the
// naive form's up-projected ones), or over the shared latents (the absorbed form, where
// every head reads the same matrix). Paged and ragged inputs are gathered to contiguous
// latents first, so they share every line of the arithmetic.
#include "flashstep/reference/mla.hpp"

#include <Eigen/Dense>
#include <cmath>
#include <limits>
#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Row `row` of a rank-3 tensor's slice [:, head, :] as a vector: t[row, head, :].
Eigen::VectorXd row_of(const Tensor& t, int64_t row, int64_t head) {
  Eigen::VectorXd v(t.dim(2));
  for (int64_t d = 0; d < t.dim(2); ++d) v(d) = t({row, head, d});
  return v;
}

/// A rank-2 tensor as a matrix.
Matrix matrix_of(const Tensor& t) {
  Matrix m(t.dim(0), t.dim(1));
  for (int64_t i = 0; i < t.dim(0); ++i)
    for (int64_t j = 0; j < t.dim(1); ++j) m(i, j) = t({i, j});
  return m;
}

/// Head h's slice [h, :, :] of a rank-3 weight tensor, as a matrix.
Matrix head_matrix(const Tensor& w, int64_t h) {
  Matrix m(w.dim(1), w.dim(2));
  for (int64_t i = 0; i < w.dim(1); ++i)
    for (int64_t j = 0; j < w.dim(2); ++j) m(i, j) = w({h, i, j});
  return m;
}

/// Softmax attention of one head: queries q (qo_len, dqk) over keys k (kv_len, dqk) and
/// values v (kv_len, dvo), scores scaled by `scale`, the causal mask bottom-right aligned.
/// Writes o[i] (dvo) and lse[i] for every query row i through `store`.
template <typename Store>
void attend_head(const Matrix& q, const Matrix& k, const Matrix& v, double scale, bool causal, Store&& store) {
  const int64_t qo_len = q.rows(), kv_len = k.rows();
  const Matrix s = (q * k.transpose()) * scale;
  for (int64_t i = 0; i < qo_len; ++i) {
    double m = kNegInf;
    for (int64_t j = 0; j < kv_len; ++j)
      if (key_visible(i, j, qo_len, kv_len, causal, -1)) m = std::max(m, s(i, j));
    Eigen::VectorXd o = Eigen::VectorXd::Zero(v.cols());
    if (m == kNegInf) {  // no visible key: the empty state
      store(i, o, kNegInf);
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < kv_len; ++j) {
      if (!key_visible(i, j, qo_len, kv_len, causal, -1)) continue;
      const double p = std::exp(s(i, j) - m);
      sum += p;
      o += p * v.row(j).transpose();
    }
    store(i, o / sum, m + std::log(sum));
  }
}

void check_scale(const char* fn, const MlaOptions& opt, bool required) {
  require(!required || opt.sm_scale.has_value(), fn,
          "sm_scale is required: MLA's scale is 1/sqrt(head_dim_nope + rope_dim), the query/key head dim "
          "before absorption, which the latent shapes do not tell");
  require(!opt.sm_scale || (std::isfinite(*opt.sm_scale) && *opt.sm_scale > 0), fn,
          "sm_scale must be a positive finite number (got " +
              (opt.sm_scale ? std::to_string(*opt.sm_scale) : std::string("none")) + ")");
}

/// Checks the queries: `q_name` (n, H, width) and q_pe (n, H, rope_dim), finite.
void check_queries(const char* fn, const char* q_name, const Tensor& q, const Tensor& q_pe) {
  check_rank(fn, q_name, q, 3);
  check_rank(fn, "q_pe", q_pe, 3);
  require_lazy(q_pe.dim(0) == q.dim(0) && q_pe.dim(1) == q.dim(1), fn, [&] {
    return std::string("q_pe ") + shape_string(q_pe.shape) + " must have " + q_name + "'s tokens and heads " +
           shape_string(q.shape);
  });
  require(q.dim(1) >= 1 && q.dim(2) >= 1 && q_pe.dim(2) >= 1, fn, "num_heads and the head widths must be positive");
  check_storage(fn, q_name, q);
  check_storage(fn, "q_pe", q_pe);
  check_finite(fn, q_name, q);
  check_finite(fn, "q_pe", q_pe);
}

/// Checks contiguous latents: ckv (kv, rank) and kpe (kv, rope), finite.
void check_latents(const char* fn, const Tensor& ckv, const Tensor& kpe, int64_t rank, int64_t rope) {
  check_rank(fn, "ckv", ckv, 2);
  check_rank(fn, "kpe", kpe, 2);
  check_dim(fn, "ckv", ckv, 1, rank, "kv_lora_rank, must match the queries'");
  check_dim(fn, "kpe", kpe, 1, rope, "rope_dim, must match q_pe");
  check_dim(fn, "kpe", kpe, 0, ckv.dim(0), "kv tokens, must match ckv");
  check_storage(fn, "ckv", ckv);
  check_storage(fn, "kpe", kpe);
  check_finite(fn, "ckv", ckv);
  check_finite(fn, "kpe", kpe);
}

/// The absorbed form over one request's rows [q0, q0 + qo_len) of q_lat/q_pe and its
/// contiguous latents, into rows [q0, ...) of o and lse.
void attend_latents(const Tensor& q_lat, const Tensor& q_pe, int64_t q0, int64_t qo_len, const Matrix& keys,
                    const Matrix& values, double scale, bool causal, Tensor& o, Tensor& lse) {
  const int64_t heads = q_lat.dim(1), rank = q_lat.dim(2), rope = q_pe.dim(2);
  for (int64_t h = 0; h < heads; ++h) {
    Matrix q(qo_len, rank + rope);  // [q_lat_h ; q_pe_h], against keys [c ; k_pe]
    for (int64_t i = 0; i < qo_len; ++i) {
      q.row(i).head(rank) = row_of(q_lat, q0 + i, h).transpose();
      q.row(i).tail(rope) = row_of(q_pe, q0 + i, h).transpose();
    }
    attend_head(q, keys, values, scale, causal, [&](int64_t i, const Eigen::VectorXd& out, double l) {
      for (int64_t d = 0; d < rank; ++d) o({q0 + i, h, d}) = out(d);
      lse({q0 + i, h}) = l;
    });
  }
}

/// The keys [c ; k_pe] (kv, rank + rope) and values c (kv, rank) of contiguous latents.
std::pair<Matrix, Matrix> latent_keys_values(const Tensor& ckv, const Tensor& kpe) {
  Matrix keys(ckv.dim(0), ckv.dim(1) + kpe.dim(1));
  keys << matrix_of(ckv), matrix_of(kpe);
  return {keys, matrix_of(ckv)};
}

}  // namespace

AttentionResult mla_naive(const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                          const MlaWeights& w, const MlaOptions& opt) {
  constexpr const char* fn = "mla_naive";
  check_queries(fn, "q_nope", q_nope, q_pe);
  check_rank(fn, "w.w_uk", w.w_uk, 3);
  check_rank(fn, "w.w_uv", w.w_uv, 3);
  check_rank(fn, "ckv", ckv, 2);
  check_latents(fn, ckv, kpe, ckv.dim(1), q_pe.dim(2));
  check_dim(fn, "w.w_uk", w.w_uk, 0, q_nope.dim(1), "num_heads, must match q_nope");
  check_dim(fn, "w.w_uk", w.w_uk, 1, q_nope.dim(2), "head_dim_nope, must match q_nope");
  check_dim(fn, "w.w_uk", w.w_uk, 2, ckv.dim(1), "kv_lora_rank, must match ckv");
  check_dim(fn, "w.w_uv", w.w_uv, 0, q_nope.dim(1), "num_heads, must match q_nope");
  check_dim(fn, "w.w_uv", w.w_uv, 2, ckv.dim(1), "kv_lora_rank, must match ckv");
  require(w.w_uv.dim(1) >= 1, fn, "w.w_uv's head_dim_vo must be positive");
  check_storage(fn, "w.w_uk", w.w_uk);
  check_storage(fn, "w.w_uv", w.w_uv);
  check_finite(fn, "w.w_uk", w.w_uk);
  check_finite(fn, "w.w_uv", w.w_uv);
  check_scale(fn, opt, false);
  const int64_t qo_len = q_nope.dim(0), heads = q_nope.dim(1), nope = q_nope.dim(2), rope = q_pe.dim(2);
  const int64_t kv_len = ckv.dim(0), dvo = w.w_uv.dim(1);
  const double scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(static_cast<double>(nope + rope));
  const Matrix c = matrix_of(ckv), k_pe = matrix_of(kpe);
  AttentionResult r{Tensor({qo_len, heads, dvo}), Tensor({qo_len, heads})};
  for (int64_t h = 0; h < heads; ++h) {
    // k_hj = [W_UK[h] c_j ; k_pe_j], v_hj = W_UV[h] c_j: the per-head cache MLA never stores
    Matrix k(kv_len, nope + rope);
    k << c * head_matrix(w.w_uk, h).transpose(), k_pe;
    const Matrix v = c * head_matrix(w.w_uv, h).transpose();
    Matrix q(qo_len, nope + rope);
    for (int64_t i = 0; i < qo_len; ++i) {
      q.row(i).head(nope) = row_of(q_nope, i, h).transpose();
      q.row(i).tail(rope) = row_of(q_pe, i, h).transpose();
    }
    attend_head(q, k, v, scale, opt.causal, [&](int64_t i, const Eigen::VectorXd& out, double l) {
      for (int64_t d = 0; d < dvo; ++d) r.o({i, h, d}) = out(d);
      r.lse({i, h}) = l;
    });
  }
  return r;
}

namespace {

/// y[i, h] = M_h x[i, h] for every token i and head h, with M_h = w[h] or, transposed,
/// w[h]^T: the per-head projections of the absorbed form.
Tensor project_heads(const Tensor& x, const Tensor& w, bool transposed) {
  const int64_t n = x.dim(0), heads = x.dim(1), out_dim = transposed ? w.dim(2) : w.dim(1);
  Tensor y({n, heads, out_dim});
  for (int64_t h = 0; h < heads; ++h) {
    const Matrix m = transposed ? Matrix(head_matrix(w, h).transpose()) : head_matrix(w, h);
    for (int64_t i = 0; i < n; ++i) {
      const Eigen::VectorXd out = m * row_of(x, i, h);
      for (int64_t d = 0; d < out_dim; ++d) y({i, h, d}) = out(d);
    }
  }
  return y;
}

}  // namespace

Tensor mla_absorb_query(const Tensor& q_nope, const Tensor& w_uk) {
  constexpr const char* fn = "mla_absorb_query";
  check_rank(fn, "q_nope", q_nope, 3);
  check_rank(fn, "w_uk", w_uk, 3);
  check_dim(fn, "w_uk", w_uk, 0, q_nope.dim(1), "num_heads, must match q_nope");
  check_dim(fn, "w_uk", w_uk, 1, q_nope.dim(2), "head_dim_nope, must match q_nope");
  return project_heads(q_nope, w_uk, true);  // W_UK[h]^T q_nope_h: (rank, nope) x (nope)
}

Tensor mla_project_output(const Tensor& o_lat, const Tensor& w_uv) {
  constexpr const char* fn = "mla_project_output";
  check_rank(fn, "o_lat", o_lat, 3);
  check_rank(fn, "w_uv", w_uv, 3);
  check_dim(fn, "w_uv", w_uv, 0, o_lat.dim(1), "num_heads, must match o_lat");
  check_dim(fn, "w_uv", w_uv, 2, o_lat.dim(2), "kv_lora_rank, must match o_lat");
  return project_heads(o_lat, w_uv, false);  // W_UV[h] o_lat_h: (vo, rank) x (rank)
}

AttentionResult mla_attention(const Tensor& q_lat, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                              const MlaOptions& opt) {
  constexpr const char* fn = "mla_attention";
  check_queries(fn, "q_lat", q_lat, q_pe);
  check_latents(fn, ckv, kpe, q_lat.dim(2), q_pe.dim(2));
  check_scale(fn, opt, true);
  AttentionResult r{Tensor({q_lat.dim(0), q_lat.dim(1), q_lat.dim(2)}), Tensor({q_lat.dim(0), q_lat.dim(1)})};
  const auto [keys, values] = latent_keys_values(ckv, kpe);
  attend_latents(q_lat, q_pe, 0, q_lat.dim(0), keys, values, *opt.sm_scale, opt.causal, r.o, r.lse);
  return r;
}

void check_paged_latent_cache(const char* fn, const PagedLatentCache& cache) {
  check_rank(fn, "ckv_pages", cache.ckv_pages, 3);
  check_rank(fn, "kpe_pages", cache.kpe_pages, 3);
  check_dim(fn, "kpe_pages", cache.kpe_pages, 0, cache.ckv_pages.dim(0), "num_pages, must match ckv_pages");
  check_dim(fn, "kpe_pages", cache.kpe_pages, 1, cache.ckv_pages.dim(1), "page_size, must match ckv_pages");
  require(cache.page_size() >= 1, fn, "page_size must be >= 1");
  check_storage(fn, "ckv_pages", cache.ckv_pages);
  check_storage(fn, "kpe_pages", cache.kpe_pages);
  require(!cache.kv_indptr.empty(), fn, "kv_indptr must hold batch_size + 1 offsets");
  check_indptr(fn, "kv_indptr", cache.kv_indptr, -1, static_cast<int64_t>(cache.kv_indices.size()));
  const int64_t batch = cache.batch_size();
  require(static_cast<int64_t>(cache.kv_len.size()) == batch, fn,
          "kv_len must hold one length per request (" + std::to_string(batch) + "), got " +
              std::to_string(cache.kv_len.size()));
  const int64_t num_pages = cache.ckv_pages.dim(0), page = cache.page_size();
  for (size_t i = 0; i < cache.kv_indices.size(); ++i)
    require(cache.kv_indices[i] >= 0 && cache.kv_indices[i] < num_pages, fn,
            "kv_indices[" + std::to_string(i) + "] = " + std::to_string(cache.kv_indices[i]) +
                " is not a page of the pool (num_pages " + std::to_string(num_pages) + ")");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t pages = cache.kv_indptr[b + 1] - cache.kv_indptr[b], len = cache.kv_len[b];
    require(len >= 0 && len <= pages * page && (pages == 0 ? len == 0 : len > (pages - 1) * page), fn,
            "kv_len[" + std::to_string(b) + "] = " + std::to_string(len) + " does not fit request " +
                std::to_string(b) + "'s " + std::to_string(pages) + " pages of " + std::to_string(page) +
                " (it must need every page it owns)");
  }
}

std::pair<Tensor, Tensor> gather_latents(const PagedLatentCache& cache, int64_t request) {
  const int64_t len = cache.kv_len[static_cast<size_t>(request)], page = cache.page_size();
  const int64_t rank = cache.ckv_pages.dim(2), rope = cache.kpe_pages.dim(2);
  Tensor ckv({len, rank}), kpe({len, rope});
  for (int64_t t = 0; t < len; ++t) {
    const int64_t p = cache.kv_indices[static_cast<size_t>(cache.kv_indptr[request] + t / page)], slot = t % page;
    for (int64_t d = 0; d < rank; ++d) ckv({t, d}) = cache.ckv_pages({p, slot, d});
    for (int64_t d = 0; d < rope; ++d) kpe({t, d}) = cache.kpe_pages({p, slot, d});
  }
  return {ckv, kpe};
}

AttentionResult batch_mla_paged_attention(const Tensor& q_lat, const Tensor& q_pe,
                                          const std::vector<int32_t>& qo_indptr, const PagedLatentCache& cache,
                                          const MlaOptions& opt) {
  constexpr const char* fn = "batch_mla_paged_attention";
  check_paged_latent_cache(fn, cache);
  check_indptr(fn, "qo_indptr", qo_indptr, cache.batch_size() + 1, q_lat.dim(0));
  check_queries(fn, "q_lat", q_lat, q_pe);
  check_dim(fn, "ckv_pages", cache.ckv_pages, 2, q_lat.dim(2), "kv_lora_rank, must match q_lat");
  check_dim(fn, "kpe_pages", cache.kpe_pages, 2, q_pe.dim(2), "rope_dim, must match q_pe");
  check_scale(fn, opt, true);
  AttentionResult r{Tensor({q_lat.dim(0), q_lat.dim(1), q_lat.dim(2)}), Tensor({q_lat.dim(0), q_lat.dim(1)})};
  for (int64_t b = 0; b < cache.batch_size(); ++b) {
    const auto [ckv, kpe] = gather_latents(cache, b);
    // only the slots a request owns are read, so only they must be finite
    check_finite(fn, "ckv_pages (a request's tokens)", ckv);
    check_finite(fn, "kpe_pages (a request's tokens)", kpe);
    const auto [keys, values] = latent_keys_values(ckv, kpe);
    attend_latents(q_lat, q_pe, qo_indptr[b], qo_indptr[b + 1] - qo_indptr[b], keys, values, *opt.sm_scale, opt.causal,
                   r.o, r.lse);
  }
  return r;
}

AttentionResult batch_mla_ragged_attention(const Tensor& q_lat, const Tensor& q_pe,
                                           const std::vector<int32_t>& qo_indptr, const Tensor& ckv, const Tensor& kpe,
                                           const std::vector<int32_t>& kv_indptr, const MlaOptions& opt) {
  constexpr const char* fn = "batch_mla_ragged_attention";
  check_queries(fn, "q_lat", q_lat, q_pe);
  check_latents(fn, ckv, kpe, q_lat.dim(2), q_pe.dim(2));
  require(!qo_indptr.empty(), fn, "qo_indptr must hold batch_size + 1 offsets");
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  check_indptr(fn, "qo_indptr", qo_indptr, batch + 1, q_lat.dim(0));
  check_indptr(fn, "kv_indptr", kv_indptr, batch + 1, ckv.dim(0));
  check_scale(fn, opt, true);
  AttentionResult r{Tensor({q_lat.dim(0), q_lat.dim(1), q_lat.dim(2)}), Tensor({q_lat.dim(0), q_lat.dim(1)})};
  const auto [keys, values] = latent_keys_values(ckv, kpe);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t k0 = kv_indptr[b], kv_len = kv_indptr[b + 1] - k0;
    attend_latents(q_lat, q_pe, qo_indptr[b], qo_indptr[b + 1] - qo_indptr[b], keys.middleRows(k0, kv_len),
                   values.middleRows(k0, kv_len), *opt.sm_scale, opt.causal, r.o, r.lse);
  }
  return r;
}

}  // namespace flashstep::ref
