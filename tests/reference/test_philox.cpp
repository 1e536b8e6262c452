// Philox4x32 (kernels/flashstep/kernels/philox.cuh) against the published known answers,
// and the (seed, subsequence, offset) -> uniform mapping the samplers rely on.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include <flashstep/kernels/philox.cuh>

#include "support/random.hpp"

using flashstep::kernels::Philox4x32;
using flashstep::kernels::PhiloxKey;

namespace {

struct KnownAnswer {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Random123 known-answer vectors ("kat_vectors" of the Random123 distribution by
// D. E. Shaw Research), lines "philox4x32 7 ..." and "philox4x32 10 ...": counter (4
// words), key (2 words), expected output (4 words). Typed from the copy in
// github.com/DEShawResearch/Random123-Boost, libs/random/test/test_philox.cpp (commit
// 916db91ae4c6fd8324ef054a518851321ab41f91), which states they were cut and pasted from
// that file.
const KnownAnswer kPhilox4x32_10[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};
const KnownAnswer kPhilox4x32_7[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x5f6fb709, 0x0d893f64, 0x4f121f81, 0x4f730a48}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x5207ddc2, 0x45165e59, 0x4d8ee751, 0x8c52f662}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0x4dfccaba, 0x190a87f0, 0xc47362ba, 0xb6b5242a}},
};

template <int Rounds>
void check_known_answers(const KnownAnswer (&cases)[3]) {
  for (const auto& c : cases) {
    Philox4x32 ctr{{c.ctr[0], c.ctr[1], c.ctr[2], c.ctr[3]}};
    PhiloxKey key{{c.key[0], c.key[1]}};
    const Philox4x32 out = flashstep::kernels::philox4x32<Rounds>(ctr, key);
    CAPTURE(Rounds);
    CAPTURE(c.ctr[0]);
    CAPTURE(c.key[0]);
    for (int w = 0; w < 4; ++w) {
      CAPTURE(w);
      CHECK(out.v[w] == c.expected[w]);
    }
  }
}

}  // namespace

TEST_CASE("philox: Philox4x32-10 and -7 reproduce the Random123 known answers") {
  check_known_answers<10>(kPhilox4x32_10);
  check_known_answers<7>(kPhilox4x32_7);
  // philox4x32_10 is the 10-round instance.
  const auto& c = kPhilox4x32_10[2];
  const auto out = flashstep::kernels::philox4x32_10({{c.ctr[0], c.ctr[1], c.ctr[2], c.ctr[3]}},
                                                     {{c.key[0], c.key[1]}});
  CHECK(out.v[0] == c.expected[0]);
  CHECK(out.v[3] == c.expected[3]);
}

TEST_CASE("philox: stream word n is lane n % 4 of counter (n / 4, subsequence) under key seed") {
  // Seed 0, subsequence 0, words 0..3 are the all-zero known answer.
  for (int lane = 0; lane < 4; ++lane) {
    CAPTURE(lane);
    CHECK(flashstep::kernels::philox_word(0, 0, lane) == kPhilox4x32_10[0].expected[lane]);
  }
  // The counter/key layout documented in philox.cuh, for random 64-bit values.
  auto rng = flashstep::test::case_rng("philox layout");
  for (int trial = 0; trial < 100; ++trial) {
    const uint64_t seed = rng(), subsequence = rng(), n = rng() >> 1;
    CAPTURE(seed);
    CAPTURE(subsequence);
    CAPTURE(n);
    const uint64_t block = n / 4;
    const Philox4x32 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                          static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)}};
    const PhiloxKey key{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
    REQUIRE(flashstep::kernels::philox_word(seed, subsequence, n) ==
            flashstep::kernels::philox4x32<10>(ctr, key).v[n % 4]);
  }
}

TEST_CASE("philox: uniforms are the top 24 bits over 2^24, at least 0 and below 1, exact in float") {
  auto rng = flashstep::test::case_rng("philox uniforms");
  const uint64_t seed = rng();
  CAPTURE(seed);
  for (uint64_t row = 0; row < 64; ++row) {
    for (uint64_t n = 0; n < 64; ++n) {
      const uint32_t word = flashstep::kernels::philox_word(seed, row, n);
      const uint32_t bits = flashstep::kernels::philox_uniform_bits24(seed, row, n);
      const float u = flashstep::kernels::philox_uniform(seed, row, n);
      REQUIRE(bits == word >> 8);
      REQUIRE(static_cast<double>(u) == std::ldexp(static_cast<double>(bits), -24));
      REQUIRE(u >= 0.0f);
      REQUIRE(u < 1.0f);
    }
  }
}

TEST_CASE("philox: a (seed, subsequence, offset) stream is stateless and distinct per subsequence") {
  auto rng = flashstep::test::case_rng("philox streams");
  const uint64_t seed = rng();
  CAPTURE(seed);
  // Word n of an output that starts at offset o is word o + n: no hidden state, so any
  // order of evaluation gives the same numbers.
  for (uint64_t n = 0; n < 16; ++n)
    CHECK(flashstep::kernels::philox_word(seed, 7, 5 + n) == flashstep::kernels::philox_word(seed, 7, 5 + n));
  // Different subsequences, seeds and offsets give different words (collisions among
  // 4096 random 32-bit words have probability ~0.2%, so require at least 4090 distinct).
  std::set<uint32_t> words;
  for (uint64_t row = 0; row < 64; ++row)
    for (uint64_t n = 0; n < 64; ++n) words.insert(flashstep::kernels::philox_word(seed, row, n));
  CHECK(words.size() >= 4090);
  CHECK(flashstep::kernels::philox_word(seed, 0, 0) != flashstep::kernels::philox_word(seed + 1, 0, 0));
  // The high halves of seed and subsequence matter (they are key[1] and counter[3]).
  CHECK(flashstep::kernels::philox_word(seed, 0, 0) !=
        flashstep::kernels::philox_word(seed ^ (uint64_t{1} << 40), 0, 0));
  CHECK(flashstep::kernels::philox_word(seed, 1, 0) !=
        flashstep::kernels::philox_word(seed, 1 | (uint64_t{1} << 40), 0));
}

TEST_CASE("philox: 2^20 uniforms pass a 256-bin chi-square test and have mean 1/2") {
  auto rng = flashstep::test::case_rng("philox chi-square");
  const uint64_t seed = rng();
  CAPTURE(seed);
  const int bins = 256;
  const int64_t n = int64_t{1} << 20;
  std::vector<int64_t> count(bins, 0);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float u = flashstep::kernels::philox_uniform(seed, static_cast<uint64_t>(i) >> 6,
                                                       static_cast<uint64_t>(i) & 63);
    ++count[static_cast<int>(u * bins)];
    sum += u;
  }
  const double expected = static_cast<double>(n) / bins;
  double chi2 = 0.0;
  for (int64_t c : count) chi2 += (c - expected) * (c - expected) / expected;
  // 255 degrees of freedom: mean 255, sd sqrt(510) ~ 22.6; 400 is about 6.4 sd out.
  const double kChi2Bound = 400.0;
  CAPTURE(chi2);
  CHECK(chi2 < kChi2Bound);
  // Mean of U(0,1): 1/2 with sd 1/sqrt(12 n) ~ 2.8e-4; allow 6 sd.
  CHECK(std::abs(sum / n - 0.5) < 6.0 / std::sqrt(12.0 * n));
}
