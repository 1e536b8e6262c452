// The sorting-free rejection sampler: exact masses, the per-output loop (as the GPU kernel
// runs it) and the batched evaluation that gives the same draws for many outputs at once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <flashstep/kernels/philox.cuh>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/sampling.hpp"

namespace flashstep::ref {

// ---- Exact masses -------------------------------------------------------------------------

Mass mass_of(float p) {
  if (!(p > 0.0f)) return 0;
  uint32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  // A denormal is m * 2^-149: below 2^-126, far below one 2^-96 unit.
  if (exponent == 0) return 0;
  const Mass significand = static_cast<Mass>((bits & 0x7FFFFFu) | 0x800000u);
  // p = significand * 2^(exponent - 150), so p * 2^96 = significand * 2^(exponent - 54).
  const int shift = exponent - 54;
  if (shift >= 0) return significand << shift;
  if (shift <= -24) return 0;
  return significand >> (-shift);  // truncation: floor(p * 2^96)
}

double mass_to_double(Mass m) { return std::ldexp(static_cast<double>(m), -kMassFractionBits); }

Mass scaled_threshold(uint32_t u24, Mass q) {
  // u24 * q needs up to 151 bits: split q = qh * 2^64 + ql. Then
  // floor(u24 * q / 2^24) = u24 * qh * 2^40 + floor(u24 * ql / 2^24), exactly, because
  // u24 * qh * 2^64 is a multiple of 2^24.
  const Mass ql = static_cast<uint64_t>(q);
  const Mass qh = q >> 64;
  return ((static_cast<Mass>(u24) * qh) << 40) + ((static_cast<Mass>(u24) * ql) >> 24);
}

Mass mass_fraction_ceil(Mass total, float fraction) {
  if (!(fraction > 0.0f)) return 0;
  uint32_t bits;
  std::memcpy(&bits, &fraction, sizeof bits);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  // fraction = M * 2^-s with an integer M < 2^24.
  const uint64_t M = exponent == 0 ? (bits & 0x7FFFFFu) : ((bits & 0x7FFFFFu) | 0x800000u);
  const int s = exponent == 0 ? 149 : 150 - exponent;
  // P = M * total as three 64-bit limbs (w2, w1, w0); M * total < 2^24 * 2^127.
  const Mass lo = static_cast<Mass>(M) * static_cast<uint64_t>(total);
  const Mass hi = static_cast<Mass>(M) * static_cast<uint64_t>(total >> 64);
  const Mass mid = (lo >> 64) + static_cast<uint64_t>(hi);
  uint64_t w[3] = {static_cast<uint64_t>(lo), static_cast<uint64_t>(mid),
                   static_cast<uint64_t>((hi >> 64) + (mid >> 64))};
  // ceil(P / 2^s): shift right by s (s >= 23 for fraction <= 1), round up if bits fell off.
  bool remainder = false;
  int shift = s;
  while (shift >= 64) {
    remainder = remainder || w[0] != 0;
    w[0] = w[1];
    w[1] = w[2];
    w[2] = 0;
    shift -= 64;
  }
  if (shift > 0) {
    remainder = remainder || (w[0] & ((uint64_t{1} << shift) - 1)) != 0;
    w[0] = (w[0] >> shift) | (w[1] << (64 - shift));
    w[1] = (w[1] >> shift) | (w[2] << (64 - shift));
    w[2] >>= shift;
  }
  const Mass q = (static_cast<Mass>(w[1]) << 64) | w[0];
  return q + (remainder ? 1 : 0);
}

namespace {

bool uses_top_k(FilterKind k) { return k == FilterKind::top_k || k == FilterKind::top_k_top_p; }
bool uses_top_p(FilterKind k) { return k == FilterKind::top_p || k == FilterKind::top_k_top_p; }

// Does a pivot with `count` tokens and `mass` strictly above it pass the filter? Every
// token at or above an accepted pivot is kept, so "pivot passes" == "threshold admissible".
bool pivot_passes(const SamplingFilter& f, int64_t count, Mass mass, Mass top_p_bound) {
  if (uses_top_k(f.kind) && !(count < f.top_k)) return false;
  if (uses_top_p(f.kind) && !(mass < top_p_bound)) return false;
  return true;
}

// The min-p pivot, in float as FlashInfer computes it.
float min_p_pivot(float max_p, float min_p) { return max_p * min_p; }

}  // namespace

// ---- One output, as the GPU kernel runs it ------------------------------------------------

RejectionDraw rejection_sample_row(const float* probs, int64_t vocab, const SamplingFilter& filter, uint64_t seed,
                                   uint64_t subsequence, uint64_t offset) {
  const char* fn = "rejection_sample_row";
  // Pass 0: the row's exact total (FlashInfer assumes the row sums to 1 and skips this).
  Mass total = 0;
  float max_p = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) {
    total += mass_of(probs[i]);
    max_p = std::max(max_p, probs[i]);
  }
  require(total > 0, fn, "the row has zero total mass");

  RejectionDraw draw;
  auto inverse_cdf = [&](auto is_candidate, Mass q) {
    const Mass threshold = scaled_threshold(
        kernels::philox_uniform_bits24(seed, subsequence, offset + static_cast<uint64_t>(draw.rounds)), q);
    ++draw.rounds;
    // Pass 1: the first candidate, in vocabulary order, whose cumulative mass exceeds the
    // threshold. (A GPU block does this with a block scan; the exact sum does not care.)
    Mass cdf = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!is_candidate(probs[i])) continue;
      cdf += mass_of(probs[i]);
      if (cdf > threshold) return static_cast<int32_t>(i);
    }
    // threshold < q = the candidates' mass, so the loop always returns.
    throw InvalidArgument(std::string(fn) + ": internal error: inverse CDF ran off the row");
  };

  if (filter.kind == FilterKind::none) {
    draw.token = inverse_cdf([](float p) { return p > 0.0f; }, total);
    return draw;
  }
  if (filter.kind == FilterKind::min_p) {
    // One draw among p >= max_p * min_p: no rejection needed, the pivot is known upfront.
    const float pivot = min_p_pivot(max_p, filter.min_p);
    Mass q = 0;
    for (int64_t i = 0; i < vocab; ++i)
      if (probs[i] >= pivot) q += mass_of(probs[i]);
    draw.token = inverse_cdf([pivot](float p) { return p >= pivot && p > 0.0f; }, q);
    return draw;
  }

  const Mass top_p_bound = uses_top_p(filter.kind) ? mass_fraction_ceil(total, filter.top_p) : 0;
  float low = 0.0f, high = 1.0f;
  Mass q = total;
  bool accepted = false;
  do {
    const int32_t s = inverse_cdf([low](float p) { return p > low; }, q);
    draw.token = s;
    // Two pivots per pass: the sampled probability, and the midpoint towards `high`.
    const float pivot_0 = probs[s];
    const float pivot_1 = (pivot_0 + high) * 0.5f;
    // Pass 2: count and mass strictly above each pivot.
    int64_t count_0 = 0, count_1 = 0;
    Mass mass_0 = 0, mass_1 = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (probs[i] > pivot_0) {
        ++count_0;
        mass_0 += mass_of(probs[i]);
      }
      if (probs[i] > pivot_1) {
        ++count_1;
        mass_1 += mass_of(probs[i]);
      }
    }
    if (pivot_passes(filter, count_0, mass_0, top_p_bound)) {
      accepted = true;  // case 1: the sampled token is in the keep set
      break;
    }
    if (pivot_passes(filter, count_1, mass_1, top_p_bound)) {
      low = pivot_0;  // case 2: the threshold lies in (pivot_0, pivot_1]
      high = pivot_1;
      q = mass_0;
    } else {
      low = pivot_1;  // case 3: the threshold lies above pivot_1
      q = mass_1;
    }
  } while (low < high);
  // `high` always passes and `low` never does, so low < high until acceptance.
  require(accepted, fn, "internal error: the interval [low, high] closed without acceptance");
  return draw;
}

// ---- Many outputs of one row --------------------------------------------------------------
//
// rejection_sample_row costs O(rounds * V) per output: 10^6 draws of a 128k vocabulary
// would be ~10^12 steps. The batched evaluation runs the same loop for all outputs of a
// row together, one round at a time, and answers each round's questions with shared
// structures instead of passes:
//
//   count_gt / mass_gt of a pivot  ->  binary search in one descending copy of the row
//   inverse CDF over p > low        ->  outputs sorted by (low descending, u ascending);
//                                      tokens enter a Fenwick tree of exact masses as low
//                                      falls; a big group of equal low is answered by one
//                                      sweep over the vocabulary, a small one by tree search
//
// Exact integer masses make the order of additions irrelevant, so every output gets the
// token and round count rejection_sample_row gives it (tested draw for draw).

namespace {

// Fenwick (binary indexed) tree of exact masses over vocabulary positions.
class MassFenwick {
 public:
  explicit MassFenwick(int64_t n) : n_(n), tree_(static_cast<size_t>(n) + 1, 0) {
    top_ = 1;
    while (top_ * 2 <= n_) top_ *= 2;
  }
  void clear() { std::fill(tree_.begin(), tree_.end(), Mass{0}); }
  void add(int64_t index, Mass m) {
    for (int64_t i = index + 1; i <= n_; i += i & -i) tree_[static_cast<size_t>(i)] += m;
  }
  // The first position whose inclusive prefix exceeds `threshold` (n if none).
  int64_t first_exceeding(Mass threshold) const {
    int64_t pos = 0;
    Mass acc = 0;
    for (int64_t step = top_; step > 0; step >>= 1) {
      const int64_t next = pos + step;
      if (next <= n_ && acc + tree_[static_cast<size_t>(next)] <= threshold) {
        pos = next;
        acc += tree_[static_cast<size_t>(next)];
      }
    }
    return pos;
  }

 private:
  int64_t n_, top_;
  std::vector<Mass> tree_;
};

uint32_t float_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}
float bits_float(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// An output still in the loop. `key` orders the round's work: (~bits of low) in the high
// 32 bits (non-negative floats order like their bits, so ascending key = descending low),
// this round's 24-bit uniform in the low 24 bits.
struct ActiveDraw {
  uint64_t key;
  uint64_t subsequence;  // Philox subsequence (carried here: a gather by id would miss cache)
  uint32_t id;           // index into the batch
  float high;
  int32_t token;  // this round's sampled token
};

float low_of(const ActiveDraw& a) { return bits_float(~static_cast<uint32_t>(a.key >> 24)); }
uint32_t u24_of(const ActiveDraw& a) { return static_cast<uint32_t>(a.key & 0xFFFFFFu); }
uint64_t make_key(float low, uint32_t u24) { return (static_cast<uint64_t>(~float_bits(low)) << 24) | u24; }

// LSD radix sort of the 56-bit keys, four 14-bit digits.
void sort_by_key(std::vector<ActiveDraw>& a, std::vector<ActiveDraw>& scratch) {
  if (a.size() < 2048) {
    std::sort(a.begin(), a.end(), [](const ActiveDraw& x, const ActiveDraw& y) { return x.key < y.key; });
    return;
  }
  scratch.resize(a.size());
  std::vector<uint32_t> count((1u << 14) + 1);
  for (int shift = 0; shift < 56; shift += 14) {
    std::fill(count.begin(), count.end(), 0u);
    for (const auto& x : a) ++count[((x.key >> shift) & 0x3FFFu) + 1];
    // A digit shared by every key (e.g. `low` in the first round) needs no pass.
    if (*std::max_element(count.begin(), count.end()) == a.size()) continue;
    for (size_t b = 1; b < count.size(); ++b) count[b] += count[b - 1];
    for (const auto& x : a) scratch[count[(x.key >> shift) & 0x3FFFu]++] = x;
    a.swap(scratch);
  }
}

}  // namespace

std::vector<RejectionDraw> rejection_sample_row_batched(const float* probs, int64_t vocab,
                                                        const std::vector<SamplingFilter>& filters,
                                                        const std::vector<uint64_t>& subsequences, uint64_t seed,
                                                        uint64_t offset) {
  const char* fn = "rejection_sample_row_batched";
  const size_t n = subsequences.size();
  require(filters.size() == 1 || filters.size() == n, fn,
          "filters must hold one filter or one per output (" + std::to_string(n) + "), got " +
              std::to_string(filters.size()));
  std::vector<RejectionDraw> draws(n);
  if (n == 0) return draws;

  // The row, once: exact masses, the positive tokens sorted by descending p, the prefix
  // masses of that order, and for each token the number of tokens strictly above it.
  std::vector<Mass> mass(static_cast<size_t>(vocab));
  Mass total = 0;
  std::vector<int32_t> order;
  for (int64_t i = 0; i < vocab; ++i) {
    mass[static_cast<size_t>(i)] = mass_of(probs[i]);
    total += mass[static_cast<size_t>(i)];
    if (probs[i] > 0.0f) order.push_back(static_cast<int32_t>(i));
  }
  require(total > 0, fn, "the row has zero total mass");
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  const size_t m = order.size();
  std::vector<float> sorted_p(m);
  std::vector<Mass> prefix(m + 1, 0);
  std::vector<int32_t> count_above(static_cast<size_t>(vocab), 0);  // count_gt(p[i])
  for (size_t j = 0; j < m; ++j) {
    sorted_p[j] = probs[order[j]];
    prefix[j + 1] = prefix[j] + mass[static_cast<size_t>(order[j])];
    const bool tied_with_previous = j > 0 && sorted_p[j] == sorted_p[j - 1];
    count_above[static_cast<size_t>(order[j])] = tied_with_previous ? count_above[static_cast<size_t>(order[j - 1])]
                                                                    : static_cast<int32_t>(j);
  }
  auto count_gt = [&](float t) -> int64_t {
    return std::partition_point(sorted_p.begin(), sorted_p.end(), [t](float x) { return x > t; }) - sorted_p.begin();
  };
  const float max_p = m > 0 ? sorted_p[0] : 0.0f;

  // Per-filter constants: the top-p bound, and the starting `low` (min-p draws once from
  // p >= pivot, which for floats is p > nextafter(pivot, 0)).
  std::vector<Mass> bound(filters.size(), 0);
  std::vector<float> start_low(filters.size(), 0.0f);
  for (size_t f = 0; f < filters.size(); ++f) {
    if (uses_top_p(filters[f].kind)) bound[f] = mass_fraction_ceil(total, filters[f].top_p);
    if (filters[f].kind == FilterKind::min_p) {
      const float pivot = min_p_pivot(max_p, filters[f].min_p);
      start_low[f] = pivot > 0.0f ? std::nextafter(pivot, 0.0f) : 0.0f;
    }
  }
  auto filter_index = [&](uint32_t id) -> size_t { return filters.size() == 1 ? 0 : id; };
  auto uniform = [&](uint64_t subsequence, uint64_t round) {
    return kernels::philox_uniform_bits24(seed, subsequence, offset + round);
  };

  std::vector<ActiveDraw> active(n), scratch;
  for (uint32_t id = 0; id < n; ++id)
    active[id] = {make_key(start_low[filter_index(id)], uniform(subsequences[id], 0)), subsequences[id], id, 1.0f, -1};
  MassFenwick fenwick(vocab);
  std::vector<Mass> threshold;
  // A group of equal `low` at least this large is answered by one sweep of the vocabulary.
  int64_t log2_vocab = 1;
  while ((int64_t{1} << log2_vocab) < vocab) ++log2_vocab;
  const size_t sweep_from = static_cast<size_t>(std::max<int64_t>(1, vocab / (2 * log2_vocab)));

  for (uint64_t round = 0; !active.empty(); ++round) {
    // 1. Inverse CDF. Walk groups of equal low in descending order of low; before each
    //    group insert the tokens that became candidates (p > low).
    sort_by_key(active, scratch);
    fenwick.clear();
    size_t inserted = 0;
    for (size_t g = 0; g < active.size();) {
      const float low = low_of(active[g]);
      size_t g_end = g;
      while (g_end < active.size() && low_of(active[g_end]) == low) ++g_end;
      while (inserted < m && sorted_p[inserted] > low) {
        fenwick.add(order[inserted], mass[static_cast<size_t>(order[inserted])]);
        ++inserted;
      }
      const Mass q = prefix[inserted];  // mass of p > low: the group's shared q
      threshold.resize(g_end - g);
      for (size_t j = g; j < g_end; ++j) threshold[j - g] = scaled_threshold(u24_of(active[j]), q);
      if (g_end - g >= sweep_from) {
        // Thresholds ascend with u (same q), so one pass in vocabulary order answers all.
        Mass cdf = 0;
        size_t j = g;
        for (int64_t i = 0; i < vocab && j < g_end; ++i) {
          if (!(probs[i] > low)) continue;
          cdf += mass[static_cast<size_t>(i)];
          while (j < g_end && threshold[j - g] < cdf) active[j++].token = static_cast<int32_t>(i);
        }
        if (j < g_end) require(false, fn, "internal error: inverse CDF ran off the row");
      } else {
        for (size_t j = g; j < g_end; ++j) {
          const int64_t s = fenwick.first_exceeding(threshold[j - g]);
          if (s >= vocab) require(false, fn, "internal error: inverse CDF ran off the row");
          active[j].token = static_cast<int32_t>(s);
        }
      }
      g = g_end;
    }
    // 2. Accept, or move the pivots exactly as rejection_sample_row does; survivors draw
    //    their next uniform now so that the next sort can use it.
    size_t still = 0;
    for (const ActiveDraw& a : active) {
      const size_t f = filter_index(a.id);
      const SamplingFilter& filter = filters[f];
      bool accepted = filter.kind == FilterKind::none || filter.kind == FilterKind::min_p;
      if (!accepted) {
        const int64_t count_0 = count_above[static_cast<size_t>(a.token)];  // count_gt(pivot_0)
        accepted = pivot_passes(filter, count_0, prefix[static_cast<size_t>(count_0)], bound[f]);
      }
      if (accepted) {
        draws[a.id] = {a.token, static_cast<int32_t>(round + 1)};
        continue;
      }
      const float pivot_0 = probs[a.token];
      const float pivot_1 = (pivot_0 + a.high) * 0.5f;
      const int64_t count_1 = count_gt(pivot_1);
      const Mass mass_1 = prefix[static_cast<size_t>(count_1)];
      float low, high = a.high;
      if (pivot_passes(filter, count_1, mass_1, bound[f])) {
        low = pivot_0;
        high = pivot_1;
      } else {
        low = pivot_1;
      }
      if (!(low < high)) require(false, fn, "internal error: the interval [low, high] closed without acceptance");
      active[still++] = {make_key(low, uniform(a.subsequence, round + 1)), a.subsequence, a.id, high, -1};
    }
    active.resize(still);
  }
  return draws;
}

}  // namespace flashstep::ref
