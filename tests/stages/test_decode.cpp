// Decode grids (stages/harness/cases.hpp) run through every stage that supports them:
// 02_paged and later paged stages on the page table, 01_naive on contiguous KV (fp32).
#include <doctest/doctest.h>

#include "02_paged/paged.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"

using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

TEST_CASE(
    "decode: edge grid, batch {1,12,17} x kv_len {1,15,16,17,54,97} x page {1,8,16} x 4 head configs x head_dim {64,128,256}") {
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

TEST_CASE("decode: sanitizer subset") { CHECK(check_grid(grids::decode_sanitizer_grid()).count("02_paged") == 1); }

TEST_CASE("decode: 02_paged at every block size and pipeline depth (also the sanitizer's)") {
  using namespace flashstep::stages;
  using harness::CaseSpec;
  std::vector<CaseSpec> specs(3);
  specs[0].kv_len = 300;  // bf16, 32/8 heads, head_dim 128, page 16: many tiles, a partial last one
  specs[0].batch_size = 3;
  specs[1].dtype = DType::f32, specs[1].head_dim = 256, specs[1].num_qo_heads = 7, specs[1].num_kv_heads = 1;
  specs[1].page_size = 1, specs[1].kv_len = 77, specs[1].batch_size = 2;
  specs[2].dtype = DType::f16, specs[2].head_dim = 64, specs[2].num_qo_heads = 4, specs[2].num_kv_heads = 4;
  specs[2].page_size = 64, specs[2].kv_len = 200, specs[2].batch_size = 4;
  specs[2].kv_layout = KVLayout::HND, specs[2].lengths = harness::LengthPolicy::ragged_with_empty;
  for (int threads : {256, 512})
    for (int depth : {2, 3, 6}) {
      if (threads == 512 && depth > 2) continue;  // 2 x 3 x 32 KB + merge: more shared memory than a block may have
      StageInfo stage = find_stage("02_paged");
      stage.make_runner = [=] { return std::make_unique<paged::PagedRunner>(paged::PagedConfig{depth, threads}); };
      for (const CaseSpec& spec : specs) {
        CAPTURE(threads);
        CAPTURE(depth);
        const auto report = harness::validate(stage, spec,
                                              harness::case_seed(flashstep::test::run_seed(), spec.describe()));
        CHECK_MESSAGE(report.passed, report.message());
      }
    }
}

// ---- FP8 caches: stages 02 and 03 (the stages whose StageInfo lists kv_dtypes) on e4m3
// and e5m2 pools, against the reference's FP8 attention of the same pool values.

TEST_CASE("decode fp8: e4m3/e5m2 x NHD/HND x page 1/16 x group 1/4/8 x head_dim 64/128/256 x scales") {
  const auto ran = check_grid(grids::decode_fp8_grid());
  const int cases = static_cast<int>(grids::decode_fp8_grid().size());
  REQUIRE(ran.count("02_paged") == 1);
  REQUIRE(ran.count("03_split_kv") == 1);
  CHECK(ran.at("02_paged") == cases);
  CHECK(ran.at("03_split_kv") == cases);
}

TEST_CASE("decode fp8: long sequences (stage 03 splits) and batch 128 (blocks in waves)") {
  const auto ran = check_grid(grids::decode_fp8_long_grid());
  CHECK(ran.count("02_paged") == 1);
  CHECK(ran.count("03_split_kv") == 1);
}

TEST_CASE("decode fp8: sanitizer subset") {
  CHECK(check_grid(grids::decode_fp8_sanitizer_grid()).count("02_paged") == 1);
}

TEST_CASE("decode fp8: 02_paged at every block size and pipeline depth") {
  using namespace flashstep::stages;
  using harness::CaseSpec;
  std::vector<CaseSpec> specs(3);
  specs[0].kv_dtype = DType::e4m3, specs[0].kv_len = 300, specs[0].batch_size = 3;  // several FP8 tiles
  specs[0].k_scale = 1.0 / 200, specs[0].v_scale = 0.0123;
  specs[1].dtype = DType::f16, specs[1].kv_dtype = DType::e5m2, specs[1].head_dim = 256;
  specs[1].num_qo_heads = 7, specs[1].num_kv_heads = 1, specs[1].page_size = 1, specs[1].kv_len = 77;
  specs[1].batch_size = 2;
  specs[2].kv_dtype = DType::e4m3, specs[2].head_dim = 64, specs[2].num_qo_heads = 4, specs[2].num_kv_heads = 4;
  specs[2].page_size = 64, specs[2].kv_len = 200, specs[2].batch_size = 4, specs[2].v_scale = 3.7;
  specs[2].kv_layout = KVLayout::HND, specs[2].lengths = harness::LengthPolicy::ragged_with_empty;
  for (int threads : {256, 512})
    for (int depth : {2, 3, 6}) {
      if (threads == 512 && depth > 2) continue;  // more shared memory than a block may have
      StageInfo stage = find_stage("02_paged");
      stage.make_runner = [=] { return std::make_unique<paged::PagedRunner>(paged::PagedConfig{depth, threads}); };
      for (const CaseSpec& spec : specs) {
        CAPTURE(threads);
        CAPTURE(depth);
        const auto report = harness::validate(stage, spec,
                                              harness::case_seed(flashstep::test::run_seed(), spec.describe()));
        CHECK_MESSAGE(report.passed, report.message());
      }
    }
}
