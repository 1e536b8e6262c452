// Grader of exercise 21: random latents, rotary keys and up-projections; your absorbed
// decode against the reference's naive form (every head's keys and values built).
#include <cmath>
#include <random>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::AttentionResult absorbed_decode(const Tensor& q_nope, const Tensor& q_pe, const Tensor& ckv, const Tensor& kpe,
                                     const Tensor& w_uk, const Tensor& w_uv, double sm_scale);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "mla_absorb", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t heads = random_int(rng, 1, 6), rank = random_int(rng, 1, 16), rope = random_int(rng, 1, 4);
      const int64_t nope = random_int(rng, 1, 6), vo = random_int(rng, 1, 6);
      const int64_t kv_len = c % 10 == 9 ? 0 : random_int(rng, 1, 25);
      const Tensor q_nope = random_tensor(rng, {1, heads, nope}), q_pe = random_tensor(rng, {1, heads, rope});
      const Tensor ckv = random_tensor(rng, {kv_len, rank}), kpe = random_tensor(rng, {kv_len, rope});
      const ref::MlaWeights w{random_tensor(rng, {heads, nope, rank}), random_tensor(rng, {heads, vo, rank})};
      ref::MlaOptions opt;
      opt.sm_scale = 1.0 / std::sqrt(static_cast<double>(nope + rope));  // MLA's: the head dim before absorption
      g.at("case " + std::to_string(c + 1) + " of 30: heads " + std::to_string(heads) + ", rank " +
           std::to_string(rank) + ", rope " + std::to_string(rope) + ", nope " + std::to_string(nope) + ", vo " +
           std::to_string(vo) + ", keys " + std::to_string(kv_len));
      const ref::AttentionResult naive = ref::mla_naive(q_nope, q_pe, ckv, kpe, w, opt);
      const Tensor expected_o({heads, vo}, naive.o.data), expected_lse({heads}, naive.lse.data);
      const ref::AttentionResult yours = absorbed_decode(Tensor({heads, nope}, q_nope.data),
                                                         Tensor({heads, rope}, q_pe.data), ckv, kpe, w.w_uk, w.w_uv,
                                                         *opt.sm_scale);
      g.close("o", yours.o, expected_o, {"head", "dim"});
      g.close("lse", yours.lse, expected_lse, {"head"});
      g.passed_case();
    }
  });
}
