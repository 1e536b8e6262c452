// Reference attention against independent formulas and against itself through other
// data layouts: direct per-element formula, paged == ragged, GQA == repeated K/V,
// NHD == HND, masks, soft cap, fully masked rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>
#include <numeric>

#include "support/random.hpp"

using namespace flashstep;
using ref::AttentionOptions;
using ref::KVLayout;
using ref::Tensor;

namespace {

constexpr double kTol = 1e-12;  // double vs double: only summation order differs

/// Attention written as plainly as possible, straight from the formulas, sharing no code
/// with the reference: scores, mask, cap, max-subtracted softmax, weighted sum.
void direct_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, int window_left, double sm_scale,
                      double cap, Tensor& o, Tensor& lse) {
  const int64_t qo_len = q.dim(0), hq = q.dim(1), d = q.dim(2), kv_len = k.dim(0), hk = k.dim(1);
  o = Tensor({qo_len, hq, d});
  lse = Tensor({qo_len, hq});
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kh = h * hk / hq;  // == h / (hq / hk) when hk divides hq
    for (int64_t i = 0; i < qo_len; ++i) {
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t j = 0; j < kv_len; ++j) {
        const int64_t last_visible = i + kv_len - qo_len;
        if (causal && j > last_visible) continue;
        if (window_left >= 0 && last_visible - j > window_left) continue;
        double dot = 0;
        for (int64_t x = 0; x < d; ++x) dot += q({i, h, x}) * k({j, kh, x});
        double sj = dot * sm_scale;
        if (cap > 0) sj = cap * std::tanh(sj / cap);
        s.push_back(sj);
        keys.push_back(j);
      }
      if (s.empty()) {
        lse({i, h}) = -INFINITY;
        continue;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double z = 0;
      for (double sj : s) z += std::exp(sj - m);
      lse({i, h}) = m + std::log(z);
      for (size_t n = 0; n < s.size(); ++n)
        for (int64_t x = 0; x < d; ++x) o({i, h, x}) += std::exp(s[n] - m) / z * v({keys[n], kh, x});
    }
  }
}

/// (kv_len, H, D) NHD -> (H, kv_len, D) HND.
Tensor to_hnd(const Tensor& t) {
  Tensor r({t.dim(1), t.dim(0), t.dim(2)});
  for (int64_t n = 0; n < t.dim(0); ++n)
    for (int64_t h = 0; h < t.dim(1); ++h)
      for (int64_t x = 0; x < t.dim(2); ++x) r({h, n, x}) = t({n, h, x});
  return r;
}

/// Rows [begin, end) of a (N, H, D) tensor.
Tensor slice_rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t row = t.dim(1) * t.dim(2);
  return Tensor({end - begin, t.dim(1), t.dim(2)},
                std::vector<double>(t.data.begin() + begin * row, t.data.begin() + end * row));
}

/// Concatenates (n_i, H, D) tensors along the first axis.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  Tensor r({0, parts[0].dim(1), parts[0].dim(2)});
  for (const Tensor& p : parts) {
    r.data.insert(r.data.end(), p.data.begin(), p.data.end());
    r.shape[0] += p.dim(0);
  }
  return r;
}

std::vector<int32_t> shuffled_pages(std::mt19937_64& rng, int64_t n) {
  std::vector<int32_t> pages(static_cast<size_t>(n));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  return pages;
}

}  // namespace

TEST_CASE("single prefill equals the direct formula (causal, window, soft cap, GQA incl. group 7)") {
  auto rng = test::case_rng("single-direct");
  CAPTURE(test::run_seed());
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t hk = test::random_int(rng, 1, 3);
    const int64_t group = std::vector<int64_t>{1, 2, 4, 7, 8}[static_cast<size_t>(trial % 5)];
    const int64_t hq = hk * group, d = std::vector<int64_t>{1, 4, 16}[static_cast<size_t>(trial % 3)];
    const int64_t kv_len = test::random_int(rng, 0, 40);
    const int64_t qo_len = test::random_int(rng, 1, 12);
    AttentionOptions opt;
    opt.causal = trial % 2 == 0;
    opt.window_left = trial % 3 == 0 ? static_cast<int>(test::random_int(rng, 0, 10)) : -1;
    opt.logits_soft_cap = trial % 4 == 1 ? 0.7 + 5.0 * static_cast<double>(trial % 7) / 7 : 0.0;
    if (trial % 5 == 2) opt.sm_scale = 0.3;
    const Tensor q = test::random_tensor(rng, {qo_len, hq, d}, -2, 2);
    const Tensor k = test::random_tensor(rng, {kv_len, hk, d}, -2, 2);
    const Tensor v = test::random_tensor(rng, {kv_len, hk, d});
    CAPTURE(trial);
    CAPTURE(kv_len);
    CAPTURE(qo_len);
    const auto r = ref::single_prefill_with_kv_cache(q, k, v, opt);
    Tensor o, lse;
    direct_attention(q, k, v, opt.causal, opt.window_left, opt.sm_scale.value_or(1 / std::sqrt(double(d))),
                     opt.logits_soft_cap, o, lse);
    CHECK(test::max_abs_diff(r.o, o) < kTol);
    CHECK(test::max_abs_diff(r.lse, lse) < kTol);
    // And HND input gives the very same numbers.
    AttentionOptions hnd = opt;
    hnd.kv_layout = KVLayout::HND;
    const auto rh = ref::single_prefill_with_kv_cache(q, to_hnd(k), to_hnd(v), hnd);
    CHECK(test::max_abs_diff(rh.o, r.o) == 0);
    CHECK(test::max_abs_diff(rh.lse, r.lse) == 0);
  }
}

TEST_CASE("single decode is prefill with one query at the end of the sequence") {
  auto rng = test::case_rng("decode-vs-prefill");
  CAPTURE(test::run_seed());
  const Tensor q = test::random_tensor(rng, {8, 64});
  const Tensor k = test::random_tensor(rng, {37, 2, 64}), v = test::random_tensor(rng, {37, 2, 64});
  AttentionOptions opt;
  opt.window_left = 5;
  const auto dec = ref::single_decode_with_kv_cache(q, k, v, opt);
  const auto pre = ref::single_prefill_with_kv_cache(Tensor({1, 8, 64}, q.data), k, v, opt);
  CHECK(dec.o.shape == std::vector<int64_t>{8, 64});
  CHECK(dec.lse.shape == std::vector<int64_t>{8});
  CHECK(dec.o.data == pre.o.data);
  CHECK(dec.lse.data == pre.lse.data);
}

TEST_CASE("paged == ragged contiguous on random batches (page sizes 1..32, shuffled pages, NHD and HND)") {
  auto rng = test::case_rng("paged-vs-ragged");
  CAPTURE(test::run_seed());
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t batch = test::random_int(rng, 1, 6), hk = test::random_int(rng, 1, 2);
    const int64_t hq = hk * test::random_int(rng, 1, 4), d = 8;
    const int64_t page_size = test::random_int(rng, 1, 32);
    const KVLayout layout = trial % 2 ? KVLayout::HND : KVLayout::NHD;
    std::vector<Tensor> ks, vs, qs;
    std::vector<int32_t> qo_indptr{0}, kv_indptr{0};
    int64_t pages_needed = 0;
    for (int64_t b = 0; b < batch; ++b) {
      // Lengths hit the edge cases: 1, multiples of page_size, one past, random.
      const int64_t choices[] = {1, page_size, page_size + 1, 2 * page_size, test::random_int(rng, 1, 70)};
      const int64_t kv_len = choices[test::random_int(rng, 0, 4)];
      const int64_t qo_len = test::random_int(rng, 1, std::min<int64_t>(kv_len, 5));
      ks.push_back(test::random_tensor(rng, {kv_len, hk, d}));
      vs.push_back(test::random_tensor(rng, {kv_len, hk, d}));
      qs.push_back(test::random_tensor(rng, {qo_len, hq, d}));
      qo_indptr.push_back(qo_indptr.back() + static_cast<int32_t>(qo_len));
      kv_indptr.push_back(kv_indptr.back() + static_cast<int32_t>(kv_len));
      pages_needed += (kv_len + page_size - 1) / page_size;
    }
    const int64_t num_pages = pages_needed + 3;  // a few pages nobody uses
    const auto cache = ref::make_paged_kv_cache(ks, vs, page_size, layout, shuffled_pages(rng, num_pages), num_pages);
    const Tensor q = concat_rows(qs);
    AttentionOptions opt;
    opt.causal = trial % 3 != 0;
    opt.window_left = trial % 4 == 0 ? 3 : -1;
    CAPTURE(trial);
    CAPTURE(page_size);
    const auto paged = ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, cache, opt);
    const auto ragged = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, concat_rows(ks), concat_rows(vs),
                                                                kv_indptr, opt);
    CHECK(test::max_abs_diff(paged.o, ragged.o) < kTol);
    CHECK(test::max_abs_diff(paged.lse, ragged.lse) < kTol);
    // Every request alone through single prefill agrees too.
    for (int64_t b = 0; b < batch; ++b) {
      const auto one = ref::single_prefill_with_kv_cache(qs[static_cast<size_t>(b)], ks[static_cast<size_t>(b)],
                                                         vs[static_cast<size_t>(b)], opt);
      CHECK(test::max_abs_diff(one.o, slice_rows(paged.o, qo_indptr[b], qo_indptr[b + 1])) < kTol);
    }
    // Batch decode: the last query of each request.
    Tensor q_dec({batch, hq, d});
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t x = 0; x < d; ++x) q_dec({b, h, x}) = q({qo_indptr[b + 1] - 1, h, x});
    const auto dec = ref::batch_decode_with_paged_kv_cache(q_dec, cache, opt);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < hq; ++h) {
        CHECK(std::abs(dec.lse({b, h}) - paged.lse({qo_indptr[b + 1] - 1, h})) < kTol);
        for (int64_t x = 0; x < d; ++x)
          CHECK(std::abs(dec.o({b, h, x}) - paged.o({qo_indptr[b + 1] - 1, h, x})) < kTol);
      }
  }
}

TEST_CASE("GQA equals multi-head attention with K/V repeated per group") {
  auto rng = test::case_rng("gqa-repeat");
  CAPTURE(test::run_seed());
  for (int64_t group : {1, 4, 7, 8}) {
    const int64_t hk = 2, hq = hk * group, d = 16, kv_len = 29, qo_len = 6;
    const Tensor q = test::random_tensor(rng, {qo_len, hq, d});
    const Tensor k = test::random_tensor(rng, {kv_len, hk, d}), v = test::random_tensor(rng, {kv_len, hk, d});
    Tensor k_rep({kv_len, hq, d}), v_rep({kv_len, hq, d});
    for (int64_t j = 0; j < kv_len; ++j)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t x = 0; x < d; ++x) {
          k_rep({j, h, x}) = k({j, h / group, x});
          v_rep({j, h, x}) = v({j, h / group, x});
        }
    AttentionOptions opt;
    opt.causal = true;
    const auto gqa = ref::single_prefill_with_kv_cache(q, k, v, opt);
    const auto mha = ref::single_prefill_with_kv_cache(q, k_rep, v_rep, opt);
    CAPTURE(group);
    CHECK(test::max_abs_diff(gqa.o, mha.o) < kTol);
    CHECK(test::max_abs_diff(gqa.lse, mha.lse) < kTol);
  }
}

TEST_CASE("sliding window keeps exactly the last window_left + 1 keys") {
  auto rng = test::case_rng("window");
  CAPTURE(test::run_seed());
  const int64_t kv_len = 20, d = 4;
  const Tensor q = test::random_tensor(rng, {1, 1, d});
  const Tensor k = test::random_tensor(rng, {kv_len, 1, d}), v = test::random_tensor(rng, {kv_len, 1, d});
  for (int w : {0, 1, 5, 19, 50}) {
    AttentionOptions opt;
    opt.window_left = w;
    const auto windowed = ref::single_prefill_with_kv_cache(q, k, v, opt);
    // The same as plain attention over the last min(w + 1, kv_len) keys.
    const int64_t keep = std::min<int64_t>(w + 1, kv_len);
    const auto tail = ref::single_prefill_with_kv_cache(q, slice_rows(k, kv_len - keep, kv_len),
                                                        slice_rows(v, kv_len - keep, kv_len));
    CAPTURE(w);
    CHECK(test::max_abs_diff(windowed.o, tail.o) < kTol);
    CHECK(test::max_abs_diff(windowed.lse, tail.lse) < kTol);
  }
  // window_left = 0 sees only the diagonal key: the output is that key's value.
  AttentionOptions opt0;
  opt0.window_left = 0;
  const auto r = ref::single_prefill_with_kv_cache(q, k, v, opt0);
  for (int64_t x = 0; x < d; ++x) CHECK(r.o({0, 0, x}) == doctest::Approx(v({kv_len - 1, 0, x})));
}

TEST_CASE("soft cap bounds every score by the cap and tends to plain attention for a huge cap") {
  auto rng = test::case_rng("softcap");
  CAPTURE(test::run_seed());
  const Tensor q = test::random_tensor(rng, {3, 2, 8}, -4, 4);
  const Tensor k = test::random_tensor(rng, {11, 2, 8}, -4, 4);
  AttentionOptions opt;
  opt.logits_soft_cap = 1.5;
  const Tensor s = ref::attention_scores(q, k, 1, opt);
  AttentionOptions plain;
  const Tensor s_plain = ref::attention_scores(q, k, 1, plain);
  for (size_t i = 0; i < s.data.size(); ++i) {
    CHECK(std::abs(s.data[i]) < 1.5);
    CHECK(s.data[i] == doctest::Approx(1.5 * std::tanh(s_plain.data[i] / 1.5)).epsilon(1e-14));
  }
  AttentionOptions huge;
  huge.logits_soft_cap = 1e7;
  const Tensor v = test::random_tensor(rng, {11, 2, 8});
  CHECK(test::max_abs_diff(ref::single_prefill_with_kv_cache(q, k, v, huge).o,
                           ref::single_prefill_with_kv_cache(q, k, v, plain).o) < 1e-9);
}

TEST_CASE("fully masked rows are the empty state: o = 0, lse = -inf") {
  auto rng = test::case_rng("masked-rows");
  CAPTURE(test::run_seed());
  // Causal with more queries than keys: query i sees j <= i - 2, so rows 0, 1 see nothing.
  const Tensor q = test::random_tensor(rng, {5, 1, 4});
  const Tensor k = test::random_tensor(rng, {3, 1, 4}), v = test::random_tensor(rng, {3, 1, 4});
  AttentionOptions opt;
  opt.causal = true;
  const auto r = ref::single_prefill_with_kv_cache(q, k, v, opt);
  for (int64_t i : {0, 1}) {
    CHECK(r.lse({i, 0}) == -INFINITY);
    for (int64_t x = 0; x < 4; ++x) CHECK(r.o({i, 0, x}) == 0.0);
  }
  CHECK(std::isfinite(r.lse({2, 0})));
  // kv_len 0: every row is empty.
  const auto e = ref::single_prefill_with_kv_cache(q, Tensor({0, 1, 4}), Tensor({0, 1, 4}));
  for (double x : e.lse.data) CHECK(x == -INFINITY);
  for (double x : e.o.data) CHECK(x == 0.0);
}

TEST_CASE("a sink is one more key whose score is the sink and whose value is 0") {
  // With one query head per kv head, appending to head h's keys a row k* = q_h sink_h /
  // (sm_scale |q_h|^2) gives that key the score sm_scale q_h . k* = sink_h; with value 0 it
  // adds e^{sink_h} to the denominator and nothing to the numerator. So attention with
  // sinks must equal plain attention over the keys plus that row, causal or not.
  auto rng = test::case_rng("sinks-as-a-key");
  CAPTURE(test::run_seed());
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t h = test::random_int(rng, 1, 4), d = 16, kv_len = test::random_int(rng, 0, 40);
    const Tensor q = test::random_tensor(rng, {h, d}, -2, 2);
    const Tensor k = test::random_tensor(rng, {kv_len, h, d}, -2, 2), v = test::random_tensor(rng, {kv_len, h, d});
    AttentionOptions with;
    with.sm_scale = 0.3;
    for (int64_t x = 0; x < h; ++x) with.sinks.push_back(std::uniform_real_distribution<double>(-3, 5)(rng));
    Tensor k_ext({kv_len + 1, h, d}), v_ext({kv_len + 1, h, d});  // v_ext's last row stays 0
    for (int64_t j = 0; j < kv_len; ++j)
      for (int64_t x = 0; x < h; ++x)
        for (int64_t e = 0; e < d; ++e) {
          k_ext({j, x, e}) = k({j, x, e});
          v_ext({j, x, e}) = v({j, x, e});
        }
    for (int64_t x = 0; x < h; ++x) {
      double norm2 = 0;
      for (int64_t e = 0; e < d; ++e) norm2 += q({x, e}) * q({x, e});
      for (int64_t e = 0; e < d; ++e) k_ext({kv_len, x, e}) = q({x, e}) * with.sinks[size_t(x)] / (0.3 * norm2);
    }
    AttentionOptions plain;
    plain.sm_scale = 0.3;
    const auto got = ref::single_decode_with_kv_cache(q, k, v, with);
    const auto want = ref::single_decode_with_kv_cache(q, k_ext, v_ext, plain);
    CAPTURE(kv_len);
    CHECK(test::max_abs_diff(got.o, want.o) < 1e-12);
    CHECK(test::max_abs_diff(got.lse, want.lse) < 1e-12);
  }
  // no key at all: o = 0 and lse = the sink
  AttentionOptions only;
  only.sinks = {1.5};
  const auto empty = ref::single_decode_with_kv_cache(Tensor({1, 8}), Tensor({0, 1, 8}), Tensor({0, 1, 8}), only);
  CHECK(empty.lse.data[0] == 1.5);
  CHECK(test::max_abs_diff(empty.o, Tensor({1, 8})) == 0);
}

TEST_CASE("sinks: one finite logit per query head, or an error naming the function") {
  const Tensor q({4, 8}), k({3, 2, 8}), v({3, 2, 8});
  AttentionOptions opt;
  opt.sinks = {0.0, 1.0, 2.0};  // 3 heads' worth for 4 query heads
  CHECK_THROWS_WITH_AS(ref::single_decode_with_kv_cache(q, k, v, opt), doctest::Contains("one logit per query head"),
                       ref::InvalidArgument);
  opt.sinks = {0.0, 1.0, std::nan(""), 2.0};
  CHECK_THROWS_WITH_AS(ref::single_decode_with_kv_cache(q, k, v, opt), doctest::Contains("sinks[2] must be finite"),
                       ref::InvalidArgument);
}
