// Reference attention. Every public entry point validates, then reduces to one routine:
// attend_request(), which computes softmax attention of one request's queries over one
// request's contiguous K/V, in double, a block of query rows at a time. Paged inputs are
// first gathered to contiguous K/V, so paged and ragged share every line of the arithmetic.
#include "flashstep/reference/attention.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/kv_cache.hpp"

namespace flashstep::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Rows [row0, row0 + len) of kv head `head` of a K or V tensor, as a (len, head_dim) matrix.
Matrix kv_head_rows(const Tensor& kv, KVLayout layout, int64_t head, int64_t row0, int64_t len) {
  const int64_t head_dim = kv.dim(2);
  Matrix m(len, head_dim);
  for (int64_t j = 0; j < len; ++j)
    for (int64_t d = 0; d < head_dim; ++d)
      m(j, d) = layout == KVLayout::NHD ? kv({row0 + j, head, d}) : kv({head, row0 + j, d});
  return m;
}

}  // namespace

double resolved_sm_scale(const AttentionOptions& opt, int64_t head_dim) {
  return opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

void check_attention_options(const char* fn, const AttentionOptions& opt) {
  require(!opt.sm_scale || (std::isfinite(*opt.sm_scale) && *opt.sm_scale > 0), fn,
          "sm_scale must be a positive finite number when given (got " +
              (opt.sm_scale ? std::to_string(*opt.sm_scale) : std::string("none")) + ")");
  require(opt.window_left >= -1, fn,
          "window_left must be -1 (off) or >= 0 (got " + std::to_string(opt.window_left) + ")");
  require(std::isfinite(opt.logits_soft_cap) && opt.logits_soft_cap >= 0, fn,
          "logits_soft_cap must be 0 (off) or a positive finite number (got " + std::to_string(opt.logits_soft_cap) +
              ")");
  for (size_t h = 0; h < opt.sinks.size(); ++h)
    require(std::isfinite(opt.sinks[h]), fn, "sinks[" + std::to_string(h) + "] must be finite");
}

namespace {

/// Checks k/v of a single or ragged call against q; returns num_kv_heads. v may have its own
/// last dimension, head_dim_vo (DeepSeek's MLA prefill: q and k 192 wide, v 128).
int64_t check_contiguous_kv(const char* fn, const Tensor& q, const Tensor& k, const Tensor& v, KVLayout layout) {
  check_rank(fn, "k", k, 3);
  check_rank(fn, "v", v, 3);
  require(k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1), fn,
          "k and v must have the same shape but for the last dimension (head_dim_vo may differ), got k " +
              shape_string(k.shape) + " and v " + shape_string(v.shape));
  check_dim(fn, "k", k, 2, q.dim(-1), "head_dim, must match q");
  const int64_t num_kv_heads = layout == KVLayout::NHD ? k.dim(1) : k.dim(0);
  check_head_dim(fn, q.dim(-1));
  require(v.dim(2) > 0, fn, "head_dim_vo (v's last dimension) must be positive, got v " + shape_string(v.shape));
  check_heads(fn, q.dim(-2), num_kv_heads);
  check_finite(fn, "k", k);
  check_finite(fn, "v", v);
  return num_kv_heads;
}

/// Attention of one request. Reads q rows [q_row0, q_row0 + qo_len) of q (nnz, Hq, D)
/// and K/V rows [kv_row0, kv_row0 + kv_len) of k/v; writes the same rows of o (v's last
/// dimension wide, head_dim_vo) and lse. The scale's default is 1/sqrt of q's head_dim.
///
/// The queries of a head are taken kBlockRows at a time, so the scores of a block are one
/// matrix product S = Q_block K^T (and the output one product P V): the same arithmetic
/// as one query at a time, in double, at the speed of a matrix product, which is what
/// lets the tests check long sequences. Under the causal mask a block reads only the keys
/// its last query can see.
void attend_request(const Tensor& q, int64_t q_row0, int64_t qo_len, const Tensor& k, const Tensor& v, KVLayout layout,
                    int64_t kv_row0, int64_t kv_len, const AttentionOptions& opt, Tensor& o, Tensor& lse) {
  constexpr int64_t kBlockRows = 64;
  const int64_t num_qo_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t num_kv_heads = layout == KVLayout::NHD ? k.dim(1) : k.dim(0);
  const int64_t group_size = num_qo_heads / num_kv_heads;
  const double sm_scale = resolved_sm_scale(opt, head_dim);
  const double cap = opt.logits_soft_cap;
  const bool has_sinks = !opt.sinks.empty();
  require(!has_sinks || static_cast<int64_t>(opt.sinks.size()) == num_qo_heads, "attention",
          "sinks must hold one logit per query head: " + std::to_string(num_qo_heads) + ", got " +
              std::to_string(opt.sinks.size()));

  for (int64_t kv_head = 0; kv_head < num_kv_heads; ++kv_head) {
    // K and V of this kv head are read once and shared by its group of query heads (GQA).
    const Matrix K = kv_head_rows(k, layout, kv_head, kv_row0, kv_len);
    const Matrix V = kv_head_rows(v, layout, kv_head, kv_row0, kv_len);
    for (int64_t h = kv_head * group_size; h < (kv_head + 1) * group_size; ++h) {
      for (int64_t i0 = 0; i0 < qo_len; i0 += kBlockRows) {
        const int64_t rows = std::min(kBlockRows, qo_len - i0);
        // keys past the block's last query's diagonal are masked for every row of it
        const int64_t keys = opt.causal ? std::clamp<int64_t>(i0 + rows + (kv_len - qo_len), 0, kv_len) : kv_len;
        Matrix Q(rows, head_dim);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t d = 0; d < head_dim; ++d) Q(i, d) = q({q_row0 + i0 + i, h, d});
        // s_ij = sm_scale * q_i.k_j, soft-capped, -inf where the mask hides key j.
        Matrix S = (Q * K.topRows(keys).transpose()) * sm_scale;
        Eigen::VectorXd denom(rows);
        for (int64_t i = 0; i < rows; ++i) {
          double m = kNegInf;
          for (int64_t j = 0; j < keys; ++j) {
            double& s_ij = S(i, j);
            if (cap > 0) s_ij = cap * std::tanh(s_ij / cap);
            if (!key_visible(i0 + i, j, qo_len, kv_len, opt.causal, opt.window_left)) s_ij = kNegInf;
            m = std::max(m, s_ij);
          }
          const int64_t row = q_row0 + i0 + i;
          // A sink is one more term of the denominator, with no value: it takes part in
          // the max, so that exp never overflows, and in the sum.
          const double sink = has_sinks ? opt.sinks[static_cast<size_t>(h)] : kNegInf;
          m = std::max(m, sink);
          if (m == kNegInf) {  // no visible key and no sink: the empty state (o = 0, lse = -inf)
            S.row(i).setZero();
            denom(i) = 0.0;
            lse({row, h}) = kNegInf;
            continue;
          }
          // Softmax with the max subtracted; lse = m + log(sum exp(s - m) + exp(sink - m)).
          S.row(i) = (S.row(i).array() - m).exp();
          const double sink_term = has_sinks ? std::exp(sink - m) : 0.0;
          denom(i) = S.row(i).sum() + sink_term;
          lse({row, h}) = m + std::log(denom(i));
        }
        // o_i = sum_j p_ij v_j / sum_j p_ij  (a row with no visible key stays 0)
        const Matrix out = S * V.topRows(keys);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t d = 0; d < V.cols(); ++d)
            o({q_row0 + i0 + i, h, d}) = denom(i) > 0.0 ? out(i, d) / denom(i) : 0.0;
      }
    }
  }
}

/// Batch prefill through a paged cache; `fn` names the public entry point in errors.
AttentionResult paged_prefill(const char* fn, const Tensor& q, const std::vector<int32_t>& qo_indptr,
                              const PagedKVCache& cache, const AttentionOptions& opt) {
  check_attention_options(fn, opt);
  check_rank(fn, "q", q, 3);
  check_finite(fn, "q", q);
  check_paged_kv_cache(fn, cache);
  check_dim(fn, "paged_kv_cache", cache.pages, 4, q.dim(2), "head_dim, must match q");
  check_head_dim(fn, q.dim(2));
  check_heads(fn, q.dim(1), cache.num_kv_heads());
  check_indptr(fn, "qo_indptr", qo_indptr, cache.batch_size() + 1, q.dim(0));
  AttentionResult r{Tensor({q.dim(0), q.dim(1), cache.head_dim_vo()}), Tensor({q.dim(0), q.dim(1)})};
  for (int64_t i = 0; i < cache.batch_size(); ++i) {
    const auto [k, v] = gather_paged_kv(cache, i);
    attend_request(q, qo_indptr[i], qo_indptr[i + 1] - qo_indptr[i], k, v, KVLayout::NHD, 0, k.dim(0), opt, r.o, r.lse);
  }
  return r;
}

}  // namespace

KVLayout parse_kv_layout(const std::string& name) {
  if (name == "NHD") return KVLayout::NHD;
  if (name == "HND") return KVLayout::HND;
  throw InvalidArgument("kv_layout must be \"NHD\" or \"HND\" (got \"" + name + "\")");
}

const char* to_string(KVLayout layout) { return layout == KVLayout::NHD ? "NHD" : "HND"; }

bool key_visible(int64_t i, int64_t j, int64_t qo_len, int64_t kv_len, bool causal, int window_left) {
  const int64_t diagonal = i + (kv_len - qo_len);  // the last key query i may see if causal
  if (causal && j > diagonal) return false;
  if (window_left >= 0 && j < diagonal - window_left) return false;
  return true;
}

int64_t PagedKVCache::kv_len(int64_t i) const {
  const int64_t pages = kv_indptr[i + 1] - kv_indptr[i];
  return pages == 0 ? 0 : (pages - 1) * page_size() + kv_last_page_len[i];
}

double PagedKVCache::at(int64_t page, int k_or_v, int64_t token, int64_t head, int64_t d) const {
  return const_cast<PagedKVCache&>(*this).at(page, k_or_v, token, head, d);  // reads only
}

double& PagedKVCache::at(int64_t page, int k_or_v, int64_t token, int64_t head, int64_t d) {
  const bool own_v = k_or_v == 1 && v_pages.rank() > 0;  // V in a pool of its own width
  Tensor& pool = own_v ? v_pages : pages;
  const int64_t kv = own_v ? 0 : k_or_v;
  return layout == KVLayout::NHD ? pool({page, kv, token, head, d}) : pool({page, kv, head, token, d});
}

void check_paged_kv_pools(const char* fn, const PagedKVCache& c) {
  check_rank(fn, "paged_kv_cache", c.pages, 5);
  if (c.v_pages.rank() == 0) {
    require(c.pages.dim(1) == 2, fn,
            "paged_kv_cache dimension 1 must be 2 (K and V), got shape " + shape_string(c.pages.shape));
  } else {  // K and V in pools of their own widths
    check_rank(fn, "v_pages", c.v_pages, 5);
    require(c.pages.dim(1) == 1 && c.v_pages.dim(1) == 1, fn,
            "with v_pages, paged_kv_cache and v_pages hold K and V alone: dimension 1 must be 1, got shapes " +
                shape_string(c.pages.shape) + " and " + shape_string(c.v_pages.shape));
    for (int d : {0, 2, 3})
      require_lazy(c.v_pages.dim(d) == c.pages.dim(d), fn, [&] {
        return "v_pages must match the K pool but for its last dimension (head_dim_vo), got " +
               shape_string(c.v_pages.shape) + " against " + shape_string(c.pages.shape);
      });
    require(c.v_pages.dim(4) >= 1, fn, "v_pages' head_dim_vo must be positive, got " + shape_string(c.v_pages.shape));
  }
}

void check_paged_kv_cache(const char* fn, const PagedKVCache& c) {
  check_paged_kv_pools(fn, c);
  require(c.page_size() >= 1, fn,
          "page_size must be >= 1, got shape " + shape_string(c.pages.shape) + " (" + to_string(c.layout) + ")");
  check_indptr(fn, "kv_indptr", c.kv_indptr, -1, static_cast<int64_t>(c.kv_indices.size()));
  const int64_t batch = c.batch_size();
  require(static_cast<int64_t>(c.kv_last_page_len.size()) == batch, fn,
          "kv_last_page_len must have length batch_size = " + std::to_string(batch) + ", got " +
              std::to_string(c.kv_last_page_len.size()));
  for (size_t n = 0; n < c.kv_indices.size(); ++n)
    require_lazy(c.kv_indices[n] >= 0 && c.kv_indices[n] < c.num_pages(), fn, [&] {
      return "kv_indices[" + std::to_string(n) + "] = " + std::to_string(c.kv_indices[n]) +
             " is out of range for a pool of " + std::to_string(c.num_pages()) + " pages";
    });
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t pages = c.kv_indptr[i + 1] - c.kv_indptr[i];
    const int32_t lpl = c.kv_last_page_len[i];
    if (pages == 0) {
      require(lpl == 0, fn,
              "kv_last_page_len[" + std::to_string(i) + "] must be 0 for a request with no pages (got " +
                  std::to_string(lpl) + ")");
    } else {
      require(lpl >= 1 && lpl <= c.page_size(), fn,
              "kv_last_page_len[" + std::to_string(i) + "] = " + std::to_string(lpl) + " must be in 1..page_size (" +
                  std::to_string(c.page_size()) + ")");
    }
  }
  // Only the slots a request can read must be finite: unused pool memory may hold anything.
  for (int64_t i = 0; i < batch; ++i)
    for (int64_t t = 0; t < c.kv_len(i); ++t) {
      const int32_t page = c.kv_indices[c.kv_indptr[i] + t / c.page_size()];
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t h = 0; h < c.num_kv_heads(); ++h)
          for (int64_t d = 0; d < (kv ? c.head_dim_vo() : c.head_dim()); ++d)
            require_lazy(std::isfinite(c.at(page, kv, t % c.page_size(), h, d)), fn, [&] {
              return std::string("paged_kv_cache must be finite, but the ") + (kv ? "V" : "K") + " of request " +
                     std::to_string(i) + ", token " + std::to_string(t) + ", head " + std::to_string(h) + ", dim " +
                     std::to_string(d) + " (page " + std::to_string(page) + ") is " +
                     std::to_string(c.at(page, kv, t % c.page_size(), h, d));
            });
    }
}

AttentionResult single_prefill_with_kv_cache(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opt) {
  const char* fn = "single_prefill_with_kv_cache";
  check_attention_options(fn, opt);
  check_rank(fn, "q", q, 3);
  check_finite(fn, "q", q);
  check_contiguous_kv(fn, q, k, v, opt.kv_layout);
  const int64_t kv_len = opt.kv_layout == KVLayout::NHD ? k.dim(0) : k.dim(1);
  AttentionResult r{Tensor({q.dim(0), q.dim(1), v.dim(2)}), Tensor({q.dim(0), q.dim(1)})};
  attend_request(q, 0, q.dim(0), k, v, opt.kv_layout, 0, kv_len, opt, r.o, r.lse);
  return r;
}

AttentionResult single_decode_with_kv_cache(const Tensor& q, const Tensor& k, const Tensor& v,
                                            const AttentionOptions& opt) {
  const char* fn = "single_decode_with_kv_cache";
  check_rank(fn, "q", q, 2);
  check_attention_options(fn, opt);
  check_finite(fn, "q", q);
  Tensor q3({1, q.dim(0), q.dim(1)}, q.data);
  check_contiguous_kv(fn, q3, k, v, opt.kv_layout);
  const int64_t kv_len = opt.kv_layout == KVLayout::NHD ? k.dim(0) : k.dim(1);
  Tensor o({1, q.dim(0), v.dim(2)}), lse({1, q.dim(0)});
  attend_request(q3, 0, 1, k, v, opt.kv_layout, 0, kv_len, opt, o, lse);
  return {Tensor({q.dim(0), v.dim(2)}, std::move(o.data)), Tensor({q.dim(0)}, std::move(lse.data))};
}

AttentionResult batch_prefill_with_ragged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                   const Tensor& k, const Tensor& v,
                                                   const std::vector<int32_t>& kv_indptr, const AttentionOptions& opt) {
  const char* fn = "batch_prefill_with_ragged_kv_cache";
  check_attention_options(fn, opt);
  check_rank(fn, "q", q, 3);
  check_finite(fn, "q", q);
  check_contiguous_kv(fn, q, k, v, opt.kv_layout);
  check_indptr(fn, "qo_indptr", qo_indptr, -1, q.dim(0));
  const int64_t nnz_kv = opt.kv_layout == KVLayout::NHD ? k.dim(0) : k.dim(1);
  check_indptr(fn, "kv_indptr", kv_indptr, static_cast<int64_t>(qo_indptr.size()), nnz_kv);
  AttentionResult r{Tensor({q.dim(0), q.dim(1), v.dim(2)}), Tensor({q.dim(0), q.dim(1)})};
  for (size_t i = 0; i + 1 < qo_indptr.size(); ++i)
    attend_request(q, qo_indptr[i], qo_indptr[i + 1] - qo_indptr[i], k, v, opt.kv_layout, kv_indptr[i],
                   kv_indptr[i + 1] - kv_indptr[i], opt, r.o, r.lse);
  return r;
}

AttentionResult batch_prefill_with_paged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                  const PagedKVCache& cache, const AttentionOptions& opt) {
  return paged_prefill("batch_prefill_with_paged_kv_cache", q, qo_indptr, cache, opt);
}

AttentionResult batch_decode_with_paged_kv_cache(const Tensor& q, const PagedKVCache& cache,
                                                 const AttentionOptions& opt) {
  const char* fn = "batch_decode_with_paged_kv_cache";
  check_rank(fn, "q", q, 3);
  require(q.dim(0) == cache.batch_size(), fn,
          "q dimension 0 (batch_size) must equal len(kv_indptr) - 1 = " + std::to_string(cache.batch_size()) +
              ", got " + std::to_string(q.dim(0)));
  // Decode is prefill with one query per request; causal is meaningless for it.
  AttentionOptions decode_opt = opt;
  decode_opt.causal = false;
  std::vector<int32_t> qo_indptr(static_cast<size_t>(q.dim(0)) + 1);
  for (size_t i = 0; i < qo_indptr.size(); ++i) qo_indptr[i] = static_cast<int32_t>(i);
  return paged_prefill(fn, q, qo_indptr, cache, decode_opt);
}

Tensor attention_scores(const Tensor& q, const Tensor& k, int64_t qo_head, const AttentionOptions& opt) {
  const char* fn = "attention_scores";
  check_attention_options(fn, opt);
  check_rank(fn, "q", q, 3);
  check_contiguous_kv(fn, q, k, k, opt.kv_layout);
  require(qo_head >= 0 && qo_head < q.dim(1), fn,
          "qo_head must be in [0, " + std::to_string(q.dim(1)) + "), got " + std::to_string(qo_head));
  const int64_t qo_len = q.dim(0), head_dim = q.dim(2);
  const int64_t num_kv_heads = opt.kv_layout == KVLayout::NHD ? k.dim(1) : k.dim(0);
  const int64_t kv_len = opt.kv_layout == KVLayout::NHD ? k.dim(0) : k.dim(1);
  const int64_t kv_head = qo_head / (q.dim(1) / num_kv_heads);
  const double sm_scale = resolved_sm_scale(opt, head_dim);
  const Matrix K = kv_head_rows(k, opt.kv_layout, kv_head, 0, kv_len);
  Tensor s({qo_len, kv_len});
  for (int64_t i = 0; i < qo_len; ++i)
    for (int64_t j = 0; j < kv_len; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < head_dim; ++d) dot += q({i, qo_head, d}) * K(j, d);
      double sij = dot * sm_scale;
      if (opt.logits_soft_cap > 0) sij = opt.logits_soft_cap * std::tanh(sij / opt.logits_soft_cap);
      s({i, j}) = key_visible(i, j, qo_len, kv_len, opt.causal, opt.window_left) ? sij : kNegInf;
    }
  return s;
}

}  // namespace flashstep::ref
