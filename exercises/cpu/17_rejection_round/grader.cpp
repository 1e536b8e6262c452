// Grader of exercise 17: random rows (softmax of scaled normal logits, vocabularies of 2
// to 2000) and top_p; for several outputs of each row, the loop below runs your round with
// the reference's Philox uniforms, and the accepted token and the number of rounds must
// equal the reference's rejection_sample_row.
#include <cmath>
#include <string>
#include <vector>

#include <flashstep/kernels/philox.cuh>

#include "grade.hpp"
#include "rejection_round.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "rejection_round", [](Grader& g, std::mt19937_64& rng) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (int c = 0; c < 20; ++c) {
      const int64_t vocab = random_int(rng, 2, c % 2 ? 2000 : 50);
      Tensor logits({1, vocab});
      const double scale = std::uniform_real_distribution<double>(0.5, 4.0)(rng);
      for (double& x : logits.data) x = scale * normal(rng);
      const Tensor p = ref::softmax(logits);
      const std::vector<float> probs(p.data.begin(), p.data.end());
      const float top_p = static_cast<float>(std::uniform_real_distribution<double>(0.05, 0.99)(rng));
      const uint64_t seed = rng(), offset = static_cast<uint64_t>(random_int(rng, 0, 1000));
      ref::Mass total = 0;
      for (float x : probs) total += ref::mass_of(x);
      const ref::Mass bound = ref::mass_fraction_ceil(total, top_p);
      for (uint64_t output = 0; output < 8; ++output) {
        g.at("case " + std::to_string(c + 1) + " of 20: vocab " + std::to_string(vocab) + ", top_p " +
             std::to_string(top_p) + ", Philox seed " + std::to_string(seed) + ", output " + std::to_string(output) +
             ", offset " + std::to_string(offset));
        const ref::RejectionDraw expected = ref::rejection_sample_row(
            probs.data(), vocab, ref::SamplingFilter::make_top_p(top_p), seed, output, offset);
        // The loop around your round: round j reads Philox word offset + j of this output.
        RejectionState state;
        state.q = total;
        int32_t token = -1, rounds = 0;
        while (token < 0 && rounds < 64) {
          const uint32_t u24 = kernels::philox_uniform_bits24(seed, output, offset + static_cast<uint64_t>(rounds));
          ++rounds;
          token = rejection_round(probs, bound, u24, state);
        }
        g.same("accepted token (-1: none in 64 rounds)", token, expected.token);
        g.same("rounds", rounds, expected.rounds);
      }
      g.passed_case();
    }
  });
}
