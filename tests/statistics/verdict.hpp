// The verdict of the distribution tests: draws of a sampler against the exact target.
//
//   - off_support: draws of tokens whose target probability is 0 (must be none),
//   - chi2: binned chi-square (consecutive tokens by probability, >= 50 expected draws per
//     bin) below the Wilson-Hilferty quantile at z = 5 (one-sided p ~ 2.9e-7),
//   - max_z: every token with >= 50 expected draws within 6 standard deviations
//     (Bonferroni over at most 20000 such tokens per 10^6 draws).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace flashstep::test {

// Expected draws per chi-square bin, and the z of the critical values (one-sided
// p ~ 2.9e-7 for the chi-square; Bonferroni over <= 20000 tokens for the per-token z).
constexpr double kMinExpected = 50.0;
constexpr double kChi2Z = 5.0;
constexpr double kTokenZ = 6.0;

struct Verdict {
  int64_t off_support = 0;  // draws of tokens with target probability 0
  double chi2 = 0.0, critical = 0.0;
  int64_t df = 0;
  double max_z = 0.0;
  bool pass() const { return off_support == 0 && chi2 <= critical && max_z <= kTokenZ; }
  std::string text() const {
    char buf[200];
    std::snprintf(buf, sizeof buf, "off-support %lld, chi2 %.1f (df %lld, critical %.1f), max |z| %.2f -> %s",
                  static_cast<long long>(off_support), chi2, static_cast<long long>(df), critical, max_z,
                  pass() ? "pass" : "REJECT");
    return buf;
  }
};

// Wilson-Hilferty approximation of the chi-square quantile at standard-normal z.
inline double chi2_quantile(int64_t df, double z) {
  const double a = 2.0 / (9.0 * static_cast<double>(df));
  return static_cast<double>(df) * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

inline Verdict compare(const std::vector<int64_t>& counts, const std::vector<double>& target, int64_t draws) {
  Verdict v;
  std::vector<size_t> support;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] > 0.0) {
      support.push_back(i);
    } else {
      v.off_support += counts[i];
    }
  }
  std::sort(support.begin(), support.end(), [&](size_t a, size_t b) { return target[a] > target[b]; });
  // Bins of consecutive tokens (by probability) holding >= kMinExpected expected draws.
  std::vector<std::pair<double, double>> bins;  // (expected, observed)
  double e = 0.0, o = 0.0;
  for (size_t i : support) {
    const double expected = target[i] * static_cast<double>(draws);
    if (expected >= kMinExpected) {
      const double sd = std::sqrt(expected * (1.0 - target[i]));
      if (sd > 0.0) v.max_z = std::max(v.max_z, std::abs(static_cast<double>(counts[i]) - expected) / sd);
    }
    e += expected;
    o += static_cast<double>(counts[i]);
    if (e >= kMinExpected) {
      bins.emplace_back(e, o);
      e = o = 0.0;
    }
  }
  if (e > 0.0 || o > 0.0) {
    if (bins.empty()) {
      bins.emplace_back(e, o);
    } else {
      bins.back().first += e;
      bins.back().second += o;
    }
  }
  for (const auto& [expected, observed] : bins) v.chi2 += (observed - expected) * (observed - expected) / expected;
  v.df = static_cast<int64_t>(bins.size()) - 1;
  v.critical = v.df > 0 ? chi2_quantile(v.df, kChi2Z) : 0.0;
  return v;
}

/// Logits of the samplers' test row: N(0, 2.5^2), 3% of the tokens masked (-inf); the
/// 111-token row is quantized to quarters and given ties at ranks (1, 2) and (10, 11),
/// where top_k = 1 and top_k = 10 cut. float32_values: each normal draw is rounded to
/// float first (the GPU suite's rows are float logits).
inline std::vector<double> test_logits(std::mt19937_64& rng, int64_t vocab, bool float32_values) {
  std::normal_distribution<double> normal(0.0, 2.5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> logits(static_cast<size_t>(vocab));
  for (auto& x : logits) x = float32_values ? static_cast<float>(normal(rng)) : normal(rng);
  if (vocab == 111) {
    for (auto& x : logits) x = std::round(4.0 * x) / 4.0;
    std::vector<size_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
    logits[order[1]] = logits[order[0]];
    logits[order[10]] = logits[order[9]];
  }
  for (auto& x : logits)
    if (unit(rng) < 0.03) x = -std::numeric_limits<double>::infinity();
  return logits;
}

/// A random row for the speculative-sampling laws: gamma(0.7) weights (a few large, many
/// small), normalized and rounded to float32 (what a sampler reads), as doubles.
inline std::vector<double> random_row(std::mt19937_64& rng, int64_t vocab) {
  std::gamma_distribution<double> gamma(0.7, 1.0);
  std::vector<double> w(static_cast<size_t>(vocab));
  double sum = 0.0;
  for (auto& x : w) sum += (x = gamma(rng) + 1e-3);
  for (auto& x : w) x = static_cast<float>(x / sum);
  return w;
}

/// The exact law of a float row: renormalized by its own sum, as a sampler's masses are.
inline std::vector<double> normalized(const std::vector<double>& w) {
  double s = 0.0;
  for (double x : w) s += x;
  std::vector<double> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) out[i] = w[i] / s;
  return out;
}

}  // namespace flashstep::test
