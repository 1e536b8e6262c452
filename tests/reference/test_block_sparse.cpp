// FlashInfer's block-sparse view: the course's three tables (worked out by hand) and
// attention by walking the view equal to batch attention on random batches.
#include <doctest/doctest.h>

#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>
#include <numeric>
#include <set>

#include "support/random.hpp"

using flashstep::ref::AttentionOptions;
using flashstep::ref::block_sparse_attention;
using flashstep::ref::BlockSparseDrawOptions;
using flashstep::ref::build_block_sparse;
using flashstep::ref::draw_block_sparse;
using flashstep::ref::draw_block_sparse_lookup;
using flashstep::ref::InvalidArgument;
using flashstep::ref::KVLayout;
using flashstep::ref::PagedKVCache;
using flashstep::ref::Tensor;
using flashstep::test::case_rng;
using flashstep::test::random_int;

namespace {

// Tolerance of the walk (online softmax, page by page) against the gathered full softmax:
// both in double, different summation order.
constexpr double kTol = 1e-12;

// The course's tokens: K and V of "The", "cat", "sat", "ran", "fast".
const double kK[5][2] = {{1, 0}, {0, 1}, {1, 1}, {1, -1}, {0, -1}};
const double kV[5][2] = {{1, 1}, {2, 0}, {0, 1}, {1, 0}, {0, 1}};
const std::vector<std::string> kWords = {"The", "cat", "sat", "ran", "fast"};

// Pages of the course, Bc = 1: P0..P4 hold one token each; A = [P0 P1 P2], B = [P0 P1 P3 P4].
PagedKVCache example_bc1() {
  PagedKVCache c;
  c.pages = Tensor({5, 2, 1, 1, 2});
  for (int p = 0; p < 5; ++p)
    for (int d = 0; d < 2; ++d) {
      c.pages({p, 0, 0, 0, d}) = kK[p][d];
      c.pages({p, 1, 0, 0, d}) = kV[p][d];
    }
  c.kv_indptr = {0, 3, 7};
  c.kv_indices = {0, 1, 2, 0, 1, 3, 4};
  c.kv_last_page_len = {1, 1};
  return c;
}

// Bc = 2, the course's repacking: P0 = (The, cat), P1 = (sat), P2 = (ran, fast).
PagedKVCache example_bc2() {
  PagedKVCache c;
  c.pages = Tensor({3, 2, 2, 1, 2}, std::numeric_limits<double>::quiet_NaN());
  const int packed[3][2] = {{0, 1}, {2, -1}, {3, 4}};
  for (int p = 0; p < 3; ++p)
    for (int slot = 0; slot < 2; ++slot) {
      if (packed[p][slot] < 0) continue;  // P1's second slot stays NaN: it must never be read
      for (int d = 0; d < 2; ++d) {
        c.pages({p, 0, slot, 0, d}) = kK[packed[p][slot]][d];
        c.pages({p, 1, slot, 0, d}) = kV[packed[p][slot]][d];
      }
    }
  c.kv_indptr = {0, 2, 4};
  c.kv_indices = {0, 1, 0, 2};
  c.kv_last_page_len = {1, 2};
  return c;
}

// Queries of A pos 0..2 and B pos 0..3, packed (qo_indptr [0, 3, 7]).
const Tensor kQ({7, 1, 2}, {1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, -1, 0, -1});
const std::vector<int32_t> kQoIndptr = {0, 3, 7};

AttentionOptions example_options() {
  AttentionOptions opt;
  opt.causal = true;
  opt.sm_scale = 1.0;
  return opt;
}

void check_close(const flashstep::ref::AttentionResult& got, const flashstep::ref::AttentionResult& want) {
  REQUIRE(got.o.shape == want.o.shape);
  CHECK(flashstep::test::max_abs_diff(got.o, want.o) <= kTol);
  CHECK(flashstep::test::max_abs_diff(got.lse, want.lse) <= kTol);
}

}  // namespace

TEST_CASE("block_sparse: the course's Br=1, Bc=1 table and lookup") {
  const PagedKVCache c = example_bc1();
  const auto view = build_block_sparse(kQoIndptr, c, 1, true);
  CHECK(view.indptr == std::vector<int32_t>{0, 1, 3, 6, 7, 9, 12, 16});
  CHECK(view.indices == std::vector<int32_t>{0, 0, 1, 0, 1, 2, 0, 0, 1, 0, 1, 3, 0, 1, 3, 4});
  // The course's lookup table, verbatim.
  CHECK(draw_block_sparse_lookup(view) ==
        "A, pos 0 → pages [P0]\n"
        "A, pos 1 → pages [P0, P1]\n"
        "A, pos 2 → pages [P0, P1, P2]\n"
        "B, pos 0 → pages [P0]\n"
        "B, pos 1 → pages [P0, P1]\n"
        "B, pos 2 → pages [P0, P1, P3]\n"
        "B, pos 3 → pages [P0, P1, P3, P4]\n");
  BlockSparseDrawOptions draw;
  draw.page_labels = kWords;
  CHECK(draw_block_sparse(view, draw) ==
        "               P0     P1     P2     P3     P4\n"
        "             (The)  (cat)  (sat)  (ran)  (fast)\n"
        "             shared shared A-only B-only B-only\n"
        "            ┌──────┬──────┬──────┬──────┬──────┐\n"
        "A, pos 0    │  P0  │      │      │      │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "A, pos 1    │  P0  │  P1  │      │      │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "A, pos 2    │  P0  │  P1  │  P2  │      │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 0    │  P0  │      │      │      │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 1    │  P0  │  P1  │      │      │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 2    │  P0  │  P1  │      │  P3  │      │\n"
        "            ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 3    │  P0  │  P1  │      │  P3  │  P4  │\n"
        "            └──────┴──────┴──────┴──────┴──────┘\n");
  // Walking it: row "A, pos 2" is the course's [0.63, 0.79], and every row equals batch
  // attention.
  const auto walked = block_sparse_attention(kQ, c, view, example_options());
  CHECK(walked.o({2, 0, 0}) == doctest::Approx(0.63).epsilon(0.01));
  CHECK(walked.o({2, 0, 1}) == doctest::Approx(0.79).epsilon(0.01));
  check_close(walked, flashstep::ref::batch_prefill_with_paged_kv_cache(kQ, kQoIndptr, c, example_options()));
}

TEST_CASE("block_sparse: the course's Br=3 table, where the causal mask inside a block is essential") {
  const PagedKVCache c = example_bc1();
  const auto view = build_block_sparse(kQoIndptr, c, 3, true);
  CHECK(draw_block_sparse_lookup(view) ==
        "A, pos 0-2 → pages [P0, P1, P2]\n"
        "B, pos 0-2 → pages [P0, P1, P3]\n"
        "B, pos 3 → pages [P0, P1, P3, P4]\n");
  BlockSparseDrawOptions draw;
  draw.page_labels = kWords;
  CHECK(draw_block_sparse(view, draw) ==
        "                 P0     P1     P2     P3     P4\n"
        "               (The)  (cat)  (sat)  (ran)  (fast)\n"
        "               shared shared A-only B-only B-only\n"
        "              ┌──────┬──────┬──────┬──────┬──────┐\n"
        "A, pos 0-2    │  P0  │  P1  │  P2  │      │      │\n"
        "              ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 0-2    │  P0  │  P1  │      │  P3  │      │\n"
        "              ├──────┼──────┼──────┼──────┼──────┤\n"
        "B, pos 3      │  P0  │  P1  │      │  P3  │  P4  │\n"
        "              └──────┴──────┴──────┴──────┴──────┘\n");
  const auto walked = block_sparse_attention(kQ, c, view, example_options());
  check_close(walked, flashstep::ref::batch_prefill_with_paged_kv_cache(kQ, kQoIndptr, c, example_options()));
  // A's block loads P0, P1, P2 for all three queries; only the mask keeps "A, pos 0" on
  // "The": its output is exactly V("The") = [1, 1], which unmasked attention is not.
  CHECK(walked.o({0, 0, 0}) == 1.0);
  CHECK(walked.o({0, 0, 1}) == 1.0);
  AttentionOptions unmasked = example_options();
  unmasked.causal = false;
  const auto leak = flashstep::ref::batch_prefill_with_paged_kv_cache(kQ, kQoIndptr, c, unmasked);
  CHECK(std::abs(leak.o({0, 0, 0}) - 1.0) > 0.1);
}

TEST_CASE("block_sparse: the course's Bc=2 repacking gives the same rows") {
  const PagedKVCache c = example_bc2();
  const auto view = build_block_sparse(kQoIndptr, c, 1, true);
  CHECK(view.Bc == 2);
  CHECK(draw_block_sparse_lookup(view) ==
        "A, pos 0 → pages [P0]\n"
        "A, pos 1 → pages [P0]\n"
        "A, pos 2 → pages [P0, P1]\n"
        "B, pos 0 → pages [P0]\n"
        "B, pos 1 → pages [P0]\n"
        "B, pos 2 → pages [P0, P2]\n"
        "B, pos 3 → pages [P0, P2]\n");
  BlockSparseDrawOptions draw;
  draw.page_labels = {"The, cat", "sat", "ran, fast"};
  CHECK(draw_block_sparse(view, draw) ==
        "                 P0       P1       P2\n"
        "             (The, cat) (sat)  (ran, fast)\n"
        "               shared   A-only   B-only\n"
        "            ┌──────────┬──────┬───────────┐\n"
        "A, pos 0    │    P0    │      │           │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "A, pos 1    │    P0    │      │           │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "A, pos 2    │    P0    │  P1  │           │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "B, pos 0    │    P0    │      │           │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "B, pos 1    │    P0    │      │           │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "B, pos 2    │    P0    │      │    P2     │\n"
        "            ├──────────┼──────┼───────────┤\n"
        "B, pos 3    │    P0    │      │    P2     │\n"
        "            └──────────┴──────┴───────────┘\n");
  // "A, pos 0" loads both slots of P0 and the mask drops "cat"; P1's unused slot is NaN
  // and is never read. Same results as the Bc = 1 layout.
  const auto walked = block_sparse_attention(kQ, c, view, example_options());
  const auto bc1 = example_bc1();
  check_close(walked, flashstep::ref::batch_prefill_with_paged_kv_cache(kQ, kQoIndptr, bc1, example_options()));
}

TEST_CASE("block_sparse: the course's shared-prefix tile (Br=7) drawn one line per query") {
  // All seven queries as one row block over the shared pages P0, P1 (not causal).
  const auto view = build_block_sparse({0, 7}, {0, 2}, {0, 1}, {1}, 1, 5, 7, false);
  CHECK(view.num_row_blocks() == 1);
  BlockSparseDrawOptions draw;
  draw.page_labels = kWords;
  draw.show_sharing = false;
  draw.one_line_per_query = true;
  draw.row_names = {"A, pos 0", "A, pos 1", "A, pos 2", "B, pos 0", "B, pos 1", "B, pos 2", "B, pos 3"};
  CHECK(draw_block_sparse(view, draw) ==
        "               P0     P1\n"
        "             (The)  (cat)\n"
        "            ┌──────┬──────┐\n"
        "A, pos 0    │      │      │\n"
        "A, pos 1    │      │      │\n"
        "A, pos 2    │      │      │\n"
        "B, pos 0    │  P0  │  P1  │\n"
        "B, pos 1    │      │      │\n"
        "B, pos 2    │      │      │\n"
        "B, pos 3    │      │      │\n"
        "            └──────┴──────┘\n");
}

TEST_CASE("block_sparse: walking the view equals batch attention on random batches") {
  auto rng = case_rng("block_sparse: random");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int cases = 0;
  for (int64_t page_size : {1, 3, 4}) {
    for (int64_t Br : {1, 2, 3, 7, 16}) {
      CAPTURE(page_size);
      CAPTURE(Br);
      const int64_t batch = random_int(rng, 1, 4);
      const int64_t num_kv_heads = random_int(rng, 1, 2), group = random_int(rng, 1, 3);
      const int64_t head_dim = random_int(rng, 1, 5);
      std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last;
      std::vector<int64_t> kv_lens;
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t kv_len = random_int(rng, 0, 13);
        // Mostly appends (qo_len <= kv_len); sometimes more queries than keys (rows that
        // see nothing under causal).
        const int64_t qo_len = random_int(rng, 0, 5) == 0 ? random_int(rng, 0, 5) : random_int(rng, 0, kv_len);
        kv_lens.push_back(kv_len);
        qo_indptr.push_back(static_cast<int32_t>(qo_indptr.back() + qo_len));
        const int64_t pages = (kv_len + page_size - 1) / page_size;
        kv_indptr.push_back(static_cast<int32_t>(kv_indptr.back() + pages));
        last.push_back(static_cast<int32_t>(pages == 0 ? 0 : kv_len - (pages - 1) * page_size));
      }
      const int64_t used = kv_indptr.back(), num_pages = used + random_int(rng, 1, 4);
      std::vector<int32_t> perm(static_cast<size_t>(num_pages));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      kv_indices.assign(perm.begin(), perm.begin() + used);
      for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
        PagedKVCache c;
        c.layout = layout;
        c.pages = layout == KVLayout::NHD ? Tensor({num_pages, 2, page_size, num_kv_heads, head_dim}, nan)
                                          : Tensor({num_pages, 2, num_kv_heads, page_size, head_dim}, nan);
        c.kv_indptr = kv_indptr;
        c.kv_indices = kv_indices;
        c.kv_last_page_len = last;
        // Only slots a request owns get values; the rest stay NaN.
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t t = 0; t < kv_lens[static_cast<size_t>(r)]; ++t)
            for (int kv = 0; kv < 2; ++kv)
              for (int64_t h = 0; h < num_kv_heads; ++h)
                for (int64_t d = 0; d < head_dim; ++d)
                  c.at(kv_indices[static_cast<size_t>(kv_indptr[r] + t / page_size)], kv, t % page_size, h,
                       d) = std::uniform_real_distribution<double>(-2, 2)(rng);
        const Tensor q = flashstep::test::random_tensor(rng, {qo_indptr.back(), num_kv_heads * group, head_dim}, -2, 2);
        for (int variant = 0; variant < 4; ++variant) {
          CAPTURE(variant);
          AttentionOptions opt;
          opt.causal = variant != 1;
          opt.window_left = variant == 2 ? static_cast<int>(random_int(rng, 0, 4)) : -1;
          opt.logits_soft_cap = variant == 3 ? 1.5 : 0.0;
          if (variant == 3) opt.sm_scale = 0.7;
          const auto view = build_block_sparse(qo_indptr, c, Br, opt.causal, opt.window_left);
          // The view is exact: a block is present iff some query of the row block sees
          // some key of the page.
          for (int64_t b = 0; b < view.num_row_blocks(); ++b) {
            const int64_t r = view.row_request[static_cast<size_t>(b)];
            const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r], kv_len = kv_lens[static_cast<size_t>(r)];
            std::set<int32_t> expected, got;
            for (int64_t row = view.row_indptr[b]; row < view.row_indptr[b + 1]; ++row)
              for (int64_t j = 0; j < kv_len; ++j)
                if (flashstep::ref::key_visible(row - qo_indptr[r], j, qo_len, kv_len, opt.causal, opt.window_left))
                  expected.insert(kv_indices[static_cast<size_t>(kv_indptr[r] + j / page_size)]);
            for (int32_t n = view.indptr[b]; n < view.indptr[b + 1]; ++n) got.insert(view.indices[n]);
            REQUIRE(got == expected);
            REQUIRE(view.row_indptr[b + 1] - view.row_indptr[b] <= Br);
          }
          check_close(block_sparse_attention(q, c, view, opt),
                      flashstep::ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, c, opt));
          ++cases;
        }
      }
    }
  }
  CHECK(cases == 3 * 5 * 2 * 4);
}

TEST_CASE("block_sparse: bad arguments are InvalidArgument") {
  const PagedKVCache c = example_bc1();
  CHECK_THROWS_WITH_AS(build_block_sparse(kQoIndptr, c, 0), doctest::Contains("Br must be >= 1"), InvalidArgument);
  CHECK_THROWS_WITH_AS(build_block_sparse({0, 3}, c, 1), doctest::Contains("kv_indptr must have length 2"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(build_block_sparse(kQoIndptr, {0, 1, 2}, {0, 9}, {1, 1}, 1, 5, 1),
                       doctest::Contains("kv_indices[1] = 9 is out of range"), InvalidArgument);
  CHECK_THROWS_WITH_AS(build_block_sparse(kQoIndptr, {0, 1, 2}, {0, 1}, {2, 1}, 1, 5, 1),
                       doctest::Contains("kv_last_page_len[0] = 2 must be in 1..page_size"), InvalidArgument);
  const auto view = build_block_sparse(kQoIndptr, c, 1, true);
  AttentionOptions not_causal = example_options();
  not_causal.causal = false;
  CHECK_THROWS_WITH_AS(block_sparse_attention(kQ, c, view, not_causal),
                       doctest::Contains("must be the ones the view was built with"), InvalidArgument);
  CHECK_THROWS_WITH_AS(block_sparse_attention(kQ, example_bc2(), view, example_options()),
                       doctest::Contains("was not built for this pool"), InvalidArgument);
  auto broken = view;
  broken.indices[3] = 99;
  CHECK_THROWS_WITH_AS(block_sparse_attention(kQ, c, broken, example_options()), doctest::Contains("out of range"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(block_sparse_attention(Tensor({6, 1, 2}), c, view, example_options()),
                       doctest::Contains("q has 6 rows"), InvalidArgument);
  // A hand-edited view is refused by the printers too, before they index anything.
  auto short_rows = view;
  short_rows.row_request.pop_back();
  CHECK_THROWS_WITH_AS(draw_block_sparse(short_rows), doctest::Contains("view.row_indptr"), InvalidArgument);
  auto short_kv = view;
  short_kv.kv_len.pop_back();
  CHECK_THROWS_WITH_AS(draw_block_sparse_lookup(short_kv), doctest::Contains("view.qo_indptr"), InvalidArgument);
  BlockSparseDrawOptions names;
  names.request_names = {"only one"};
  CHECK_THROWS_WITH_AS(draw_block_sparse(view, names), doctest::Contains("request_names"), InvalidArgument);
}
