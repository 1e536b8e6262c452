// Stage 06's chain_speculative_sampling on the GPU against the speculative sampling
// theorem (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding",
// ICML 2023; Chen et al., "Accelerating Large Language Model Decoding with Speculative
// Sampling", 2023): with drafts drawn from the draft distributions q_j, the token the
// kernel emits at position j (over the requests that reach position j: the first token
// over all requests, the second over those that accepted the first, ..., the bonus token
// over those that accepted every draft) is distributed as the target p_j, and the first
// draft is accepted with probability sum_i min(p_0(i), q_0(i)). 10^6 requests per
// configuration, judged by the reference statistics suite's verdict (statistics/
// verdict.hpp). The same verdict must reject two broken samplers, drawn by the GPU
// kernel itself: one told other draft probabilities than the drafts came from (q^2,
// renormalized: a draft model's probabilities at another temperature), one whose
// acceptance test always passes (draft probabilities 0: u * 0 < p).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/philox.cuh"
#include "sampling_support.hpp"
#include "statistics/verdict.hpp"
#include "support/random.hpp"

namespace gpu = flashstep::stages::sampling;
using flashstep::test::compare;
using flashstep::test::DeviceArray;
using flashstep::test::Verdict;

using flashstep::test::normalized;
using flashstep::test::random_row;

namespace {

struct Setup {
  int64_t vocab, n;
  std::vector<std::vector<double>> q, p;  // n draft rows, n + 1 target rows
};

// What one run of the kernel over many requests showed.
struct Outcome {
  std::vector<Verdict> positions;  // position j's tokens against p_j
  double acceptance = 0.0, expected_acceptance = 0.0, z = 0.0;
  int64_t bad = 0;  // status != ok, or a token outside [0, vocab)
  bool pass() const {
    bool ok = bad == 0 && std::abs(z) <= flashstep::test::kTokenZ;
    for (const Verdict& v : positions) ok = ok && v.pass();
    return ok;
  }
};

// `requests` requests in chunks: drafts drawn on the host from s.q with their own Philox
// stream; the kernel is handed `kernel_q` as the draft probabilities (s.q when correct).
Outcome run(const Setup& s, const std::vector<std::vector<double>>& kernel_q, int64_t requests, uint64_t seed) {
  const int64_t V = s.vocab, n = s.n, chunk = 100000;
  std::vector<float> draft(static_cast<size_t>(chunk * n * V)), target(static_cast<size_t>(chunk * (n + 1) * V));
  for (int64_t b = 0; b < chunk; ++b) {
    for (int64_t j = 0; j < n; ++j)
      std::copy(kernel_q[static_cast<size_t>(j)].begin(), kernel_q[static_cast<size_t>(j)].end(),
                draft.begin() + (b * n + j) * V);
    for (int64_t j = 0; j <= n; ++j)
      std::copy(s.p[static_cast<size_t>(j)].begin(), s.p[static_cast<size_t>(j)].end(),
                target.begin() + (b * (n + 1) + j) * V);
  }
  DeviceArray<float> d_draft(draft), d_target(target);
  std::vector<std::vector<double>> cdf(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    cdf[static_cast<size_t>(j)].resize(static_cast<size_t>(V));
    std::partial_sum(s.q[static_cast<size_t>(j)].begin(), s.q[static_cast<size_t>(j)].end(),
                     cdf[static_cast<size_t>(j)].begin());
  }
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(n + 1), std::vector<int64_t>(static_cast<size_t>(V), 0));
  std::vector<int64_t> reached(static_cast<size_t>(n + 1), 0);
  int64_t first_accepted = 0, bad = 0;
  DeviceArray<int32_t> d_ids(static_cast<size_t>(chunk * n)), tokens(static_cast<size_t>(chunk * (n + 1))),
      accepted(static_cast<size_t>(chunk)), emitted(static_cast<size_t>(chunk)), status(static_cast<size_t>(chunk));
  for (int64_t done = 0; done < requests; done += chunk) {
    std::vector<int32_t> ids(static_cast<size_t>(chunk * n));
    for (int64_t b = 0; b < chunk; ++b) {
      for (int64_t j = 0; j < n; ++j) {
        const auto& c = cdf[static_cast<size_t>(j)];
        const double u = flashstep::kernels::philox_uniform(~seed, static_cast<uint64_t>(done + b),
                                                            static_cast<uint64_t>(j)) *
                         c.back();
        ids[static_cast<size_t>(b * n + j)] = static_cast<int32_t>(
            std::min<int64_t>(std::upper_bound(c.begin(), c.end(), u) - c.begin(), V - 1));
      }
    }
    flashstep::test::cuda_ok(cudaMemcpy(d_ids.get(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
                             "upload");
    tokens.poison(), accepted.poison(), emitted.poison(), status.poison();
    // a fresh Philox stream per chunk: request b of the chunk reads subsequence b
    gpu::chain_speculative_sampling(d_draft.get(), d_ids.get(), d_target.get(), chunk, n, V,
                                    {tokens.get(), accepted.get(), emitted.get(), status.get()},
                                    seed + static_cast<uint64_t>(done), 0);
    const auto t = tokens.download(), e = emitted.download(), st = status.download();
    for (int64_t b = 0; b < chunk; ++b) {
      const int32_t m = e[static_cast<size_t>(b)];
      if (st[static_cast<size_t>(b)] != 0 || m < 0 || m > n) {
        ++bad;
        continue;
      }
      if (m >= 1) ++first_accepted;
      for (int64_t j = 0; j <= m; ++j) {  // positions 0 .. m were reached; m holds the resampled or bonus token
        const int32_t token = t[static_cast<size_t>(b * (n + 1) + j)];
        if (token < 0 || token >= V) {
          ++bad;
          break;
        }
        ++counts[static_cast<size_t>(j)][static_cast<size_t>(token)];
        ++reached[static_cast<size_t>(j)];
      }
    }
  }
  Outcome o;
  o.bad = bad;
  for (int64_t j = 0; j <= n; ++j)
    o.positions.push_back(compare(counts[static_cast<size_t>(j)], normalized(s.p[static_cast<size_t>(j)]),
                                  reached[static_cast<size_t>(j)]));
  const auto p0 = normalized(s.p[0]), q0 = normalized(s.q[0]);
  for (int64_t i = 0; i < V; ++i)
    o.expected_acceptance += std::min(p0[static_cast<size_t>(i)], q0[static_cast<size_t>(i)]);
  o.acceptance = static_cast<double>(first_accepted) / static_cast<double>(requests);
  const double a = o.expected_acceptance;
  o.z = (o.acceptance - a) / std::sqrt(a * (1.0 - a) / static_cast<double>(requests));
  return o;
}

void report(const char* what, const Setup& s, const Outcome& o) {
  std::printf("GPU speculative %-44s V=%-4lld n=%lld: first draft accepted %.5f, expected %.5f (z %.2f), bad %lld\n",
              what, static_cast<long long>(s.vocab), static_cast<long long>(s.n), o.acceptance, o.expected_acceptance,
              o.z, static_cast<long long>(o.bad));
  for (size_t j = 0; j < o.positions.size(); ++j)
    std::printf("    position %zu: %s\n", j, o.positions[j].text().c_str());
}

// The exact law of the first emitted token when drafts come from q but the kernel is
// told q_told: accepted with probability min(1, p / q_told), else a draw from
// relu(p - q_told) (p when that is empty). Equal to p exactly when q_told = q.
std::vector<double> first_token_law(const std::vector<double>& p_row, const std::vector<double>& q_row,
                                    const std::vector<double>& q_told) {
  const auto p = normalized(p_row), q = normalized(q_row);
  const double told_sum = std::accumulate(q_told.begin(), q_told.end(), 0.0);
  std::vector<double> law(p.size(), 0.0), residual(p.size(), 0.0);
  double accepted = 0.0, residual_sum = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double t = told_sum > 0.0 ? q_told[i] / told_sum : 0.0;
    const double a = t > 0.0 ? std::min(1.0, p[i] / t) : (p[i] > 0.0 ? 1.0 : 0.0);
    law[i] = q[i] * a;
    accepted += law[i];
    residual_sum += (residual[i] = std::max(p[i] - t, 0.0));
  }
  for (size_t i = 0; i < p.size(); ++i)
    law[i] += (1.0 - accepted) * (residual_sum > 0.0 ? residual[i] / residual_sum : p[i]);
  return law;
}

double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d += std::abs(a[i] - b[i]);
  return d / 2.0;
}

Setup make_setup(std::mt19937_64& rng, int64_t vocab, int64_t n) {
  Setup s{vocab, n, {}, {}};
  for (int64_t j = 0; j < n; ++j) s.q.push_back(random_row(rng, vocab));
  for (int64_t j = 0; j <= n; ++j) s.p.push_back(random_row(rng, vocab));
  return s;
}

}  // namespace

TEST_CASE("chain_speculative_sampling on the GPU: emitted tokens follow the target at every position (10^6 requests)") {
  auto rng = flashstep::test::case_rng("gpu statistics speculative");
  for (const auto& [vocab, n] : {std::pair<int64_t, int64_t>{20, 2}, std::pair<int64_t, int64_t>{111, 3}}) {
    const uint64_t seed = rng();
    CAPTURE(seed);
    CAPTURE(vocab);
    const Setup s = make_setup(rng, vocab, n);
    const Outcome o = run(s, s.q, 1000000, seed);
    report("chain_speculative_sampling", s, o);
    CHECK(o.bad == 0);
    for (size_t j = 0; j < o.positions.size(); ++j) {
      CAPTURE(j);
      INFO(o.positions[j].text());
      CHECK(o.positions[j].pass());
    }
    CHECK(std::abs(o.z) <= flashstep::test::kTokenZ);
  }
}

TEST_CASE("the verdict rejects two broken speculative samplers, drawn on the GPU") {
  auto rng = flashstep::test::case_rng("gpu statistics speculative broken");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const Setup s = make_setup(rng, 20, 2);
  // the control: the same setup and seed with the right draft probabilities passes
  const Outcome control = run(s, s.q, 1000000, seed);
  report("control", s, control);
  CHECK(control.pass());
  // broken 1: the kernel is told q^2 (renormalized), not the q the drafts came from
  std::vector<std::vector<double>> sharpened;
  for (const auto& row : s.q) {
    std::vector<double> sq(row.size());
    for (size_t i = 0; i < row.size(); ++i) sq[i] = row[i] * row[i];
    const double sum = std::accumulate(sq.begin(), sq.end(), 0.0);
    for (auto& x : sq) x = static_cast<float>(x / sum);
    sharpened.push_back(sq);
  }
  // the oracle: right q gives p_0 exactly; the broken law is far from it (so 10^6 draws must see it)
  CHECK(total_variation(first_token_law(s.p[0], s.q[0], s.q[0]), normalized(s.p[0])) < 1e-12);
  const double tv_wrong_q = total_variation(first_token_law(s.p[0], s.q[0], sharpened[0]), normalized(s.p[0]));
  std::printf("broken q^2: total variation of the first token's law from p_0 %.4f\n", tv_wrong_q);
  REQUIRE(tv_wrong_q > 0.01);
  const Outcome wrong_q = run(s, sharpened, 1000000, seed);
  report("broken: draft probabilities q^2, drafts from q", s, wrong_q);
  CHECK(wrong_q.bad == 0);
  INFO(wrong_q.positions[0].text());
  CHECK_FALSE(wrong_q.positions[0].pass());  // the first token no longer follows p_0
  CHECK_FALSE(wrong_q.pass());
  // broken 2: every draft accepted (q = 0 makes u * q < p always true)
  const std::vector<std::vector<double>> zeros(s.q.size(), std::vector<double>(static_cast<size_t>(s.vocab), 0.0));
  const Outcome accept_all = run(s, zeros, 1000000, seed);
  report("broken: the acceptance test always passes", s, accept_all);
  CHECK(accept_all.bad == 0);
  INFO(accept_all.positions[0].text());
  CHECK_FALSE(accept_all.positions[0].pass());  // the first token follows q_0, not p_0
  CHECK_FALSE(accept_all.pass());
}
