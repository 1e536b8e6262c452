// Grader of exercise 1: your causal_attention() against the reference's
// single_prefill_with_kv_cache (causal, the same sm_scale) on random requests: one to
// eight queries, zero to twelve keys (so some rows see no key), grouped-query heads.
#include <cmath>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::AttentionResult causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "causal_attention", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t qo_len = random_int(rng, 1, 8), kv_len = random_int(rng, 0, 12);
      const int64_t num_kv_heads = random_int(rng, 1, 2), group = random_int(rng, 1, 3);
      const int64_t head_dim = random_int(rng, 1, 16);
      const Tensor q = random_tensor(rng, {qo_len, num_kv_heads * group, head_dim});
      const Tensor k = random_tensor(rng, {kv_len, num_kv_heads, head_dim});
      const Tensor v = random_tensor(rng, {kv_len, num_kv_heads, head_dim});
      ref::AttentionOptions opt;
      opt.causal = true;
      opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      g.at("case " + std::to_string(c + 1) + " of 30: qo_len " + std::to_string(qo_len) + ", kv_len " +
           std::to_string(kv_len) + ", heads " + std::to_string(num_kv_heads * group) + " over " +
           std::to_string(num_kv_heads) + " kv heads, head_dim " + std::to_string(head_dim));
      const ref::AttentionResult expected = ref::single_prefill_with_kv_cache(q, k, v, opt);
      const ref::AttentionResult yours = causal_attention(q, k, v, *opt.sm_scale);
      g.close("o", yours.o, expected.o, {"row", "head", "dim"});
      g.close("lse", yours.lse, expected.lse, {"row", "head"});
      g.passed_case();
    }
  });
}
