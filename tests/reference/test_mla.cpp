// MLA: the naive form (per-head keys and values up-projected from the latents) and the
// absorbed form (every head on the shared latents) agree; the absorbed form equals ordinary
// attention over [c ; k_pe]; paged, ragged and single calls agree for any page size;
// bad input is refused by name.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>
#include <numeric>

#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

namespace {

/// DeepSeek's shapes, scaled down so the double reference stays quick: kv_lora_rank 32,
/// rope_dim 8, head_dim_nope 12, head_dim_vo 10.
constexpr int64_t kRank = 32, kRope = 8, kNope = 12, kVo = 10;

double model_scale() { return 1.0 / std::sqrt(static_cast<double>(kNope + kRope)); }

/// Rows [r0, r0 + n) of a tensor's first dimension.
Tensor rows(const Tensor& t, int64_t r0, int64_t n) {
  std::vector<int64_t> shape = t.shape;
  shape[0] = n;
  const int64_t per = t.numel() / std::max<int64_t>(t.dim(0), 1);
  return Tensor(shape, std::vector<double>(t.data.begin() + r0 * per, t.data.begin() + (r0 + n) * per));
}

/// A paged latent cache holding per-request latents, pages handed out from a shuffled
/// list, every slot a request does not own NaN (a reader of one fails the check).
ref::PagedLatentCache make_cache(std::mt19937_64& rng, const std::vector<Tensor>& ckv, const std::vector<Tensor>& kpe,
                                 int64_t page) {
  int64_t need = 0;
  for (const Tensor& c : ckv) need += (c.dim(0) + page - 1) / page;
  const int64_t num_pages = need + 3;
  std::vector<int32_t> order(static_cast<size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  ref::PagedLatentCache cache;
  cache.ckv_pages = Tensor({num_pages, page, kRank}, NAN);
  cache.kpe_pages = Tensor({num_pages, page, kRope}, NAN);
  cache.kv_indptr = {0};
  size_t next = 0;
  for (size_t b = 0; b < ckv.size(); ++b) {
    const int64_t len = ckv[b].dim(0);
    for (int64_t t = 0; t < len; ++t) {
      if (t % page == 0) cache.kv_indices.push_back(order[next++]);
      const int64_t p = cache.kv_indices.back();
      for (int64_t d = 0; d < kRank; ++d) cache.ckv_pages({p, t % page, d}) = ckv[b]({t, d});
      for (int64_t d = 0; d < kRope; ++d) cache.kpe_pages({p, t % page, d}) = kpe[b]({t, d});
    }
    cache.kv_indptr.push_back(static_cast<int32_t>(cache.kv_indices.size()));
    cache.kv_len.push_back(static_cast<int32_t>(len));
  }
  return cache;
}

}  // namespace

TEST_CASE("mla: the naive and the absorbed form agree (decode and causal append)") {
  auto rng = test::case_rng("mla naive vs absorbed");
  CAPTURE(test::run_seed());
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t heads = test::random_int(rng, 1, 6), kv_len = test::random_int(rng, 1, 50);
    const int64_t qo_len = trial % 2 ? 1 : test::random_int(rng, 1, 6);
    const bool causal = trial % 3 != 0;
    CAPTURE(heads);
    CAPTURE(kv_len);
    CAPTURE(qo_len);
    CAPTURE(causal);
    const Tensor q_nope = test::random_tensor(rng, {qo_len, heads, kNope}, -2, 2);
    const Tensor q_pe = test::random_tensor(rng, {qo_len, heads, kRope}, -2, 2);
    const Tensor ckv = test::random_tensor(rng, {kv_len, kRank}), kpe = test::random_tensor(rng, {kv_len, kRope});
    const ref::MlaWeights w{test::random_tensor(rng, {heads, kNope, kRank}, -0.5, 0.5),
                            test::random_tensor(rng, {heads, kVo, kRank}, -0.5, 0.5)};
    ref::MlaOptions opt;
    opt.causal = causal;
    const ref::AttentionResult naive = ref::mla_naive(q_nope, q_pe, ckv, kpe, w, opt);  // default scale
    opt.sm_scale = model_scale();
    const ref::AttentionResult lat = ref::mla_attention(ref::mla_absorb_query(q_nope, w.w_uk), q_pe, ckv, kpe, opt);
    const Tensor o = ref::mla_project_output(lat.o, w.w_uv);
    CHECK(ref::max_abs_diff(o, naive.o) < 1e-12);
    CHECK(ref::max_abs_diff(lat.lse, naive.lse) < 1e-12);
    // the check can fail: the scale of the absorbed shapes (1/sqrt(rank + rope)) is not MLA's
    opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(kRank + kRope));
    const ref::AttentionResult wrong = ref::mla_attention(ref::mla_absorb_query(q_nope, w.w_uk), q_pe, ckv, kpe, opt);
    if (kv_len > 1) CHECK(ref::max_abs_diff(wrong.lse, naive.lse) > 1e-6);
  }
}

TEST_CASE("mla: the absorbed form is ordinary attention over [c ; k_pe] with c as the value") {
  // an oracle outside mla.cpp: the reference's single prefill on an MQA problem, q = [q_lat ;
  // q_pe], k = [c ; k_pe], v = [c ; 0], one kv head for every query head
  auto rng = test::case_rng("mla vs single prefill");
  CAPTURE(test::run_seed());
  const int64_t heads = 4, qo_len = 3, kv_len = 29;
  const Tensor q_lat = test::random_tensor(rng, {qo_len, heads, kRank}, -1, 1);
  const Tensor q_pe = test::random_tensor(rng, {qo_len, heads, kRope}, -1, 1);
  const Tensor ckv = test::random_tensor(rng, {kv_len, kRank}), kpe = test::random_tensor(rng, {kv_len, kRope});
  Tensor q({qo_len, heads, kRank + kRope}), k({kv_len, 1, kRank + kRope}), v({kv_len, 1, kRank + kRope});
  for (int64_t i = 0; i < qo_len; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < kRank + kRope; ++d) q({i, h, d}) = d < kRank ? q_lat({i, h, d}) : q_pe({i, h, d - kRank});
  for (int64_t j = 0; j < kv_len; ++j)
    for (int64_t d = 0; d < kRank + kRope; ++d) {
      k({j, 0, d}) = d < kRank ? ckv({j, d}) : kpe({j, d - kRank});
      v({j, 0, d}) = d < kRank ? ckv({j, d}) : 0.0;
    }
  ref::AttentionOptions aopt;
  aopt.causal = true;
  aopt.sm_scale = model_scale();
  const ref::AttentionResult want = ref::single_prefill_with_kv_cache(q, k, v, aopt);
  ref::MlaOptions opt;
  opt.causal = true;
  opt.sm_scale = model_scale();
  const ref::AttentionResult got = ref::mla_attention(q_lat, q_pe, ckv, kpe, opt);
  double err = 0;
  for (int64_t i = 0; i < qo_len; ++i)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < kRank; ++d) err = std::max(err, std::abs(got.o({i, h, d}) - want.o({i, h, d})));
  CHECK(err < 1e-13);
  CHECK(ref::max_abs_diff(got.lse, want.lse) < 1e-13);
}

TEST_CASE("mla: the naive form is ragged prefill with head_dim_qk != head_dim_vo (NHD and HND)") {
  // DeepSeek's prefill runs the naive form as ordinary attention with q and k of
  // head_dim_nope + rope_dim (192) and v of head_dim_vo (128); here 20 and 10. The oracle
  // is mla_naive (mla.cpp); the call under test is attention.cpp's ragged prefill, each
  // head its own kv head (MHA), k = [W_UK[h] c ; k_pe] and v = W_UV[h] c built here.
  auto rng = test::case_rng("mla naive vs ragged prefill");
  CAPTURE(test::run_seed());
  const int64_t heads = 3, batch = 3;
  const std::vector<int64_t> qo_lens = {4, 1, 6}, kv_lens = {9, 17, 6};
  const ref::MlaWeights w{test::random_tensor(rng, {heads, kNope, kRank}, -0.5, 0.5),
                          test::random_tensor(rng, {heads, kVo, kRank}, -0.5, 0.5)};
  const int64_t nnz_qo = 11, nnz_kv = 32;
  Tensor q({nnz_qo, heads, kNope + kRope}), k({nnz_kv, heads, kNope + kRope}), v({nnz_kv, heads, kVo});
  Tensor want_o({nnz_qo, heads, kVo}), want_lse({nnz_qo, heads});
  std::vector<int32_t> qo_indptr = {0}, kv_indptr = {0};
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q0 = qo_indptr.back(), k0 = kv_indptr.back(), qn = qo_lens[size_t(b)], kn = kv_lens[size_t(b)];
    const Tensor q_nope = test::random_tensor(rng, {qn, heads, kNope}, -2, 2);
    const Tensor q_pe = test::random_tensor(rng, {qn, heads, kRope}, -2, 2);
    const Tensor ckv = test::random_tensor(rng, {kn, kRank}), kpe = test::random_tensor(rng, {kn, kRope});
    ref::MlaOptions mopt;
    mopt.causal = true;
    const ref::AttentionResult naive = ref::mla_naive(q_nope, q_pe, ckv, kpe, w, mopt);
    for (int64_t i = 0; i < qn; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < kNope + kRope; ++d)
          q({q0 + i, h, d}) = d < kNope ? q_nope({i, h, d}) : q_pe({i, h, d - kNope});
        for (int64_t d = 0; d < kVo; ++d) want_o({q0 + i, h, d}) = naive.o({i, h, d});
        want_lse({q0 + i, h}) = naive.lse({i, h});
      }
    for (int64_t j = 0; j < kn; ++j)
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t d = 0; d < kNope; ++d) {
          double s = 0;
          for (int64_t r = 0; r < kRank; ++r) s += w.w_uk({h, d, r}) * ckv({j, r});
          k({k0 + j, h, d}) = s;
        }
        for (int64_t d = 0; d < kRope; ++d) k({k0 + j, h, kNope + d}) = kpe({j, d});
        for (int64_t d = 0; d < kVo; ++d) {
          double s = 0;
          for (int64_t r = 0; r < kRank; ++r) s += w.w_uv({h, d, r}) * ckv({j, r});
          v({k0 + j, h, d}) = s;
        }
      }
    qo_indptr.push_back(static_cast<int32_t>(q0 + qn));
    kv_indptr.push_back(static_cast<int32_t>(k0 + kn));
  }
  ref::AttentionOptions aopt;
  aopt.causal = true;  // the scale: 1/sqrt(q's head_dim) = 1/sqrt(head_dim_nope + rope_dim), MLA's
  const ref::AttentionResult got = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, aopt);
  REQUIRE(got.o.shape == want_o.shape);
  CHECK(ref::max_abs_diff(got.o, want_o) < 1e-12);
  CHECK(ref::max_abs_diff(got.lse, want_lse) < 1e-12);
  // HND: the same K and V with heads first
  Tensor k_hnd({heads, nnz_kv, kNope + kRope}), v_hnd({heads, nnz_kv, kVo});
  for (int64_t j = 0; j < nnz_kv; ++j)
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t d = 0; d < kNope + kRope; ++d) k_hnd({h, j, d}) = k({j, h, d});
      for (int64_t d = 0; d < kVo; ++d) v_hnd({h, j, d}) = v({j, h, d});
    }
  aopt.kv_layout = ref::KVLayout::HND;
  const ref::AttentionResult hnd = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k_hnd, v_hnd, kv_indptr, aopt);
  CHECK(ref::max_abs_diff(hnd.o, want_o) < 1e-12);
  // the check can fail: the scale of v's width (1/sqrt(head_dim_vo)) is not MLA's
  aopt.kv_layout = ref::KVLayout::NHD;
  aopt.sm_scale = 1.0 / std::sqrt(static_cast<double>(kVo));
  const ref::AttentionResult wrong = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, aopt);
  CHECK(ref::max_abs_diff(wrong.lse, want_lse) > 1e-6);
}

TEST_CASE("mla prefill shape over pages: K and V pools of their own widths (v_pages), appended and read") {
  // The ragged test above, paged: K (20 wide) in `pages`, V (10 wide) in `v_pages`, both
  // filled by append_paged_kv_cache through a shuffled page table; batch prefill and decode
  // over them equal ragged prefill on the same rows, bit for bit (the same arithmetic on
  // the same values).
  auto rng = test::case_rng("mla prefill paged");
  CAPTURE(test::run_seed());
  const int64_t heads = 3, dqk = kNope + kRope;
  const std::vector<int32_t> kv_lens = {9, 17, 6}, qo_lens = {4, 1, 6};
  for (int64_t page : {1, 3, 16})
    for (ref::KVLayout layout : {ref::KVLayout::NHD, ref::KVLayout::HND}) {
      CAPTURE(page);
      const int64_t nnz_kv = 32, nnz_qo = 11;
      const Tensor k = test::random_tensor(rng, {nnz_kv, heads, dqk}),
                   v = test::random_tensor(rng, {nnz_kv, heads, kVo});
      const Tensor q = test::random_tensor(rng, {nnz_qo, heads, dqk}, -2, 2);
      ref::PagedKVCache cache;
      cache.layout = layout;
      int64_t num_pages = 0;
      for (int32_t len : kv_lens) num_pages += (len + page - 1) / page;
      num_pages += 2;  // spare pages, NaN: a reader of one fails
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      auto pool = [&](int64_t width) {
        return layout == ref::KVLayout::NHD ? Tensor({num_pages, 1, page, heads, width}, NAN)
                                            : Tensor({num_pages, 1, heads, page, width}, NAN);
      };
      cache.pages = pool(dqk);
      cache.v_pages = pool(kVo);
      cache.kv_indptr = {0};
      size_t next = 0;
      for (int32_t len : kv_lens) {
        const int32_t pages = static_cast<int32_t>((len + page - 1) / page);
        for (int32_t p = 0; p < pages; ++p) cache.kv_indices.push_back(order[next++]);
        cache.kv_indptr.push_back(static_cast<int32_t>(cache.kv_indices.size()));
        cache.kv_last_page_len.push_back(static_cast<int32_t>(len - (pages - 1) * page));
      }
      std::vector<int32_t> kv_indptr = {0}, qo_indptr = {0}, batch_indices, positions;
      for (size_t b = 0; b < kv_lens.size(); ++b) {
        kv_indptr.push_back(kv_indptr.back() + kv_lens[b]);
        qo_indptr.push_back(qo_indptr.back() + qo_lens[b]);
        for (int32_t t = 0; t < kv_lens[b]; ++t) {
          batch_indices.push_back(static_cast<int32_t>(b));
          positions.push_back(t);
        }
      }
      ref::append_paged_kv_cache(k, v, batch_indices, positions, cache);
      ref::AttentionOptions opt;
      opt.causal = true;
      const ref::AttentionResult want = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, opt);
      const ref::AttentionResult got = ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, cache, opt);
      REQUIRE(got.o.shape == want.o.shape);
      CHECK(got.o.data == want.o.data);
      CHECK(got.lse.data == want.lse.data);
      const auto [k1, v1] = ref::gather_paged_kv(cache, 1);
      CHECK(v1.shape == std::vector<int64_t>{17, heads, kVo});
      // decode: each request's last query against its keys (a one-row product, not a block's:
      // equal to rounding)
      Tensor q_last({3, heads, dqk});
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dqk; ++d) q_last({b, h, d}) = q({qo_indptr[b + 1] - 1, h, d});
      const ref::AttentionResult dec = ref::batch_decode_with_paged_kv_cache(q_last, cache);
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < kVo; ++d)
            CHECK(std::abs(dec.o({b, h, d}) - want.o({qo_indptr[b + 1] - 1, h, d})) < 1e-13);
    }
  // bad input: a V pool whose pages or heads differ from K's, a combined K pool beside v_pages
  ref::PagedKVCache c;
  c.pages = Tensor({4, 1, 16, 2, 20});
  c.v_pages = Tensor({4, 1, 16, 3, 10});
  c.kv_indptr = {0, 1};
  c.kv_indices = {0};
  c.kv_last_page_len = {5};
  const Tensor q({1, 2, 20}, 0.1);
  CHECK_THROWS_WITH_AS(ref::batch_decode_with_paged_kv_cache(q, c),
                       doctest::Contains("v_pages must match the K pool but for its last dimension"),
                       ref::InvalidArgument);
  c.v_pages = Tensor({4, 1, 16, 2, 10});
  c.pages = Tensor({4, 2, 16, 2, 20});
  CHECK_THROWS_WITH_AS(ref::batch_decode_with_paged_kv_cache(q, c), doctest::Contains("dimension 1 must be 1"),
                       ref::InvalidArgument);
  c.pages = Tensor({4, 1, 16, 2, 20});
  CHECK_THROWS_WITH_AS(ref::append_paged_kv_cache(Tensor({1, 2, 20}), Tensor({1, 2, 20}), {0}, {0}, c),
                       doctest::Contains("append_value"), ref::InvalidArgument);
}

TEST_CASE("mla: paged (pages of 1, 3, 16, 64, shuffled), ragged and single calls agree") {
  auto rng = test::case_rng("mla paged ragged");
  CAPTURE(test::run_seed());
  for (const bool append : {false, true}) {
    CAPTURE(append);
    const int64_t heads = 3;
    // an empty request and one shorter than its queries (those rows see no key: o = 0, lse = -inf)
    const std::vector<int64_t> kv_lens{37, 0, 1, 70, 2};
    std::vector<Tensor> ckv, kpe;
    std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
    for (int64_t len : kv_lens) {
      ckv.push_back(test::random_tensor(rng, {len, kRank}));
      kpe.push_back(test::random_tensor(rng, {len, kRope}));
      qo_indptr.push_back(qo_indptr.back() + (append ? 4 : 1));
      kv_indptr.push_back(kv_indptr.back() + static_cast<int32_t>(len));
    }
    const int64_t nnz_qo = qo_indptr.back();
    const Tensor q_lat = test::random_tensor(rng, {nnz_qo, heads, kRank}, -2, 2);
    const Tensor q_pe = test::random_tensor(rng, {nnz_qo, heads, kRope}, -2, 2);
    ref::MlaOptions opt;
    opt.causal = append;
    opt.sm_scale = model_scale();
    // ragged: every request's latents one after the other
    Tensor all_ckv({kv_indptr.back(), kRank}), all_kpe({kv_indptr.back(), kRope});
    for (size_t b = 0; b < kv_lens.size(); ++b) {
      std::copy(ckv[b].data.begin(), ckv[b].data.end(), all_ckv.data.begin() + kv_indptr[b] * kRank);
      std::copy(kpe[b].data.begin(), kpe[b].data.end(), all_kpe.data.begin() + kv_indptr[b] * kRope);
    }
    const ref::AttentionResult ragged = ref::batch_mla_ragged_attention(q_lat, q_pe, qo_indptr, all_ckv, all_kpe,
                                                                        kv_indptr, opt);
    for (size_t b = 0; b < kv_lens.size(); ++b) {
      const int64_t q0 = qo_indptr[b], n = qo_indptr[b + 1] - q0;
      const ref::AttentionResult one = ref::mla_attention(rows(q_lat, q0, n), rows(q_pe, q0, n), ckv[b], kpe[b], opt);
      CHECK(ref::max_abs_diff(rows(ragged.o, q0, n), one.o) == 0.0);
      CHECK(ref::max_abs_diff(rows(ragged.lse, q0, n), one.lse) == 0.0);
    }
    CHECK(ragged.lse({qo_indptr[1], 0}) == -INFINITY);              // the empty request
    if (append) CHECK(ragged.lse({qo_indptr[2], 0}) == -INFINITY);  // 4 queries over 1 key: the first sees none
    for (int64_t page : {1, 3, 16, 64}) {
      CAPTURE(page);
      const ref::PagedLatentCache cache = make_cache(rng, ckv, kpe, page);
      const ref::AttentionResult paged = ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, cache, opt);
      CHECK(ref::max_abs_diff(paged.o, ragged.o) == 0.0);
      CHECK(ref::max_abs_diff(paged.lse, ragged.lse) == 0.0);
    }
  }
}

TEST_CASE("mla: bad input is refused, naming the function and the argument") {
  auto rng = test::case_rng("mla bad input");
  const Tensor q_lat = test::random_tensor(rng, {2, 2, kRank}), q_pe = test::random_tensor(rng, {2, 2, kRope});
  const Tensor ckv = test::random_tensor(rng, {5, kRank}), kpe = test::random_tensor(rng, {5, kRope});
  ref::MlaOptions opt;
  auto fails_with = [](auto&& call, const std::string& what) {
    try {
      call();
    } catch (const ref::InvalidArgument& e) {
      const std::string msg = e.what();
      CHECK_MESSAGE(msg.find(what) != std::string::npos, msg);
      return;
    }
    FAIL("no InvalidArgument for: " << what);
  };
  fails_with([&] { ref::mla_attention(q_lat, q_pe, ckv, kpe, opt); }, "mla_attention: sm_scale is required");
  opt.sm_scale = model_scale();
  fails_with([&] { ref::mla_attention(q_lat, q_pe, test::random_tensor(rng, {5, kRank + 1}), kpe, opt); }, "ckv");
  fails_with([&] { ref::mla_attention(q_lat, q_pe, ckv, test::random_tensor(rng, {4, kRope}), opt); }, "kpe");
  fails_with([&] { ref::mla_attention(q_lat, test::random_tensor(rng, {2, 3, kRope}), ckv, kpe, opt); }, "q_pe");
  Tensor nan_q = q_lat;
  nan_q.data[3] = NAN;
  fails_with([&] { ref::mla_attention(nan_q, q_pe, ckv, kpe, opt); }, "q_lat");
  const ref::MlaWeights w{test::random_tensor(rng, {2, kNope, kRank}), test::random_tensor(rng, {3, kVo, kRank})};
  fails_with([&] { ref::mla_naive(test::random_tensor(rng, {2, 2, kNope}), q_pe, ckv, kpe, w); }, "mla_naive: w.w_uv");
  // a cache that disagrees with itself or with the queries
  ref::PagedLatentCache cache = make_cache(rng, {ckv}, {kpe}, 2);
  const std::vector<int32_t> qo_indptr{0, 2};
  ref::PagedLatentCache bad = cache;
  bad.kv_len[0] = 7;  // 3 pages of 2 hold at most 6
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, bad, opt); }, "kv_len[0]");
  bad = cache;
  bad.kv_len[0] = 2;  // needs 1 page, owns 3
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, bad, opt); }, "kv_len[0]");
  bad = cache;
  bad.kpe_pages = Tensor({bad.ckv_pages.dim(0), 3, kRope});
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, bad, opt); }, "kpe_pages");
  bad = cache;
  bad.kv_indices[1] = 1000;
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, bad, opt); }, "kv_indices[1]");
  bad = cache;
  bad.ckv_pages({bad.kv_indices[0], 1, 0}) = NAN;  // a slot the request owns
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, bad, opt); }, "ckv_pages");
  fails_with([&] { ref::batch_mla_paged_attention(q_lat, q_pe, {0, 3}, cache, opt); }, "qo_indptr");
}
