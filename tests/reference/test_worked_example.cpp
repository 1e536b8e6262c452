// The worked example of docs/concepts/01_sequence_and_attention.md (and of the tour):
// d_model 2, one head, sm_scale 1, pages P0..P4. The expected numbers are worked out by
// hand from the chapter's vectors, not computed by the code under test.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>

using flashstep::ref::AttentionOptions;
using flashstep::ref::KVLayout;
using flashstep::ref::Tensor;

namespace {

// K and V of "The", "cat", "sat", "ran", "fast" (P0..P4 of the course).
const double kK[5][2] = {{1, 0}, {0, 1}, {1, 1}, {1, -1}, {0, -1}};
const double kV[5][2] = {{1, 1}, {2, 0}, {0, 1}, {1, 0}, {0, 1}};

Tensor rows(const double (*src)[2], std::initializer_list<int> tokens) {
  Tensor t({static_cast<int64_t>(tokens.size()), 1, 2});
  int64_t j = 0;
  for (int tok : tokens) {
    t({j, 0, 0}) = src[tok][0];
    t({j, 0, 1}) = src[tok][1];
    ++j;
  }
  return t;
}

AttentionOptions example_options() {
  AttentionOptions opt;
  opt.sm_scale = 1.0;  // the course leaves out 1/sqrt(d)
  opt.causal = true;
  return opt;
}

}  // namespace

TEST_CASE("worked example: row \"A, pos 2\" gives softmax [0.21, 0.21, 0.58] and output [0.63, 0.79]") {
  const auto r = flashstep::ref::single_decode_with_kv_cache(Tensor({1, 2}, {1, 1}), rows(kK, {0, 1, 2}),
                                                             rows(kV, {0, 1, 2}), example_options());
  // The course rounds the weights to two decimals before multiplying:
  // 0.21*[1,1] + 0.21*[2,0] + 0.58*[0,1] = [0.63, 0.79]. Exactly, o = [0.6358, 0.7884].
  const double s0 = std::exp(1.0), z0 = 2 * s0 + s0 * s0;
  const double w[3] = {std::round(100 * s0 / z0) / 100, std::round(100 * s0 / z0) / 100,
                       std::round(100 * s0 * s0 / z0) / 100};
  CHECK(w[0] == 0.21);
  CHECK(w[2] == 0.58);
  CHECK(w[0] * 1 + w[1] * 2 + w[2] * 0 == doctest::Approx(0.63).epsilon(1e-12));
  CHECK(w[0] * 1 + w[1] * 0 + w[2] * 1 == doctest::Approx(0.79).epsilon(1e-12));
  CHECK(std::abs(r.o({0, 0}) - 0.63) < 0.01);
  CHECK(std::abs(r.o({0, 1}) - 0.79) < 0.01);
  // Exact values: p = (e, e, e^2) / (2e + e^2); o = (p0 + 2 p1, p0 + p2); lse = log(2e + e^2).
  const double e = std::exp(1.0), z = 2 * e + e * e;
  CHECK(r.o({0, 0}) == doctest::Approx(3 * e / z).epsilon(1e-14));
  CHECK(r.o({0, 1}) == doctest::Approx((e + e * e) / z).epsilon(1e-14));
  CHECK(r.lse({0}) == doctest::Approx(std::log(z)).epsilon(1e-14));
  // And the softmax itself, via the score matrix: [0.21, 0.21, 0.58].
  const Tensor s = flashstep::ref::attention_scores(Tensor({1, 1, 2}, {1, 1}), rows(kK, {0, 1, 2}), 0,
                                                    example_options());
  const double p2 = std::exp(s({0, 2})) / (std::exp(s({0, 0})) + std::exp(s({0, 1})) + std::exp(s({0, 2})));
  CHECK(p2 == doctest::Approx(0.58).epsilon(0.01));
}

TEST_CASE("worked example: Br=3 score matrix has -inf above the diagonal") {
  // A's queries at pos 0, 1, 2 chosen so the visible scores match the course's table.
  const Tensor q({3, 1, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor s = flashstep::ref::attention_scores(q, rows(kK, {0, 1, 2}), 0, example_options());
  const double inf = INFINITY;
  const double expected[3][3] = {{1, -inf, -inf}, {0, 1, -inf}, {1, 1, 2}};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(s({i, j}) == expected[i][j]);
    }
}

TEST_CASE("worked example: Bc=2 repacking gives the same outputs as Bc=1, for every row of A and B") {
  // Bc = 1: every token its own page, pages P0..P4 as in the course, P0/P1 shared.
  flashstep::ref::PagedKVCache bc1;
  bc1.pages = Tensor({5, 2, 1, 1, 2});
  for (int p = 0; p < 5; ++p)
    for (int d = 0; d < 2; ++d) {
      bc1.pages({p, 0, 0, 0, d}) = kK[p][d];
      bc1.pages({p, 1, 0, 0, d}) = kV[p][d];
    }
  bc1.kv_indptr = {0, 3, 7};
  bc1.kv_indices = {0, 1, 2, 0, 1, 3, 4};  // A: P0 P1 P2, B: P0 P1 P3 P4
  bc1.kv_last_page_len = {1, 1};

  // Bc = 2: P0 = (The, cat) shared, P1 = (sat), P2 = (ran, fast).
  flashstep::ref::PagedKVCache bc2;
  bc2.pages = Tensor({3, 2, 2, 1, 2});
  const int packed[3][2] = {{0, 1}, {2, -1}, {3, 4}};
  for (int p = 0; p < 3; ++p)
    for (int slot = 0; slot < 2; ++slot) {
      const int tok = packed[p][slot];
      if (tok < 0) continue;  // P1's second slot is unused (last_page_len 1)
      for (int d = 0; d < 2; ++d) {
        bc2.pages({p, 0, slot, 0, d}) = kK[tok][d];
        bc2.pages({p, 1, slot, 0, d}) = kV[tok][d];
      }
    }
  bc2.kv_indptr = {0, 2, 4};
  bc2.kv_indices = {0, 1, 0, 2};
  bc2.kv_last_page_len = {1, 2};

  // Queries for A pos 0..2 and B pos 0..3 (packed ragged, qo_indptr [0, 3, 7]).
  const Tensor q({7, 1, 2}, {1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, -1, 0, -1});
  const auto r1 = flashstep::ref::batch_prefill_with_paged_kv_cache(q, {0, 3, 7}, bc1, example_options());
  const auto r2 = flashstep::ref::batch_prefill_with_paged_kv_cache(q, {0, 3, 7}, bc2, example_options());
  for (size_t i = 0; i < r1.o.data.size(); ++i) CHECK(r2.o.data[i] == doctest::Approx(r1.o.data[i]).epsilon(1e-14));
  for (size_t i = 0; i < r1.lse.data.size(); ++i)
    CHECK(r2.lse.data[i] == doctest::Approx(r1.lse.data[i]).epsilon(1e-14));
  // And row "A, pos 2" is the course's [0.63, 0.79] through both layouts.
  CHECK(r2.o({2, 0, 0}) == doctest::Approx(0.63).epsilon(0.01));
  CHECK(r2.o({2, 0, 1}) == doctest::Approx(0.79).epsilon(0.01));
  // Row "A, pos 0" sees only "The": output is exactly V("The") = [1, 1].
  CHECK(r2.o({0, 0, 0}) == doctest::Approx(1.0));
  CHECK(r2.o({0, 0, 1}) == doctest::Approx(1.0));
}
