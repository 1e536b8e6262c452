// The merge operator: split the keys anywhere, attend each part, merge -> the unsplit
// result; associativity, commutativity, the empty state as identity.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>

#include "support/random.hpp"

using namespace flashstep;
using ref::Tensor;

namespace {

Tensor rows(const Tensor& t, int64_t begin, int64_t end) {
  const int64_t row = t.dim(1) * t.dim(2);
  return Tensor({end - begin, t.dim(1), t.dim(2)},
                std::vector<double>(t.data.begin() + begin * row, t.data.begin() + end * row));
}

/// Stacks per-part states (each o (n, H, D), lse (n, H)) into merge_states' layout.
void stack(const std::vector<ref::AttentionResult>& parts, Tensor& v, Tensor& s) {
  const int64_t n = parts[0].o.dim(0), h = parts[0].o.dim(1), d = parts[0].o.dim(2);
  const int64_t k = static_cast<int64_t>(parts.size());
  v = Tensor({n, k, h, d});
  s = Tensor({n, k, h});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t hh = 0; hh < h; ++hh) {
        s({i, p, hh}) = parts[static_cast<size_t>(p)].lse({i, hh});
        for (int64_t x = 0; x < d; ++x) v({i, p, hh, x}) = parts[static_cast<size_t>(p)].o({i, hh, x});
      }
}

}  // namespace

TEST_CASE("split the keys anywhere, attend each chunk, merge: the unsplit result") {
  auto rng = test::case_rng("split-merge");
  CAPTURE(test::run_seed());
  for (int trial = 0; trial < 30; ++trial) {
    const int64_t kv_len = test::random_int(rng, 1, 60), qo = test::random_int(rng, 1, 4), d = 8, h = 3;
    const Tensor q = test::random_tensor(rng, {qo, h, d}, -3, 3);
    const Tensor k = test::random_tensor(rng, {kv_len, h, d}, -3, 3);
    const Tensor v = test::random_tensor(rng, {kv_len, h, d});
    const auto whole = ref::single_prefill_with_kv_cache(q, k, v);
    // Random cut points, including empty chunks (cut twice at the same place).
    std::vector<int64_t> cuts{0, kv_len};
    for (int c = 0; c < test::random_int(rng, 0, 5); ++c) cuts.push_back(test::random_int(rng, 0, kv_len));
    std::sort(cuts.begin(), cuts.end());
    std::vector<ref::AttentionResult> parts;
    for (size_t c = 0; c + 1 < cuts.size(); ++c)
      parts.push_back(
          ref::single_prefill_with_kv_cache(q, rows(k, cuts[c], cuts[c + 1]), rows(v, cuts[c], cuts[c + 1])));
    Tensor vs, ss;
    stack(parts, vs, ss);
    const auto merged = ref::merge_states(vs, ss);
    CAPTURE(trial);
    CHECK(test::max_abs_diff(merged.v, whole.o) < 1e-12);
    CHECK(test::max_abs_diff(merged.s, whole.lse) < 1e-12);
    // Pairwise, left to right, gives the same.
    auto acc = ref::MergedState{parts[0].o, parts[0].lse};
    for (size_t p = 1; p < parts.size(); ++p) acc = ref::merge_state(acc.v, acc.s, parts[p].o, parts[p].lse);
    CHECK(test::max_abs_diff(acc.v, whole.o) < 1e-12);
    CHECK(test::max_abs_diff(acc.s, whole.lse) < 1e-12);
  }
}

TEST_CASE("merge_state is commutative and associative, and the empty state is its identity") {
  auto rng = test::case_rng("merge-algebra");
  CAPTURE(test::run_seed());
  const int64_t n = 5, h = 2, d = 6;
  auto state = [&] {
    return ref::MergedState{test::random_tensor(rng, {n, h, d}), test::random_tensor(rng, {n, h}, -5, 5)};
  };
  const auto a = state(), b = state(), c = state();
  const auto ab = ref::merge_state(a.v, a.s, b.v, b.s), ba = ref::merge_state(b.v, b.s, a.v, a.s);
  CHECK(test::max_abs_diff(ab.v, ba.v) < 1e-14);
  CHECK(test::max_abs_diff(ab.s, ba.s) < 1e-14);
  const auto ab_c = ref::merge_state(ab.v, ab.s, c.v, c.s);
  const auto bc = ref::merge_state(b.v, b.s, c.v, c.s);
  const auto a_bc = ref::merge_state(a.v, a.s, bc.v, bc.s);
  CHECK(test::max_abs_diff(ab_c.v, a_bc.v) < 1e-13);
  CHECK(test::max_abs_diff(ab_c.s, a_bc.s) < 1e-13);
  // Identity: (0, -inf) changes nothing, even at extreme LSEs.
  Tensor empty_v({n, h, d}), empty_s({n, h}, -INFINITY);
  const auto ae = ref::merge_state(a.v, a.s, empty_v, empty_s);
  CHECK(ae.v.data == a.v.data);
  CHECK(ae.s.data == a.s.data);
  const auto ee = ref::merge_state(empty_v, empty_s, empty_v, empty_s);
  for (double x : ee.s.data) CHECK(x == -INFINITY);
  for (double x : ee.v.data) CHECK(x == 0.0);
  // No overflow with LSEs far from 0.
  Tensor big_s({n, h}, 800.0), v1({n, h, d}, 1.0), v3({n, h, d}, 3.0);
  const auto big = ref::merge_state(v1, big_s, v3, big_s);
  for (double x : big.v.data) CHECK(x == doctest::Approx(2.0));
  for (double x : big.s.data) CHECK(x == doctest::Approx(800.0 + std::log(2.0)));
}
