// The laws of four deliberately broken samplers on one row, and the laws they pretend to
// follow: the negative controls of the CPU and GPU statistics suites (a verdict that
// does not reject them cannot be trusted to accept the real samplers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "flashstep/reference/sampling.hpp"

namespace flashstep::test {

struct BrokenSamplers {
  std::vector<double> top_k;       ///< the right top_k = 10 law
  std::vector<double> k_plus_1;    ///< keeps one token more than top_k = 10 (the next k that grows the set)
  std::vector<double> top_p;       ///< the right top-p law, for a cut whose nucleus holds at least four tokens
  std::vector<double> no_renorm;   ///< top-p that forgets to renormalize
  std::vector<double> short_head;  ///< top-p that drops the token crossing the cut
  std::vector<double> tilted;      ///< top_k with the row's top token too likely
  double tilt = 0.0;               ///< how much too likely: at least 2%
};

/// The broken laws of `row` (a sampler's float row) for a test of `draws` draws.
///
/// Two choices make each of them detectable whatever row was drawn:
/// - the top-p cut lies halfway between the mass of the three and of the four most likely
///   tokens, so the nucleus holds four tokens, more where others tie with the fourth (a
///   fixed p = 0.5 keeps one token when the top one holds more than half the mass, and
///   then neither top-p bug changes anything), and the short head three;
/// - the top token is 2% too likely, or more where its probability p in the top_k law is
///   so small or so large that 2% would shift its count by under 10 standard deviations
///   of `draws` draws (the shift is about tilt * sqrt(draws * p * (1 - p)) of them).
inline BrokenSamplers broken_samplers(const std::vector<float>& row, int64_t draws) {
  using ref::SamplingFilter;
  BrokenSamplers b;
  auto support = [](const std::vector<double>& d) {
    return std::count_if(d.begin(), d.end(), [](double x) { return x > 0.0; });
  };
  b.top_k = ref::sampling_target_distribution(row, SamplingFilter::make_top_k(10));
  for (int64_t k = 11; support(b.k_plus_1) <= support(b.top_k); ++k)
    b.k_plus_1 = ref::sampling_target_distribution(row, SamplingFilter::make_top_k(k));

  std::vector<size_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t c) { return row[a] > row[c]; });
  const double total = std::accumulate(row.begin(), row.end(), 0.0);
  const double c3 = (double{row[order[0]]} + row[order[1]] + row[order[2]]) / total;
  const double p_cut = c3 + row[order[3]] / total / 2;
  b.top_p = ref::sampling_target_distribution(row, SamplingFilter::make_top_p(p_cut));

  b.no_renorm.assign(row.size(), 0.0);
  double kept = 0.0;
  size_t last_kept = 0;
  for (size_t i = 0; i < row.size(); ++i)
    if (b.top_p[i] > 0.0) b.no_renorm[i] = row[i], kept += row[i], last_kept = i;
  b.no_renorm[last_kept] += total - kept;  // u over the whole row; a miss falls on the head's last token

  b.short_head.assign(row.size(), 0.0);
  double cumulative = 0.0;
  for (size_t i : order) {
    cumulative += row[i] / total;
    if (cumulative <= p_cut) b.short_head[i] = row[i];
  }

  const double p = b.top_k[order[0]];
  const double spread = static_cast<double>(draws) * p * (1.0 - p);
  b.tilt = spread > 0.0 ? std::max(0.02, 10.0 / std::sqrt(spread)) : 0.02;
  b.tilted = b.top_k;
  b.tilted[order[0]] *= 1.0 + b.tilt;
  return b;
}

}  // namespace flashstep::test
