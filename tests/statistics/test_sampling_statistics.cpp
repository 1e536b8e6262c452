// Every sampling operator, on vocabularies of 111, 32000 and 128256 tokens and FlashInfer's
// parameter grid (k in {1, 10, 500}, p in {0.1, 0.5, 0.9}, min_p in {0.05, 0.5}), draws
// 10^6 tokens from one row (FlashInfer's `indices` pointing every output at it) and the
// counts are compared with the exact oracle (sampling_target_distribution):
//
//   - no draw of a token the oracle gives probability 0 (masked, filtered or zero),
//   - a binned chi-square test (bins of >= 50 expected draws) below its 1 - 3e-7 quantile,
//   - every token with >= 50 expected draws within 6 standard deviations.
//
// The same verdict is shown to reject deliberately broken samplers (one that forgets to
// renormalize, one that keeps k + 1 tokens, one that drops the token crossing top_p, one
// that is 2% off on the top token), so a pass means something. Mean and maximum
// rejection rounds are printed and bounded. Seeds are fresh per run (FLASHSTEP_SEED
// reproduces); the draws use Philox, so a seed reproduces every token.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <flashstep/kernels/philox.cuh>
#include <flashstep/reference/sampling.hpp>

#include "support/random.hpp"
#include "statistics/broken_samplers.hpp"
#include "statistics/verdict.hpp"

using namespace flashstep;
using ref::FilterApplyOrder;
using ref::SamplingFilter;
using ref::SamplingOptions;
using ref::Tensor;
using test::compare;
using test::Verdict;

namespace {

constexpr int64_t kDraws = 1000000;
const int64_t kVocabs[] = {111, 32000, 128256};
// Regression bounds on the rejection rounds, about 1.5x the largest mean (5.1, top_k = 1
// on 128256 tokens) and 3x the largest maximum (13) measured on these rows.
constexpr double kMaxMeanRounds = 8.0;
constexpr int32_t kMaxRounds = 40;

std::vector<int64_t> histogram(const std::vector<int32_t>& samples, int64_t vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  int64_t out_of_range = 0;  // counted, not asserted per draw (10^6 doctest assertions are slow)
  for (int32_t s : samples) {
    if (s < 0 || s >= vocab) {
      ++out_of_range;
      continue;
    }
    ++counts[static_cast<size_t>(s)];
  }
  REQUIRE(out_of_range == 0);
  return counts;
}

// The float32 row a sampler reads for these logits.
std::vector<float> as_float(const Tensor& probs) {
  std::vector<float> f(probs.data.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(probs.data[i]);
  return f;
}

struct Case {
  std::string name;
  int64_t vocab;
  std::function<ref::SamplingResult(const SamplingOptions&)> draw;
  std::vector<double> target;
};

void run_case(const Case& c, uint64_t seed) {
  SamplingOptions opt;
  opt.seed = seed;
  opt.indices.assign(static_cast<size_t>(kDraws), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const ref::SamplingResult r = c.draw(opt);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Verdict v = compare(histogram(r.samples, c.vocab), c.target, kDraws);
  std::printf("%-44s V=%-6lld %lld draws in %.2f s, rounds mean %.3f max %d | %s\n", c.name.c_str(),
              static_cast<long long>(c.vocab), static_cast<long long>(kDraws), seconds, r.mean_rounds(), r.max_rounds(),
              v.text().c_str());
  CAPTURE(c.name);
  CAPTURE(c.vocab);
  CAPTURE(seed);
  INFO(v.text());
  CHECK(r.samples.size() == static_cast<size_t>(kDraws));
  CHECK(v.pass());
  CHECK(r.mean_rounds() <= kMaxMeanRounds);
  CHECK(r.max_rounds() <= kMaxRounds);
}

// Runs `make_cases(vocab, logits, probs)` for each vocabulary.
void run_grid(const char* salt,
              const std::function<std::vector<Case>(int64_t, const Tensor&, const Tensor&)>& make_cases) {
  auto rng = test::case_rng(salt);
  const uint64_t seed = rng();
  CAPTURE(seed);
  for (int64_t vocab : kVocabs) {
    Tensor logits({1, vocab});
    logits.data = test::test_logits(rng, vocab, false);
    const Tensor probs = ref::softmax(logits);
    for (const Case& c : make_cases(vocab, logits, probs)) run_case(c, seed);
  }
}

std::vector<double> target_of(const Tensor& probs, const SamplingFilter& f) {
  return ref::sampling_target_distribution(as_float(probs), f);
}

const std::pair<int64_t, double> kTopKTopP[] = {{10, 0.9}, {500, 0.1}, {500, 0.5}};

}  // namespace

TEST_CASE("sampling_from_probs and sampling_from_logits match the softmax row") {
  run_grid("statistics plain", [](int64_t vocab, const Tensor& logits, const Tensor& probs) {
    const auto target = target_of(probs, SamplingFilter::none());
    return std::vector<Case>{
        {"sampling_from_probs", vocab, [probs](const SamplingOptions& o) { return ref::sampling_from_probs(probs, o); },
         target},
        {"sampling_from_logits", vocab,
         [logits](const SamplingOptions& o) { return ref::sampling_from_logits(logits, o); }, target},
    };
  });
}

TEST_CASE("top_k_sampling_from_probs matches the oracle for k in {1, 10, 500}") {
  run_grid("statistics top_k", [](int64_t vocab, const Tensor&, const Tensor& probs) {
    std::vector<Case> cases;
    for (int64_t k : {1, 10, 500})
      cases.push_back({"top_k_sampling_from_probs k=" + std::to_string(k), vocab,
                       [probs, k](const SamplingOptions& o) { return ref::top_k_sampling_from_probs(probs, k, o); },
                       target_of(probs, SamplingFilter::make_top_k(k))});
    return cases;
  });
}

TEST_CASE("top_p_sampling_from_probs matches the oracle for p in {0.1, 0.5, 0.9}") {
  run_grid("statistics top_p", [](int64_t vocab, const Tensor&, const Tensor& probs) {
    std::vector<Case> cases;
    for (double p : {0.1, 0.5, 0.9})
      cases.push_back({"top_p_sampling_from_probs p=" + std::to_string(p).substr(0, 3), vocab,
                       [probs, p](const SamplingOptions& o) { return ref::top_p_sampling_from_probs(probs, p, o); },
                       target_of(probs, SamplingFilter::make_top_p(p))});
    return cases;
  });
}

TEST_CASE("min_p_sampling_from_probs matches the oracle for min_p in {0.05, 0.5}") {
  run_grid("statistics min_p", [](int64_t vocab, const Tensor&, const Tensor& probs) {
    std::vector<Case> cases;
    for (double m : {0.05, 0.5})
      cases.push_back({"min_p_sampling_from_probs min_p=" + std::to_string(m).substr(0, 4), vocab,
                       [probs, m](const SamplingOptions& o) { return ref::min_p_sampling_from_probs(probs, m, o); },
                       target_of(probs, SamplingFilter::make_min_p(m))});
    return cases;
  });
}

TEST_CASE("top_k_renorm_probs, top_p_renorm_probs and top_k_mask_logits, then plain sampling, match the filters") {
  // FlashInfer: "top_k_renorm_probs + sampling_from_probs should be equivalent to
  // top_k_sampling_from_probs", and likewise for top-p and for mask + softmax.
  run_grid("statistics renorm", [](int64_t vocab, const Tensor& logits, const Tensor& probs) {
    const Tensor top_k = ref::top_k_renorm_probs(probs, 10), top_p = ref::top_p_renorm_probs(probs, 0.5);
    const Tensor masked = ref::top_k_mask_logits(logits, 10);
    return std::vector<Case>{
        {"sampling_from_probs(top_k_renorm_probs k=10)", vocab,
         [top_k](const SamplingOptions& o) { return ref::sampling_from_probs(top_k, o); },
         target_of(probs, SamplingFilter::make_top_k(10))},
        {"sampling_from_probs(top_p_renorm_probs p=0.5)", vocab,
         [top_p](const SamplingOptions& o) { return ref::sampling_from_probs(top_p, o); },
         target_of(probs, SamplingFilter::make_top_p(0.5))},
        {"sampling_from_logits(top_k_mask_logits k=10)", vocab,
         [masked](const SamplingOptions& o) { return ref::sampling_from_logits(masked, o); },
         target_of(probs, SamplingFilter::make_top_k(10))},
    };
  });
}

TEST_CASE("top_k_top_p_sampling_from_probs, joint, matches the oracle") {
  run_grid("statistics top_k_top_p joint", [](int64_t vocab, const Tensor&, const Tensor& probs) {
    std::vector<Case> cases;
    for (const auto& [k, p] : kTopKTopP)
      cases.push_back(
          {"top_k_top_p_sampling_from_probs joint k=" + std::to_string(k) + " p=" + std::to_string(p).substr(0, 3),
           vocab,
           [probs, k = k, p = p](const SamplingOptions& o) {
             return ref::top_k_top_p_sampling_from_probs(probs, k, p, FilterApplyOrder::joint, o);
           },
           target_of(probs, SamplingFilter::make_top_k_top_p(k, p))});
    return cases;
  });
}

TEST_CASE("top_k_top_p_sampling_from_probs, top_k_first, matches top-p on the renormalized top-k") {
  run_grid("statistics top_k_top_p top_k_first", [](int64_t vocab, const Tensor&, const Tensor& probs) {
    std::vector<Case> cases;
    for (const auto& [k, p] : kTopKTopP)
      cases.push_back({"top_k_top_p_sampling_from_probs top_k_first k=" + std::to_string(k) +
                           " p=" + std::to_string(p).substr(0, 3),
                       vocab,
                       [probs, k = k, p = p](const SamplingOptions& o) {
                         return ref::top_k_top_p_sampling_from_probs(probs, k, p, FilterApplyOrder::top_k_first, o);
                       },
                       // top-p on the renormalized top-k row, read as float32 again.
                       target_of(ref::top_k_renorm_probs(probs, k), SamplingFilter::make_top_p(p))});
    return cases;
  });
}

TEST_CASE("top_k_top_p_sampling_from_logits, joint and top_k_first, match their oracles") {
  run_grid("statistics top_k_top_p logits", [](int64_t vocab, const Tensor& logits, const Tensor& probs) {
    const int64_t k = 10;
    const double p = 0.5;
    return std::vector<Case>{
        {"top_k_top_p_sampling_from_logits joint k=10 p=0.5", vocab,
         [logits](const SamplingOptions& o) {
           return ref::top_k_top_p_sampling_from_logits(logits, 10, 0.5, FilterApplyOrder::joint, o);
         },
         target_of(probs, SamplingFilter::make_top_k_top_p(k, p))},
        {"top_k_top_p_sampling_from_logits top_k_first k=10 p=0.5", vocab,
         [logits](const SamplingOptions& o) {
           return ref::top_k_top_p_sampling_from_logits(logits, 10, 0.5, FilterApplyOrder::top_k_first, o);
         },
         target_of(ref::softmax(ref::top_k_mask_logits(logits, k)), SamplingFilter::make_top_p(p))},
    };
  });
}

namespace {

// 10^6 draws from an explicit distribution by inverse CDF over Philox uniforms: how a
// broken sampler would behave, without writing one per bug.
std::vector<int64_t> draw_from(const std::vector<double>& dist, uint64_t seed) {
  std::vector<double> cdf(dist.size());
  std::partial_sum(dist.begin(), dist.end(), cdf.begin());
  std::vector<int64_t> counts(dist.size(), 0);
  for (int64_t i = 0; i < kDraws; ++i) {
    const double u = kernels::philox_uniform(seed, static_cast<uint64_t>(i), 0) * cdf.back();
    size_t t = static_cast<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    while (dist[std::min(t, dist.size() - 1)] == 0.0 && t > 0) --t;  // never land on a zero by rounding
    ++counts[std::min(t, dist.size() - 1)];
  }
  return counts;
}

}  // namespace

TEST_CASE("the same verdict rejects broken samplers and accepts the oracle's own draws") {
  auto rng = test::case_rng("statistics broken samplers");
  const uint64_t seed = rng();
  CAPTURE(seed);
  for (int64_t vocab : {int64_t{111}, int64_t{32000}}) {
    Tensor logits({1, vocab});
    logits.data = test::test_logits(rng, vocab, false);
    const auto row = as_float(ref::softmax(logits));
    CAPTURE(vocab);
    auto report = [&](const char* what, const Verdict& v) {
      std::printf("%-44s V=%-6lld %s\n", what, static_cast<long long>(vocab), v.text().c_str());
    };

    const test::BrokenSamplers b = test::broken_samplers(row, kDraws);
    auto support = [](const std::vector<double>& d) {
      return std::count_if(d.begin(), d.end(), [](double x) { return x > 0.0; });
    };
    // the nucleus: the four most likely tokens (and any tied with the fourth); the short head three
    REQUIRE(support(b.top_p) >= 4);
    REQUIRE(support(b.short_head) == 3);

    // Control: draws from the target itself pass.
    const Verdict control = compare(draw_from(b.top_k, seed), b.top_k, kDraws);
    report("control: exact top_k=10 draws", control);
    CHECK(control.pass());

    // Keeps one token more than top_k = 10 does (an off-by-one in the count test; on the
    // 111-token row ranks 10 and 11 are tied, so the next k that grows the set is used).
    const Verdict v1 = compare(draw_from(b.k_plus_1, seed), b.top_k, kDraws);
    report("broken: top_k keeps k+1 tokens", v1);
    CHECK_FALSE(v1.pass());

    // Forgets to renormalize: u is drawn over the whole row, and a draw that lands outside
    // the top-p head falls back to the head's last token (in vocabulary order).
    const Verdict v2 = compare(draw_from(b.no_renorm, seed), b.top_p, kDraws);
    report("broken: top_p forgets to renormalize", v2);
    CHECK_FALSE(v2.pass());

    // Drops the token that crosses top_p (keeps only tokens whose cumulative mass <= p).
    const Verdict v3 = compare(draw_from(b.short_head, seed), b.top_p, kDraws);
    report("broken: top_p drops the crossing token", v3);
    CHECK_FALSE(v3.pass());

    // Subtle: the top token 2% too likely (renormalized), everything else right.
    const Verdict v4 = compare(draw_from(b.tilted, seed), b.top_k, kDraws);
    report("broken: top_k with the top token 2% heavy", v4);
    CAPTURE(b.tilt);
    CHECK_FALSE(v4.pass());
  }
}
