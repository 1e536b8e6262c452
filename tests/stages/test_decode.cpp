// Decode grids (tests/stages/cases.hpp) run through every stage that supports them:
// 02_paged and later paged stages on the page table, 01_naive on contiguous KV (fp32).
#include <doctest/doctest.h>

#include "cases.hpp"
#include "grid_runner.hpp"

using flashstep::test::check_grid;
namespace grids = flashstep::test::grids;

TEST_CASE("decode: edge grid, batch {1,12,17} x kv_len {1,15,16,17,54,97} x page {1,8,16} x 4 head configs x head_dim {64,128,256}") {
  const auto ran = check_grid(grids::decode_edge_grid());
  CHECK(ran.count("02_paged") == 1);
}

TEST_CASE("decode: long sequences, kv_len {512, 2048, 16384} x page {1, 16, 64}") {
  CHECK(check_grid(grids::decode_long_grid()).count("02_paged") == 1);
}

TEST_CASE("decode: batch 128, blocks in waves") {
  CHECK(check_grid(grids::decode_batch128_grid()).count("02_paged") == 1);
}

TEST_CASE("decode: every GQA group size 1..8 and every dtype") {
  CHECK(check_grid(grids::decode_group_grid()).at("02_paged") == 24);
}

TEST_CASE("decode: ragged lengths, empty requests, page order") {
  CHECK(check_grid(grids::decode_ragged_grid()).count("02_paged") == 1);
}

TEST_CASE("decode: contiguous KV grid (fp32)") {
  CHECK(check_grid(grids::decode_contiguous_grid()).count("01_naive") == 1);
}

TEST_CASE("decode: sanitizer subset") {
  CHECK(check_grid(grids::decode_sanitizer_grid()).count("02_paged") == 1);
}
