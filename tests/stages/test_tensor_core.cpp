// Stage 04 (tensor cores): the prefill and large-group decode grids through the harness,
// forced KV splits (partial states merged by stage 03's kernel), the planner's schedule,
// and the shapes the stage must refuse.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "04_tensor_core/tensor_core.hpp"
#include "flashstep/reference/errors.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"
#include "harness/validate.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

namespace {

/// The paged registry entry with a runner that plans with `options`.
StageInfo with_options(StageInfo info, tensor_core::TensorCoreOptions options) {
  const KVStorage storage = info.storage;
  info.make_runner = [storage, options] { return std::make_unique<tensor_core::TensorCoreRunner>(storage, options); };
  return info;
}

BatchShape prefill_shape(std::vector<int32_t> qo_lens, std::vector<int32_t> kv_lens, int hq, int hkv, bool causal) {
  BatchShape s;
  s.mode = Mode::prefill;
  s.storage = KVStorage::ragged;
  s.dtype = DType::bf16;
  s.batch_size = static_cast<int>(qo_lens.size());
  s.num_qo_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = 128;
  s.causal = causal;
  s.qo_indptr = {0};
  s.kv_indptr = {0};
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    s.qo_indptr.push_back(s.qo_indptr.back() + qo_lens[i]);
    s.kv_indptr.push_back(s.kv_indptr.back() + kv_lens[i]);
  }
  return s;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("04_tensor_core: refuses what it is not built for, naming the rule") {
  BatchShape s = prefill_shape({16}, {32}, 8, 2, true);
  const StageInfo ragged = tensor_core::ragged_stage_info();
  CHECK(ragged.unsupported_reason(s).empty());
  BatchShape d96 = s;
  d96.head_dim = 96;
  CHECK(ragged.unsupported_reason(d96).find("head_dim 96") != std::string::npos);
  BatchShape f32 = s;
  f32.dtype = DType::f32;
  CHECK(ragged.unsupported_reason(f32).find("f32") != std::string::npos);
  BatchShape g64 = s;
  g64.num_qo_heads = 64;
  g64.num_kv_heads = 1;
  CHECK(ragged.unsupported_reason(g64).find("groups up to 32") != std::string::npos);
  BatchShape paged = s;
  paged.storage = KVStorage::paged;
  CHECK(ragged.unsupported_reason(paged).find("ragged") != std::string::npos);
  // The CUDA-core stages refuse what only stage 04 implements.
  BatchShape window = s;
  window.window_left = 8;
  window.dtype = DType::f32;
  CHECK(find_stage("01_naive").unsupported_reason(window).find("window_left") != std::string::npos);
}

TEST_CASE("04_tensor_core: plan() rejects a bad option with InvalidArgument naming it") {
  const BatchShape s = prefill_shape({16}, {32}, 8, 2, false);
  tensor_core::TensorCoreRunner runner(KVStorage::ragged, {0, 100});
  try {
    runner.workspace_bytes(s);
    FAIL("no exception");
  } catch (const ref::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("kv_chunk_size") != std::string::npos);
  }
}

TEST_CASE("04_tensor_core schedule: every (request, tile, chunk) once, longest first, partial rows per query") {
  // 3 requests: a causal square of 300, an append of 5 queries on 1000 keys, 1 on 0 keys.
  const BatchShape s = prefill_shape({300, 5, 1}, {300, 1000, 0}, 8, 2, true);
  tensor_core::TensorCoreRunner runner(KVStorage::ragged, {0, 256});
  const tensor_core::Schedule sched = runner.make_schedule(s);
  CHECK(sched.Br == 128);
  CHECK(sched.kv_chunk_size == 256);
  // group 4: request 0 has 1200 packed rows = 10 tiles of 128, request 1 20 rows = 1 tile,
  // request 2 one tile. Chunks of 256 keys: 2, 4 and 1 (an empty request still gets one).
  std::multiset<std::tuple<int, int, int>> expected, got;
  for (int t = 0; t < 10; ++t)
    for (int c = 0; c < 2; ++c) expected.emplace(0, t, c);
  for (int c = 0; c < 4; ++c) expected.emplace(1, 0, c);
  expected.emplace(2, 0, 0);
  REQUIRE(sched.num_items() == static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < sched.num_items(); ++i)
    got.emplace(sched.request_indices[i], sched.qo_tile_indices[i], sched.kv_chunk_indices[i]);
  CHECK(got == expected);
  // Longest first: the first item is a full chunk of 256 visible keys (request 1, any
  // chunk but its last, or request 0's last tiles, chunk 0); the last ones see no key:
  // request 2 (no keys), and request 0's first tile on chunk 1 (keys 256.. are above its
  // diagonal: its 32 tokens see keys up to 31).
  CHECK(sched.request_indices.back() != 1);
  const auto last = std::make_tuple(sched.request_indices.back(), sched.qo_tile_indices.back(),
                                    sched.kv_chunk_indices.back());
  CHECK((last == std::make_tuple(2, 0, 0) || last == std::make_tuple(0, 0, 1)));
  // Partial rows: 2 per query of request 0, 4 per query of request 1, 1 for request 2.
  REQUIRE(sched.partial_indptr.size() == 307);
  CHECK(sched.partial_indptr[300] == 600);
  CHECK(sched.partial_indptr[305] == 620);
  CHECK(sched.partial_rows() == 621);
}

TEST_CASE("04_tensor_core schedule: no split when the grid is full, a split when it is not") {
  const BatchShape big = prefill_shape({4096, 4096}, {4096, 4096}, 32, 8, true);
  tensor_core::TensorCoreOptions opt;
  opt.target_blocks = 264;
  CHECK(tensor_core::TensorCoreRunner(KVStorage::ragged, opt).make_schedule(big).kv_chunk_size == 0);
  // One decode-like request of group 32 on 16384 keys: one block without a split.
  BatchShape small = prefill_shape({1}, {16384}, 32, 1, false);
  small.mode = Mode::decode;
  const tensor_core::Schedule sched = tensor_core::TensorCoreRunner(KVStorage::ragged, opt).make_schedule(small);
  CHECK(sched.kv_chunk_size >= tensor_core::kMinChunkKeys);
  CHECK(sched.num_items() == (16384 + sched.kv_chunk_size - 1) / sched.kv_chunk_size);
  CHECK(sched.num_items() > 1);
  // 128 such requests on 8192 keys: 128 blocks for 264 places -> 3 chunks of 2752 keys
  // (8192 / 3 rounded up to a multiple of 64), 384 blocks.
  BatchShape wide = prefill_shape(std::vector<int32_t>(128, 1), std::vector<int32_t>(128, 8192), 32, 1, false);
  wide.mode = Mode::decode;
  const tensor_core::Schedule wide_sched = tensor_core::TensorCoreRunner(KVStorage::ragged, opt).make_schedule(wide);
  CHECK(wide_sched.kv_chunk_size == 2752);
  CHECK(wide_sched.num_items() == 384);
}

}  // TEST_SUITE("host")

TEST_CASE(
    "04_tensor_core: prefill grid, qo_len 1..1000 x kv_len qo_len..qo_len+4096 x causal, rotating groups 1..32, head_dim, dtype, layout, page, window, soft cap") {
  const auto grid = grids::tensor_core_prefill_grid();
  const auto ran = check_grid(grid);
  CHECK(ran.count("04_tensor_core") == 1);
  CHECK(ran.count("04_tensor_core_ragged") == 1);
  if (ran.count("04_tensor_core")) CHECK(ran.at("04_tensor_core") == static_cast<int>(grid.size()));
}

TEST_CASE("04_tensor_core: decode grid, groups 16 and 32 packed into tile rows") {
  const auto grid = grids::tensor_core_decode_grid();
  const auto ran = check_grid(grid);
  CHECK(ran.count("04_tensor_core") == 1);
  if (ran.count("04_tensor_core")) CHECK(ran.at("04_tensor_core") == static_cast<int>(grid.size()));
}

TEST_CASE("04_tensor_core: sanitizer subset") {
  CHECK(check_grid(grids::tensor_core_sanitizer_grid()).count("04_tensor_core") == 1);
}

TEST_CASE("04_tensor_core: forced KV splits (chunks of 64 and 256 keys) merged by stage 03's kernel") {
  using namespace stages::harness;
  int n = 0, failures = 0;
  std::vector<CaseSpec> cases = grids::tensor_core_sanitizer_grid();
  for (const CaseSpec& c : grids::tensor_core_decode_grid())
    if (c.batch_size < 150) cases.push_back(c);
  for (const CaseSpec& spec : cases) {
    const int chunk = n++ % 2 ? 64 : 256;
    const StageInfo stage = with_options(tensor_core::stage_info(), {0, chunk});
    const uint64_t seed = case_seed(test::run_seed(), "split " + spec.describe());
    const ValidationReport r = validate(stage, spec, seed);
    CHECK_MESSAGE(r.passed, "chunk " << chunk << ": " << r.message());
    if (!r.passed && ++failures >= 5) break;
  }
}

// ---- FP8 caches: tiles copied as FP8 and widened to q's dtype in shared memory, k_scale
// in the score scale, v_scale in the output's normalisation.

TEST_CASE("04_tensor_core fp8: prefill/append and large-group decode over e4m3/e5m2 caches, with and without scales") {
  const auto grid = grids::tensor_core_fp8_grid();
  const auto ran = check_grid(grid);
  REQUIRE(ran.count("04_tensor_core") == 1);
  CHECK(ran.at("04_tensor_core") == static_cast<int>(grid.size()));
  CHECK(ran.count("04_tensor_core_ragged") == 0);  // ragged K/V stays in q's dtype
}

TEST_CASE("04_tensor_core fp8: sanitizer subset") {
  CHECK(check_grid(grids::tensor_core_fp8_sanitizer_grid()).count("04_tensor_core") == 1);
}

TEST_CASE("04_tensor_core fp8: forced KV splits, partial rows carrying v_scale") {
  using namespace stages::harness;
  int n = 0, failures = 0;
  for (const CaseSpec& spec : grids::tensor_core_fp8_sanitizer_grid()) {
    const int chunk = n++ % 2 ? 64 : 256;
    const StageInfo stage = with_options(tensor_core::stage_info(), {0, chunk});
    const uint64_t seed = case_seed(test::run_seed(), "split fp8 " + spec.describe());
    const ValidationReport r = validate(stage, spec, seed);
    CHECK_MESSAGE(r.passed, "chunk " << chunk << ": " << r.message());
    if (!r.passed && ++failures >= 5) break;
  }
}
