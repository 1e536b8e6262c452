// Cascade levels (FlashInfer's MultiLevelCascadeAttentionWrapper layout): a hand-built
// 3-level example, the course's shared-prefix example as a decode/append step, and random
// trees of 1..3 levels (empty shared prefixes included) whose merged result must equal flat
// attention over the whole page table.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <flashstep/reference.hpp>
#include <limits>
#include <numeric>

#include "support/random.hpp"

using flashstep::ref::AttentionOptions;
using flashstep::ref::build_cascade_levels;
using flashstep::ref::cascade_attention;
using flashstep::ref::derive_cascade_level_ends;
using flashstep::ref::InvalidArgument;
using flashstep::ref::KVLayout;
using flashstep::ref::PagedKVCache;
using flashstep::ref::Tensor;
using flashstep::test::case_rng;
using flashstep::test::random_int;

namespace {

// Merged levels against flat attention: same double arithmetic, merged in another order.
constexpr double kTol = 1e-12;

}  // namespace

TEST_CASE("cascade: three levels for R0 = P0 P1 P2, R1 = P0 P1 P3 P4, R2 = P0 P5") {
  const std::vector<int32_t> qo_indptr = {0, 1, 3, 4};  // decode, append 2, decode
  const std::vector<int32_t> kv_indptr = {0, 3, 7, 9}, kv_indices = {0, 1, 2, 0, 1, 3, 4, 0, 5};
  const std::vector<int32_t> last = {1, 1, 1};
  const std::vector<std::vector<int32_t>> ends = {{1, 1, 1}, {2, 2, 1}};
  const auto c = build_cascade_levels(qo_indptr, kv_indptr, kv_indices, last, 1, ends, true);
  REQUIRE(c.levels.size() == 3);
  const auto& l0 = c.levels[0];
  CHECK(l0.qo_indptr == std::vector<int32_t>{0, 4});  // the whole batch is one row block
  CHECK(l0.kv_indptr == std::vector<int32_t>{0, 1});
  CHECK(l0.kv_indices == std::vector<int32_t>{0});
  CHECK(l0.kv_last_page_len == std::vector<int32_t>{1});
  CHECK(l0.request_indptr == std::vector<int32_t>{0, 3});
  CHECK_FALSE(l0.causal);
  const auto& l1 = c.levels[1];
  CHECK(l1.qo_indptr == std::vector<int32_t>{0, 3, 4});  // {R0, R1} and {R2}
  CHECK(l1.kv_indptr == std::vector<int32_t>{0, 1, 1});
  CHECK(l1.kv_indices == std::vector<int32_t>{1});
  CHECK(l1.kv_last_page_len == std::vector<int32_t>{1, 0});  // R2 shares nothing here
  CHECK(l1.request_indptr == std::vector<int32_t>{0, 2, 3});
  const auto& l2 = c.levels[2];
  CHECK(l2.qo_indptr == qo_indptr);
  CHECK(l2.kv_indptr == std::vector<int32_t>{0, 1, 3, 4});
  CHECK(l2.kv_indices == std::vector<int32_t>{2, 3, 4, 5});
  CHECK(l2.kv_last_page_len == std::vector<int32_t>{1, 1, 1});
  CHECK(l2.causal);
  // Deriving the ends from the shared page ids finds the same tree.
  CHECK(derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, 1, 3, true) == ends);
  // With two levels, the only level-0 group is everyone sharing P0.
  CHECK(derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, 1, 2, true) ==
        std::vector<std::vector<int32_t>>{{1, 1, 1}});
}

TEST_CASE("cascade: the course's shared prefix as a decode/append step, merged == flat, drawn") {
  // A = "The cat sat" decodes at pos 2; B = "The cat ran fast" appends pos 2 and 3.
  const double kK[5][2] = {{1, 0}, {0, 1}, {1, 1}, {1, -1}, {0, -1}};
  const double kV[5][2] = {{1, 1}, {2, 0}, {0, 1}, {1, 0}, {0, 1}};
  Tensor pool({5, 2, 1, 1, 2});
  for (int p = 0; p < 5; ++p)
    for (int d = 0; d < 2; ++d) {
      pool({p, 0, 0, 0, d}) = kK[p][d];
      pool({p, 1, 0, 0, d}) = kV[p][d];
    }
  const std::vector<int32_t> qo_indptr = {0, 1, 3}, kv_indptr = {0, 3, 7}, kv_indices = {0, 1, 2, 0, 1, 3, 4};
  const std::vector<int32_t> last = {1, 1};
  const auto ends = derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, 1, 2, true);
  CHECK(ends == std::vector<std::vector<int32_t>>{{2, 2}});  // "The cat" shared
  const auto c = build_cascade_levels(qo_indptr, kv_indptr, kv_indices, last, 1, ends, true);
  const Tensor q({3, 1, 2}, {1, 1, 1, -1, 0, -1});
  AttentionOptions opt;
  opt.causal = true;
  opt.sm_scale = 1.0;
  const auto r = cascade_attention(q, c, pool, KVLayout::NHD, opt);
  PagedKVCache flat;
  flat.pages = pool;
  flat.kv_indptr = kv_indptr;
  flat.kv_indices = kv_indices;
  flat.kv_last_page_len = last;
  const auto want = flashstep::ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, flat, opt);
  CHECK(flashstep::test::max_abs_diff(r.o, want.o) <= kTol);
  CHECK(flashstep::test::max_abs_diff(r.lse, want.lse) <= kTol);
  // "A, pos 2" is still the course's [0.63, 0.79], now as shared + unique merged.
  CHECK(r.o({0, 0, 0}) == doctest::Approx(0.63).epsilon(0.01));
  CHECK(r.o({0, 0, 1}) == doctest::Approx(0.79).epsilon(0.01));
  REQUIRE(r.level.size() == 2);
  flashstep::ref::BlockSparseDrawOptions draw;
  draw.page_labels = {"The", "cat", "sat", "ran", "fast"};
  CHECK(flashstep::ref::draw_cascade(c, draw) ==
        "level 0 (shared pages, one row block per group, not masked):\n"
        "               P0     P1\n"
        "             (The)  (cat)\n"
        "            ┌──────┬──────┐\n"
        "A, pos 2    │      │      │\n"
        "B, pos 2    │  P0  │  P1  │\n"
        "B, pos 3    │      │      │\n"
        "            └──────┴──────┘\n"
        "level 1 (each request's own pages, Br = 1, causal):\n"
        "               P2     P3     P4\n"
        "             (sat)  (ran)  (fast)\n"
        "            ┌──────┬──────┬──────┐\n"
        "A, pos 2    │  P2  │      │      │\n"
        "            ├──────┼──────┼──────┤\n"
        "B, pos 2    │      │  P3  │      │\n"
        "            ├──────┼──────┼──────┤\n"
        "B, pos 3    │      │  P3  │  P4  │\n"
        "            └──────┴──────┴──────┘\n");
}

TEST_CASE("cascade: the course's prefill version is rejected with causal (queries inside the prefix)") {
  // Prefill of all 7 tokens: "A, pos 0" would see "cat" through an unmasked shared level.
  const std::vector<int32_t> qo_indptr = {0, 3, 7}, kv_indptr = {0, 3, 7}, kv_indices = {0, 1, 2, 0, 1, 3, 4};
  CHECK_THROWS_WITH_AS(build_cascade_levels(qo_indptr, kv_indptr, kv_indices, {1, 1}, 1, {{2, 2}}, true),
                       doctest::Contains("request 0 has 3 queries but only 1 keys in its last level"), InvalidArgument);
  // Derived with causal, nothing may be shared: the cascade degenerates to flat attention.
  CHECK(derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, {1, 1}, 1, 2, true) ==
        std::vector<std::vector<int32_t>>{{0, 0}});
  // Without causal, sharing the prefix is exact.
  CHECK(derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, {1, 1}, 1, 2, false) ==
        std::vector<std::vector<int32_t>>{{2, 2}});
}

TEST_CASE("cascade: random trees of 1..3 levels, merged level by level == flat attention") {
  auto rng = case_rng("cascade: random trees");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int empty_prefixes = 0, cases = 0, derived_shares = 0;
  for (int trial = 0; trial < 36; ++trial) {
    const int64_t num_levels = 1 + trial % 3;
    const int64_t page_size = 1 + random_int(rng, 0, 3);
    const int64_t num_kv_heads = random_int(rng, 1, 2), group = random_int(rng, 1, 3), head_dim = random_int(rng, 1, 4);
    const KVLayout layout = trial % 2 ? KVLayout::HND : KVLayout::NHD;
    CAPTURE(trial);
    CAPTURE(num_levels);
    CAPTURE(page_size);
    // Page ids handed out from a shuffled pool, so that shared and private pages interleave.
    std::vector<int32_t> ids(200);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next_id = 0;
    auto take = [&](int64_t n) {
      std::vector<int32_t> v(ids.begin() + static_cast<long>(next_id), ids.begin() + static_cast<long>(next_id + n));
      next_id += static_cast<size_t>(n);
      return v;
    };
    // The tree: per request, its shared segments (one per shared level) and its suffix.
    struct Request {
      std::vector<std::vector<int32_t>> shared;
      std::vector<int32_t> suffix;
      int64_t suffix_len, qo_len;
    };
    std::vector<Request> reqs;
    std::vector<std::vector<int32_t>> path(static_cast<size_t>(num_levels - 1));
    std::function<void(int64_t)> grow = [&](int64_t level) {
      if (level == num_levels - 1) {
        for (int64_t n = random_int(rng, 1, 3); n > 0; --n) {
          Request r;
          r.shared = path;
          r.qo_len = random_int(rng, 0, 3);
          r.suffix_len = r.qo_len + random_int(rng, 0, 2 * page_size);
          r.suffix = take((r.suffix_len + page_size - 1) / page_size);
          reqs.push_back(r);
        }
        return;
      }
      for (int64_t g = random_int(rng, 1, 2); g > 0; --g) {
        const int64_t pages = random_int(rng, 0, 2);  // 0: an empty shared prefix
        empty_prefixes += pages == 0;
        path[static_cast<size_t>(level)] = take(pages);
        grow(level + 1);
      }
    };
    grow(0);
    // Flat page table and level ends.
    std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last;
    std::vector<std::vector<int32_t>> ends(static_cast<size_t>(num_levels - 1));
    for (const Request& r : reqs) {
      int64_t shared_pages = 0;
      for (size_t l = 0; l < r.shared.size(); ++l) {
        kv_indices.insert(kv_indices.end(), r.shared[l].begin(), r.shared[l].end());
        shared_pages += static_cast<int64_t>(r.shared[l].size());
        ends[l].push_back(static_cast<int32_t>(shared_pages));
      }
      kv_indices.insert(kv_indices.end(), r.suffix.begin(), r.suffix.end());
      kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
      qo_indptr.push_back(static_cast<int32_t>(qo_indptr.back() + r.qo_len));
      const int64_t total_pages = shared_pages + static_cast<int64_t>(r.suffix.size());
      const int64_t kv_len = shared_pages * page_size + r.suffix_len;
      last.push_back(static_cast<int32_t>(total_pages == 0 ? 0 : kv_len - (total_pages - 1) * page_size));
    }
    // NaN-poisoned pool; only slots that hold a token get values.
    const int64_t num_pages = static_cast<int64_t>(ids.size());
    Tensor pool = layout == KVLayout::NHD ? Tensor({num_pages, 2, page_size, num_kv_heads, head_dim}, nan)
                                          : Tensor({num_pages, 2, num_kv_heads, page_size, head_dim}, nan);
    PagedKVCache flat;
    flat.layout = layout;
    flat.kv_indptr = kv_indptr;
    flat.kv_indices = kv_indices;
    flat.kv_last_page_len = last;
    flat.pages = std::move(pool);
    for (size_t r = 0; r < reqs.size(); ++r)
      for (int64_t t = 0; t < flat.kv_len(static_cast<int64_t>(r)); ++t)
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t h = 0; h < num_kv_heads; ++h)
            for (int64_t d = 0; d < head_dim; ++d)
              flat.at(kv_indices[static_cast<size_t>(kv_indptr[r] + t / page_size)], kv, t % page_size, h,
                      d) = std::uniform_real_distribution<double>(-2, 2)(rng);
    const Tensor q = flashstep::test::random_tensor(rng, {qo_indptr.back(), num_kv_heads * group, head_dim}, -2, 2);
    for (bool causal : {true, false}) {
      CAPTURE(causal);
      AttentionOptions opt;
      opt.causal = causal;
      opt.logits_soft_cap = trial % 4 == 0 ? 2.0 : 0.0;
      const auto want = flashstep::ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, flat, opt);
      const auto derived = derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, page_size, num_levels,
                                                     causal);
      for (const auto& level_ends : {ends, derived}) {  // given explicitly, and found from page ids
        const auto c = build_cascade_levels(qo_indptr, kv_indptr, kv_indices, last, page_size, level_ends, causal);
        REQUIRE(static_cast<int64_t>(c.levels.size()) == num_levels);
        if (level_ends == derived)
          for (size_t l = 0; l + 1 < c.levels.size(); ++l) derived_shares += !c.levels[l].kv_indices.empty();
        const auto got = cascade_attention(q, c, flat.pages, layout, opt);
        CHECK(flashstep::test::max_abs_diff(got.o, want.o) <= kTol);
        CHECK(flashstep::test::max_abs_diff(got.lse, want.lse) <= kTol);
        ++cases;
      }
    }
  }
  CHECK(empty_prefixes > 0);
  CHECK(derived_shares > 0);  // the derivation found shared pages, not only flat tables
  CHECK(cases == 36 * 2 * 2);
}

TEST_CASE("cascade: levels taken from the radix cache's shared pages") {
  // A system prompt S (3 pages of 2 tokens) shared by three requests; r0 and r1 also share
  // their next page. Each request matches the cache, allocates the rest and inserts, as
  // an engine does; the decode batch's page tables then share page ids exactly where the
  // radix tree shares nodes, and the derived levels follow the tree.
  auto rng = case_rng("cascade: from the radix cache");
  const int64_t page_size = 2;
  flashstep::ref::PageAllocator alloc(64, page_size);
  flashstep::ref::RadixCache cache(alloc);
  const std::vector<int32_t> S = {90, 91, 92, 93, 94, 95};
  std::vector<std::vector<int32_t>> requests = {{1, 2, 3, 4}, {1, 2, 5, 6, 7}, {8, 9, 10}};
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last;
  for (auto& tail : requests) {
    std::vector<int32_t> tokens = S;
    tokens.insert(tokens.end(), tail.begin(), tail.end());
    const auto m = cache.match_prefix(tokens);
    auto pages = m.pages;
    const int64_t total = (static_cast<int64_t>(tokens.size()) + page_size - 1) / page_size;
    const auto fresh = alloc.allocate(total - static_cast<int64_t>(pages.size()));
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    cache.insert(tokens, pages);
    kv_indices.insert(kv_indices.end(), pages.begin(), pages.end());
    kv_indptr.push_back(static_cast<int32_t>(kv_indices.size()));
    last.push_back(static_cast<int32_t>(tokens.size() - (pages.size() - 1) * page_size));
    qo_indptr.push_back(qo_indptr.back() + 1);  // one decode query each
  }
  const auto ends = derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, page_size, 3, true);
  CHECK(ends == std::vector<std::vector<int32_t>>{{3, 3, 3}, {4, 4, 3}});
  const auto c = build_cascade_levels(qo_indptr, kv_indptr, kv_indices, last, page_size, ends, true);
  CHECK(c.levels[0].kv_indices.size() == 3);  // S, read once for the whole batch
  CHECK(c.levels[1].request_indptr == std::vector<int32_t>{0, 2, 3});
  PagedKVCache flat;
  flat.pages = flashstep::test::random_tensor(rng, {64, 2, page_size, 2, 4});
  flat.kv_indptr = kv_indptr;
  flat.kv_indices = kv_indices;
  flat.kv_last_page_len = last;
  const Tensor q = flashstep::test::random_tensor(rng, {3, 4, 4});
  AttentionOptions opt;
  opt.causal = true;
  const auto got = cascade_attention(q, c, flat.pages, KVLayout::NHD, opt);
  const auto want = flashstep::ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, flat, opt);
  CHECK(flashstep::test::max_abs_diff(got.o, want.o) <= kTol);
  CHECK(flashstep::test::max_abs_diff(got.lse, want.lse) <= kTol);
}

TEST_CASE("cascade: bad arguments are InvalidArgument") {
  const std::vector<int32_t> qo = {0, 1, 2}, kv_indptr = {0, 2, 4}, kv_indices = {0, 1, 0, 2}, last = {1, 2};
  // page_size 2: R0 = P0 (full) + P1 (1 token), R1 = P0 + P2 (full).
  CHECK_THROWS_WITH_AS(build_cascade_levels(qo, kv_indptr, kv_indices, last, 2, {{2, 1}}, true),
                       doctest::Contains("exceeds request 0's 1 full pages"), InvalidArgument);
  CHECK_THROWS_WITH_AS(build_cascade_levels(qo, kv_indptr, kv_indices, last, 2, {{1}}, true),
                       doctest::Contains("one entry per request"), InvalidArgument);
  CHECK_THROWS_WITH_AS(build_cascade_levels(qo, kv_indptr, kv_indices, last, 2, {{1, 1}, {0, 1}}, true),
                       doctest::Contains("must not be below the previous level's end"), InvalidArgument);
  CHECK_THROWS_AS(build_cascade_levels(qo, kv_indptr, kv_indices, {1, 3}, 2, {}, true), InvalidArgument);
  CHECK_THROWS_AS(derive_cascade_level_ends(qo, kv_indptr, kv_indices, last, 2, 0, true), InvalidArgument);
  const auto c = build_cascade_levels(qo, kv_indptr, kv_indices, last, 2, {{1, 1}}, true);
  CHECK(c.levels[0].kv_indices == std::vector<int32_t>{0});
  const Tensor pool({3, 2, 2, 1, 1}, 0.5);
  const Tensor q({2, 1, 1}, 1.0);
  AttentionOptions opt;
  opt.causal = true;
  opt.window_left = 2;
  CHECK_THROWS_WITH_AS(cascade_attention(q, c, pool, KVLayout::NHD, opt), doctest::Contains("window_left must be -1"),
                       InvalidArgument);
  opt.window_left = -1;
  opt.causal = false;
  CHECK_THROWS_WITH_AS(cascade_attention(q, c, pool, KVLayout::NHD, opt), doctest::Contains("opt.causal"),
                       InvalidArgument);
  opt.causal = true;
  CHECK_THROWS_WITH_AS(cascade_attention(q, c, Tensor({3, 2, 4, 1, 1}), KVLayout::NHD, opt),
                       doctest::Contains("page_size 2"), InvalidArgument);
  CHECK_THROWS_WITH_AS(cascade_attention(Tensor({3, 1, 1}), c, pool, KVLayout::NHD, opt), doctest::Contains("level 0"),
                       InvalidArgument);
  CHECK_NOTHROW(cascade_attention(q, c, pool, KVLayout::NHD, opt));
  auto broken = c;
  broken.levels[0].request_indptr = {0, 1};  // the only group must cover both requests
  CHECK_THROWS_WITH_AS(flashstep::ref::draw_cascade(broken), doctest::Contains("level 0 request_indptr"),
                       InvalidArgument);
  CHECK_THROWS_AS(cascade_attention(q, broken, pool, KVLayout::NHD, opt), InvalidArgument);
}
