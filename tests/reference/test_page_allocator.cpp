// PagedAttention's memory manager: pool, reference counts, fork, copy-on-write, accounting.
// Expected numbers are the course's or computed here from the definitions, never taken
// from the code under test.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>
#include <map>
#include <set>

#include "support/random.hpp"

using flashstep::ref::account_memory;
using flashstep::ref::InvalidArgument;
using flashstep::ref::kNoPage;
using flashstep::ref::OutOfPages;
using flashstep::ref::PageAllocator;
using flashstep::ref::PageCopy;
using flashstep::ref::PagedSequences;
using flashstep::ref::Tensor;
using flashstep::test::case_rng;
using flashstep::test::random_int;

TEST_CASE("page_allocator: a fresh pool hands out P0, P1, ... and says kNoPage when empty") {
  PageAllocator alloc(3, 16);
  CHECK(alloc.num_free_pages() == 3);
  CHECK(alloc.try_allocate() == 0);
  CHECK(alloc.allocate(2) == std::vector<int32_t>{1, 2});
  CHECK(alloc.num_used_pages() == 3);
  CHECK(alloc.try_allocate() == kNoPage);  // the documented "no page" result
  CHECK(alloc.num_free_pages() == 0);
  alloc.check_invariants();
  // Freed pages come back first-freed-first.
  CHECK(alloc.decref(2));
  CHECK(alloc.decref(0));
  CHECK(alloc.free_pages() == std::vector<int32_t>{2, 0});
  CHECK(alloc.try_allocate() == 2);
  alloc.check_invariants();
}

TEST_CASE("page_allocator: allocate is all-or-nothing and exhaustion never corrupts the pool") {
  PageAllocator alloc(4, 2);
  const auto first = alloc.allocate(3);
  CHECK_THROWS_AS(alloc.allocate(2), OutOfPages);
  CHECK(alloc.num_free_pages() == 1);  // nothing was taken by the failed call
  alloc.check_invariants();
  CHECK(alloc.allocate(1).size() == 1);
  CHECK(alloc.allocate(0).empty());
  CHECK_THROWS_AS(alloc.allocate(-1), InvalidArgument);
}

TEST_CASE("page_allocator: reference counts, double free and bad ids are InvalidArgument") {
  PageAllocator alloc(2, 1);
  const int32_t p = alloc.try_allocate();
  alloc.incref(p);
  CHECK(alloc.refcount(p) == 2);
  CHECK_FALSE(alloc.decref(p));  // one holder left
  CHECK(alloc.decref(p));        // now free
  CHECK_THROWS_WITH_AS(alloc.decref(p), doctest::Contains("double free"), InvalidArgument);
  CHECK_THROWS_WITH_AS(alloc.incref(p), doctest::Contains("is free"), InvalidArgument);
  CHECK_THROWS_WITH_AS(alloc.refcount(7), doctest::Contains("page must be in [0, 2)"), InvalidArgument);
  CHECK_THROWS_AS(alloc.decref(-1), InvalidArgument);
  CHECK_THROWS_AS(PageAllocator(0, 1), InvalidArgument);
  CHECK_THROWS_AS(PageAllocator(4, 0), InvalidArgument);
  alloc.check_invariants();
}

TEST_CASE("page_allocator: sizes past int32 are refused by name, the largest one is taken") {
  // A last_page_len and a page id are int32 in the page table: 2^31 - 1 is the limit.
  CHECK_THROWS_WITH_AS(PageAllocator(4, int64_t{1} << 40), doctest::Contains("PageAllocator: page_size must be in"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(PageAllocator(4, int64_t{1} << 31), doctest::Contains("got 2147483648"), InvalidArgument);
  CHECK_THROWS_WITH_AS(PageAllocator(int64_t{1} << 31, 1), doctest::Contains("PageAllocator: num_pages must be in"),
                       InvalidArgument);
  CHECK(PageAllocator(2, (int64_t{1} << 31) - 1).page_size() == 2147483647);
}

TEST_CASE("page_allocator: the course's \"The cat sat\" / \"The cat ran\" share P0, P1 by fork") {
  PageAllocator alloc(8, 1);  // page size 1 token, as in the course
  PagedSequences seqs(alloc);
  const int32_t a = seqs.add_sequence();
  CHECK(seqs.append_tokens(a, 2).new_pages == std::vector<int32_t>{0, 1});  // "The cat"
  const int32_t b = seqs.fork(a);
  const auto ra = seqs.append_tokens(a, 1);  // "sat"
  const auto rb = seqs.append_tokens(b, 1);  // "ran"
  CHECK(ra.copies.empty());                  // P1 is full: nothing to copy, the new token gets a new page
  CHECK(rb.copies.empty());
  CHECK(seqs.pages(a) == std::vector<int32_t>{0, 1, 2});
  CHECK(seqs.pages(b) == std::vector<int32_t>{0, 1, 3});
  CHECK(alloc.refcount(0) == 2);
  CHECK(alloc.refcount(1) == 2);
  CHECK(alloc.refcount(2) == 1);
  CHECK(alloc.refcount(3) == 1);
  const auto table = seqs.page_table({a, b});
  CHECK(table.kv_indptr == std::vector<int32_t>{0, 3, 6});
  CHECK(table.kv_indices == std::vector<int32_t>{0, 1, 2, 0, 1, 3});
  CHECK(table.kv_last_page_len == std::vector<int32_t>{1, 1});
  // Freeing A releases only its private page.
  seqs.free_sequence(a);
  CHECK(alloc.refcount(0) == 1);
  CHECK(alloc.refcount(2) == 0);
  CHECK(alloc.num_used_pages() == 3);
  alloc.check_invariants();
}

TEST_CASE("page_allocator: copy-on-write only for a shared, partly filled last page") {
  PageAllocator alloc(8, 4);
  PagedSequences seqs(alloc);
  const int32_t a = seqs.add_sequence();
  seqs.append_tokens(a, 6);  // pages [0, 1], last page holds 2 of 4
  const int32_t b = seqs.fork(a);
  const auto rb = seqs.append_tokens(b, 1);
  REQUIRE(rb.copies.size() == 1);
  CHECK(rb.copies[0].src == 1);
  CHECK(rb.copies[0].dst == 2);
  CHECK(rb.new_pages == std::vector<int32_t>{2});
  CHECK(seqs.pages(b) == std::vector<int32_t>{0, 2});
  CHECK(seqs.pages(a) == std::vector<int32_t>{0, 1});
  CHECK(alloc.refcount(1) == 1);  // A alone now: its next append needs no copy
  CHECK(seqs.append_tokens(a, 1).copies.empty());
  CHECK(seqs.last_page_len(a) == 3);
  CHECK(seqs.last_page_len(b) == 3);
  // A full shared last page is only read: append takes a new page, no copy.
  const int32_t c = seqs.add_sequence();
  seqs.append_tokens(c, 8);
  const int32_t d = seqs.fork(c);
  const auto rd = seqs.append_tokens(d, 1);
  CHECK(rd.copies.empty());
  CHECK(rd.new_pages.size() == 1);
  CHECK(seqs.seq_len(d) == 9);
  CHECK(seqs.last_page_len(d) == 1);
  alloc.check_invariants();
}

TEST_CASE("page_allocator: a failed append (OutOfPages) changes nothing, retry after free works") {
  PageAllocator alloc(3, 2);
  PagedSequences seqs(alloc);
  const int32_t a = seqs.add_sequence();
  seqs.append_tokens(a, 3);  // 2 pages, last holds 1
  const int32_t b = seqs.fork(a);
  // b needs a copy (1 page) + 2 more pages for 4 more tokens: 3 > 1 free.
  CHECK_THROWS_WITH_AS(seqs.append_tokens(b, 4), doctest::Contains("copy-on-write"), OutOfPages);
  CHECK(seqs.pages(b) == seqs.pages(a));
  CHECK(seqs.seq_len(b) == 3);
  CHECK(alloc.num_free_pages() == 1);
  CHECK(alloc.refcount(seqs.pages(a)[1]) == 2);
  alloc.check_invariants();
  seqs.free_sequence(a);  // frees nothing (b holds both pages) but unshares b's last page
  CHECK(alloc.num_free_pages() == 1);
  const auto r = seqs.append_tokens(b, 2);  // fills the last page, then one new page
  CHECK(r.copies.empty());
  CHECK(r.new_pages.size() == 1);
  CHECK(seqs.seq_len(b) == 5);
  alloc.check_invariants();
}

TEST_CASE("page_allocator: bad sequence arguments are InvalidArgument") {
  PageAllocator alloc(4, 2);
  PagedSequences seqs(alloc);
  CHECK_THROWS_WITH_AS(seqs.fork(3), doctest::Contains("no live sequence with id 3"), InvalidArgument);
  CHECK_THROWS_AS(seqs.append_tokens(0, 1), InvalidArgument);
  const int32_t a = seqs.add_sequence();
  CHECK_THROWS_WITH_AS(seqs.append_tokens(a, -1), doctest::Contains("n must be >= 0"), InvalidArgument);
  CHECK_THROWS_WITH_AS(seqs.add_sequence({0}, 3), doctest::Contains("ceil(prefix_len / page_size)"), InvalidArgument);
  CHECK_THROWS_WITH_AS(seqs.add_sequence({0}, 2), doctest::Contains("must be a page in use"), InvalidArgument);
  const auto held = alloc.allocate(2);
  CHECK_THROWS_WITH_AS(seqs.add_sequence({held[0], held[0]}, 4), doctest::Contains("appears twice"), InvalidArgument);
  const int32_t c = seqs.add_sequence(held, 3);  // shares pages someone else holds
  CHECK(alloc.refcount(held[0]) == 2);
  CHECK(seqs.last_page_len(c) == 1);
  seqs.free_sequence(c);
  CHECK_THROWS_AS(seqs.free_sequence(c), InvalidArgument);
  seqs.append_tokens(a, 3);
  CHECK_THROWS_WITH_AS(seqs.memory_report(2), doctest::Contains("more than max_seq_len"), InvalidArgument);
}

TEST_CASE("page_allocator: the course's 2048 / 500 example: 1548 slots wasted contiguously") {
  const auto r = account_memory({500}, 16, 2048);
  CHECK(r.contiguous_slots == 2048);
  CHECK(r.contiguous_slots_wasted == 1548);  // the course's number
  CHECK(r.pages_in_use == 32);               // ceil(500 / 16)
  CHECK(r.slots_wasted == 12);               // 32 * 16 - 500: only the last page's tail
  const auto r1 = account_memory({500}, 1, 2048);
  CHECK(r1.slots_wasted == 0);
  CHECK_THROWS_WITH_AS(account_memory({3000}, 16, 2048), doctest::Contains("seq_lens[0] = 3000"), InvalidArgument);
  CHECK_THROWS_AS(account_memory({1}, 0, 2048), InvalidArgument);
}

TEST_CASE("page_allocator: memory accounting of a random workload, paged vs contiguous") {
  auto rng = case_rng("page_allocator: random workload");
  const int64_t page_size = 16, max_seq_len = 2048;
  const int64_t n = random_int(rng, 20, 60);
  std::vector<int64_t> lens;
  int64_t tokens = 0, pages = 0;
  for (int64_t i = 0; i < n; ++i) {
    lens.push_back(random_int(rng, 1, max_seq_len));
    tokens += lens.back();
    pages += (lens.back() + page_size - 1) / page_size;
  }
  const auto r = account_memory(lens, page_size, max_seq_len);
  CHECK(r.tokens == tokens);
  CHECK(r.slots_wasted == pages * page_size - tokens);
  CHECK(r.slots_wasted < n * page_size);  // at most one partly filled page per sequence
  CHECK(r.contiguous_slots_wasted == n * max_seq_len - tokens);
  MESSAGE("random workload of " << n << " sequences (lengths 1.." << max_seq_len << ", page_size " << page_size
                                << "): " << tokens << " tokens; paged wastes " << r.slots_wasted << " slots ("
                                << 100.0 * r.slots_wasted / r.slots_allocated
                                << "% of allocated), contiguous max-length preallocation wastes "
                                << r.contiguous_slots_wasted << " slots ("
                                << 100.0 * r.contiguous_slots_wasted / r.contiguous_slots << "% of reserved)");

  // The same workload through PagedSequences, then forked: shared pages count once.
  PageAllocator alloc(pages * 2 + n, page_size);
  PagedSequences seqs(alloc);
  std::vector<int32_t> ids;
  for (int64_t len : lens) {
    ids.push_back(seqs.add_sequence());
    seqs.append_tokens(ids.back(), len);
  }
  const auto live = seqs.memory_report(max_seq_len);
  CHECK(live.slots_wasted == r.slots_wasted);
  CHECK(live.contiguous_slots_wasted == r.contiguous_slots_wasted);
  CHECK(live.shared_pages == 0);
  const int32_t child = seqs.fork(ids[0]);
  const auto forked = seqs.memory_report(max_seq_len);
  CHECK(forked.pages_in_use == live.pages_in_use);  // the child adds no page...
  CHECK(forked.tokens == live.tokens + lens[0]);    // ...but its tokens count logically
  CHECK(forked.shared_pages == (lens[0] + page_size - 1) / page_size);
  CHECK(forked.slots_filled == live.slots_filled);
  CHECK(forked.contiguous_slots_wasted == (n + 1) * max_seq_len - (tokens + lens[0]));
  seqs.free_sequence(child);
}

namespace {

// Writes `rows` random K/V tokens into `seq` through the page table, recording them in
// `history` (the sequence's contiguous truth).
void append_random_tokens(std::mt19937_64& rng, PagedSequences& seqs, Tensor& pool, int32_t seq, int64_t rows,
                          std::vector<std::vector<double>>& history) {
  const int64_t heads = pool.dim(3), dim = pool.dim(4);
  const auto r = seqs.append_tokens(seq, rows);
  flashstep::ref::copy_pages(pool, r.copies);  // before writing, as vLLM orders it
  flashstep::ref::PagedKVCache cache;
  cache.pages = std::move(pool);
  const auto table = seqs.page_table({seq});
  cache.kv_indptr = table.kv_indptr;
  cache.kv_indices = table.kv_indices;
  cache.kv_last_page_len = table.kv_last_page_len;
  const Tensor k = flashstep::test::random_tensor(rng, {rows, heads, dim});
  const Tensor v = flashstep::test::random_tensor(rng, {rows, heads, dim});
  std::vector<int32_t> batch(static_cast<size_t>(rows), 0), pos;
  const int64_t len = seqs.seq_len(seq);
  for (int64_t t = 0; t < rows; ++t) {
    pos.push_back(static_cast<int32_t>(len - rows + t));
    std::vector<double> row;
    for (int64_t e = 0; e < heads * dim; ++e) row.push_back(k.data[static_cast<size_t>(t * heads * dim + e)]);
    for (int64_t e = 0; e < heads * dim; ++e) row.push_back(v.data[static_cast<size_t>(t * heads * dim + e)]);
    history.push_back(row);
  }
  flashstep::ref::append_paged_kv_cache(k, v, batch, pos, cache);
  pool = std::move(cache.pages);
}

}  // namespace

TEST_CASE("page_allocator: random forks/appends/frees keep every sequence's K/V intact (COW works)") {
  auto rng = case_rng("page_allocator: cow end to end");
  for (int64_t page_size : {1, 3, 4}) {
    CAPTURE(page_size);
    const int64_t num_pages = 40, heads = 2, dim = 3;
    PageAllocator alloc(num_pages, page_size);
    PagedSequences seqs(alloc);
    // NaN-poisoned pool: a slot that was never written (a missed copy) cannot pass.
    Tensor pool({num_pages, 2, page_size, heads, dim}, std::numeric_limits<double>::quiet_NaN());
    std::map<int32_t, std::vector<std::vector<double>>> history;
    int copies_seen = 0;
    for (int step = 0; step < 300; ++step) {
      CAPTURE(step);
      const auto ids = seqs.sequence_ids();
      const int op = static_cast<int>(random_int(rng, 0, 9));
      if (ids.empty() || op == 0) {
        const int32_t s = seqs.add_sequence();
        history[s] = {};
      } else {
        const int32_t s = ids[static_cast<size_t>(random_int(rng, 0, static_cast<int64_t>(ids.size()) - 1))];
        if (op <= 2) {
          const int32_t c = seqs.fork(s);
          history[c] = history[s];
        } else if (op == 3 && ids.size() > 1) {
          seqs.free_sequence(s);
          history.erase(s);
        } else {
          const int64_t rows = random_int(rng, 1, 2 * page_size);
          const bool shared_partial = seqs.seq_len(s) % page_size != 0 && alloc.refcount(seqs.pages(s).back()) > 1;
          try {
            const auto before = seqs.pages(s);
            append_random_tokens(rng, seqs, pool, s, rows, history[s]);
            if (shared_partial) {
              ++copies_seen;
              CHECK(seqs.pages(s)[before.size() - 1] != before.back());  // written into a copy
            }
          } catch (const OutOfPages&) {
            // Pool full: drop the longest sequence so that the walk goes on.
            int32_t longest = ids[0];
            for (int32_t id : ids)
              if (seqs.seq_len(id) > seqs.seq_len(longest)) longest = id;
            seqs.free_sequence(longest);
            history.erase(longest);
          }
        }
      }
      alloc.check_invariants();
      // Every live sequence reads back exactly its own history.
      for (int32_t id : seqs.sequence_ids()) {
        CAPTURE(id);
        flashstep::ref::PagedKVCache cache;
        cache.pages = pool;
        const auto table = seqs.page_table({id});
        cache.kv_indptr = table.kv_indptr;
        cache.kv_indices = table.kv_indices;
        cache.kv_last_page_len = table.kv_last_page_len;
        const auto [k, v] = flashstep::ref::gather_paged_kv(cache, 0);
        const auto& h = history[id];
        REQUIRE(k.dim(0) == static_cast<int64_t>(h.size()));
        for (size_t t = 0; t < h.size(); ++t)
          for (int64_t e = 0; e < heads * dim; ++e) {
            REQUIRE(k.data[t * heads * dim + static_cast<size_t>(e)] == h[t][static_cast<size_t>(e)]);
            REQUIRE(v.data[t * heads * dim + static_cast<size_t>(e)] == h[t][static_cast<size_t>(heads * dim + e)]);
          }
      }
      // Conservation: each page's count is the number of table entries naming it.
      std::map<int32_t, int> holders;
      for (int32_t id : seqs.sequence_ids())
        for (int32_t p : seqs.pages(id)) ++holders[p];
      for (int32_t p = 0; p < num_pages; ++p) REQUIRE(alloc.refcount(p) == holders[p]);
    }
    if (page_size > 1) CHECK(copies_seen > 0);  // the walk did exercise copy-on-write
  }
}

TEST_CASE("page_allocator: copy_pages copies whole pages and checks ids") {
  Tensor pool({3, 2, 2, 1, 1}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  flashstep::ref::copy_pages(pool, {PageCopy{0, 2}});
  CHECK(pool.data == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(flashstep::ref::copy_pages(pool, {PageCopy{0, 3}}), doctest::Contains("out of range"),
                       InvalidArgument);
  Tensor bad({3, 1, 2, 1, 1});
  CHECK_THROWS_AS(flashstep::ref::copy_pages(bad, {}), InvalidArgument);
}
