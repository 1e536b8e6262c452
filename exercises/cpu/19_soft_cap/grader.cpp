// Grader of exercise 19: random queries and keys, some scaled so that their scores pass
// the cap many times over; your capped decode against the reference's.
#include <random>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::AttentionResult capped_decode(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale, double cap);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "soft_cap", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t kv_heads = random_int(rng, 1, 3), group = random_int(rng, 1, 4), head_dim = random_int(rng, 1, 8);
      const int64_t kv_len = c % 10 == 9 ? 0 : random_int(rng, 1, 20);
      const Tensor q = random_tensor(rng, {kv_heads * group, head_dim});
      Tensor k = random_tensor(rng, {kv_len, kv_heads, head_dim});
      const Tensor v = random_tensor(rng, {kv_len, kv_heads, head_dim});
      if (c % 3 == 2)  // scores far past the cap: an uncapped softmax would be one-hot
        for (double& x : k.data) x *= 200.0;
      ref::AttentionOptions opt;
      opt.sm_scale = 0.5;
      opt.logits_soft_cap = c % 2 ? 5.0 : 30.0;
      g.at("case " + std::to_string(c + 1) + " of 30: heads " + std::to_string(kv_heads * group) + "/" +
           std::to_string(kv_heads) + ", head_dim " + std::to_string(head_dim) + ", keys " + std::to_string(kv_len) +
           ", cap " + std::to_string(opt.logits_soft_cap));
      const ref::AttentionResult expected = ref::single_decode_with_kv_cache(q, k, v, opt);
      const ref::AttentionResult yours = capped_decode(q, k, v, *opt.sm_scale, opt.logits_soft_cap);
      g.close("o", yours.o, expected.o, {"head", "dim"});
      g.close("lse", yours.lse, expected.lse, {"head"});
      g.passed_case();
    }
  });
}
