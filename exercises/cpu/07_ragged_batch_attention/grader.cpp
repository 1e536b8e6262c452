// Grader of exercise 7: your batch_attention() against the reference's
// batch_prefill_with_ragged_kv_cache on random ragged batches, causal or not: requests of
// different lengths, some with no queries, some with no keys.
#include <cmath>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::AttentionResult batch_attention(const Tensor& q, const std::vector<int32_t>& qo_indptr, const Tensor& k,
                                     const Tensor& v, const std::vector<int32_t>& kv_indptr,
                                     const ref::AttentionOptions& opt);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "ragged_batch_attention", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 20; ++c) {
      const int64_t batch = random_int(rng, 1, 5), num_kv_heads = random_int(rng, 1, 2);
      const int64_t num_qo_heads = num_kv_heads * random_int(rng, 1, 2), head_dim = random_int(rng, 2, 8);
      std::vector<int32_t> qo_lens, kv_lens;
      for (int64_t i = 0; i < batch; ++i) {
        qo_lens.push_back(static_cast<int32_t>(random_int(rng, 0, 5)));
        kv_lens.push_back(static_cast<int32_t>(random_int(rng, 0, 9)));
      }
      const std::vector<int32_t> qo_indptr = indptr_of(qo_lens), kv_indptr = indptr_of(kv_lens);
      const Tensor q = random_tensor(rng, {qo_indptr.back(), num_qo_heads, head_dim});
      const Tensor k = random_tensor(rng, {kv_indptr.back(), num_kv_heads, head_dim});
      const Tensor v = random_tensor(rng, {kv_indptr.back(), num_kv_heads, head_dim});
      ref::AttentionOptions opt;
      opt.causal = c % 2 == 0;
      g.at("case " + std::to_string(c + 1) + " of 20: qo_indptr " + list_text(qo_indptr) + ", kv_indptr " +
           list_text(kv_indptr) + (opt.causal ? ", causal" : ", not causal"));
      const ref::AttentionResult expected = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, opt);
      const ref::AttentionResult yours = batch_attention(q, qo_indptr, k, v, kv_indptr, opt);
      g.close("o", yours.o, expected.o, {"packed row", "head", "dim"});
      g.close("lse", yours.lse, expected.lse, {"packed row", "head"});
      g.passed_case();
    }
  });
}
