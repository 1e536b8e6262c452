// Grader of exercise 6: your batch_indices_positions() against the reference's
// get_batch_indices_positions on random batches: requests that append nothing, requests
// whose whole sequence is new (a prefill), requests appending to a long history.
#include <string>
#include <utility>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
std::pair<std::vector<int32_t>, std::vector<int32_t>> batch_indices_positions(const std::vector<int32_t>& append_indptr,
                                                                              const std::vector<int32_t>& seq_lens);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "batch_indices_positions", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t batch = random_int(rng, 1, 6);
      std::vector<int32_t> append_lens, seq_lens;
      for (int64_t i = 0; i < batch; ++i) {
        append_lens.push_back(static_cast<int32_t>(random_int(rng, 0, 5)));
        const int64_t history = random_int(rng, 0, 2) == 0 ? 0 : random_int(rng, 1, 40);
        seq_lens.push_back(static_cast<int32_t>(append_lens.back() + history));
      }
      const std::vector<int32_t> append_indptr = indptr_of(append_lens);
      g.at("case " + std::to_string(c + 1) + " of 30: append_indptr " + list_text(append_indptr) + ", seq_lens " +
           list_text(seq_lens));
      const auto expected = ref::get_batch_indices_positions(append_indptr, seq_lens, append_indptr.back());
      const auto yours = batch_indices_positions(append_indptr, seq_lens);
      g.same("batch_indices", yours.first, expected.first);
      g.same("positions", yours.second, expected.second);
      g.passed_case();
    }
  });
}
