// The fp32 rotation of fused RoPE (rope_fp32.hpp) against the rotation in double
// (rope.hpp). The bound on cos and sin is derived here, then checked over every position a
// test or the engine reaches and every frequency of head_dim 64 and 128.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>
#include <vector>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

namespace {

// The error of rope_cos_sin_fp32, step by step (u = 2^-24, fp32's unit roundoff):
//   t = RN(p f): relative 2^-53; at p < 2^24 and f <= 1/(2 pi) |t| < 2^22, an error below
//     2^-31 turns; f itself (theta_i / 2 pi in double) adds p * 2^-53 f, smaller still;
//   x = float(r), |r| <= 1/2: at most 2^-26 turns = 9.4e-8 rad;
//   z = RN(2 pi_f y): 2 pi_f is 2 pi within 2^-24 relative, the product rounds once, so
//     |dz| <= 2 u |z| <= 2 u pi/4 = 9.4e-8;
//   the polynomials: Taylor remainders below 2e-9, Horner in fp32 with |terms| < 1
//     about 3 u = 1.8e-7.
// Sum: under 4.1e-7 < 2^-21 = 4.8e-7, the bound checked below.
constexpr double kCosSinBound = 0x1p-21;

double two_pi() { return 2.0 * std::acos(-1.0); }

}  // namespace

TEST_CASE("rope_cos_sin_fp32 is within 2^-21 of cos and sin in double") {
  double worst = 0;
  for (int64_t head_dim : {64, 128}) {
    const std::vector<double> turns = ref::rope_llama_turns(head_dim, 1.0, 1e4);
    const std::vector<double> theta = ref::rope_frequencies(head_dim, 1.0, 1e4);
    for (size_t i = 0; i < turns.size(); ++i)
      for (int p = 0; p < 140000; p += (p < 4096 ? 1 : 7)) {
        float c, s;
        ref::rope_cos_sin_fp32(p, turns[i], c, s);
        const double angle = p * theta[i];
        worst = std::max({worst, std::abs(c - std::cos(angle)), std::abs(s - std::sin(angle))});
      }
  }
  // Positions near 2^24 as well, with rope_scale and another theta.
  const std::vector<double> turns = ref::rope_llama_turns(128, 8.0, 5e5);
  const std::vector<double> theta = ref::rope_frequencies(128, 8.0, 5e5);
  for (size_t i = 0; i < turns.size(); ++i)
    for (int p = (1 << 24) - 5000; p <= (1 << 24); ++p) {
      float c, s;
      ref::rope_cos_sin_fp32(p, turns[i], c, s);
      const double angle = p * theta[i];
      worst = std::max({worst, std::abs(c - std::cos(angle)), std::abs(s - std::sin(angle))});
    }
  MESSAGE("largest error of cos/sin: " << worst << " (bound " << kCosSinBound << ")");
  CHECK(worst <= kCosSinBound);
}

TEST_CASE("rope_cos_sin_fp32: quarter turns and position 0 come out exact") {
  float c, s;
  ref::rope_cos_sin_fp32(0, 0.1, c, s);
  CHECK(c == 1.f);
  CHECK(s == 0.f);
  ref::rope_cos_sin_fp32(1, 0.25, c, s);  // a quarter turn
  CHECK(c == 0.f);
  CHECK(s == 1.f);
  ref::rope_cos_sin_fp32(3, 0.5, c, s);  // three half turns
  CHECK(c == -1.f);
  CHECK(s == 0.f);
}

TEST_CASE("rope_llama_turns are the plain frequencies over 2 pi") {
  const std::vector<double> turns = ref::rope_llama_turns(128, 2.0, 5e5);
  const std::vector<double> theta = ref::rope_frequencies(128, 2.0, 5e5);
  REQUIRE(turns.size() == 64);
  for (size_t i = 0; i < turns.size(); ++i) CHECK(turns[i] * two_pi() == doctest::Approx(theta[i]).epsilon(1e-15));
  CHECK(turns[0] == doctest::Approx(1.0 / (2.0 * two_pi())).epsilon(1e-15));  // theta_0 = 1 / rope_scale
}

TEST_CASE("rope_llama_fp32 is the rotate-half rotation in double, within the derived bound") {
  std::mt19937_64 rng(2701);
  const int64_t nnz = 40, heads = 3, head_dim = 64;
  Tensor x = test::random_tensor(rng, {nnz, heads, head_dim}, -3.0, 3.0);
  for (double& v : x.data) v = static_cast<float>(v);
  std::vector<int64_t> positions;
  for (int64_t t = 0; t < nnz; ++t) positions.push_back(test::random_int(rng, 0, 100000));
  const Tensor got = ref::rope_llama_fp32(x, positions, ref::rope_llama_turns(head_dim, 1.0, 1e4));
  const Tensor want = ref::apply_rotary_embedding(x, positions, ref::rope_frequencies(head_dim, 1.0, 1e4),
                                                  /*interleave=*/false);
  // Each output a c - b s (or b c + a s): |da| <= (|a| + |b|) 2^-21 from cos/sin, plus two
  // fp32 roundings of terms below |a| + |b| <= 6: 6 * (2^-21 + 2 * 2^-24).
  const double bound = 6.0 * (kCosSinBound + 2 * 0x1p-24);
  double worst = 0;
  for (size_t i = 0; i < got.data.size(); ++i) {
    CHECK(static_cast<double>(static_cast<float>(got.data[i])) == got.data[i]);  // fp32 values
    worst = std::max(worst, std::abs(got.data[i] - want.data[i]));
  }
  MESSAGE("largest error of a rotated element: " << worst << " (bound " << bound << ")");
  CHECK(worst <= bound);
}

TEST_CASE("rope_llama_fp32 and rope_llama_turns refuse bad input by name") {
  const Tensor x({1, 1, 4}, {1, 2, 3, 4});
  const std::vector<double> turns = ref::rope_llama_turns(4, 1.0, 1e4);
  test::expect_error([&] { ref::rope_llama_fp32(x, {0, 1}, turns); }, {"rope_llama", "positions"});
  test::expect_error([&] { ref::rope_llama_fp32(x, {0}, {0.1}); }, {"rope_llama", "turns"});
  test::expect_error([&] { ref::rope_llama_fp32(x, {(1 << 24) + 1}, turns); }, {"rope_llama", "positions[0]"});
  test::expect_error(
      [&] {
        ref::rope_llama_fp32(Tensor({1, 1, 4}, {0.1, 0, 0, 0}), {0}, turns);
      },
      {"rope_llama", "fp32 values"});
  test::expect_error([&] { ref::rope_llama_turns(4, 0.0, 1e4); }, {"rope_llama", "rope_scale"});
  test::expect_error([&] { ref::rope_llama_turns(3, 1.0, 1e4); }, {"rope_llama", "rotary_dim"});
}
