// chain_speculative_sampling (reference/speculative.hpp): exact outputs for one-hot
// targets, acceptance probability min(1, p/q), FlashInfer's counters and padding checked
// against the documented Philox words, and bad input. The distribution of every emitted
// token (the speculative sampling theorem) is tested with 10^6 requests in
// tests/statistics/.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <flashstep/kernels/philox.cuh>
#include <flashstep/reference/errors.hpp>
#include <flashstep/reference/speculative.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

using flashstep::test::expect_error;

namespace {

// Random probability rows (float32-exact values), shape (B, J, V).
Tensor random_probs(std::mt19937_64& rng, int64_t B, int64_t J, int64_t V) {
  Tensor t({B, J, V});
  std::uniform_real_distribution<double> unit(0.05, 1.0);
  for (int64_t r = 0; r < B * J; ++r) {
    double sum = 0.0;
    for (int64_t i = 0; i < V; ++i) sum += (t.data[static_cast<size_t>(r * V + i)] = unit(rng));
    for (int64_t i = 0; i < V; ++i) {
      auto& x = t.data[static_cast<size_t>(r * V + i)];
      x = static_cast<float>(x / sum);
    }
  }
  return t;
}

}  // namespace

TEST_CASE("speculative: one-hot targets give exact outputs, counters and padding") {
  auto rng = test::case_rng("speculative one-hot");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const int64_t B = 300, V = 50;
  for (int64_t n : {0, 1, 4}) {
    CAPTURE(n);
    const Tensor draft = random_probs(rng, B, n, V);
    Tensor target({B, n + 1, V}, 0.0);
    std::vector<int32_t> wanted(static_cast<size_t>(B * (n + 1))), drafts(static_cast<size_t>(B * n));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j <= n; ++j) {
        const int32_t t = static_cast<int32_t>(test::random_int(rng, 0, V - 1));
        wanted[static_cast<size_t>(b * (n + 1) + j)] = t;
        target.data[static_cast<size_t>((b * (n + 1) + j) * V + t)] = 1.0;
        if (j < n) {
          // Draft agrees with the target 60% of the time.
          const bool agree = test::random_int(rng, 0, 9) < 6;
          drafts[static_cast<size_t>(b * n + j)] =
              agree ? t : static_cast<int32_t>((t + 1 + test::random_int(rng, 0, V - 2)) % V);
        }
      }
    }
    const auto r = ref::chain_speculative_sampling(draft, drafts, target, seed, 0);
    REQUIRE(r.output_token_ids.size() == static_cast<size_t>(B * (n + 1)));
    for (int64_t b = 0; b < B; ++b) {
      CAPTURE(b);
      // A draft passes iff it is the target's token (p = 1 > u * q; p = 0 never passes).
      int64_t first_mismatch = n;
      int32_t matches = 0;
      for (int64_t j = 0; j < n; ++j) {
        const bool match = drafts[static_cast<size_t>(b * n + j)] == wanted[static_cast<size_t>(b * (n + 1) + j)];
        matches += match ? 1 : 0;
        if (!match && first_mismatch == n) first_mismatch = j;
      }
      for (int64_t j = 0; j <= n; ++j) {
        const int32_t expected = j <= first_mismatch ? wanted[static_cast<size_t>(b * (n + 1) + j)] : -1;
        CAPTURE(j);
        CHECK(r.output_token_ids[static_cast<size_t>(b * (n + 1) + j)] == expected);
      }
      CHECK(r.output_emitted_draft_token_num[static_cast<size_t>(b)] == first_mismatch);
      CHECK(r.output_accepted_token_num[static_cast<size_t>(b)] == matches);
    }
  }
}

TEST_CASE("speculative: a draft is accepted with probability min(1, p/q)") {
  auto rng = test::case_rng("speculative acceptance");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const int64_t B = 100000, V = 4;
  const double q[V] = {0.4, 0.3, 0.2, 0.1};
  // Target probability of the draft token 0, and the acceptance rate it implies.
  for (double p0 : {0.1, 0.2, 0.36, 0.4, 0.7}) {
    CAPTURE(p0);
    Tensor draft({B, 1, V}), target({B, 2, V});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < V; ++i) draft.data[static_cast<size_t>(b * V + i)] = q[i];
      const double rest = (1.0 - p0) / 3.0;
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t i = 0; i < V; ++i)
          target.data[static_cast<size_t>((b * 2 + j) * V + i)] = j == 0 ? (i == 0 ? p0 : rest) : 0.25;
    }
    const std::vector<int32_t> drafts(static_cast<size_t>(B), 0);
    const auto r = ref::chain_speculative_sampling(draft, drafts, target, seed, 0);
    int64_t accepted = 0;
    for (int64_t b = 0; b < B; ++b) {
      const bool ok = r.output_emitted_draft_token_num[static_cast<size_t>(b)] == 1;
      accepted += ok ? 1 : 0;
      CHECK(r.output_accepted_token_num[static_cast<size_t>(b)] == (ok ? 1 : 0));
      // After a rejection the resampled token comes from relu(p - q): never token 0 when p0 < q0.
      if (!ok) CHECK(r.output_token_ids[static_cast<size_t>(b * 2)] != 0);
    }
    const double a = std::min(1.0, static_cast<double>(static_cast<float>(p0)) / static_cast<float>(q[0]));
    const double rate = static_cast<double>(accepted) / B;
    if (a >= 1.0) {
      CHECK(accepted == B);
    } else {
      // 6 standard deviations of a binomial proportion.
      CHECK(std::abs(rate - a) <= 6.0 * std::sqrt(a * (1.0 - a) / B));
    }
  }
}

TEST_CASE("speculative: counters, padding and tokens follow the documented Philox words") {
  auto rng = test::case_rng("speculative words");
  const uint64_t seed = rng(), offset = rng() % 100;
  CAPTURE(seed);
  CAPTURE(offset);
  const int64_t B = 400, n = 3, V = 7;
  const Tensor draft = random_probs(rng, B, n, V), target = random_probs(rng, B, n + 1, V);
  std::vector<int32_t> drafts(static_cast<size_t>(B * n));
  for (auto& d : drafts) d = static_cast<int32_t>(test::random_int(rng, 0, V - 1));
  const auto r = ref::chain_speculative_sampling(draft, drafts, target, seed, offset);
  const auto again = ref::chain_speculative_sampling(draft, drafts, target, seed, offset);
  CHECK(r.output_token_ids == again.output_token_ids);
  for (int64_t b = 0; b < B; ++b) {
    CAPTURE(b);
    int64_t pos = n;
    int32_t passes = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t d = drafts[static_cast<size_t>(b * n + j)];
      const double u = kernels::philox_uniform(seed, static_cast<uint64_t>(b), offset + static_cast<uint64_t>(j));
      const bool pass = u * draft.data[static_cast<size_t>((b * n + j) * V + d)] <
                        target.data[static_cast<size_t>((b * (n + 1) + j) * V + d)];
      passes += pass ? 1 : 0;
      if (!pass && pos == n) pos = j;
    }
    CHECK(r.output_emitted_draft_token_num[static_cast<size_t>(b)] == pos);
    CHECK(r.output_accepted_token_num[static_cast<size_t>(b)] == passes);
    for (int64_t j = 0; j < pos; ++j)
      CHECK(r.output_token_ids[static_cast<size_t>(b * (n + 1) + j)] == drafts[static_cast<size_t>(b * n + j)]);
    for (int64_t j = pos + 1; j <= n; ++j) CHECK(r.output_token_ids[static_cast<size_t>(b * (n + 1) + j)] == -1);
    // The final token lies where relu(p - q) (or p for the bonus) has mass.
    const int32_t last = r.output_token_ids[static_cast<size_t>(b * (n + 1) + pos)];
    REQUIRE(last >= 0);
    REQUIRE(last < V);
    const double p_last = target.data[static_cast<size_t>((b * (n + 1) + pos) * V + last)];
    const double q_last = pos < n ? draft.data[static_cast<size_t>((b * n + pos) * V + last)] : 0.0;
    CHECK(p_last > q_last);
  }
}

TEST_CASE("speculative: bad input names the argument") {
  const Tensor draft({1, 2, 3}, 1.0 / 3), target({1, 3, 3}, 1.0 / 3);
  const std::vector<int32_t> ids = {0, 2};
  expect_error(
      [&] {
        ref::chain_speculative_sampling(draft, {0, 3}, target);
      },
      {"chain_speculative_sampling", "draft_token_ids[0, 1] = 3", "vocab_size = 3"});
  expect_error([&] { ref::chain_speculative_sampling(draft, {0}, target); }, {"draft_token_ids must hold", "2"});
  expect_error(
      [&] {
        ref::chain_speculative_sampling(draft, ids, Tensor({1, 2, 3}, 0.3));
      },
      {"target_probs", "num_speculate_tokens + 1"});
  expect_error([&] { ref::chain_speculative_sampling(Tensor({2, 3}, 0.5), ids, target); }, {"draft_probs", "rank 3"});
  Tensor nan_draft = draft;
  nan_draft.data[4] = std::nan("");
  expect_error([&] { ref::chain_speculative_sampling(nan_draft, ids, target); }, {"draft_probs[0, 1, 1]", "NaN"});
  Tensor negative = target;
  negative.data[2] = -0.5;
  expect_error([&] { ref::chain_speculative_sampling(draft, ids, negative); },
               {"target_probs", "non-negative", "-0.5"});
  Tensor zero_row = target;
  for (int i = 3; i < 6; ++i) zero_row.data[static_cast<size_t>(i)] = 0.0;
  expect_error([&] { ref::chain_speculative_sampling(draft, ids, zero_row); }, {"target_probs[0, 1]", "sums to zero"});
  expect_error(
      [&] {
        ref::chain_speculative_sampling(Tensor({1, 2, 0}), ids, Tensor({1, 3, 0}));
      },
      {"vocab_size >= 1"});
}
