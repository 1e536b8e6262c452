// Exercise 16's solution: sort once, walk groups of equal probability, exact masses.
#include <algorithm>
#include <numeric>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Mass;

std::vector<double> top_p_distribution(const std::vector<float>& probs, float top_p) {
  const size_t vocab = probs.size();
  Mass total = 0;
  for (float p : probs) total += flashstep::ref::mass_of(p);
  const Mass bound = flashstep::ref::mass_fraction_ceil(total, top_p);  // ceil(top_p * total), exactly
  std::vector<size_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probs[a] > probs[b]; });
  std::vector<bool> keep(vocab, false);
  Mass before = 0, kept = 0;                // before: the mass of every token strictly more likely than the group
  for (size_t start = 0; start < vocab;) {  // one group of equal probability per pass
    const float p = probs[order[start]];
    const bool kept_group = p > 0.0f && before < bound;  // a group is kept or dropped whole
    Mass group = 0;
    for (; start < vocab && probs[order[start]] == p; ++start) {
      keep[order[start]] = kept_group;
      group += flashstep::ref::mass_of(p);
    }
    if (kept_group) kept += group;
    before += group;
  }
  std::vector<double> target(vocab, 0.0);
  for (size_t i = 0; i < vocab; ++i)
    if (keep[i])
      target[i] = static_cast<double>(static_cast<long double>(flashstep::ref::mass_of(probs[i])) /
                                      static_cast<long double>(kept));
  return target;
}
