// The Scheduler and StepBatch: hand-worked steps, the invariants of every step of seeded
// workloads (checked here from the arrays and the allocator, not by the scheduler), a
// starved request that waits, prefix sharing's saving computed by hand, bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "09_engine/scheduler.hpp"
#include "support/expect_error.hpp"

using namespace flashstep::stages::engine;
using flashstep::test::expect_error;

namespace {

Request req(int64_t arrival, std::vector<int32_t> prompt, int64_t max_new) {
  Request r;
  r.arrival_step = arrival;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  return r;
}

std::vector<int32_t> iota(int32_t first, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + i;
  return v;
}

/// The fake model's token for request r at step s (never the end token 255 unless asked).
int32_t fake_token(int32_t r, int64_t s) { return static_cast<int32_t>((r * 31 + s * 7 + 1) % 250); }

/// What the test remembers of a request across steps, to check the arrays against.
struct Track {
  std::vector<int32_t> prefill_positions;  // every prompt position prefilled, in order
  std::vector<int32_t> sampled;            // the tokens the fake model gave it
};

/// Checks one step's arrays against each other, against the workload and against the
/// allocator, from the definitions (FlashInfer's CSR conventions), not from the scheduler.
void check_step(const Scheduler& s, const StepBatch& b, std::map<int32_t, Track>& tracks) {
  const int64_t ps = s.config().page_size;
  const int32_t n = b.batch_size();
  CAPTURE(b.step);
  REQUIRE(b.num_decodes + b.num_prefills == n);
  // qo_indptr: n + 1 offsets from 0, every row at least one token, decodes exactly one.
  REQUIRE(b.qo_indptr.size() == static_cast<size_t>(n + 1));
  REQUIRE(b.qo_indptr[0] == 0);
  for (int32_t i = 0; i < n; ++i) {
    REQUIRE(b.qo_indptr[i + 1] > b.qo_indptr[i]);
    if (i < b.num_decodes) CHECK(b.qo_indptr[i + 1] - b.qo_indptr[i] == 1);
  }
  const auto nnz = static_cast<size_t>(b.qo_indptr[n]);
  REQUIRE(b.tokens.size() == nnz);
  REQUIRE(b.positions.size() == nnz);
  REQUIRE(b.batch_indices.size() == nnz);
  REQUIRE(b.append_pages.size() == nnz);
  REQUIRE(b.append_slots.size() == nnz);
  // The CSR page table: consistent with each row's length.
  REQUIRE(b.kv_indptr.size() == static_cast<size_t>(n + 1));
  REQUIRE(b.kv_last_page_len.size() == static_cast<size_t>(n));
  REQUIRE(b.kv_lens.size() == static_cast<size_t>(n));
  REQUIRE(b.kv_indptr[0] == 0);
  REQUIRE(b.kv_indptr[n] == static_cast<int32_t>(b.kv_indices.size()));
  std::set<int32_t> requests_in_batch;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t r = b.request_ids[i];
    CHECK(requests_in_batch.insert(r).second);  // a request appears once per step
    const int32_t pages = b.kv_indptr[i + 1] - b.kv_indptr[i];
    REQUIRE(pages >= 1);
    CHECK(b.kv_last_page_len[i] >= 1);
    CHECK(b.kv_last_page_len[i] <= ps);
    CHECK((pages - 1) * ps + b.kv_last_page_len[i] == b.kv_lens[i]);
    const RequestState& st = s.state(r);
    const Request& rq = s.requests()[static_cast<size_t>(r)];
    CHECK(b.kv_lens[i] == s.sequences().seq_len(st.sequence));
    const int32_t q0 = b.qo_indptr[i], q1 = b.qo_indptr[i + 1];
    for (int32_t t = q0; t < q1; ++t) {
      // Positions are the new tokens' indices in the sequence: the last q1 - q0 of kv_len.
      CHECK(b.positions[t] == b.kv_lens[i] - (q1 - q0) + (t - q0));
      CHECK(b.batch_indices[t] == i);
      // The append slot is that position's place in the row's page table.
      CHECK(b.append_pages[t] == b.kv_indices[b.kv_indptr[i] + b.positions[t] / ps]);
      CHECK(b.append_slots[t] == b.positions[t] % ps);
    }
    Track& tr = tracks[r];
    if (i < b.num_decodes) {
      // A decode feeds back the request's last sampled token, after its whole prompt.
      REQUIRE_FALSE(tr.sampled.empty());
      CHECK(b.tokens[q0] == tr.sampled.back());
      CHECK(b.positions[q0] == static_cast<int32_t>(rq.prompt.size() + tr.sampled.size()) - 1);
    } else {
      CHECK(tr.sampled.empty());  // a prefill row belongs to a request that has not sampled yet
      for (int32_t t = q0; t < q1; ++t) {
        CHECK(b.tokens[t] == rq.prompt[static_cast<size_t>(b.positions[t])]);
        tr.prefill_positions.push_back(b.positions[t]);
      }
    }
    // Sampling: every decode, and a prefill whose chunk reaches the prompt's end.
    const bool samples = i < b.num_decodes || b.kv_lens[i] == static_cast<int32_t>(rq.prompt.size());
    const auto it = std::find(b.sample_rows.begin(), b.sample_rows.end(), i);
    CHECK((it != b.sample_rows.end()) == samples);
    if (it != b.sample_rows.end())
      CHECK(b.sample_token_rows[static_cast<size_t>(it - b.sample_rows.begin())] == q1 - 1);
  }
  CHECK(std::is_sorted(b.sample_rows.begin(), b.sample_rows.end()));
  REQUIRE(b.sample_token_rows.size() == b.sample_rows.size());
  // No two new tokens write the same slot.
  std::set<std::pair<int32_t, int32_t>> slots;
  for (size_t t = 0; t < nnz; ++t) CHECK(slots.insert({b.append_pages[t], b.append_slots[t]}).second);

  // Ownership over every live sequence and the cache: each page's reference count is
  // the number of page tables holding it plus one if the cache holds it; a page in two
  // tables is a cached prefix page, at the same index in both, full, and never written.
  std::map<int32_t, int> holders;
  std::map<int32_t, std::set<size_t>> index_of;
  for (int32_t seq : s.sequences().sequence_ids()) {
    const auto& pages = s.sequences().pages(seq);
    std::set<int32_t> mine(pages.begin(), pages.end());
    CHECK(mine.size() == pages.size());  // a table never holds a page twice
    for (size_t k = 0; k < pages.size(); ++k) {
      ++holders[pages[k]];
      index_of[pages[k]].insert(k);
    }
  }
  std::set<int32_t> cached;
  for (const auto& node : s.cache().nodes())
    for (int32_t p : node.pages) CHECK(cached.insert(p).second);
  for (int32_t p = 0; p < s.allocator().num_pages(); ++p) {
    const int expected = holders[p] + (cached.count(p) ? 1 : 0);
    CAPTURE(p);
    CHECK(s.allocator().refcount(p) == expected);
    if (holders[p] > 1) {
      CHECK(cached.count(p) == 1);
      CHECK(index_of[p].size() == 1);
      CHECK(slots.lower_bound({p, 0}) == slots.lower_bound({p + 1, 0}));  // nothing written to it
    }
  }
  CHECK(b.page_copies.empty());  // only whole pages are shared, so no copy-on-write
  // Admission reserved every running request's remaining pages: the pool still holds them.
  int64_t reserved = 0;
  for (int32_t r = 0; r < static_cast<int32_t>(s.requests().size()); ++r) {
    const RequestState& st = s.state(r);
    CHECK(st.reserved_pages >= 0);
    if (st.sequence >= 0)  // pages held (cached prefix included) + still reserved == lifetime
      CHECK(static_cast<int64_t>(s.sequences().pages(st.sequence).size()) + st.reserved_pages == s.lifetime_pages(r));
    reserved += st.reserved_pages;
  }
  CHECK(s.allocator().num_free_pages() >= reserved);
  s.allocator().check_invariants();
  s.cache().check_invariants();
  CHECK(s.allocator().num_free_pages() + s.allocator().num_used_pages() == s.allocator().num_pages());
}

/// Runs the workload to the end with the fake model, checking every step. Returns the
/// number of steps.
int64_t run_checked(Scheduler& s, std::map<int32_t, Track>& tracks, int64_t max_steps = 100000) {
  while (!s.done()) {
    REQUIRE(s.steps() < max_steps);
    const StepBatch b = s.next_step();
    check_step(s, b, tracks);
    std::vector<int32_t> sampled;
    for (int32_t row : b.sample_rows) {
      const int32_t r = b.request_ids[static_cast<size_t>(row)];
      sampled.push_back(fake_token(r, b.step));
      tracks[r].sampled.push_back(sampled.back());
    }
    s.complete_step(sampled);
  }
  return s.steps();
}

}  // namespace

TEST_CASE("Hand-worked: three requests, page size 4, no prefix sharing") {
  // Pool of 8 pages handed out P0, P1, ... in order; budget 8 query tokens per step.
  //   r0 arrives at step 0, prompt 10 11 12 13 14 (5 tokens), 3 new tokens
  //   r1 arrives at step 0, prompt 20 .. 25 (6 tokens), 2 new tokens
  //   r2 arrives at step 1, prompt 30 31 32, 2 new tokens
  // Step 0: no decodes. r0 admitted, its 5 prompt tokens (budget left 3) go to P0 (4) and
  //   P1 (1); r1 admitted, a chunk of 3 (budget 0) into P2. r0's chunk ends its prompt:
  //   it samples (token row 4); r1 does not.
  //   qo_indptr [0 5 8], kv_indptr [0 2 3], kv_indices [0 1 2], last_page_len [1 3]
  // Step 1: decodes first: r0 feeds back its token (position 5: P1 slot 1). Then r1's
  //   remaining 3 prompt tokens (positions 3 4 5: P2 slot 3, new page P3 slots 0 1), then
  //   r2 is admitted with its 3 tokens in P4. All three sample.
  //   qo_indptr [0 1 4 7], kv_indptr [0 2 4 5], kv_indices [0 1 2 3 4],
  //   last_page_len [2 2 3], sample token rows [0 3 6]
  // Step 2: three decodes at positions 6 6 3: P1 slot 2, P3 slot 2, P4 slot 3.
  //   qo_indptr [0 1 2 3], kv_indices [0 1 2 3 4], last_page_len [3 3 4]. r0 has its 3
  //   tokens, r1 and r2 their 2: all finish and every page is free.
  SchedulerConfig c;
  c.num_pages = 8;
  c.page_size = 4;
  c.max_tokens_per_step = 8;
  c.max_running = 3;
  c.prefix_sharing = false;
  Scheduler s(c, {req(0, iota(10, 5), 3), req(0, iota(20, 6), 2), req(1, iota(30, 3), 2)});
  using V = std::vector<int32_t>;

  StepBatch b = s.next_step();
  CHECK(b.num_decodes == 0);
  CHECK(b.num_prefills == 2);
  CHECK(b.request_ids == V{0, 1});
  CHECK(b.qo_indptr == V{0, 5, 8});
  CHECK(b.kv_indptr == V{0, 2, 3});
  CHECK(b.kv_indices == V{0, 1, 2});
  CHECK(b.kv_last_page_len == V{1, 3});
  CHECK(b.tokens == V{10, 11, 12, 13, 14, 20, 21, 22});
  CHECK(b.positions == V{0, 1, 2, 3, 4, 0, 1, 2});
  CHECK(b.append_pages == V{0, 0, 0, 0, 1, 2, 2, 2});
  CHECK(b.append_slots == V{0, 1, 2, 3, 0, 0, 1, 2});
  CHECK(b.sample_rows == V{0});
  CHECK(b.sample_token_rows == V{4});
  CHECK(b.admitted == V{0, 1});
  s.complete_step({100});

  b = s.next_step();
  CHECK(b.num_decodes == 1);
  CHECK(b.num_prefills == 2);
  CHECK(b.request_ids == V{0, 1, 2});
  CHECK(b.qo_indptr == V{0, 1, 4, 7});
  CHECK(b.kv_indptr == V{0, 2, 4, 5});
  CHECK(b.kv_indices == V{0, 1, 2, 3, 4});
  CHECK(b.kv_last_page_len == V{2, 2, 3});
  CHECK(b.tokens == V{100, 23, 24, 25, 30, 31, 32});
  CHECK(b.positions == V{5, 3, 4, 5, 0, 1, 2});
  CHECK(b.append_pages == V{1, 2, 3, 3, 4, 4, 4});
  CHECK(b.append_slots == V{1, 3, 0, 1, 0, 1, 2});
  CHECK(b.sample_rows == V{0, 1, 2});
  CHECK(b.sample_token_rows == V{0, 3, 6});
  const std::string text = b.describe();
  CAPTURE(text);
  CHECK(text.find("step 1: 1 decode + 2 prefill chunks, 7 new tokens; admitted r2") != std::string::npos);
  CHECK(text.find("qo_indptr          [0 1 4 7]") != std::string::npos);
  CHECK(text.find("kv_last_page_len   [2 2 3]") != std::string::npos);
  CHECK(text.find("append page:slot   [1:1 2:3 3:0 3:1 4:0 4:1 4:2]") != std::string::npos);
  s.complete_step({101, 200, 300});

  b = s.next_step();
  CHECK(b.num_decodes == 3);
  CHECK(b.num_prefills == 0);
  CHECK(b.qo_indptr == V{0, 1, 2, 3});
  CHECK(b.kv_indptr == V{0, 2, 4, 5});
  CHECK(b.kv_indices == V{0, 1, 2, 3, 4});
  CHECK(b.kv_last_page_len == V{3, 3, 4});
  CHECK(b.tokens == V{101, 200, 300});
  CHECK(b.positions == V{6, 6, 3});
  CHECK(b.append_pages == V{1, 3, 4});
  CHECK(b.append_slots == V{2, 2, 3});
  s.complete_step({102, 201, 301});
  CHECK(s.done());
  CHECK(s.state(0).generated == V{100, 101, 102});
  CHECK(s.state(1).generated == V{200, 201});
  CHECK(s.allocator().num_free_pages() == 8);
}

TEST_CASE("Hand-worked: a later prompt reuses a cached prefix's pages") {
  // Page size 4, 6 pages. r0 (step 0): prompt 1..9 (9 tokens), 1 new token: pages P0 P1
  // P2. After its prefill the cache adopts the whole pages P0 P1 (tokens 1..8); it
  // finishes at once and drops its references: P2 frees (the free list is now P3 P4 P5
  // P2), P0 P1 stay, held by the cache alone.
  // r1 (step 2): prompt 1..8 50 51, 2 new tokens. The match stops at the whole pages
  // before its last token: 8 tokens, pages P0 P1. Only 50 51 are prefilled, at positions
  // 8 9, into a fresh page, P3. qo_indptr [0 2], kv_indptr [0 3], kv_indices [0 1 3],
  // last_page_len [2]; P0 and P1 have two holders (the cache and r1).
  SchedulerConfig c;
  c.num_pages = 6;
  c.page_size = 4;
  c.max_tokens_per_step = 16;
  c.max_running = 4;
  std::vector<int32_t> p1 = iota(1, 8);
  p1.push_back(50);
  p1.push_back(51);
  Scheduler s(c, {req(0, iota(1, 9), 1), req(2, p1, 2)});
  using V = std::vector<int32_t>;
  StepBatch b = s.next_step();
  CHECK(b.kv_indices == V{0, 1, 2});
  s.complete_step({7});
  CHECK(s.state(0).phase == Phase::finished);
  CHECK(s.allocator().num_used_pages() == 2);
  CHECK(s.allocator().free_pages() == V{3, 4, 5, 2});
  b = s.next_step();
  CHECK(b.batch_size() == 0);
  CHECK(b.nnz() == 0);
  s.complete_step({});
  b = s.next_step();
  CHECK(b.request_ids == V{1});
  CHECK(b.cached_tokens == V{8});
  CHECK(b.qo_indptr == V{0, 2});
  CHECK(b.kv_indptr == V{0, 3});
  CHECK(b.kv_indices == V{0, 1, 3});
  CHECK(b.kv_last_page_len == V{2});
  CHECK(b.tokens == V{50, 51});
  CHECK(b.positions == V{8, 9});
  CHECK(b.append_pages == V{3, 3});
  CHECK(b.append_slots == V{0, 1});
  CHECK(s.allocator().refcount(0) == 2);
  CHECK(s.allocator().refcount(1) == 2);
  CHECK(s.allocator().refcount(3) == 1);
  s.complete_step({60});
  b = s.next_step();
  CHECK(b.tokens == V{60});
  CHECK(b.positions == V{10});
  s.complete_step({61});
  CHECK(s.done());
  CHECK(s.allocator().num_used_pages() == 2);  // P0 P1, in the cache
  s.release_cache();
  CHECK(s.allocator().num_free_pages() == 6);
}

TEST_CASE("Seeded workloads: every step's invariants, chunked prefill in order, all pages back") {
  for (const int64_t page_size : {1, 4, 16}) {
    for (const bool sharing : {false, true}) {
      for (const uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(page_size);
        CAPTURE(sharing);
        CAPTURE(seed);
        ArrivalParams p;
        p.seed = seed;
        p.num_requests = 40;
        p.arrivals_per_step = 1.2;
        p.min_prompt_len = 1;
        p.max_prompt_len = 70;
        p.min_new_tokens = 1;
        p.max_new_tokens = 20;
        p.num_shared_prefixes = 3;
        p.shared_prefix_len = 24;
        p.shared_fraction = 0.6;
        const ArrivalSchedule sched = ArrivalSchedule::make(p);
        SchedulerConfig c;
        c.page_size = page_size;
        c.num_pages = 200 / page_size + 8;  // tight: requests wait for pages
        c.max_tokens_per_step = 48;         // short: long prompts are chunked
        c.max_running = 12;
        c.prefix_sharing = sharing;
        Scheduler s(c, sched);
        std::map<int32_t, Track> tracks;
        run_checked(s, tracks);
        int64_t waited = 0, chunked = 0;
        for (int32_t r = 0; r < static_cast<int32_t>(sched.requests().size()); ++r) {
          const Request& rq = sched.requests()[static_cast<size_t>(r)];
          const RequestState& st = s.state(r);
          CAPTURE(r);
          CHECK(st.phase == Phase::finished);
          CHECK(static_cast<int64_t>(st.generated.size()) == rq.max_new_tokens);
          CHECK(st.generated == tracks[r].sampled);
          // Chunked prefill covered the prompt past its cached prefix once, in order.
          std::vector<int32_t> want;
          for (auto t = static_cast<int32_t>(st.cached_tokens); t < static_cast<int32_t>(rq.prompt.size()); ++t)
            want.push_back(t);
          CHECK(tracks[r].prefill_positions == want);
          CHECK(st.cached_tokens % page_size == 0);
          CHECK(st.cached_tokens < static_cast<int64_t>(rq.prompt.size()));
          if (!sharing) CHECK(st.cached_tokens == 0);
          // Admitted no earlier than its arrival, and in arrival order.
          CHECK(st.admitted_step >= rq.arrival_step);
          if (r > 0) CHECK(st.admitted_step >= s.state(r - 1).admitted_step);
          waited += st.admitted_step > rq.arrival_step;
          chunked += static_cast<int64_t>(rq.prompt.size()) - st.cached_tokens > c.max_tokens_per_step;
        }
        CHECK(waited > 0);  // the pool (or the running limit) held someone back
        if (sharing) {
          CHECK(s.allocator().num_used_pages() == s.cache().cached_pages());
          s.release_cache();
        }
        CHECK(s.allocator().num_free_pages() == c.num_pages);
        CHECK(s.peak_used_pages() <= c.num_pages);
        // Over all seeds some prompt is longer than the budget, so chunking happened.
        if (seed == 1) CHECK(chunked > 0);
      }
    }
  }
}

TEST_CASE("A request the pool cannot hold waits, then runs when pages free up") {
  // Page size 4, 4 pages. r0 needs 8 + 9 - 1 = 16 slots: the whole pool, reserved at
  // admission. r1 (1 page) and r2 behind it must wait until r0 has generated its 9
  // tokens: prefill at step 0, decodes at steps 1..8, finished in step 8. Both are
  // admitted at step 9 (r1 first), with and without prefix sharing (with it, r0's pages
  // sit in the cache and are evicted to make room).
  for (const bool sharing : {false, true}) {
    CAPTURE(sharing);
    SchedulerConfig c;
    c.num_pages = 4;
    c.page_size = 4;
    c.max_tokens_per_step = 16;
    c.max_running = 4;
    c.prefix_sharing = sharing;
    Scheduler s(c, {req(0, iota(1, 8), 9), req(0, {200, 201}, 2), req(1, {210}, 1)});
    std::map<int32_t, Track> tracks;
    while (!s.done()) {
      REQUIRE(s.steps() < 100);
      const StepBatch b = s.next_step();
      check_step(s, b, tracks);
      if (b.step <= 8) {
        CHECK(std::find(b.waiting.begin(), b.waiting.end(), 1) != b.waiting.end());
        CHECK(b.request_ids == std::vector<int32_t>{0});
      }
      std::vector<int32_t> sampled;
      for (int32_t row : b.sample_rows) {
        sampled.push_back(fake_token(b.request_ids[static_cast<size_t>(row)], b.step));
        tracks[b.request_ids[static_cast<size_t>(row)]].sampled.push_back(sampled.back());
      }
      s.complete_step(sampled);
    }
    CHECK(s.state(0).finished_step == 8);
    CHECK(s.state(1).admitted_step == 9);
    CHECK(s.state(2).admitted_step == 9);
    CHECK(s.state(1).generated.size() == 2);
    if (sharing) s.release_cache();
    CHECK(s.allocator().num_free_pages() == 4);
  }
}

TEST_CASE("Prefix sharing saves the pages computed by hand from the schedule") {
  // Every request is admitted and prefilled at its arrival step (a large pool and
  // budget) and is still running at step S, the last arrival step. So after step S
  // request i holds kv_i = prompt_i + (S - arrival_i) tokens in ceil(kv_i / 4) pages.
  // Without sharing the pool holds the sum of those. With sharing, a request whose shared
  // prefix (16 tokens = 4 pages) was prefilled by another request at an earlier step
  // holds those 4 pages in common with it; a request arriving in the same step as the
  // first of its prefix cannot (the pages enter the cache after that step).
  ArrivalParams p;
  p.seed = 11;
  p.num_requests = 24;
  p.arrivals_per_step = 0.8;
  p.min_prompt_len = 3;
  p.max_prompt_len = 9;
  p.min_new_tokens = 80;
  p.max_new_tokens = 100;
  p.num_shared_prefixes = 2;
  p.shared_prefix_len = 16;
  p.shared_fraction = 0.75;
  const ArrivalSchedule sched = ArrivalSchedule::make(p);
  const int64_t last = sched.last_arrival_step();
  int64_t unshared_pages = 0, sharers = 0;
  std::map<int32_t, int64_t> first_arrival;  // shared prefix -> earliest arrival step
  for (const Request& r : sched.requests()) {
    REQUIRE(r.arrival_step + r.max_new_tokens - 1 > last);  // still running after step `last`
    const int64_t kv = static_cast<int64_t>(r.prompt.size()) + (last - r.arrival_step);
    unshared_pages += (kv + 3) / 4;
    if (r.shared_prefix < 0) continue;
    auto it = first_arrival.find(r.shared_prefix);
    if (it == first_arrival.end()) first_arrival[r.shared_prefix] = r.arrival_step;
    else if (it->second < r.arrival_step) ++sharers;
  }
  REQUIRE(sharers >= 5);  // the workload does share
  const int64_t shared_pages = unshared_pages - sharers * (16 / 4);

  for (const bool sharing : {false, true}) {
    CAPTURE(sharing);
    SchedulerConfig c;
    c.num_pages = 1024;
    c.page_size = 4;
    c.max_tokens_per_step = 512;
    c.max_running = 64;
    c.prefix_sharing = sharing;
    Scheduler s(c, sched);
    std::map<int32_t, Track> tracks;
    for (int64_t step = 0; step <= last; ++step) {
      const StepBatch b = s.next_step();
      check_step(s, b, tracks);
      std::vector<int32_t> sampled;
      for (int32_t row : b.sample_rows) {
        sampled.push_back(fake_token(b.request_ids[static_cast<size_t>(row)], b.step));
        tracks[b.request_ids[static_cast<size_t>(row)]].sampled.push_back(sampled.back());
      }
      s.complete_step(sampled);
    }
    for (int32_t r = 0; r < static_cast<int32_t>(sched.requests().size()); ++r)
      CHECK(s.state(r).admitted_step == sched.requests()[static_cast<size_t>(r)].arrival_step);
    CHECK(s.allocator().num_used_pages() == (sharing ? shared_pages : unshared_pages));
  }
}

TEST_CASE("The end token finishes a request early and frees its pages and reservation") {
  SchedulerConfig c;
  c.num_pages = 4;
  c.page_size = 4;
  c.max_tokens_per_step = 8;
  c.max_running = 2;
  c.end_token = 255;
  c.prefix_sharing = false;
  // r0 reserves 4 pages (3 + 14 - 1 = 16 slots); r1 (1 page) waits until r0 ends.
  Scheduler s(c, {req(0, {1, 2, 3}, 14), req(0, {9}, 1)});
  StepBatch b = s.next_step();
  CHECK(b.request_ids == std::vector<int32_t>{0});
  CHECK(b.waiting == std::vector<int32_t>{1});
  CHECK(s.state(0).reserved_pages == 3);  // 4 reserved, 1 allocated
  s.complete_step({5});
  b = s.next_step();
  CHECK(b.waiting == std::vector<int32_t>{1});
  s.complete_step({255});  // the end token
  CHECK(s.state(0).phase == Phase::finished);
  CHECK(s.state(0).generated == std::vector<int32_t>{5, 255});
  CHECK(s.allocator().num_free_pages() == 4);
  b = s.next_step();
  CHECK(b.request_ids == std::vector<int32_t>{1});
  s.complete_step({3});
  CHECK(s.done());
}

TEST_CASE("Bad input is refused by name") {
  SchedulerConfig ok;
  ok.num_pages = 4;
  ok.page_size = 4;
  ok.max_tokens_per_step = 8;
  ok.max_running = 2;
  auto with = [&](auto change, std::vector<Request> rs) {
    SchedulerConfig c = ok;
    change(c);
    return [c, rs] { Scheduler s(c, rs); };
  };
  auto same = [](SchedulerConfig&) {};
  const std::vector<Request> one{req(0, {1, 2}, 2)};
  expect_error(with(same, {req(0, {1}, 1), req(0, {}, 3)}), {"Scheduler", "request 1", "prompt is empty"});
  expect_error(with(same, {req(0, iota(0, 17), 1)}), {"request 0", "longer than the whole pool", "16 slots"});
  expect_error(with(same, {req(0, iota(0, 10), 10), req(0, iota(0, 12), 8)}),
               {"num_pages 4 is too small to admit any request", "smallest needs 5 pages"});
  expect_error(with(same, {req(0, {1}, 1), req(0, iota(0, 10), 10)}),
               {"request 1", "needs 5 pages", "never be admitted"});
  expect_error(with([](SchedulerConfig& c) { c.num_pages = 0; }, one), {"num_pages must be >= 1"});
  expect_error(with([](SchedulerConfig& c) { c.page_size = 0; }, one), {"page_size must be >= 1"});
  expect_error(with([](SchedulerConfig& c) { c.max_tokens_per_step = 0; }, one), {"max_tokens_per_step must be >= 1"});
  expect_error(with([](SchedulerConfig& c) { c.max_running = 0; }, one), {"max_running must be >= 1"});
  expect_error(with([](SchedulerConfig& c) { c.max_tokens_per_step = 1; }, one),
               {"max_tokens_per_step must be >= max_running"});
  expect_error(with([](SchedulerConfig& c) { c.end_token = -2; }, one), {"end_token"});
  expect_error(with(same, {}), {"requests must not be empty"});
  expect_error(with(same, {req(0, {1, -4}, 1)}), {"request 0", "prompt[1]", "negative token id"});
  expect_error(with(same, {req(0, {1}, 0)}), {"request 0", "max_new_tokens must be >= 1"});
  expect_error(with(same, {req(2, {1}, 1), req(1, {1}, 1)}), {"request 1", "arrival order"});
  expect_error(with(same, {req(-1, {1}, 1)}), {"arrival_step must be >= 0"});

  Scheduler s(ok, one);
  CHECK_THROWS_AS(s.complete_step({}), std::logic_error);  // no step begun
  const StepBatch b = s.next_step();
  CHECK_THROWS_AS(s.next_step(), std::logic_error);  // the step was not completed
  expect_error([&] { s.complete_step({}); },
               {"Scheduler::complete_step", "one token per sample row of the step (1), got 0"});
  expect_error([&] { s.complete_step({-3}); }, {"sampled[0]", "negative token id"});
  expect_error([&] { s.state(5); }, {"Scheduler::state", "request must be in [0, 1)"});
  s.complete_step({4});
  s.next_step();
  s.complete_step({4});
  CHECK(s.done());
  CHECK_THROWS_AS(s.next_step(), std::logic_error);  // nothing left to run
}
