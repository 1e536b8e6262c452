// RadixAttention's prefix cache: the course's edge split and diagram, page granularity,
// locks, LRU eviction, and a randomized differential test against a naive model.
#include <doctest/doctest.h>

#include <chrono>
#include <flashstep/reference.hpp>

#include "fuzz/radix_cache_differential.hpp"
#include "support/random.hpp"

using flashstep::ref::draw_radix_tree;
using flashstep::ref::InvalidArgument;
using flashstep::ref::PageAllocator;
using flashstep::ref::RadixCache;
using flashstep::ref::RadixDrawOptions;

namespace {

enum : int32_t { A, B, C, D, E, F, G };
const std::vector<std::string> kLetters = {"A", "B", "C", "D", "E", "F", "G"};

struct RngSource {
  std::mt19937_64& rng;
  uint32_t pick(uint32_t n) {
    return n <= 1 ? 0 : static_cast<uint32_t>(std::uniform_int_distribution<uint32_t>(0, n - 1)(rng));
  }
};

}  // namespace

TEST_CASE("radix_cache: the course's edge split, [A,B,C,D,E] then [A,B,C,F,G]") {
  PageAllocator alloc(16, 1);
  RadixCache cache(alloc);
  const auto abcde = alloc.allocate(5);  // P0..P4
  CHECK(cache.insert({A, B, C, D, E}, abcde) == 0);
  CHECK(draw_radix_tree(cache, kLetters) ==
        "Root\n"
        "  └─\"A B C D E\"─→ [P0 P1 P2 P3 P4]\n");
  // The new request reuses [A,B,C] and computes only [F,G].
  const auto m = cache.match_prefix({A, B, C, F, G});
  CHECK(m.length == 3);
  CHECK(m.pages == std::vector<int32_t>{0, 1, 2});
  const auto fg = alloc.allocate(2);  // P5, P6
  CHECK(cache.insert({A, B, C, F, G}, {0, 1, 2, fg[0], fg[1]}) == 3);
  CHECK(draw_radix_tree(cache, kLetters) ==
        "Root\n"
        "  └─\"A B C\"─→ [P0 P1 P2]\n"
        "                ├─\"D E\"─→ [P3 P4]\n"
        "                └─\"F G\"─→ [P5 P6]\n");
  const auto nodes = cache.nodes();
  REQUIRE(nodes.size() == 4);
  CHECK(nodes[1].key == std::vector<int32_t>{A, B, C});
  CHECK(nodes[1].children.size() == 2);
  CHECK(nodes[2].key == std::vector<int32_t>{D, E});
  CHECK(nodes[3].key == std::vector<int32_t>{F, G});
  cache.check_invariants();
}

TEST_CASE("radix_cache: insert without a match first adopts only the new pages") {
  PageAllocator alloc(16, 1);
  RadixCache cache(alloc);
  const auto first = alloc.allocate(5);
  cache.insert({A, B, C, D, E}, first);
  for (int32_t p : first) alloc.decref(p);  // the first request is done: the cache holds them
  const auto second = alloc.allocate(5);    // recomputed all five tokens
  CHECK(cache.insert({A, B, C, F, G}, second) == 3);
  for (int32_t p : second) alloc.decref(p);
  // The recomputed [A,B,C] pages were duplicates: they are free again; [F,G] stayed.
  CHECK(alloc.refcount(second[0]) == 0);
  CHECK(alloc.refcount(second[2]) == 0);
  CHECK(alloc.refcount(second[3]) == 1);
  CHECK(cache.cached_pages() == 7);
  CHECK(alloc.num_used_pages() == 7);
  cache.check_invariants();
}

TEST_CASE("radix_cache: the course's \"The cat sat\" / \"The cat ran\" diagram") {
  const std::vector<std::string> vocab = {"The", "cat", "sat", "ran", "fast"};
  PageAllocator alloc(8, 1);
  RadixCache cache(alloc);
  cache.insert({0, 1, 2}, alloc.allocate(3));  // P0 P1 P2
  const auto m = cache.match_prefix({0, 1, 3});
  cache.insert({0, 1, 3}, {m.pages[0], m.pages[1], alloc.allocate(1)[0]});  // P3
  RadixDrawOptions per_page;
  per_page.one_line_per_page = true;
  // The course's picture, with pages P0..P3 in place of R0..R3.
  CHECK(draw_radix_tree(cache, vocab, per_page) ==
        "Root\n"
        "  └─\"The\"─→ [P0]\n"
        "              └─\"cat\"─→ [P1]\n"
        "                          ├─\"sat\"─→ [P2]\n"
        "                          └─\"ran\"─→ [P3]\n");
  // The radix tree itself merges the unbranched "The cat" into one edge.
  CHECK(draw_radix_tree(cache, vocab) ==
        "Root\n"
        "  └─\"The cat\"─→ [P0 P1]\n"
        "                  ├─\"sat\"─→ [P2]\n"
        "                  └─\"ran\"─→ [P3]\n");
  // "The cat ran fast" extends B's path; deeper levels keep "│" for open siblings.
  const auto m2 = cache.match_prefix({0, 1, 3, 4});
  CHECK(m2.length == 3);
  cache.insert({0, 1, 3, 4}, {0, 1, 3, alloc.allocate(1)[0]});
  cache.insert({0, 1, 2, 2}, {0, 1, 2, alloc.allocate(1)[0]});
  CHECK(draw_radix_tree(cache, vocab) ==
        "Root\n"
        "  └─\"The cat\"─→ [P0 P1]\n"
        "                  ├─\"sat\"─→ [P2]\n"
        "                  │           └─\"sat\"─→ [P5]\n"
        "                  └─\"ran\"─→ [P3]\n"
        "                              └─\"fast\"─→ [P4]\n");
  // Without a vocabulary, tokens print as ids.
  CHECK(draw_radix_tree(cache).find("\"0 1\"─→ [P0 P1]") != std::string::npos);
}

TEST_CASE("radix_cache: page_size 2 caches whole pages only, the partial tail stays the caller's") {
  PageAllocator alloc(8, 2);
  RadixCache cache(alloc);
  const auto pages = alloc.allocate(3);  // 5 tokens: 2 full pages + a tail holding 1
  CHECK(cache.insert({A, B, C, D, E}, pages) == 0);
  CHECK(cache.cached_pages() == 2);
  CHECK(alloc.refcount(pages[0]) == 2);  // caller + cache
  CHECK(alloc.refcount(pages[2]) == 1);  // the tail: caller only
  CHECK(cache.match_prefix({A, B, C, D, E}).length == 4);
  CHECK(cache.match_prefix({A, B, C}).length == 2);  // [C] is not a whole page
  CHECK(cache.match_prefix({A}).length == 0);
  CHECK(cache.match_prefix({A, B, C, F}).length == 2);  // second page differs in its 2nd token
  // floor(len / page_size) pages are accepted too.
  CHECK(cache.insert({A, B, F, F, G}, {pages[0], alloc.allocate(1)[0]}) == 2);
  CHECK(draw_radix_tree(cache, kLetters) ==
        "Root\n"
        "  └─\"A B\"─→ [P0]\n"
        "              ├─\"C D\"─→ [P1]\n"
        "              └─\"F F\"─→ [P3]\n");
  cache.check_invariants();
}

TEST_CASE("radix_cache: lock pins the path, evict goes least recently used first, page-exact") {
  PageAllocator alloc(16, 1);
  RadixCache cache(alloc);
  auto insert_fresh = [&](std::vector<int32_t> tokens) {
    const auto m = cache.match_prefix(tokens);
    auto pages = m.pages;
    const auto fresh = alloc.allocate(static_cast<int64_t>(tokens.size()) - m.length);
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    cache.insert(tokens, pages);
    for (int32_t p : fresh) alloc.decref(p);
    return fresh;
  };
  const auto x = insert_fresh({A, B, C});  // P0 P1 P2   used at t=2
  const auto y = insert_fresh({A, D, E});  // P3 P4      used at t=4 (A too)
  const auto z = insert_fresh({F, G});     // P5 P6      used at t=6
  CHECK(cache.evictable_pages() == 7);
  // Lock "A D E" (a running request), then use "F G" again.
  const auto locked = cache.match_prefix({A, D, E});
  cache.lock(locked.last_node);
  CHECK(cache.locked_pages() == 3);  // P0, P3, P4
  cache.match_prefix({F, G});
  // LRU among unlocked leaves: [B C] (t=2) first, deepest page first; then [F G].
  CHECK(cache.evict(1) == std::vector<int32_t>{x[2]});  // only P2: the leaf is trimmed
  CHECK(cache.match_prefix({A, B, C}).length == 2);
  CHECK(cache.evict(3) == std::vector<int32_t>{z[1], z[0], x[1]});
  CHECK(cache.evict(10).empty());  // all that is left is locked
  CHECK(cache.cached_pages() == 3);
  CHECK(alloc.num_free_pages() == 16 - 3);
  CHECK_THROWS_WITH_AS(cache.unlock(0), doctest::Contains("no lock to release"), InvalidArgument);
  cache.unlock(locked.last_node);
  CHECK_THROWS_AS(cache.unlock(locked.last_node), InvalidArgument);
  CHECK(cache.evict(10) == std::vector<int32_t>{y[1], y[0], x[0]});
  CHECK(cache.num_nodes() == 1);
  CHECK(alloc.num_free_pages() == 16);
  cache.check_invariants();
}

TEST_CASE("radix_cache: a lock survives a later split of its node") {
  PageAllocator alloc(16, 1);
  RadixCache cache(alloc);
  cache.insert({A, B, C, D}, alloc.allocate(4));
  const auto m = cache.match_prefix({A, B, C, D});
  cache.lock(m.last_node);
  cache.insert({A, B, F}, {m.pages[0], m.pages[1], alloc.allocate(1)[0]});  // splits [A..D]
  cache.check_invariants();
  CHECK(cache.node(m.last_node).key == std::vector<int32_t>{C, D});  // the id kept the tail
  CHECK(cache.locked_pages() == 4);
  cache.unlock(m.last_node);
  CHECK(cache.locked_pages() == 0);
  cache.check_invariants();
}

TEST_CASE("radix_cache: bad calls are InvalidArgument and leave the tree unchanged") {
  PageAllocator alloc(8, 2);
  RadixCache cache(alloc);
  const auto held = alloc.allocate(2);
  CHECK_THROWS_WITH_AS(cache.insert({A, B, C}, {held[0], held[1], 5}),
                       doctest::Contains("floor(len / page_size) = 1 or ceil(len / page_size) = 2"), InvalidArgument);
  CHECK_THROWS_WITH_AS(cache.insert({A, B}, {7}), doctest::Contains("is free"), InvalidArgument);
  CHECK_THROWS_WITH_AS(cache.insert({A, B}, {9}), doctest::Contains("out of range"), InvalidArgument);
  CHECK_THROWS_WITH_AS(cache.insert({A, B, C, D}, {held[0], held[0]}), doctest::Contains("appears twice"),
                       InvalidArgument);
  cache.insert({A, B}, {held[0]});
  CHECK_THROWS_WITH_AS(cache.insert({C, D}, {held[0]}), doctest::Contains("already cached"), InvalidArgument);
  CHECK_THROWS_WITH_AS(cache.lock(42), doctest::Contains("no node with id 42"), InvalidArgument);
  CHECK_THROWS_AS(cache.evict(-1), InvalidArgument);
  CHECK(cache.cached_pages() == 1);
  CHECK(cache.num_nodes() == 2);
  cache.check_invariants();
}

TEST_CASE("radix_cache: randomized differential test against the naive model") {
  auto rng = flashstep::test::case_rng("radix_cache: differential");
  RngSource src{rng};
  const auto t0 = std::chrono::steady_clock::now();
  int64_t total_steps = 0, total_evicted = 0;
  for (int64_t page_size : {1, 2, 3}) {
    for (int64_t num_pages : {6, 24}) {
      CAPTURE(page_size);
      CAPTURE(num_pages);
      flashstep::fuzz::RadixDifferential::Config cfg;
      cfg.page_size = page_size;
      cfg.num_pages = num_pages;
      cfg.max_tokens = 4 * page_size + 2;
      flashstep::fuzz::RadixDifferential diff(cfg);
      try {
        for (int i = 0; i < 2500; ++i) diff.step(src);
        diff.finish();
      } catch (const std::exception& e) {
        FAIL("step " << diff.steps() << ": " << std::string(e.what()));
      }
      CHECK(diff.evictions() > 0);  // the walk really hit eviction
      total_steps += diff.steps();
      total_evicted += diff.evictions();
    }
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE(total_steps << " random operations in 6 configurations agreed with the naive model (" << total_evicted
                      << " pages evicted) in " << ms << " ms");
}

TEST_CASE("radix_cache: the differential harness catches a planted bug (MRU instead of LRU)") {
  auto rng = flashstep::test::case_rng("radix_cache: planted bug");
  RngSource src{rng};
  flashstep::fuzz::RadixDifferential::Config cfg;
  cfg.num_pages = 6;
  cfg.plant_mru_bug = true;
  flashstep::fuzz::RadixDifferential diff(cfg);
  bool caught = false;
  try {
    for (int i = 0; i < 2000; ++i) diff.step(src);
  } catch (const flashstep::fuzz::Mismatch& e) {
    caught = std::string(e.what()).find("evicted") != std::string::npos;
    MESSAGE(std::string(e.what()));
  }
  CHECK(caught);
}
