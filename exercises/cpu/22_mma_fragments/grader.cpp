// Grader of exercise 22: tiles whose every value names its place (100 key + head), then
// random ones; your B fragments against the layout applied to the tile directly.
#include <array>
#include <random>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

using Fragments = std::array<std::array<float, 4>, 32>;  // [lane][register]

// Yours: attempt.cpp (solution.cpp in the solution's program).
Fragments b_from_c(const Fragments& c);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "mma_fragments", [](Grader& g, std::mt19937_64& rng) {
    for (int n = 0; n < 20; ++n) {
      // tile[key][head]: the first case names each value by its place, the rest are random
      float tile[16][8];
      std::uniform_int_distribution<int> value(-999, 999);
      for (int k = 0; k < 16; ++k)
        for (int h = 0; h < 8; ++h) tile[k][h] = n == 0 ? float(100 * k + h) : float(value(rng));
      Fragments c{};
      for (int lane = 0; lane < 32; ++lane) {  // the accumulator layout of mma.sync m16n8k16
        const int gr = lane / 4, t = lane % 4;
        c[lane] = {tile[gr][2 * t], tile[gr][2 * t + 1], tile[gr + 8][2 * t], tile[gr + 8][2 * t + 1]};
      }
      const Fragments yours = b_from_c(c);
      g.at("tile " + std::to_string(n + 1) + " of 20" + (n == 0 ? " (value = 100 key + head)" : " (random)"));
      for (int lane = 0; lane < 32; ++lane) {  // the B-operand layout, k = keys, n = heads
        const int gr = lane / 4, t = lane % 4;
        const std::vector<int32_t> expected = {int32_t(tile[2 * t][gr]), int32_t(tile[2 * t + 1][gr]),
                                               int32_t(tile[2 * t + 8][gr]), int32_t(tile[2 * t + 9][gr])};
        std::vector<int32_t> got;
        for (float x : yours[lane]) got.push_back(int32_t(x));
        g.same("lane " + std::to_string(lane) + "'s b[0..3]", got, expected);
      }
      g.passed_case();
    }
  });
}
