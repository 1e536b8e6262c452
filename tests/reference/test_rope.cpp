// Rotary position encoding. Small cases are worked out by hand in the comments (angles
// chosen to be quarter and eighth turns); the rest are properties a wrong rotation cannot
// keep: each pair's length, the inverse rotation, q.k depending only on the position
// difference, the two layouts being one function up to a permutation of dims, the tail past
// rotary_dim, and Llama 3.1's scaling reducing to plain RoPE at both ends of the spectrum.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>
#include <vector>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

namespace {

const double kPi = std::acos(-1.0);
const double kSqrt2 = std::sqrt(2.0);

/// One row, one head: (1, 1, d).
Tensor head(std::vector<double> values) {
  const auto d = static_cast<int64_t>(values.size());
  return Tensor({1, 1, d}, std::move(values));
}

/// Dot product of head h of row t of a with head h2 of row t2 of b.
double dot(const Tensor& a, int64_t t, int64_t h, const Tensor& b, int64_t t2, int64_t h2) {
  double s = 0;
  for (int64_t d = 0; d < a.dim(2); ++d) s += a({t, h, d}) * b({t2, h2, d});
  return s;
}

}  // namespace

TEST_CASE("rope: frequencies are rope_theta^(-2i/rotary_dim) / rope_scale") {
  // rotary_dim 8, theta 1e4: 1e4^(-2i/8) = 10^-i.
  const auto f = ref::rope_frequencies(8, 1.0, 1e4);
  REQUIRE(f.size() == 4);
  const double expected[] = {1.0, 0.1, 0.01, 0.001};
  for (int i = 0; i < 4; ++i) CHECK(f[static_cast<size_t>(i)] == doctest::Approx(expected[i]).epsilon(1e-14));
  // rope_scale divides every frequency.
  const auto g = ref::rope_frequencies(8, 4.0, 1e4);
  for (int i = 0; i < 4; ++i) CHECK(g[static_cast<size_t>(i)] == doctest::Approx(expected[i] / 4).epsilon(1e-14));
}

TEST_CASE("rope: head_dim 4 by hand, both layouts") {
  // rope_theta 4 and rope_scale 2/pi make theta_0 = 1 / (2/pi) = pi/2 and
  // theta_1 = 4^(-2/4) / (2/pi) = pi/4: at position 1 pair 0 turns 90 degrees, pair 1 45.
  ref::RopeOptions opt;
  opt.rope_theta = 4.0;
  opt.rope_scale = 2.0 / kPi;
  const Tensor x = head({1, 2, 3, 4});

  SUBCASE("rotate-half, position 1") {
    // pairs (x0, x2) = (1, 3) at 90: (1*0 - 3*1, 3*0 + 1*1) = (-3, 1);
    //       (x1, x3) = (2, 4) at 45: ((2 - 4)/sqrt2, (4 + 2)/sqrt2) = (-sqrt2, 3 sqrt2).
    const auto r = ref::apply_rope_pos_ids(x, x, {1}, opt);
    const double expected[] = {-3, -kSqrt2, 1, 3 * kSqrt2};
    for (int d = 0; d < 4; ++d) {
      CHECK(r.q_rope({0, 0, d}) == doctest::Approx(expected[d]).epsilon(1e-12));
      CHECK(r.k_rope({0, 0, d}) == doctest::Approx(expected[d]).epsilon(1e-12));
    }
  }
  SUBCASE("rotate-half, position 2") {
    // pair 0 turns 180: (1, 3) -> (-1, -3); pair 1 turns 90: (2, 4) -> (-4, 2).
    const auto r = ref::apply_rope_pos_ids(x, x, {2}, opt);
    const double expected[] = {-1, -4, -3, 2};
    for (int d = 0; d < 4; ++d) CHECK(r.q_rope({0, 0, d}) == doctest::Approx(expected[d]).epsilon(1e-12));
  }
  SUBCASE("interleaved, position 1") {
    // pairs (x0, x1) = (1, 2) at 90: (-2, 1); (x2, x3) = (3, 4) at 45: (-1/sqrt2, 7/sqrt2).
    opt.interleave = true;
    const auto r = ref::apply_rope_pos_ids(x, x, {1}, opt);
    const double expected[] = {-2, 1, -1 / kSqrt2, 7 / kSqrt2};
    for (int d = 0; d < 4; ++d) CHECK(r.q_rope({0, 0, d}) == doctest::Approx(expected[d]).epsilon(1e-12));
  }
  SUBCASE("position 0 is the identity") {
    const auto r = ref::apply_rope_pos_ids(x, x, {0}, opt);
    CHECK(ref::max_abs_diff(r.q_rope, x) == 0.0);
  }
  SUBCASE("rotary_dim 2 of head_dim 4: one pair at theta_0 = 4^0 / (2/pi) = pi/2, the tail copied") {
    // pair (x0, x1) = (1, 2) at 90 (rotate-half with rotary_dim 2 pairs x0 with x1): (-2, 1).
    opt.rotary_dim = 2;
    const auto r = ref::apply_rope_pos_ids(x, x, {1}, opt);
    const double expected[] = {-2, 1, 3, 4};
    for (int d = 0; d < 4; ++d) CHECK(r.q_rope({0, 0, d}) == doctest::Approx(expected[d]).epsilon(1e-12));
  }
}

TEST_CASE("rope: apply_rope's positions are offsets[b] + (t - indptr[b])") {
  // indptr {0, 2, 5}, offsets {3, 0}: request 0 rows 0, 1 at 3, 4; request 1 rows 2..4 at 0, 1, 2.
  CHECK(ref::rope_positions({0, 2, 5}, {3, 0}) == std::vector<int64_t>{3, 4, 0, 1, 2});
  CHECK(ref::rope_positions({0, 0, 1}, {7, 9}) == std::vector<int64_t>{9});
  auto rng = test::case_rng("rope ragged");
  const Tensor q = test::random_tensor(rng, {5, 4, 8}), k = test::random_tensor(rng, {5, 2, 8});
  for (bool interleave : {false, true}) {
    ref::RopeOptions opt;
    opt.interleave = interleave;
    const auto a = ref::apply_rope(q, k, {0, 2, 5}, {3, 0}, opt);
    const auto b = ref::apply_rope_pos_ids(q, k, {3, 4, 0, 1, 2}, opt);
    CHECK(ref::max_abs_diff(a.q_rope, b.q_rope) == 0.0);
    CHECK(ref::max_abs_diff(a.k_rope, b.k_rope) == 0.0);
  }
}

TEST_CASE("rope: every pair keeps its length, and p then -p is the identity") {
  auto rng = test::case_rng("rope norms");
  const Tensor x = test::random_tensor(rng, {6, 3, 16});
  const std::vector<int64_t> positions{0, 1, 7, 100, 4095, 123456};
  std::vector<int64_t> negated;
  for (int64_t p : positions) negated.push_back(-p);
  for (bool interleave : {false, true})
    for (int64_t rotary_dim : {16, 10, 2}) {
      CAPTURE(interleave);
      CAPTURE(rotary_dim);
      const auto f = ref::rope_frequencies(rotary_dim, 1.0, 1e4);
      const Tensor y = ref::apply_rotary_embedding(x, positions, f, interleave);
      const int64_t half = rotary_dim / 2;
      for (int64_t t = 0; t < 6; ++t)
        for (int64_t h = 0; h < 3; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + half;
            CHECK(std::hypot(y({t, h, a}), y({t, h, b})) ==
                  doctest::Approx(std::hypot(x({t, h, a}), x({t, h, b}))).epsilon(1e-13));
          }
      const Tensor back = ref::apply_rotary_embedding(y, negated, f, interleave);
      CHECK(ref::max_abs_diff(back, x) < 1e-12);
      // The positions above move something: a rotation that did nothing would pass the two
      // checks before.
      if (rotary_dim == 16) CHECK(ref::max_abs_diff(y, x) > 0.1);
    }
}

TEST_CASE("rope: q.k after RoPE depends only on the position difference") {
  auto rng = test::case_rng("rope relative");
  const Tensor q = test::random_tensor(rng, {1, 1, 32}), k = test::random_tensor(rng, {1, 1, 32});
  const auto f = ref::rope_frequencies(32, 1.0, 1e4);
  for (bool interleave : {false, true}) {
    CAPTURE(interleave);
    auto score = [&](int64_t m, int64_t n) {
      return dot(ref::apply_rotary_embedding(q, {m}, f, interleave), 0, 0,
                 ref::apply_rotary_embedding(k, {n}, f, interleave), 0, 0);
    };
    // (m, n) and (m + s, n + s) give the same score, and equal q . R_(n-m) k.
    for (int64_t m : {0, 3, 50})
      for (int64_t n : {0, 1, 17, 2000}) {
        const double base = score(m, n);
        CHECK(dot(q, 0, 0, ref::apply_rotary_embedding(k, {n - m}, f, interleave), 0, 0) ==
              doctest::Approx(base).epsilon(1e-11));
        for (int64_t s : {1, 9, 1000, 65536}) CHECK(score(m + s, n + s) == doctest::Approx(base).epsilon(1e-11));
      }
    // A different offset gives a different score (the encoding is not trivial).
    CHECK(std::fabs(score(0, 1) - score(0, 2)) > 1e-6);
  }
}

TEST_CASE("rope: interleaved and rotate-half are one function up to a permutation of dims") {
  // Interleaved dims (2i, 2i+1) are rotate-half dims (i, i + r/2): with P moving rotate-half
  // dim i to 2i and i + r/2 to 2i + 1, interleaved(P x) = P rotate_half(x).
  auto rng = test::case_rng("rope permutation");
  const int64_t head_dim = 12, rotary_dim = 8, half = rotary_dim / 2;
  const Tensor x = test::random_tensor(rng, {4, 2, head_dim});
  std::vector<int64_t> perm(head_dim);  // perm[d]: where rotate-half dim d goes
  for (int64_t d = 0; d < head_dim; ++d) perm[d] = d >= rotary_dim ? d : d < half ? 2 * d : 2 * (d - half) + 1;
  auto permute = [&](const Tensor& t) {
    Tensor out(t.shape);
    for (int64_t r = 0; r < t.dim(0); ++r)
      for (int64_t h = 0; h < t.dim(1); ++h)
        for (int64_t d = 0; d < head_dim; ++d) out({r, h, perm[d]}) = t({r, h, d});
    return out;
  };
  ref::RopeOptions opt;
  opt.rotary_dim = rotary_dim;
  const std::vector<int32_t> pos{0, 5, 31, 1000};
  const Tensor rotate_half = ref::apply_rope_pos_ids(x, x, pos, opt).q_rope;
  opt.interleave = true;
  const Tensor interleaved = ref::apply_rope_pos_ids(permute(x), permute(x), pos, opt).q_rope;
  CHECK(ref::max_abs_diff(interleaved, permute(rotate_half)) < 1e-14);
  CHECK(ref::max_abs_diff(rotate_half, x) > 0.1);
}

TEST_CASE("rope: rotary_dim < head_dim rotates the leading dims as a head of rotary_dim would") {
  auto rng = test::case_rng("rope partial");
  const Tensor q = test::random_tensor(rng, {3, 2, 10}), k = test::random_tensor(rng, {3, 1, 10});
  for (bool interleave : {false, true}) {
    ref::RopeOptions opt;
    opt.rotary_dim = 6;
    opt.interleave = interleave;
    const auto r = ref::apply_rope(q, k, {0, 3}, {11}, opt);
    // The leading 6 dims alone, as a head of 6 (its frequencies use rotary_dim 6 either way).
    Tensor lead({3, 2, 6});
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 6; ++d) lead({t, h, d}) = q({t, h, d});
    ref::RopeOptions whole;
    whole.interleave = interleave;
    const Tensor lead_rope = ref::apply_rope(lead, lead, {0, 3}, {11}, whole).q_rope;
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t d = 0; d < 6; ++d) CHECK(r.q_rope({t, h, d}) == lead_rope({t, h, d}));
        for (int64_t d = 6; d < 10; ++d) CHECK(r.q_rope({t, h, d}) == q({t, h, d}));
      }
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t d = 6; d < 10; ++d) CHECK(r.k_rope({t, 0, d}) == k({t, 0, d}));
  }
}

TEST_CASE("rope: k with fewer heads is rotated like q, head by head") {
  auto rng = test::case_rng("rope gqa");
  const Tensor q = test::random_tensor(rng, {4, 4, 8});
  Tensor k({4, 1, 8});
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t d = 0; d < 8; ++d) k({t, 0, d}) = q({t, 2, d});
  const auto r = ref::apply_rope(q, k, {0, 1, 4}, {6, 2});
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t d = 0; d < 8; ++d) CHECK(r.k_rope({t, 0, d}) == r.q_rope({t, 2, d}));
}

TEST_CASE("rope: Llama 3.1 frequencies by hand") {
  // rotary_dim 8, theta 1e4: plain frequencies 1, 0.1, 0.01, 0.001 (wavelengths 2pi, 20pi,
  // 200pi, 2000pi). old_context_len 500pi, low 1, high 4: wavelengths below 500pi/4 = 125pi
  // are kept, above 500pi are divided by 8, and 200pi gets smooth = (500pi/200pi - 1)/(4 - 1)
  // = 0.5: 0.5 * 0.01 / 8 + 0.5 * 0.01 = 0.005625.
  ref::Llama31RopeOptions opt;
  opt.rope_theta = 1e4;
  opt.rope_scale = 8;
  opt.old_context_len = 500 * kPi;
  const auto f = ref::llama31_rope_frequencies(8, opt);
  const double expected[] = {1.0, 0.1, 0.005625, 0.000125};
  for (int i = 0; i < 4; ++i) CHECK(f[static_cast<size_t>(i)] == doctest::Approx(expected[i]).epsilon(1e-13));
}

TEST_CASE("rope: Llama 3.1 scaling is plain RoPE for high frequencies and divides low ones") {
  // With Llama 3.1's published values (scale 8, theta 5e5, factors 1 and 4, context 8192)
  // and head_dim 128: each frequency is either the plain one, the plain one / 8, or between.
  ref::Llama31RopeOptions llama;
  const auto scaled = ref::llama31_rope_frequencies(128, llama);
  const auto plain = ref::rope_frequencies(128, 1.0, llama.rope_theta);
  int kept = 0, divided = 0, between = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelength = 2 * kPi / plain[i];
    CAPTURE(i);
    if (wavelength < 8192.0 / 4) {
      CHECK(scaled[i] == plain[i]);
      ++kept;
    } else if (wavelength > 8192.0 / 1) {
      CHECK(scaled[i] == doctest::Approx(plain[i] / 8).epsilon(1e-15));
      ++divided;
    } else {
      CHECK(scaled[i] < plain[i]);
      CHECK(scaled[i] > plain[i] / 8);
      ++between;
    }
  }
  CHECK(kept > 0);
  CHECK(divided > 0);
  CHECK(between > 0);

  // On tensors: a context so long that every wavelength is short keeps plain RoPE; one so
  // short that every wavelength is long is plain RoPE with rope_scale = 8.
  auto rng = test::case_rng("rope llama31");
  const Tensor q = test::random_tensor(rng, {3, 2, 16}), k = test::random_tensor(rng, {3, 1, 16});
  const std::vector<int32_t> pos{0, 9, 77777};
  for (bool interleave : {false, true}) {
    ref::Llama31RopeOptions l;
    l.interleave = interleave;
    ref::RopeOptions p;
    p.interleave = interleave;
    p.rope_theta = l.rope_theta;
    l.old_context_len = 1e12;
    auto a = ref::apply_llama31_rope_pos_ids(q, k, pos, l);
    auto b = ref::apply_rope_pos_ids(q, k, pos, p);
    CHECK(ref::max_abs_diff(a.q_rope, b.q_rope) < 1e-9);
    CHECK(ref::max_abs_diff(a.k_rope, b.k_rope) < 1e-9);
    l.old_context_len = 1e-3;
    p.rope_scale = 8;
    a = ref::apply_llama31_rope(q, k, {0, 1, 3}, {0, 8}, l);
    b = ref::apply_rope(q, k, {0, 1, 3}, {0, 8}, p);
    CHECK(ref::max_abs_diff(a.q_rope, b.q_rope) < 1e-9);
    CHECK(ref::max_abs_diff(a.k_rope, b.k_rope) < 1e-9);
  }
}

TEST_CASE("rope: bad arguments are named") {
  using test::expect_error;
  const Tensor q({3, 2, 8}, 0.5), k({3, 1, 8}, 0.25);
  const std::vector<int32_t> indptr{0, 1, 3}, offsets{0, 4}, pos{0, 1, 2};
  ref::RopeOptions opt;
  auto rope = [&](const ref::RopeOptions& o) { ref::apply_rope(q, k, indptr, offsets, o); };

  opt.rotary_dim = 5;
  expect_error([&] { rope(opt); }, {"apply_rope", "rotary_dim", "even"});
  opt.rotary_dim = 0;
  expect_error([&] { rope(opt); }, {"apply_rope", "rotary_dim"});
  opt.rotary_dim = 10;
  expect_error([&] { rope(opt); }, {"apply_rope", "rotary_dim (10)", "head_dim (8)"});
  opt = {};
  opt.rope_theta = 0;
  expect_error([&] { rope(opt); }, {"apply_rope", "rope_theta", "positive"});
  opt.rope_theta = -1e4;
  expect_error([&] { ref::apply_rope_pos_ids(q, k, pos, opt); }, {"apply_rope_pos_ids", "rope_theta"});
  opt = {};
  opt.rope_scale = std::nan("");
  expect_error([&] { rope(opt); }, {"apply_rope", "rope_scale"});

  expect_error([&] { ref::apply_rope(q, Tensor({2, 1, 8}), indptr, offsets); }, {"apply_rope", "k", "nnz"});
  expect_error([&] { ref::apply_rope(q, Tensor({3, 1, 6}), indptr, offsets); }, {"apply_rope", "k", "head_dim"});
  expect_error([&] { ref::apply_rope(Tensor({3, 8}), k, indptr, offsets); }, {"apply_rope", "q", "rank 3"});
  expect_error(
      [&] {
        ref::apply_rope(Tensor({3, 2, 3}), Tensor({3, 1, 3}), indptr, offsets);
      },
      {"apply_rope", "rotary_dim", "even"});
  Tensor bad = q;
  bad.data[5] = std::nan("");
  expect_error([&] { ref::apply_rope(bad, k, indptr, offsets); }, {"apply_rope", "q", "finite"});

  expect_error([&] { ref::apply_rope(q, k, {0, 2, 1}, offsets); }, {"apply_rope", "indptr", "non-decreasing"});
  expect_error([&] { ref::apply_rope(q, k, {1, 2, 3}, offsets); }, {"apply_rope", "indptr[0]"});
  expect_error([&] { ref::apply_rope(q, k, {0, 1, 2}, offsets); }, {"apply_rope", "indptr", "end"});
  expect_error([&] { ref::apply_rope(q, k, indptr, {0}); }, {"apply_rope", "offsets", "length"});
  expect_error([&] { ref::apply_rope(q, k, indptr, {0, -1}); }, {"apply_rope", "offsets[1]", ">= 0"});
  expect_error([&] { ref::rope_positions({0, 2}, {}); }, {"rope_positions", "offsets"});

  expect_error([&] { ref::apply_rope_pos_ids(q, k, {0, 1}); }, {"apply_rope_pos_ids", "pos_ids", "nnz = 3"});
  expect_error([&] { ref::apply_rope_pos_ids(q, k, {0, -2, 1}); }, {"apply_rope_pos_ids", "pos_ids[1]"});

  ref::Llama31RopeOptions l;
  l.high_freq_factor = 1;
  expect_error([&] { ref::apply_llama31_rope(q, k, indptr, offsets, l); },
               {"apply_llama31_rope", "high_freq_factor", "low_freq_factor"});
  l = {};
  l.old_context_len = 0;
  expect_error([&] { ref::apply_llama31_rope_pos_ids(q, k, pos, l); },
               {"apply_llama31_rope_pos_ids", "old_context_len"});
  l = {};
  l.low_freq_factor = -1;
  expect_error([&] { ref::llama31_rope_frequencies(8, l); }, {"llama31_rope_frequencies", "low_freq_factor"});

  expect_error([&] { ref::rope_frequencies(7, 1, 1e4); }, {"rope_frequencies", "rotary_dim"});
  expect_error(
      [&] {
        ref::apply_rotary_embedding(q, {0, 1}, {1.0}, false);
      },
      {"apply_rotary_embedding", "positions", "nnz = 3"});
  expect_error(
      [&] {
        ref::apply_rotary_embedding(q, {0, 1, 2}, std::vector<double>(5, 1.0), false);
      },
      {"apply_rotary_embedding", "frequencies"});
  expect_error(
      [&] {
        ref::apply_rotary_embedding(q, {0, 1, 2}, {}, false);
      },
      {"apply_rotary_embedding", "frequencies"});
}
