// Grader of exercise 4: your vocab_logits() against the tiny decoder's own logits of the
// same last row, and your greedy_token() against the token its greedy generation picks
// (ref::generate, recompute mode, one new token), over random prompts and weight seeds.
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
std::vector<double> vocab_logits(const std::vector<double>& z, const Tensor& w_vocab);
int32_t greedy_token(const std::vector<double>& logits);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "greedy_next_token", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 12; ++c) {
      ref::TinyDecoderConfig config;
      config.weight_seed = static_cast<uint64_t>(random_int(rng, 0, 1 << 30));
      const ref::TinyDecoder model(config);
      std::string prompt;
      const int64_t len = random_int(rng, 1, 16);
      for (int64_t i = 0; i < len; ++i) prompt += static_cast<char>(random_int(rng, 'a', 'z'));
      g.at("case " + std::to_string(c + 1) + " of 12: prompt \"" + prompt + "\", weight_seed " +
           std::to_string(config.weight_seed));
      const std::vector<int32_t> tokens(prompt.begin(), prompt.end());
      std::vector<double> z;
      model.next_token_logits(tokens, &z);
      const std::vector<double> logits = vocab_logits(z, model.w_vocab());
      g.close("logits", logits, model.logits(z.data()));
      ref::GenerationOptions greedy;
      greedy.max_new_tokens = 1;
      const auto run = ref::generate(model, {prompt}, ref::GenerationMode::recompute, greedy);
      g.same("greedy token", greedy_token(logits), run.requests[0].generated_tokens[0]);
      g.passed_case();
    }
  });
}
