// Grader of exercise 13: random queries and keys; the keys are cut in two (set A before
// the cut, B after; the cut may leave either side empty, and a causal mask empties some
// rows of A or B), each side attended by the reference, and your merge() of the two
// states compared with the reference's merge_state.
#include <algorithm>
#include <cmath>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::MergedState merge(const Tensor& o_a, const Tensor& lse_a, const Tensor& o_b, const Tensor& lse_b);

namespace {

// Rows [begin, end) of a (rows, heads, dim) tensor.
Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t row = t.dim(1) * t.dim(2);
  Tensor out({end - begin, t.dim(1), t.dim(2)});
  std::copy(t.data.begin() + begin * row, t.data.begin() + end * row, out.data.begin());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "merge_state", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t seq_len = random_int(rng, 1, 5), heads = random_int(rng, 1, 3), head_dim = random_int(rng, 1, 8);
      const int64_t kv_len = random_int(rng, 0, 10), cut = random_int(rng, 0, kv_len);
      const Tensor q = random_tensor(rng, {seq_len, heads, head_dim});
      Tensor k = random_tensor(rng, {kv_len, heads, head_dim});
      const Tensor v = random_tensor(rng, {kv_len, heads, head_dim});
      if (c % 5 == 4)  // large scores: a merge that exponentiates lse directly overflows
        for (double& x : k.data) x *= 300.0;
      ref::AttentionOptions opt;
      opt.causal = c % 3 == 0;  // with fewer keys than queries, some rows see none: lse -inf
      g.at("case " + std::to_string(c + 1) + " of 30: seq_len " + std::to_string(seq_len) + ", heads " +
           std::to_string(heads) + ", head_dim " + std::to_string(head_dim) + "; A = keys 0.." + std::to_string(cut) +
           ", B = keys " + std::to_string(cut) + ".." + std::to_string(kv_len) + (opt.causal ? ", causal" : ""));
      const ref::AttentionResult a = ref::single_prefill_with_kv_cache(q, rows(k, 0, cut), rows(v, 0, cut), opt);
      const ref::AttentionResult b = ref::single_prefill_with_kv_cache(q, rows(k, cut, kv_len), rows(v, cut, kv_len),
                                                                       opt);
      const ref::MergedState expected = ref::merge_state(a.o, a.lse, b.o, b.lse);
      const ref::MergedState yours = merge(a.o, a.lse, b.o, b.lse);
      g.close("o", yours.v, expected.v, {"row", "head", "dim"});
      g.close("lse", yours.s, expected.s, {"row", "head"});
      g.passed_case();
    }
  });
}
