// Stage 06's samplers on the GPU against the exact oracle, with the verdict of the
// reference's statistics suite (statistics/verdict.hpp: no draw off the support, binned
// chi-square, per-token bound): 10^6 draws per operator and parameter on rows of 111 and
// 1024 tokens, 10^5 on a 128256-token row, every output pointed at the same row through
// `indices`. The same verdict must reject the four broken samplers of the reference
// suite, here drawn by the GPU sampler itself from the broken distributions. Token
// equality with the reference is tests/stages/test_sampling.cpp's job; this suite shows
// the GPU draws have the right law at scale, and prints the rejection rounds.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "06_sampling/sampling.hpp"
#include "flashstep/reference/sampling.hpp"
#include "sampling_support.hpp"
#include "statistics/broken_samplers.hpp"
#include "statistics/verdict.hpp"
#include "support/random.hpp"

namespace gpu = flashstep::stages::sampling;
namespace ref = flashstep::ref;
using flashstep::test::compare;
using flashstep::test::DeviceArray;
using flashstep::test::Verdict;
using ref::SamplingFilter;

namespace {

constexpr double kMaxMeanRounds = 8.0;  // as the reference suite
constexpr int32_t kMaxRounds = 40;

std::vector<float> as_float(const ref::Tensor& t) { return std::vector<float>(t.data.begin(), t.data.end()); }

// A draw on the GPU: fills `out` for `batch` outputs that all read row 0.
using GpuDraw = std::function<void(const gpu::SamplingOutputs&, const gpu::SamplingOptions&)>;

struct Run {
  std::vector<int64_t> counts;
  double mean_rounds = 0.0;
  int32_t max_rounds = 0;
  int64_t bad_tokens = 0;
};

Run draw(const GpuDraw& call, int64_t vocab, int64_t draws, uint64_t seed) {
  DeviceArray<int32_t> indices(std::vector<int32_t>(static_cast<size_t>(draws), 0));
  DeviceArray<int32_t> samples(static_cast<size_t>(draws)), rounds(static_cast<size_t>(draws));
  samples.poison(), rounds.poison();
  gpu::SamplingOptions opt;
  opt.indices = indices.get();
  opt.batch = draws;
  opt.seed = seed;
  call({samples.get(), rounds.get(), nullptr}, opt);
  const auto s = samples.download(), r = rounds.download();
  Run run;
  run.counts.assign(static_cast<size_t>(vocab), 0);
  for (int32_t t : s) {
    if (t < 0 || t >= vocab) {
      ++run.bad_tokens;
    } else {
      ++run.counts[static_cast<size_t>(t)];
    }
  }
  run.mean_rounds = std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(r.size());
  run.max_rounds = *std::max_element(r.begin(), r.end());
  return run;
}

void expect_law(const std::string& name, const GpuDraw& call, const std::vector<double>& target, int64_t draws,
                uint64_t seed) {
  const int64_t vocab = static_cast<int64_t>(target.size());
  const auto t0 = std::chrono::steady_clock::now();
  const Run run = draw(call, vocab, draws, seed);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Verdict v = compare(run.counts, target, draws);
  std::printf("GPU %-46s V=%-6lld %lld draws in %.2f s, rounds mean %.3f max %d | %s\n", name.c_str(),
              static_cast<long long>(vocab), static_cast<long long>(draws), seconds, run.mean_rounds, run.max_rounds,
              v.text().c_str());
  CAPTURE(name);
  CAPTURE(vocab);
  CAPTURE(seed);
  INFO(v.text());
  CHECK(run.bad_tokens == 0);
  CHECK(v.pass());
  CHECK(run.mean_rounds <= kMaxMeanRounds);
  CHECK(run.max_rounds <= kMaxRounds);
}

// The row and its float32 probabilities on the device.
struct Row {
  int64_t vocab;
  ref::Tensor logits, probs;
  std::vector<float> p;
  DeviceArray<float> d_probs, d_logits;
  Row(std::mt19937_64& rng, int64_t v) : vocab(v), logits({1, v}) {
    logits.data = flashstep::test::test_logits(rng, v, true);
    probs = ref::softmax(logits);
    p = as_float(probs);
    d_probs = DeviceArray<float>(p);
    d_logits = DeviceArray<float>(as_float(logits));
  }
  gpu::DeviceRows rows() const { return {d_probs.get(), 1, vocab}; }
  gpu::DeviceRows logit_rows() const { return {d_logits.get(), 1, vocab}; }
  std::vector<double> target(const SamplingFilter& f) const { return ref::sampling_target_distribution(p, f); }
};

void run_operators(int64_t vocab, int64_t draws, bool full) {
  auto rng = flashstep::test::case_rng("gpu statistics " + std::to_string(vocab));
  const uint64_t seed = rng();
  CAPTURE(seed);
  const Row row(rng, vocab);
  const auto probs = row.rows();
  expect_law(
      "sampling_from_probs", [&](auto out, auto opt) { gpu::sampling_from_probs(probs, out, opt); },
      row.target(SamplingFilter::none()), draws, seed);
  for (int64_t k : full ? std::vector<int64_t>{1, 10, 500} : std::vector<int64_t>{50})
    expect_law(
        "top_k_sampling_from_probs k=" + std::to_string(k),
        [&](auto out, auto opt) { gpu::top_k_sampling_from_probs(probs, k, out, opt); },
        row.target(SamplingFilter::make_top_k(k)), draws, seed);
  for (double p : full ? std::vector<double>{0.1, 0.5, 0.9} : std::vector<double>{0.9})
    expect_law(
        "top_p_sampling_from_probs p=" + std::to_string(p).substr(0, 3),
        [&](auto out, auto opt) { gpu::top_p_sampling_from_probs(probs, p, out, opt); },
        row.target(SamplingFilter::make_top_p(p)), draws, seed);
  for (double m : full ? std::vector<double>{0.05, 0.5} : std::vector<double>{0.05})
    expect_law(
        "min_p_sampling_from_probs min_p=" + std::to_string(m).substr(0, 4),
        [&](auto out, auto opt) { gpu::min_p_sampling_from_probs(probs, m, out, opt); },
        row.target(SamplingFilter::make_min_p(m)), draws, seed);
  const std::vector<std::pair<int64_t, double>> kp = full ? std::vector<std::pair<int64_t, double>>{{10, 0.9},
                                                                                                    {500, 0.5}}
                                                          : std::vector<std::pair<int64_t, double>>{{50, 0.9}};
  for (const auto& [k, p] : kp) {
    const std::string suffix = " k=" + std::to_string(k) + " p=" + std::to_string(p).substr(0, 3);
    expect_law(
        "top_k_top_p_sampling_from_probs joint" + suffix,
        [&, k = k, p = p](auto out, auto opt) {
          gpu::top_k_top_p_sampling_from_probs(probs, k, p, ref::FilterApplyOrder::joint, out, {}, opt);
        },
        row.target(SamplingFilter::make_top_k_top_p(k, p)), draws, seed);
    // top_k_first: top-p on the renormalized top-k row (one row: the workspace holds one
    // renormalized row per output, so the draw goes through renorm + sampling instead)
    DeviceArray<float> renormed(static_cast<size_t>(vocab));
    gpu::top_k_renorm_probs(probs, k, renormed.get());
    const ref::Tensor renormed_ref = ref::top_k_renorm_probs(row.probs, k);
    expect_law(
        "top_k_renorm_probs + top_p_sampling (top_k_first)" + suffix,
        [&, p = p](auto out, auto opt) {
          gpu::top_p_sampling_from_probs({renormed.get(), 1, vocab}, p, out, opt);
        },
        ref::sampling_target_distribution(as_float(renormed_ref), SamplingFilter::make_top_p(p)), draws, seed);
  }
  if (!full) return;
  DeviceArray<float> transformed(static_cast<size_t>(vocab));
  gpu::top_p_renorm_probs(probs, 0.5, transformed.get());
  expect_law(
      "sampling_from_probs(top_p_renorm_probs p=0.5)",
      [&](auto out, auto opt) {
        gpu::sampling_from_probs({transformed.get(), 1, vocab}, out, opt);
      },
      row.target(SamplingFilter::make_top_p(0.5)), draws, seed);
  const size_t bytes = gpu::workspace_bytes("sampling_from_logits", 1, draws, vocab);
  DeviceArray<uint8_t> ws(bytes);
  expect_law(
      "sampling_from_logits",
      [&](auto out, auto opt) {
        gpu::sampling_from_logits(row.logit_rows(), out, {ws.get(), bytes}, opt);
      },
      row.target(SamplingFilter::none()), draws, seed);
  expect_law(
      "top_k_top_p_sampling_from_logits joint k=10 p=0.5",
      [&](auto out, auto opt) {
        gpu::top_k_top_p_sampling_from_logits(row.logit_rows(), 10, 0.5, ref::FilterApplyOrder::joint, out,
                                              {ws.get(), bytes}, opt);
      },
      row.target(SamplingFilter::make_top_k_top_p(10, 0.5)), draws, seed);
  // bf16 logits: the law is the softmax of the bf16-rounded logits (not of the f32 ones)
  std::vector<uint16_t> bits;
  ref::Tensor rounded({1, vocab});
  for (int64_t i = 0; i < vocab; ++i) {
    bits.push_back(flashstep::test::bf16_bits(static_cast<float>(row.logits.data[static_cast<size_t>(i)])));
    rounded.data[static_cast<size_t>(i)] = flashstep::test::bf16_value(bits.back());
  }
  DeviceArray<uint16_t> d_bits(bits);
  const gpu::DeviceRows bf16_rows{d_bits.get(), 1, vocab, gpu::ElementType::bf16};
  const std::vector<float> p_bf16 = as_float(ref::softmax(rounded));
  expect_law(
      "sampling_from_logits bf16", [&](auto out, auto opt) { gpu::sampling_from_logits(bf16_rows, out, {}, opt); },
      ref::sampling_target_distribution(p_bf16, SamplingFilter::none()), draws, seed);
  expect_law(
      "top_k_top_p_sampling_from_logits bf16 joint k=10 p=0.5",
      [&](auto out, auto opt) {
        gpu::top_k_top_p_sampling_from_logits(bf16_rows, 10, 0.5, ref::FilterApplyOrder::joint, out, {}, opt);
      },
      ref::sampling_target_distribution(p_bf16, SamplingFilter::make_top_k_top_p(10, 0.5)), draws, seed);
}

}  // namespace

TEST_CASE("GPU samplers on 111 and 1024 tokens: 10^6 draws each match the oracle") {
  run_operators(111, 1000000, true);
  run_operators(1024, 1000000, true);
}

TEST_CASE("GPU samplers on a 128256-token row: 10^5 draws each match the oracle") {
  run_operators(128256, 100000, false);
}

TEST_CASE("the verdict rejects the four broken samplers, drawn on the GPU") {
  auto rng = flashstep::test::case_rng("gpu statistics broken");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const int64_t draws = 1000000;
  // the reference suite's vocabularies and broken laws (statistics/broken_samplers.hpp)
  for (int64_t vocab : {int64_t{111}, int64_t{32000}}) {
    const Row row(rng, vocab);
    CAPTURE(vocab);
    // draws of the GPU's plain sampler from an explicit (broken) distribution
    auto verdict_of = [&](const std::vector<double>& broken, const std::vector<double>& target) {
      std::vector<float> f(broken.begin(), broken.end());
      DeviceArray<float> d(f);
      const Run run = draw(
          [&](auto out, auto opt) {
            gpu::sampling_from_probs({d.get(), 1, vocab}, out, opt);
          },
          vocab, draws, seed);
      return compare(run.counts, target, draws);
    };
    auto report = [&](const char* what, const Verdict& v) {
      std::printf("GPU %-46s V=%-6lld %s\n", what, static_cast<long long>(vocab), v.text().c_str());
    };
    const flashstep::test::BrokenSamplers b = flashstep::test::broken_samplers(row.p, draws);
    auto support = [](const std::vector<double>& d) {
      return std::count_if(d.begin(), d.end(), [](double x) { return x > 0.0; });
    };
    // the nucleus: the four most likely tokens (and any tied with the fourth); the short head three
    REQUIRE(support(b.top_p) >= 4);
    REQUIRE(support(b.short_head) == 3);
    const Verdict control = verdict_of(b.top_k, b.top_k);
    report("control: exact top_k=10 row", control);
    CHECK(control.pass());

    const Verdict v1 = verdict_of(b.k_plus_1, b.top_k);
    report("broken: top_k keeps k+1 tokens", v1);
    CHECK_FALSE(v1.pass());

    const Verdict v2 = verdict_of(b.no_renorm, b.top_p);
    report("broken: top_p forgets to renormalize", v2);
    CHECK_FALSE(v2.pass());

    const Verdict v3 = verdict_of(b.short_head, b.top_p);
    report("broken: top_p drops the crossing token", v3);
    CHECK_FALSE(v3.pass());

    const Verdict v4 = verdict_of(b.tilted, b.top_k);
    report("broken: top_k with the top token 2% heavy", v4);
    CAPTURE(b.tilt);
    CHECK_FALSE(v4.pass());
  }
}
