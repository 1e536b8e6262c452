// Grader of exercise 18: random queries, keys and sinks; the reference attends the keys
// without sinks (the state you get) and with them (the state you must return). Some cases
// have no keys at all, some large scores, some sinks far above or below the keys' lse.
#include <random>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::AttentionResult add_sink(const ref::AttentionResult& state, const std::vector<double>& sinks);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "attention_sinks", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t qo_len = random_int(rng, 1, 4), heads = random_int(rng, 1, 4), head_dim = random_int(rng, 1, 8);
      const int64_t kv_len = c % 6 == 5 ? 0 : random_int(rng, 1, 12);
      const Tensor q = random_tensor(rng, {qo_len, heads, head_dim});
      Tensor k = random_tensor(rng, {kv_len, heads, head_dim});
      const Tensor v = random_tensor(rng, {kv_len, heads, head_dim});
      if (c % 5 == 4)  // large scores: a sum of exponentials without the max taken out overflows
        for (double& x : k.data) x *= 300.0;
      ref::AttentionOptions plain;
      ref::AttentionOptions with = plain;
      std::uniform_real_distribution<double> sink(c % 3 == 0 ? -40.0 : -3.0, c % 3 == 1 ? 40.0 : 5.0);
      for (int64_t h = 0; h < heads; ++h) with.sinks.push_back(sink(rng));
      g.at("case " + std::to_string(c + 1) + " of 30: qo_len " + std::to_string(qo_len) + ", heads " +
           std::to_string(heads) + ", head_dim " + std::to_string(head_dim) + ", keys " + std::to_string(kv_len));
      const ref::AttentionResult state = ref::single_prefill_with_kv_cache(q, k, v, plain);
      const ref::AttentionResult expected = ref::single_prefill_with_kv_cache(q, k, v, with);
      const ref::AttentionResult yours = add_sink(state, with.sinks);
      g.close("o", yours.o, expected.o, {"row", "head", "dim"});
      g.close("lse", yours.lse, expected.lse, {"row", "head"});
      g.passed_case();
    }
  });
}
