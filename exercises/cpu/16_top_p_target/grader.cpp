// Grader of exercise 16: random rows (sharp and flat ones, rows that do not sum to 1,
// zeros, and ties: equal probabilities that must be kept or dropped together) and random
// top_p; your top_p_distribution() against the reference's sampling_target_distribution.
#include <cmath>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
std::vector<double> top_p_distribution(const std::vector<float>& probs, float top_p);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "top_p_target", [](Grader& g, std::mt19937_64& rng) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int c = 0; c < 40; ++c) {
      const int64_t vocab = random_int(rng, 1, 40);
      const double sharpness = c % 2 ? 3.0 : 0.5;
      std::vector<float> probs(static_cast<size_t>(vocab));
      for (float& p : probs) p = static_cast<float>(std::exp(sharpness * normal(rng)) / vocab);
      for (int64_t n = random_int(rng, 0, 3); n > 0; --n)  // ties
        probs[static_cast<size_t>(random_int(rng, 0, vocab - 1))] =
            probs[static_cast<size_t>(random_int(rng, 0, vocab - 1))];
      if (vocab > 1 && c % 5 == 0) probs[static_cast<size_t>(random_int(rng, 0, vocab - 1))] = 0.0f;
      if (*std::max_element(probs.begin(), probs.end()) == 0.0f) probs[0] = 0.5f;
      const float top_p = static_cast<float>(std::uniform_real_distribution<double>(0.05, 1.0)(rng));
      std::string row;
      for (float p : probs) row += (row.empty() ? "" : ", ") + std::to_string(p);
      g.at("case " + std::to_string(c + 1) + " of 40: top_p " + std::to_string(top_p) + ", probs [" + row + "]");
      const std::vector<double> expected = ref::sampling_target_distribution(probs,
                                                                             ref::SamplingFilter::make_top_p(top_p));
      g.close("target", top_p_distribution(probs, top_p), expected);
      g.passed_case();
    }
  });
}
