// Grader of exercise 3: your softmax_with_temperature() against the reference's softmax
// on random rows: temperatures from 0.05 (nearly greedy) to 5 (nearly uniform), logits
// large enough to overflow a naive exp, and some tokens ruled out (-inf).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
Tensor softmax_with_temperature(const Tensor& logits, const std::vector<double>& temperature);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "temperature_softmax", [](Grader& g, std::mt19937_64& rng) {
    std::uniform_real_distribution<double> log_t(std::log(0.05), std::log(5.0));
    for (int c = 0; c < 20; ++c) {
      const int64_t batch = random_int(rng, 1, 4), vocab = random_int(rng, 2, 50);
      Tensor logits = random_tensor(rng, {batch, vocab});
      const double spread = c < 10 ? 3.0 : 400.0;  // exp(400 / 0.05) overflows any double
      std::vector<double> temperature;
      for (int64_t b = 0; b < batch; ++b) {
        temperature.push_back(std::exp(log_t(rng)));
        for (int64_t i = 0; i < vocab; ++i) {
          logits({b, i}) *= spread;
          if (i != b % vocab && random_int(rng, 0, 4) == 0) logits({b, i}) = -std::numeric_limits<double>::infinity();
        }
      }
      g.at("case " + std::to_string(c + 1) + " of 20: batch " + std::to_string(batch) + ", vocab " +
           std::to_string(vocab) + ", logits of size ~" + std::to_string(static_cast<int>(spread)) + ", some -inf");
      const Tensor expected = ref::softmax(logits, ref::RowParam<double>(temperature));
      g.close("probs", softmax_with_temperature(logits, temperature), expected, {"row", "token"});
      g.passed_case();
    }
  });
}
