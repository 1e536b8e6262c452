// Grader of exercise 5: random generations, step by step. The reference keeps its own
// ContiguousKVCache of the same rows; after every step your cache must hold the same K and
// V, and your output must equal single_decode_with_kv_cache of the query over it.
#include <cmath>
#include <string>

#include "grade.hpp"
#include "kv_cache.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "decode_with_kv_cache", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 8; ++c) {
      const int64_t num_kv_heads = random_int(rng, 1, 2), group = random_int(rng, 1, 3);
      const int64_t head_dim = random_int(rng, 1, 16), prompt_len = random_int(rng, 1, 8);
      const int64_t steps = random_int(rng, 1, 12), num_qo_heads = num_kv_heads * group;
      ref::AttentionOptions opt;
      opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
      KVCache yours;
      ref::ContiguousKVCache expected(num_kv_heads, head_dim);
      for (int64_t step = 0; step <= steps; ++step) {
        const int64_t n = step == 0 ? prompt_len : 1;  // the prompt first, then one token a step
        const Tensor q = random_tensor(rng, {num_qo_heads, head_dim});
        const Tensor k_new = random_tensor(rng, {n, num_kv_heads, head_dim});
        const Tensor v_new = random_tensor(rng, {n, num_kv_heads, head_dim});
        g.at("generation " + std::to_string(c + 1) + " of 8 (" + std::to_string(num_qo_heads) + " query heads over " +
             std::to_string(num_kv_heads) + " kv heads, head_dim " + std::to_string(head_dim) + "), step " +
             std::to_string(step) + ": " + std::to_string(n) + " new row(s) after " +
             std::to_string(expected.kv_len()));
        const ref::AttentionResult mine = decode_step(yours, q, k_new, v_new, *opt.sm_scale);
        expected.append(k_new, v_new);
        g.close("cache.k", yours.k, expected.k(), {"token", "kv head", "dim"});
        g.close("cache.v", yours.v, expected.v(), {"token", "kv head", "dim"});
        const ref::AttentionResult want = ref::single_decode_with_kv_cache(q, expected.k(), expected.v(), opt);
        g.close("o", mine.o, want.o, {"head", "dim"});
        g.close("lse", mine.lse, want.lse, {"head"});
      }
      g.passed_case();
    }
  });
}
