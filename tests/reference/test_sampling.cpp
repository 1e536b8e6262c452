// Sampling reference (reference/sampling.hpp): exact-mass arithmetic, the sorting oracle
// on hand-made rows, the rejection sampler one output at a time == all outputs batched
// (draw for draw), the Philox (seed, offset) -> (output, round) mapping, softmax /
// renorm / mask, and bad input. The 10^6-draw distribution tests live in
// tests/statistics/ (CTest label `statistics`).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <flashstep/kernels/philox.cuh>
#include <flashstep/reference/errors.hpp>
#include <flashstep/reference/sampling.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::FilterApplyOrder;
using ref::FilterKind;
using ref::Mass;
using ref::SamplerEvaluation;
using ref::SamplingFilter;
using ref::SamplingOptions;
using ref::Tensor;

using flashstep::test::expect_error;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

Mass pow2(int e) { return Mass{1} << e; }

// A row with ties (logits on a 1/4 grid), some exact zeros, as float32 probabilities.
std::vector<float> random_row(std::mt19937_64& rng, int64_t vocab, double zero_fraction = 0.1) {
  std::normal_distribution<double> logit(0.0, 2.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> w(static_cast<size_t>(vocab));
  double sum = 0.0;
  for (auto& x : w) {
    x = unit(rng) < zero_fraction ? 0.0 : std::exp(std::round(4.0 * logit(rng)) / 4.0);
    sum += x;
  }
  if (sum == 0.0) {
    w[0] = 1.0;
    sum = 1.0;
  }
  std::vector<float> p(w.size());
  for (size_t i = 0; i < w.size(); ++i) p[i] = static_cast<float>(w[i] / sum);
  return p;
}

Tensor as_tensor(const std::vector<std::vector<float>>& rows) {
  Tensor t({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())});
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t i = 0; i < rows[r].size(); ++i) t.data[r * rows[r].size() + i] = rows[r][i];
  return t;
}

std::vector<float> dyadic_row() { return {0.5f, 0.25f, 0.125f, 0.125f}; }

void check_target(const std::vector<double>& got, const std::vector<double>& expected) {
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-15));
  }
}

}  // namespace

TEST_CASE("sampling: exact masses are floor(p * 2^96) and the thresholds are exact") {
  CHECK(ref::mass_of(1.0f) == pow2(96));
  CHECK(ref::mass_of(0.5f) == pow2(95));
  CHECK(ref::mass_of(0.375f) == 3 * pow2(93));
  CHECK(ref::mass_of(0.0f) == 0);
  CHECK(ref::mass_of(std::ldexp(1.0f, -96)) == 1);
  CHECK(ref::mass_of(std::ldexp(1.0f, -97)) == 0);                // below one unit
  CHECK(ref::mass_of(std::ldexp(3.0f, -97)) == 1);                // 1.5 units, truncated
  CHECK(ref::mass_of(std::ldexp(1.0f, -140)) == 0);               // denormal
  CHECK(ref::mass_of(std::ldexp(16777215.0f, -96)) == 16777215);  // 24-bit significand, exact
  // floor(u * q / 2^24)
  CHECK(ref::scaled_threshold(1u << 23, pow2(96)) == pow2(95));
  CHECK(ref::scaled_threshold((1u << 24) - 1, 1) == 0);
  CHECK(ref::scaled_threshold(3, pow2(126) + 12345) == 3 * pow2(102));
  CHECK(ref::scaled_threshold(5, 7 * pow2(64) + 9) == 35 * pow2(40));  // 45 / 2^24 truncates away
  // ceil(fraction * total)
  CHECK(ref::mass_fraction_ceil(10, 0.5f) == 5);
  CHECK(ref::mass_fraction_ceil(11, 0.5f) == 6);
  CHECK(ref::mass_fraction_ceil(pow2(100) + 1, 1.0f) == pow2(100) + 1);
  // 0.1f = 13421773 * 2^-27
  CHECK(ref::mass_fraction_ceil(pow2(96), 0.1f) == Mass{13421773} * pow2(69));
  CHECK(ref::mass_fraction_ceil(3, 0.1f) == 1);
  CHECK(ref::mass_fraction_ceil(pow2(120), std::ldexp(1.0f, -140)) == 1);  // tiny, rounds up
  CHECK(ref::mass_to_double(pow2(95)) == 0.5);
}

TEST_CASE("sampling: the oracle keeps the sorted head, ties included, and renormalizes") {
  // Row [1/2, 1/4, 1/8, 1/8]: dyadic, so every mass is exact and the rules are by hand.
  const auto row = dyadic_row();
  check_target(ref::sampling_target_distribution(row, SamplingFilter::none()), {0.5, 0.25, 0.125, 0.125});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k(1)), {1, 0, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k(2)), {2.0 / 3, 1.0 / 3, 0, 0});
  // k = 3 cuts inside the tie at 1/8: both tied tokens stay.
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k(3)), {0.5, 0.25, 0.125, 0.125});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k(100)), {0.5, 0.25, 0.125, 0.125});
  // top-p: keep i iff the mass strictly above it is < P.
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_p(0.5)), {1, 0, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_p(0.75)), {2.0 / 3, 1.0 / 3, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_p(0.76)), {0.5, 0.25, 0.125, 0.125});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_p(1.0)), {0.5, 0.25, 0.125, 0.125});
  // min-p: keep p >= max_p * min_p.
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_min_p(0.5)), {2.0 / 3, 1.0 / 3, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_min_p(0.25)), {0.5, 0.25, 0.125, 0.125});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_min_p(1.0)), {1, 0, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_min_p(0.0)), {0.5, 0.25, 0.125, 0.125});
  // joint: both rules on the original row.
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k_top_p(3, 0.6)),
               {2.0 / 3, 1.0 / 3, 0, 0});
  check_target(ref::sampling_target_distribution(row, SamplingFilter::make_top_k_top_p(1, 0.9)), {1, 0, 0, 0});
  // Zeros are never kept, and an unnormalized row is renormalized by its exact total.
  check_target(ref::sampling_target_distribution({0.0f, 0.25f, 0.0f, 0.25f}, SamplingFilter::none()), {0, 0.5, 0, 0.5});
  check_target(ref::sampling_target_distribution({0.0f, 0.25f, 0.0f, 0.25f}, SamplingFilter::make_top_p(0.5)),
               {0, 0.5, 0, 0.5});
  check_target(ref::sampling_target_distribution({0.0f, 0.25f, 0.0f, 0.25f}, SamplingFilter::make_top_p(0.49)),
               {0, 0.5, 0, 0.5});
  check_target(ref::sampling_target_distribution({0.0f, 0.25f, 0.0f, 0.125f}, SamplingFilter::make_top_p(0.6)),
               {0, 1, 0, 0});
}

TEST_CASE("sampling: renorm and mask operators follow the keep rules") {
  const Tensor probs({2, 4}, {0.5, 0.25, 0.125, 0.125, 0.125, 0.125, 0.25, 0.5});
  const Tensor k = ref::top_k_renorm_probs(probs, std::vector<int64_t>{2, 1});
  const double expected_k[] = {2.0 / 3, 1.0 / 3, 0, 0, 0, 0, 0, 1};
  for (int i = 0; i < 8; ++i) CHECK(k.data[i] == doctest::Approx(expected_k[i]).epsilon(1e-15));
  const Tensor p = ref::top_p_renorm_probs(probs, 0.75);
  const double expected_p[] = {2.0 / 3, 1.0 / 3, 0, 0, 0, 0, 1.0 / 3, 2.0 / 3};
  for (int i = 0; i < 8; ++i) CHECK(p.data[i] == doctest::Approx(expected_p[i]).epsilon(1e-15));
  // FlashInfer's top_k_mask_logits docstring example (k = 3), and a tie at the k-th value.
  const Tensor logits({2, 5}, {1.0783, 0.8008, 1.6806, 0.3559, -0.6866, 1, 3, 2, 3, -kInf});
  const Tensor masked = ref::top_k_mask_logits(logits, std::vector<int64_t>{3, 1});
  const double expected_m[] = {1.0783, 0.8008, 1.6806, -kInf, -kInf, -kInf, 3, -kInf, 3, -kInf};
  for (int i = 0; i < 10; ++i) {
    CAPTURE(i);
    CHECK(masked.data[i] == expected_m[i]);
  }
}

TEST_CASE("sampling: softmax with temperature") {
  // softmax([0, ln 2, ln 3]) = [1, 2, 3] / 6; at temperature 2 the weights are square roots.
  const Tensor logits({2, 3}, {0, std::log(2.0), std::log(3.0), 0, std::log(2.0), std::log(3.0)});
  const Tensor p = ref::softmax(logits, std::vector<double>{1.0, 2.0});
  const double z = 1 + std::sqrt(2.0) + std::sqrt(3.0);
  const double expected[] = {1.0 / 6, 2.0 / 6, 3.0 / 6, 1 / z, std::sqrt(2.0) / z, std::sqrt(3.0) / z};
  for (int i = 0; i < 6; ++i) CHECK(p.data[i] == doctest::Approx(expected[i]).epsilon(1e-14));
  // -inf logits get probability 0; a huge logit does not overflow.
  const Tensor q = ref::softmax(Tensor({1, 3}, {-kInf, 1000.0, 1000.0}));
  CHECK(q.data[0] == 0.0);
  CHECK(q.data[1] == doctest::Approx(0.5).epsilon(1e-15));
}

TEST_CASE("sampling: draw i uses Philox subsequence i at offset + round (plain sampling, by hand)") {
  auto rng = test::case_rng("sampling philox mapping");
  const uint64_t seed = rng(), offset = rng() % 1000;
  CAPTURE(seed);
  CAPTURE(offset);
  const auto row = random_row(rng, 97);
  SamplingOptions opt;
  opt.seed = seed;
  opt.offset = offset;
  opt.indices.assign(500, 0);
  for (auto evaluation : {SamplerEvaluation::per_output, SamplerEvaluation::batched}) {
    opt.evaluation = evaluation;
    const auto r = ref::sampling_from_probs(as_tensor({row}), opt);
    // Independent inverse CDF in long double: the first token whose cumulative
    // probability exceeds u * total (a tie within 1e-18 of u would be needed to disagree).
    long double total = 0;
    for (float p : row) total += p;
    for (size_t i = 0; i < 500; ++i) {
      const long double u = kernels::philox_uniform(seed, i, offset);
      long double cdf = 0;
      int32_t expected = -1;
      for (size_t t = 0; t < row.size() && expected < 0; ++t) {
        cdf += row[t];
        if (row[t] > 0 && cdf > u * total) expected = static_cast<int32_t>(t);
      }
      CAPTURE(i);
      REQUIRE(r.samples[i] == expected);
      REQUIRE(r.rounds[i] == 1);
    }
  }
}

TEST_CASE("sampling: one output at a time and all outputs batched give the same tokens and rounds") {
  auto rng = test::case_rng("sampling per_output == batched");
  const uint64_t seed = rng();
  CAPTURE(seed);
  // (vocab, outputs): a small vocabulary with many outputs takes the sweep path, big ones
  // the Fenwick path; 4096 x 2000 takes both.
  const std::pair<int64_t, size_t> shapes[] = {{1, 50}, {2, 200}, {111, 3000}, {4096, 2000}, {32000, 24}, {128256, 6}};
  const FilterKind kinds[] = {FilterKind::none, FilterKind::top_k, FilterKind::top_p, FilterKind::min_p,
                              FilterKind::top_k_top_p};
  for (const auto& [vocab, outputs] : shapes) {
    const auto row = random_row(rng, vocab, vocab > 2 ? 0.1 : 0.0);
    for (FilterKind kind : kinds) {
      CAPTURE(vocab);
      CAPTURE(ref::to_string(kind));
      // One random filter per output, boundary values included.
      std::vector<SamplingFilter> filters;
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      for (size_t i = 0; i < outputs; ++i) {
        const int64_t k = i % 7 == 0 ? 1 : test::random_int(rng, 1, vocab + 2);
        const double p = i % 5 == 0 ? 1.0 : std::max(1e-3, unit(rng));
        const double m = i % 6 == 0 ? (i % 12 == 0 ? 0.0 : 1.0) : unit(rng);
        SamplingFilter f;
        f.kind = kind;
        f.top_k = k;
        f.top_p = static_cast<float>(p);
        f.min_p = static_cast<float>(m);
        filters.push_back(f);
      }
      std::vector<uint64_t> subsequences(outputs);
      for (size_t i = 0; i < outputs; ++i) subsequences[i] = 3 * i + 1;
      const uint64_t offset = 17;
      const auto batched = ref::rejection_sample_row_batched(row.data(), vocab, filters, subsequences, seed, offset);
      const auto target_check = [&](size_t i, int32_t token) {
        // Whatever is drawn must be in the oracle's support.
        const auto t = ref::sampling_target_distribution(row, filters[i]);
        return token >= 0 && token < vocab && t[static_cast<size_t>(token)] > 0.0;
      };
      for (size_t i = 0; i < outputs; ++i) {
        const auto one = ref::rejection_sample_row(row.data(), vocab, filters[i], seed, subsequences[i], offset);
        CAPTURE(i);
        REQUIRE(one.token == batched[i].token);
        REQUIRE(one.rounds == batched[i].rounds);
        if (i < (vocab > 10000 ? 4u : 64u)) REQUIRE(target_check(i, one.token));
      }
      // A shared filter takes the same path as per-output filters.
      const auto shared = ref::rejection_sample_row_batched(row.data(), vocab, {filters[0]}, subsequences, seed,
                                                            offset);
      for (size_t i = 0; i < std::min<size_t>(outputs, 200); ++i) {
        const auto one = ref::rejection_sample_row(row.data(), vocab, filters[0], seed, subsequences[i], offset);
        REQUIRE(one.token == shared[i].token);
        REQUIRE(one.rounds == shared[i].rounds);
      }
    }
  }
}

TEST_CASE("sampling: operators agree across evaluations, reproduce per seed, and never draw zeros") {
  auto rng = test::case_rng("sampling operators");
  const uint64_t seed = rng();
  CAPTURE(seed);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 3; ++r) rows.push_back(random_row(rng, 300, 0.3));
  const Tensor probs = as_tensor(rows);
  SamplingOptions opt;
  opt.seed = seed;
  for (int i = 0; i < 600; ++i) opt.indices.push_back(i % 3);
  using Op = std::function<ref::SamplingResult(const SamplingOptions&)>;
  const std::vector<std::pair<const char*, Op>> ops = {
      {"sampling_from_probs", [&](const SamplingOptions& o) { return ref::sampling_from_probs(probs, o); }},
      {"top_k", [&](const SamplingOptions& o) { return ref::top_k_sampling_from_probs(probs, 5, o); }},
      {"top_p", [&](const SamplingOptions& o) { return ref::top_p_sampling_from_probs(probs, 0.3, o); }},
      {"min_p", [&](const SamplingOptions& o) { return ref::min_p_sampling_from_probs(probs, 0.2, o); }},
      {"joint",
       [&](const SamplingOptions& o) {
         return ref::top_k_top_p_sampling_from_probs(probs, 20, 0.5, FilterApplyOrder::joint, o);
       }},
      {"top_k_first",
       [&](const SamplingOptions& o) {
         return ref::top_k_top_p_sampling_from_probs(probs, 20, 0.5, FilterApplyOrder::top_k_first, o);
       }},
  };
  for (const auto& [name, op] : ops) {
    CAPTURE(name);
    SamplingOptions a = opt, b = opt;
    a.evaluation = SamplerEvaluation::per_output;
    b.evaluation = SamplerEvaluation::batched;
    const auto ra = op(a), rb = op(b), rc = op(opt);
    REQUIRE(ra.samples == rb.samples);
    REQUIRE(ra.rounds == rb.rounds);
    REQUIRE(ra.samples == rc.samples);
    for (size_t i = 0; i < ra.samples.size(); ++i)
      REQUIRE(rows[static_cast<size_t>(opt.indices[i])][static_cast<size_t>(ra.samples[i])] > 0.0f);
    // Another seed or offset gives other draws (600 draws agreeing by chance is impossible here).
    SamplingOptions other = opt;
    other.seed = seed + 1;
    CHECK(op(other).samples != ra.samples);
    other = opt;
    other.offset = 1000;
    CHECK(op(other).samples != ra.samples);
  }
}

TEST_CASE("sampling: round counts (one for plain and min-p, one when k keeps every token)") {
  auto rng = test::case_rng("sampling rounds");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const Tensor probs = as_tensor({random_row(rng, 1000, 0.0)});
  SamplingOptions opt;
  opt.seed = seed;
  opt.indices.assign(2000, 0);
  for (const auto& r :
       {ref::sampling_from_probs(probs, opt), ref::min_p_sampling_from_probs(probs, 0.3, opt),
        ref::top_k_sampling_from_probs(probs, 1000, opt), ref::top_p_sampling_from_probs(probs, 1.0, opt)}) {
    CHECK(r.max_rounds() == 1);
    CHECK(r.mean_rounds() == 1.0);
  }
  // top_k = 1 on a spread-out row needs rejections.
  CHECK(ref::top_k_sampling_from_probs(probs, 1, opt).mean_rounds() > 1.0);
}

TEST_CASE("sampling: bad input names the argument and the rule") {
  const Tensor good({2, 4}, {0.5, 0.25, 0.125, 0.125, 0.25, 0.25, 0.25, 0.25});
  auto with = [&](int64_t i, double v) {
    Tensor t = good;
    t.data[static_cast<size_t>(i)] = v;
    return t;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  expect_error([&] { ref::sampling_from_probs(with(5, nan)); }, {"sampling_from_probs", "probs[1, 1]", "NaN"});
  expect_error([&] { ref::top_k_sampling_from_probs(with(2, -0.1), 2); },
               {"top_k_sampling_from_probs", "non-negative", "probs[0, 2] = -0.1"});
  expect_error([&] { ref::sampling_from_probs(with(0, 1.5)); }, {"probs", "<= 1"});
  expect_error(
      [&] {
        ref::sampling_from_probs(Tensor({2, 3}, {0.2, 0.3, 0.5, 0, 0, 0}));
      },
      {"sampling_from_probs", "row 1", "sums to zero"});
  expect_error([&] { ref::sampling_from_probs(Tensor({2, 0})); }, {"sampling_from_probs", "vocab_size >= 1"});
  expect_error([&] { ref::sampling_from_probs(Tensor({4}, 0.25)); }, {"probs", "rank 2"});
  expect_error([&] { ref::top_k_sampling_from_probs(good, 0); },
               {"top_k_sampling_from_probs", "top_k must be >= 1", "= 0"});
  expect_error([&] { ref::top_k_sampling_from_probs(good, std::vector<int64_t>{3, -2}); }, {"top_k[1] = -2"});
  expect_error(
      [&] {
        ref::top_k_sampling_from_probs(good, std::vector<int64_t>{3, 2, 1});
      },
      {"top_k", "scalar or have one value per output (2)"});
  expect_error([&] { ref::top_p_sampling_from_probs(good, 0.0); },
               {"top_p_sampling_from_probs", "top_p must be in (0, 1]", "= 0"});
  expect_error([&] { ref::top_p_sampling_from_probs(good, 1.5); }, {"top_p", "(0, 1]", "1.5"});
  expect_error([&] { ref::top_p_sampling_from_probs(good, nan); }, {"top_p", "(0, 1]"});
  expect_error([&] { ref::top_p_renorm_probs(good, -0.5); }, {"top_p_renorm_probs", "top_p"});
  expect_error([&] { ref::min_p_sampling_from_probs(good, -0.1); },
               {"min_p_sampling_from_probs", "min_p must be in [0, 1]"});
  expect_error([&] { ref::min_p_sampling_from_probs(good, 1.01); }, {"min_p", "[0, 1]", "1.01"});
  expect_error([&] { ref::top_k_top_p_sampling_from_probs(good, 0, 0.5); },
               {"top_k_top_p_sampling_from_probs", "top_k"});
  expect_error([&] { ref::top_k_top_p_sampling_from_probs(good, 2, 2.0); },
               {"top_k_top_p_sampling_from_probs", "top_p"});
  expect_error([&] { ref::top_k_renorm_probs(good, 0); }, {"top_k_renorm_probs", "top_k"});
  expect_error([&] { ref::parse_filter_apply_order("both"); }, {"filter_apply_order", "\"both\""});
  SamplingOptions bad_index;
  bad_index.indices = {0, 2};
  expect_error([&] { ref::sampling_from_probs(good, bad_index); }, {"sampling_from_probs", "indices[1] = 2"});
  // Temperature: > 0 required; 0 is greedy, which is an argmax, not a softmax.
  const Tensor logits({1, 3}, {0.1, 0.2, 0.3});
  expect_error([&] { ref::softmax(logits, 0.0); }, {"softmax", "temperature must be finite and > 0", "greedy"});
  expect_error([&] { ref::softmax(logits, -1.0); }, {"temperature", "-1"});
  expect_error([&] { ref::softmax(logits, kInf); }, {"temperature", "inf"});
  expect_error([&] { ref::softmax(Tensor({1, 3}, {0.1, nan, 0.3})); }, {"softmax", "logits[0, 1]", "NaN"});
  expect_error([&] { ref::softmax(Tensor({1, 3}, {0.1, kInf, 0.3})); }, {"logits[0, 1]", "+inf"});
  expect_error(
      [&] {
        ref::sampling_from_logits(Tensor({1, 2}, {-kInf, -kInf}));
      },
      {"sampling_from_logits", "entirely -inf"});
  expect_error([&] { ref::top_k_mask_logits(Tensor({1, 0}), 1); }, {"top_k_mask_logits", "vocab_size >= 1"});
}
