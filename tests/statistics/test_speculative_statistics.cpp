// The speculative sampling theorem, checked on 10^6 requests: with drafts drawn from the
// draft distributions q_j, every token chain_speculative_sampling emits is distributed as
// the target p_j at its position (the first token over all requests; the second over
// requests that accepted the first; the bonus over requests that accepted every draft),
// and the first draft is accepted with probability sum_i min(p_0(i), q_0(i)).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include <flashstep/kernels/philox.cuh>
#include <flashstep/reference/speculative.hpp>

#include "statistics/verdict.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

using flashstep::test::normalized;
using flashstep::test::random_row;

TEST_CASE("speculative sampling emits target-distributed tokens at every position (10^6 requests)") {
  auto rng = test::case_rng("statistics speculative");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const int64_t V = 20, n = 2, chunk = 50000, chunks = 20;
  std::vector<std::vector<double>> q(n), p(n + 1);
  for (auto& row : q) row = random_row(rng, V);
  for (auto& row : p) row = random_row(rng, V);
  // Draft tokens are drawn from q_j with their own Philox stream (another seed).
  std::vector<std::vector<double>> q_cdf(n);
  for (int64_t j = 0; j < n; ++j) {
    q_cdf[static_cast<size_t>(j)].resize(static_cast<size_t>(V));
    std::partial_sum(q[static_cast<size_t>(j)].begin(), q[static_cast<size_t>(j)].end(),
                     q_cdf[static_cast<size_t>(j)].begin());
  }

  std::vector<int64_t> first(static_cast<size_t>(V), 0), second(static_cast<size_t>(V), 0),
      bonus(static_cast<size_t>(V), 0);
  int64_t requests = 0, first_accepted = 0, second_total = 0, bonus_total = 0;
  Tensor draft({chunk, n, V}), target({chunk, n + 1, V});
  for (int64_t b = 0; b < chunk; ++b) {
    for (int64_t j = 0; j < n; ++j)
      std::copy(q[static_cast<size_t>(j)].begin(), q[static_cast<size_t>(j)].end(),
                draft.data.begin() + (b * n + j) * V);
    for (int64_t j = 0; j <= n; ++j)
      std::copy(p[static_cast<size_t>(j)].begin(), p[static_cast<size_t>(j)].end(),
                target.data.begin() + (b * (n + 1) + j) * V);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int32_t> drafts(static_cast<size_t>(chunk * n));
    for (int64_t b = 0; b < chunk; ++b) {
      for (int64_t j = 0; j < n; ++j) {
        const auto& cdf = q_cdf[static_cast<size_t>(j)];
        const double u =
            kernels::philox_uniform(~seed, static_cast<uint64_t>(c * chunk + b), static_cast<uint64_t>(j)) * cdf.back();
        const int64_t d = std::min<int64_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), V - 1);
        drafts[static_cast<size_t>(b * n + j)] = static_cast<int32_t>(d);
      }
    }
    const auto r = ref::chain_speculative_sampling(draft, drafts, target, seed + static_cast<uint64_t>(c), 0);
    for (int64_t b = 0; b < chunk; ++b) {
      const int32_t* out = r.output_token_ids.data() + b * (n + 1);
      const int32_t emitted = r.output_emitted_draft_token_num[static_cast<size_t>(b)];
      ++first[static_cast<size_t>(out[0])];
      if (emitted >= 1) {
        ++first_accepted;
        ++second[static_cast<size_t>(out[1])];
        ++second_total;
      }
      if (emitted == 2) {
        ++bonus[static_cast<size_t>(out[2])];
        ++bonus_total;
      }
    }
    requests += chunk;
  }

  const test::Verdict v0 = test::compare(first, normalized(p[0]), requests);
  const test::Verdict v1 = test::compare(second, normalized(p[1]), second_total);
  const test::Verdict v2 = test::compare(bonus, normalized(p[2]), bonus_total);
  double acceptance = 0.0;  // sum_i min(p_0(i), q_0(i)) = 1 - total variation distance
  for (int64_t i = 0; i < V; ++i)
    acceptance += std::min(normalized(p[0])[static_cast<size_t>(i)], normalized(q[0])[static_cast<size_t>(i)]);
  const double rate = static_cast<double>(first_accepted) / static_cast<double>(requests);
  const double z = (rate - acceptance) / std::sqrt(acceptance * (1.0 - acceptance) / static_cast<double>(requests));
  std::printf("speculative V=%lld n=%lld, %lld requests: first token %s\n", static_cast<long long>(V),
              static_cast<long long>(n), static_cast<long long>(requests), v0.text().c_str());
  std::printf("  second token (%lld requests accepted the first) %s\n", static_cast<long long>(second_total),
              v1.text().c_str());
  std::printf("  bonus token (%lld requests accepted both) %s\n", static_cast<long long>(bonus_total),
              v2.text().c_str());
  std::printf("  first draft accepted %.5f, expected sum min(p, q) = %.5f (z %.2f)\n", rate, acceptance, z);
  INFO(v0.text());
  CHECK(v0.pass());
  INFO(v1.text());
  CHECK(v1.pass());
  INFO(v2.text());
  CHECK(v2.pass());
  CHECK(std::abs(z) <= test::kTokenZ);
}
