// The split-KV planner: every field on hand-worked cases, the rule's properties on random
// batches (fits, smallest, covers every page once, CUDA-graph grid fixed by batch size),
// and split-attend-merge == unsplit decode, partial states included.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>
#include <numeric>

#include "support/random.hpp"

using flashstep::ref::AttentionOptions;
using flashstep::ref::InvalidArgument;
using flashstep::ref::KVLayout;
using flashstep::ref::PagedKVCache;
using flashstep::ref::plan_split_kv;
using flashstep::ref::SplitKVConfig;
using flashstep::ref::SplitKVPlan;
using flashstep::ref::Tensor;
using flashstep::test::case_rng;
using flashstep::test::random_int;

namespace {

// Split-attend-merge against the gathered full softmax: both double, different order.
constexpr double kTol = 1e-12;

SplitKVConfig config(int64_t num_sm, int64_t ctas_per_sm, int64_t num_kv_heads, int64_t page_size = 16,
                     bool graph = false, int64_t min_tokens = 128) {
  SplitKVConfig c;
  c.num_sm = num_sm;
  c.ctas_per_sm = ctas_per_sm;
  c.num_kv_heads = num_kv_heads;
  c.page_size = page_size;
  c.enable_cuda_graph = graph;
  c.min_kv_chunk_tokens = min_tokens;
  return c;
}

// Work items for chunk c, counted here from the definition (not by the planner).
int64_t items_for(const std::vector<int32_t>& pages, int64_t c) {
  int64_t n = 0;
  for (int32_t p : pages) n += (std::max<int64_t>(p, 1) + c - 1) / c;
  return n;
}

}  // namespace

TEST_CASE("split_plan: batch 1 with a very long KV splits into a full wave") {
  // 10000 pages, 132 SMs x 1 CTA, 8 kv heads: G / H = 16 items fit; ceil(10000 / c) <= 16
  // first holds at c = 625.
  const auto p = plan_split_kv({10000}, config(132, 1, 8));
  CHECK(p.split_kv);
  CHECK(p.kv_chunk_size_in_pages == 625);
  CHECK(p.num_work_items == 16);
  CHECK(p.padded_batch_size == 16);
  CHECK(p.max_grid_size == 132);
  CHECK(p.o_indptr == std::vector<int32_t>{0, 16});
  CHECK(p.request_indices == std::vector<int32_t>(16, 0));
  std::vector<int32_t> tiles(16);
  std::iota(tiles.begin(), tiles.end(), 0);
  CHECK(p.kv_tile_indices == tiles);
  CHECK(p.block_valid_mask == std::vector<uint8_t>(16, 1));
}

TEST_CASE("split_plan: many short requests fill the device alone, no split") {
  // 64 requests x 8 kv heads = 512 CTAs >= 132: nothing to gain from splitting.
  const auto p = plan_split_kv(std::vector<int32_t>(64, 3), config(132, 1, 8));
  CHECK_FALSE(p.split_kv);
  CHECK(p.kv_chunk_size_in_pages == 3);
  CHECK(p.num_work_items == 64);
  CHECK(p.padded_batch_size == 64);
  CHECK(p.kv_tile_indices == std::vector<int32_t>(64, 0));
  // Short requests that fit but would not be cut by the smallest chunk: no split either.
  const auto q = plan_split_kv({2, 3, 1}, config(132, 1, 8));  // c_min = 128 / 16 = 8 pages
  CHECK_FALSE(q.split_kv);
  CHECK(q.kv_chunk_size_in_pages == 8);
  CHECK(q.num_work_items == 3);
  CHECK(q.o_indptr == std::vector<int32_t>{0, 1, 2, 3});
}

TEST_CASE("split_plan: a mixed batch, every field worked by hand") {
  // G = 8, H = 1, c_min = 1 page. items(c) = ceil(10 / c) + 1 + 1 <= 8 first at c = 2 (7 items).
  const auto p = plan_split_kv({10, 1, 1}, config(4, 2, 1, 16, false, 0));
  CHECK(p.split_kv);
  CHECK(p.kv_chunk_size_in_pages == 2);
  CHECK(p.num_work_items == 7);
  CHECK(p.padded_batch_size == 7);
  CHECK(p.request_indices == std::vector<int32_t>{0, 0, 0, 0, 0, 1, 2});
  CHECK(p.kv_tile_indices == std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0});
  CHECK(p.o_indptr == std::vector<int32_t>{0, 5, 6, 7});
  CHECK(p.block_valid_mask == std::vector<uint8_t>(7, 1));
  // c_min binds: with 32 tokens / page_size 16 = 2 pages minimum the answer is the same; with
  // 64 tokens it is 4 pages (items 3 + 1 + 1 = 5).
  CHECK(plan_split_kv({10, 1, 1}, config(4, 2, 1, 16, false, 32)).kv_chunk_size_in_pages == 2);
  const auto big = plan_split_kv({10, 1, 1}, config(4, 2, 1, 16, false, 64));
  CHECK(big.kv_chunk_size_in_pages == 4);
  CHECK(big.num_work_items == 5);
}

TEST_CASE("split_plan: CUDA graphs get a grid fixed by the batch size, padded and masked") {
  const auto p = plan_split_kv({10, 1, 1}, config(4, 2, 1, 16, true, 0));
  CHECK(p.split_kv);
  CHECK(p.enable_cuda_graph);
  CHECK(p.num_work_items == 7);
  CHECK(p.padded_batch_size == 8);  // G / H, whatever the lengths
  CHECK(p.request_indices == std::vector<int32_t>{0, 0, 0, 0, 0, 1, 2, 0});
  CHECK(p.kv_tile_indices == std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0, 0});
  CHECK(p.block_valid_mask == std::vector<uint8_t>{1, 1, 1, 1, 1, 1, 1, 0});
  // Other lengths, same batch size: same kernel, same grid.
  const auto q = plan_split_kv({1, 1, 1}, config(4, 2, 1, 16, true, 0));
  CHECK(q.split_kv);  // nothing is cut, but the captured kernel is the split one
  CHECK(q.num_work_items == 3);
  CHECK(q.padded_batch_size == 8);
  // A batch that fills the device: the plain kernel with grid = batch_size.
  const auto r = plan_split_kv(std::vector<int32_t>(9, 4), config(4, 2, 1, 16, true, 0));
  CHECK_FALSE(r.split_kv);
  CHECK(r.padded_batch_size == 9);
}

TEST_CASE("split_plan: a zero-length request gets one work item that yields the empty state") {
  const auto p = plan_split_kv({0, 5}, config(4, 2, 1, 2, false, 0));
  CHECK(p.o_indptr[1] - p.o_indptr[0] == 1);
  CHECK(p.request_indices[0] == 0);
  // End to end: output 0 and lse -inf for the empty request, like batch decode.
  auto rng = case_rng("split_plan: zero-length request");
  PagedKVCache c;
  c.pages = flashstep::test::random_tensor(rng, {3, 2, 2, 1, 2});
  c.kv_indptr = {0, 0, 3};
  c.kv_indices = {2, 0, 1};
  c.kv_last_page_len = {0, 1};
  const auto p2 = plan_split_kv(flashstep::ref::kv_page_counts_from_indptr(c.kv_indptr), config(4, 2, 1, 2, false, 0));
  const Tensor q({2, 1, 2}, {0.5, -0.25, 1.0, 0.75});
  const auto got = flashstep::ref::split_kv_decode(q, c, p2);
  CHECK(got.o({0, 0, 0}) == 0.0);
  CHECK(got.lse({0, 0}) == -std::numeric_limits<double>::infinity());
  const auto want = flashstep::ref::batch_decode_with_paged_kv_cache(q, c);
  CHECK(flashstep::test::max_abs_diff(got.o, want.o) <= kTol);
  CHECK(flashstep::test::max_abs_diff(got.lse, want.lse) <= kTol);
}

TEST_CASE("split_plan: the rule's properties on random batches") {
  auto rng = case_rng("split_plan: properties");
  for (int trial = 0; trial < 400; ++trial) {
    CAPTURE(trial);
    const int64_t batch = random_int(rng, 1, 40);
    std::vector<int32_t> pages;
    for (int64_t i = 0; i < batch; ++i)
      pages.push_back(
          static_cast<int32_t>(random_int(rng, 0, 3) == 0 ? random_int(rng, 0, 2000) : random_int(rng, 0, 40)));
    const auto cfg = config(random_int(rng, 1, 140), random_int(rng, 1, 4), random_int(rng, 1, 8),
                            random_int(rng, 1, 32), random_int(rng, 0, 1) == 1, random_int(rng, 0, 256));
    const auto p = plan_split_kv(pages, cfg);
    const int64_t G = cfg.num_sm * cfg.ctas_per_sm, H = cfg.num_kv_heads;
    const int64_t c = p.kv_chunk_size_in_pages, items = items_for(pages, c);
    REQUIRE(c >= 1);
    CHECK(p.num_work_items == items);
    CHECK(p.max_grid_size == G);
    if (batch * H < G) {
      const int64_t c_min = std::max<int64_t>(cfg.min_kv_chunk_tokens / cfg.page_size, 1);
      CHECK(items * H <= G);  // fits in one wave
      CHECK(c >= c_min);
      if (c > c_min) CHECK(items_for(pages, c - 1) * H > G);  // and is the smallest that does
      CHECK(p.split_kv == (items > batch || cfg.enable_cuda_graph));
    } else {
      CHECK_FALSE(p.split_kv);
      CHECK(items == batch);
    }
    // Padding: the graph grid depends on batch size only.
    const int64_t padded = cfg.enable_cuda_graph ? (p.split_kv ? G / H : batch) : items;
    REQUIRE(p.padded_batch_size == padded);
    REQUIRE(p.request_indices.size() == static_cast<size_t>(padded));
    REQUIRE(p.kv_tile_indices.size() == static_cast<size_t>(padded));
    REQUIRE(p.block_valid_mask.size() == static_cast<size_t>(padded));
    CHECK(std::count(p.block_valid_mask.begin(), p.block_valid_mask.end(), 1) == items);
    // Every page of every request is read by exactly one work item, chunks in order.
    REQUIRE(p.o_indptr.size() == static_cast<size_t>(batch + 1));
    CHECK(p.o_indptr.back() == items);
    for (int64_t r = 0; r < batch; ++r) {
      std::vector<int> reads(static_cast<size_t>(pages[r]), 0);
      for (int32_t k = p.o_indptr[r]; k < p.o_indptr[r + 1]; ++k) {
        REQUIRE(p.request_indices[k] == r);
        REQUIRE(p.kv_tile_indices[k] == k - p.o_indptr[r]);
        const int64_t t = p.kv_tile_indices[k];
        for (int64_t pg = t * c; pg < std::min<int64_t>((t + 1) * c, pages[r]); ++pg) ++reads[static_cast<size_t>(pg)];
      }
      CHECK(std::all_of(reads.begin(), reads.end(), [](int n) { return n == 1; }));
      CHECK(p.o_indptr[r + 1] - p.o_indptr[r] >= 1);
    }
  }
}

TEST_CASE("split_plan: split, attend each chunk, merge == unsplit decode, partials checked") {
  auto rng = case_rng("split_plan: split attend merge");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int cut = 0;  // trials where some request really was cut into several chunks
  for (int trial = 0; trial < 24; ++trial) {
    CAPTURE(trial);
    const int64_t page_size = std::vector<int64_t>{1, 4, 16}[static_cast<size_t>(trial % 3)];
    const int64_t batch = random_int(rng, 1, 4), num_kv_heads = random_int(rng, 1, 2), group = random_int(rng, 1, 4);
    const int64_t head_dim = random_int(rng, 1, 8);
    std::vector<int32_t> kv_indptr{0}, last;
    std::vector<int64_t> kv_lens;
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t kv_len = random_int(rng, 0, 4) == 0 ? 0 : random_int(rng, 1, 300);
      const int64_t n = (kv_len + page_size - 1) / page_size;
      kv_lens.push_back(kv_len);
      kv_indptr.push_back(static_cast<int32_t>(kv_indptr.back() + n));
      last.push_back(static_cast<int32_t>(n == 0 ? 0 : kv_len - (n - 1) * page_size));
    }
    const int64_t num_pages = kv_indptr.back() + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    PagedKVCache c;
    c.layout = trial % 2 ? KVLayout::HND : KVLayout::NHD;
    c.pages = c.layout == KVLayout::NHD ? Tensor({num_pages, 2, page_size, num_kv_heads, head_dim}, nan)
                                        : Tensor({num_pages, 2, num_kv_heads, page_size, head_dim}, nan);
    c.kv_indptr = kv_indptr;
    c.kv_indices.assign(perm.begin(), perm.begin() + kv_indptr.back());
    c.kv_last_page_len = last;
    for (int64_t r = 0; r < batch; ++r)
      for (int64_t t = 0; t < kv_lens[static_cast<size_t>(r)]; ++t)
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t h = 0; h < num_kv_heads; ++h)
            for (int64_t d = 0; d < head_dim; ++d)
              c.at(c.kv_indices[static_cast<size_t>(kv_indptr[r] + t / page_size)], kv, t % page_size, h,
                   d) = std::uniform_real_distribution<double>(-2, 2)(rng);
    const Tensor q = flashstep::test::random_tensor(rng, {batch, num_kv_heads * group, head_dim}, -2, 2);
    // A small device so that splits happen; min chunk 0 so chunks can be a single page.
    const auto plan = plan_split_kv(flashstep::ref::kv_page_counts_from_indptr(kv_indptr),
                                    config(random_int(rng, 1, 8), random_int(rng, 1, 3), num_kv_heads, page_size,
                                           trial % 4 == 3, random_int(rng, 0, 1) ? 0 : 2 * page_size));
    cut += plan.num_work_items > batch;
    AttentionOptions opt;
    opt.window_left = trial % 5 == 2 ? static_cast<int>(random_int(rng, 0, 40)) : -1;
    opt.logits_soft_cap = trial % 5 == 4 ? 3.0 : 0.0;
    const auto partials = flashstep::ref::split_kv_partials(q, c, plan, opt);
    const auto got = flashstep::ref::merge_split_kv(partials, plan);
    const auto want = flashstep::ref::batch_decode_with_paged_kv_cache(q, c, opt);
    CHECK(flashstep::test::max_abs_diff(got.o, want.o) <= kTol);
    CHECK(flashstep::test::max_abs_diff(got.lse, want.lse) <= kTol);
    // Each partial state is plain attention over its chunk's keys (checked where no window
    // applies, through single_decode on the chunk's contiguous K/V).
    if (opt.window_left >= 0) continue;
    for (int32_t k = 0; k < plan.num_work_items; ++k) {
      const int64_t r = plan.request_indices[k], t = plan.kv_tile_indices[k];
      const auto [kr, vr] = flashstep::ref::gather_paged_kv(c, r);
      const int64_t chunk_tokens = plan.kv_chunk_size_in_pages * page_size;
      const int64_t j0 = std::min(kr.dim(0), t * chunk_tokens), j1 = std::min(kr.dim(0), (t + 1) * chunk_tokens);
      const int64_t per_row = num_kv_heads * head_dim;
      Tensor kc({j1 - j0, num_kv_heads, head_dim}), vc({j1 - j0, num_kv_heads, head_dim});
      std::copy(kr.data.begin() + j0 * per_row, kr.data.begin() + j1 * per_row, kc.data.begin());
      std::copy(vr.data.begin() + j0 * per_row, vr.data.begin() + j1 * per_row, vc.data.begin());
      Tensor qr({q.dim(1), head_dim});
      std::copy_n(q.data.begin() + r * q.dim(1) * head_dim, q.dim(1) * head_dim, qr.data.begin());
      const auto chunk = flashstep::ref::single_decode_with_kv_cache(qr, kc, vc, opt);
      for (int64_t h = 0; h < q.dim(1); ++h) {
        const double s = partials.s({k, h}), ref_s = chunk.lse({h});
        CHECK((s == ref_s || std::abs(s - ref_s) <= kTol));
        for (int64_t d = 0; d < head_dim; ++d) CHECK(std::abs(partials.v({k, h, d}) - chunk.o({h, d})) <= kTol);
      }
    }
  }
  CHECK(cut > 0);
}

TEST_CASE("split_plan: bad arguments are InvalidArgument") {
  CHECK_THROWS_WITH_AS(plan_split_kv({}, config(1, 1, 1)), doctest::Contains("at least one request"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3, -1}, config(1, 1, 1)), doctest::Contains("kv_page_counts[1] = -1"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3}, config(0, 1, 1)), doctest::Contains("num_sm must be >= 1"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3}, config(1, 0, 1)), doctest::Contains("ctas_per_sm"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3}, config(1, 1, 0)), doctest::Contains("num_kv_heads"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3}, config(1, 1, 1, 0)), doctest::Contains("page_size"), InvalidArgument);
  CHECK_THROWS_WITH_AS(plan_split_kv({3}, config(1, 1, 1, 16, false, -1)), doctest::Contains("min_kv_chunk_tokens"),
                       InvalidArgument);
  CHECK_THROWS_AS(flashstep::ref::kv_page_counts_from_indptr({1, 2}), InvalidArgument);
  // A plan made for other lengths is refused by the reference split.
  PagedKVCache c;
  c.pages = Tensor({4, 2, 1, 1, 1}, 1.0);
  c.kv_indptr = {0, 4};
  c.kv_indices = {0, 1, 2, 3};
  c.kv_last_page_len = {1};
  const auto plan = plan_split_kv({2}, config(8, 1, 1, 1, false, 0));
  CHECK_THROWS_WITH_AS(flashstep::ref::split_kv_decode(Tensor({1, 1, 1}, 1.0), c, plan),
                       doctest::Contains("made for other lengths"), InvalidArgument);
}
