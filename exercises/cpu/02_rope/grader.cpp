// Grader of exercise 2: your rope() against the reference's apply_rope_pos_ids (rotary_dim
// = head_dim, rope_scale 1), both layouts, positions up to 10^5, two bases of frequencies.
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
Tensor rope(const Tensor& x, const std::vector<int32_t>& positions, double rope_theta, bool interleave);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "rope", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 20; ++c) {
      const int64_t nnz = random_int(rng, 1, 6), heads = random_int(rng, 1, 3), head_dim = 2 * random_int(rng, 1, 8);
      const bool interleave = c % 2 == 1;
      const double rope_theta = c % 4 < 2 ? 1e4 : 5e5;
      const Tensor x = random_tensor(rng, {nnz, heads, head_dim});
      std::vector<int32_t> positions;
      for (int64_t t = 0; t < nnz; ++t)
        positions.push_back(static_cast<int32_t>(random_int(rng, 0, c < 10 ? 20 : 100000)));
      g.at("case " + std::to_string(c + 1) + " of 20: " + std::to_string(nnz) + " rows, " + std::to_string(heads) +
           " heads of " + std::to_string(head_dim) + ", " + (interleave ? "interleaved" : "rotate-half") +
           ", rope_theta " + std::to_string(static_cast<int64_t>(rope_theta)) + ", positions " + list_text(positions));
      ref::RopeOptions opt;
      opt.interleave = interleave;
      opt.rope_theta = rope_theta;
      // The reference rotates q and k together; x plays both here.
      const Tensor expected = ref::apply_rope_pos_ids(x, x, positions, opt).q_rope;
      g.close("x rotated", rope(x, positions, rope_theta, interleave), expected, {"row", "head", "dim"});
      g.passed_case();
    }
  });
}
