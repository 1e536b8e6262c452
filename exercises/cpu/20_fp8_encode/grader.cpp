// Grader of exercise 20: e4m3 patterns of ties, subnormals, the largest values, overflow,
// NaN, signed zeros and random values, yours against the reference's fp8_from_double.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
uint8_t to_e4m3(double x);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "fp8_encode", [](Grader& g, std::mt19937_64& rng) {
    std::vector<double> xs = {0.0,
                              -0.0,
                              1.0,
                              -1.0,
                              448.0,
                              -448.0,
                              460.0,
                              464.0,
                              1e9,
                              -1e9,
                              std::ldexp(1.0, -6),
                              std::ldexp(1.0, -9),
                              std::ldexp(1.0, -10),
                              std::ldexp(3.0, -11),
                              std::numeric_limits<double>::quiet_NaN(),
                              0.3,
                              1.0625,
                              1.1875,
                              240.0,
                              248.0};
    // every midpoint between two neighbouring patterns: the ties
    for (int bits = 0; bits < 0x7e; ++bits) {
      const double lo = ref::fp8_to_double(static_cast<uint8_t>(bits), ref::FP8Format::e4m3);
      const double hi = ref::fp8_to_double(static_cast<uint8_t>(bits + 1), ref::FP8Format::e4m3);
      xs.push_back((lo + hi) / 2);
      xs.push_back(-(lo + hi) / 2);
    }
    std::uniform_real_distribution<double> exponent(-12.0, 10.0);
    for (int i = 0; i < 400; ++i) xs.push_back((i % 2 ? -1 : 1) * std::exp2(exponent(rng)));
    int n = 0;
    for (double x : xs) {
      char what[64];
      std::snprintf(what, sizeof what, "x = %.17g", x);
      g.at(std::string("value ") + std::to_string(++n) + " of " + std::to_string(xs.size()) + ": " + what);
      g.same("pattern", static_cast<int64_t>(to_e4m3(x)),
             static_cast<int64_t>(ref::fp8_from_double(x, ref::FP8Format::e4m3)));
      g.passed_case();
    }
  });
}
