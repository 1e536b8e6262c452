// pack_step (step_arrays.hpp): the buffer the GPU engine uploads once per step, worked by
// hand for the chapter's mixed step and for a decode step padded for a CUDA graph, the
// offsets of two padded steps of different lengths compared, and bad padding refused.
#include <doctest/doctest.h>

#include <vector>

#include "09_engine/step_arrays.hpp"
#include "support/expect_error.hpp"

using namespace flashstep::stages::engine;
using flashstep::test::expect_error;

namespace {

// Step 1 of the chapter's hand-worked example (page size 4): r0 decodes, r1 finishes its
// chunked prompt, r2 prefills.
StepBatch chapter_step() {
  StepBatch b;
  b.step = 1;
  b.num_decodes = 1;
  b.num_prefills = 2;
  b.request_ids = {0, 1, 2};
  b.qo_indptr = {0, 1, 4, 7};
  b.kv_indptr = {0, 2, 4, 5};
  b.kv_indices = {0, 1, 2, 3, 4};
  b.kv_last_page_len = {2, 2, 3};
  b.kv_lens = {6, 6, 3};
  b.cached_tokens = {0, 0, 0};
  b.tokens = {100, 23, 24, 25, 30, 31, 32};
  b.batch_indices = {0, 1, 1, 1, 2, 2, 2};
  b.positions = {5, 3, 4, 5, 0, 1, 2};
  b.sample_rows = {0, 1, 2};
  b.sample_token_rows = {0, 3, 6};
  return b;
}

// A decode-only step of three rows (page size 4): kv lengths 6, 1 and 17.
StepBatch decode_step() {
  StepBatch b;
  b.num_decodes = 3;
  b.request_ids = {0, 1, 2};
  b.qo_indptr = {0, 1, 2, 3};
  b.kv_indptr = {0, 2, 3, 8};
  b.kv_indices = {0, 1, 5, 2, 3, 4, 6, 7};
  b.kv_last_page_len = {2, 1, 1};
  b.kv_lens = {6, 1, 17};
  b.tokens = {9, 8, 7};
  b.batch_indices = {0, 1, 2};
  b.positions = {5, 0, 16};
  b.sample_rows = {0, 1, 2};
  b.sample_token_rows = {0, 1, 2};
  return b;
}

}  // namespace

TEST_CASE("pack_step: the chapter's mixed step, every array and offset by hand") {
  const StepArrays a = pack_step(chapter_step());
  // tokens | positions | batch_indices | qo_indptr | kv_indptr | last_page_len |
  // sample_token_rows | prefill qo_indptr (qo_indptr[1..3] - 1) | prefill kv_indptr
  // (kv_indptr[1..3] - 2) | kv_indices
  const std::vector<int32_t> want = {100, 23, 24, 25, 30, 31, 32,  // 0
                                     5,   3,  4,  5,  0,  1,  2,   // 7
                                     0,   1,  1,  1,  2,  2,  2,   // 14
                                     0,   1,  4,  7,               // 21
                                     0,   2,  4,  5,               // 25
                                     2,   2,  3,                   // 29
                                     0,   3,  6,                   // 32
                                     0,   3,  6,                   // 35
                                     0,   2,  3,                   // 38
                                     0,   1,  2,  3,  4};          // 41
  CHECK(a.data == want);
  CHECK(a.tokens == 0);
  CHECK(a.positions == 7);
  CHECK(a.batch_indices == 14);
  CHECK(a.qo_indptr == 21);
  CHECK(a.kv_indptr == 25);
  CHECK(a.kv_last_page_len == 29);
  CHECK(a.sample_token_rows == 32);
  CHECK(a.prefill_qo_indptr == 35);
  CHECK(a.prefill_kv_indptr == 38);
  CHECK(a.kv_indices == 41);
  CHECK(a.nnz == 7);
  CHECK(a.rows == 3);
  CHECK(a.samples == 3);
  CHECK(a.num_decodes == 1);
  CHECK(a.num_prefills == 2);
  CHECK(a.slice(a.prefill_kv_indptr, 3) == std::vector<int32_t>{0, 2, 3});
}

TEST_CASE("pack_step: a decode step padded to 4 rows for a CUDA graph") {
  const StepArrays a = pack_step(decode_step(), 4);
  // The padding row 3: token 0 at position 0, its own batch index, one query, no pages
  // (kv_indptr stays at 8, last_page_len 0), and it samples row 0.
  const std::vector<int32_t> want = {9, 8, 7,  0,               // tokens, 0
                                     5, 0, 16, 0,               // positions, 4
                                     0, 1, 2,  3,               // batch_indices, 8
                                     0, 1, 2,  3, 4,            // qo_indptr, 12
                                     0, 2, 3,  8, 8,            // kv_indptr, 17
                                     2, 1, 1,  0,               // kv_last_page_len, 22
                                     0, 1, 2,  0,               // sample_token_rows, 26
                                     0,                         // prefill qo_indptr, 30
                                     0,                         // prefill kv_indptr, 31
                                     0, 1, 5,  2, 3, 4, 6, 7};  // kv_indices, 32
  CHECK(a.data == want);
  CHECK(a.kv_indices == 32);
  CHECK(a.nnz == 4);
  CHECK(a.rows == 4);
  CHECK(a.samples == 4);
  CHECK(a.num_decodes == 3);
  // Another decode step padded to 4 (two rows, other lengths and pages): every offset
  // but the end is the same, so a graph captured on one reads the other's arrays.
  StepBatch other;
  other.num_decodes = 2;
  other.request_ids = {4, 5};
  other.qo_indptr = {0, 1, 2};
  other.kv_indptr = {0, 1, 4};
  other.kv_indices = {9, 10, 11, 12};
  other.kv_last_page_len = {3, 4};
  other.kv_lens = {3, 16};
  other.tokens = {1, 2};
  other.batch_indices = {0, 1};
  other.positions = {2, 15};
  other.sample_rows = {0, 1};
  other.sample_token_rows = {0, 1};
  const StepArrays b = pack_step(other, 4);
  CHECK(b.tokens == a.tokens);
  CHECK(b.positions == a.positions);
  CHECK(b.batch_indices == a.batch_indices);
  CHECK(b.qo_indptr == a.qo_indptr);
  CHECK(b.kv_indptr == a.kv_indptr);
  CHECK(b.kv_last_page_len == a.kv_last_page_len);
  CHECK(b.sample_token_rows == a.sample_token_rows);
  CHECK(b.kv_indices == a.kv_indices);
  CHECK(b.slice(b.kv_indptr, 5) == std::vector<int32_t>{0, 1, 4, 4, 4});  // rows 2, 3: no pages
  CHECK(b.slice(b.kv_last_page_len, 4) == std::vector<int32_t>{3, 4, 0, 0});
}

TEST_CASE("pack_step: padding is for decode-only steps with room, named when refused") {
  expect_error([] { pack_step(chapter_step(), 4); }, {"pack_step", "padded_rows 4", "decode-only"});
  expect_error([] { pack_step(decode_step(), 2); }, {"pack_step", "padded_rows 2"});
  expect_error([] { pack_step(decode_step(), -1); }, {"pack_step", "padded_rows must be >= 0"});
  CHECK(pack_step(decode_step(), 3).data == pack_step(decode_step()).data);  // padded to its own size
}
