// Stage 07 (Hopper) beyond the registry's prefill grids: the tails of its 128 x 128 tiles,
// ragged batches with empty requests, long sequences, and what it refuses.
#include <doctest/doctest.h>

#include "07_hopper/hopper.hpp"
#include "cases.hpp"
#include "grid_runner.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
namespace grids = flashstep::test::grids;

TEST_CASE("07_hopper: tails of the 128-row, 128-key tiles, groups 1..32, head_dim 64 and 128, causal and not") {
  // over ragged K/V and over shuffled pages of 1, 3, 16 and 64 tokens, NHD and HND
  const auto ran = test::check_grid(grids::hopper_tail_grid());
  CHECK(ran.count("07_hopper_ragged"));
  CHECK(ran.count("07_hopper"));
}

TEST_CASE("07_hopper: one long request (4096 and 16384 tokens), and more units than multiprocessors") {
  // on stage 07 alone: the double-precision reference of a 16384-token request is the cost
  const StageInfo& stage = find_stage("07_hopper_ragged");
  for (const harness::CaseSpec& c : grids::hopper_long_grid()) {
    const harness::ValidationReport r = harness::validate(stage, c, harness::case_seed(test::run_seed(), c.describe()));
    CHECK_MESSAGE(r.passed, r.message());
  }
}

TEST_SUITE("host") {
TEST_CASE("07_hopper: refuses what it is not built for, naming the rule") {
  const StageInfo& stage = find_stage("07_hopper_ragged");
  BatchShape s;
  s.mode = Mode::prefill;
  s.storage = KVStorage::ragged;
  s.dtype = DType::bf16;
  s.batch_size = 1;
  s.num_qo_heads = 28;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.qo_indptr = {0, 5};
  s.kv_indptr = {0, 9};
  CHECK(stage.unsupported_reason(s).find("divides 128") != std::string::npos);  // group 7
  s.num_qo_heads = 32;
  s.head_dim = 256;
  CHECK(stage.unsupported_reason(s).find("head_dim 256") != std::string::npos);
  s.head_dim = 128;
  s.dtype = DType::f32;
  CHECK(stage.unsupported_reason(s).find("dtype") != std::string::npos);
  s.dtype = DType::bf16;
  s.window_left = 3;
  CHECK(stage.unsupported_reason(s).find("window_left") != std::string::npos);
}
}

TEST_CASE("07_hopper: sanitizer subset") {
  // a few small cases on stage 07 alone, for compute-sanitizer (memcheck, racecheck,
  // synccheck): both head_dims and dtypes, causal and not, a tail, an empty request, GQA
  // groups 1 and 4, and one batch of more units than multiprocessors
  std::vector<harness::CaseSpec> cases;
  for (int n = 0; n < 4; ++n) {
    harness::CaseSpec c;
    c.mode = Mode::prefill;
    c.batch_size = 3;
    c.qo_len = n % 2 ? 65 : 130;
    c.kv_len = c.qo_len + 70;
    c.num_qo_heads = n < 2 ? 8 : 32;
    c.num_kv_heads = 8;
    c.head_dim = n % 2 ? 64 : 128;
    c.dtype = n % 2 ? DType::f16 : DType::bf16;
    c.causal = n < 2;
    c.lengths = harness::LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  harness::CaseSpec many = cases[0];
  many.batch_size = 2;
  many.qo_len = 600;
  many.kv_len = 600;
  many.num_qo_heads = 32;  // 2 x 19 tiles x 8 kv heads = 304 units
  cases.push_back(many);
  // both entries: the TMA tiles over ragged K/V, the producer's gather over pages of 3 (HND)
  for (const char* name : {"07_hopper_ragged", "07_hopper"}) {
    const StageInfo& stage = find_stage(name);
    for (harness::CaseSpec c : cases) {
      if (stage.storage == KVStorage::paged) {
        c.page_size = 3;
        c.kv_layout = KVLayout::HND;
        c.head_dim = 128;  // the paged entry's one head_dim
      }
      const harness::ValidationReport r =
          harness::validate(stage, c, harness::case_seed(test::run_seed(), c.describe()));
      INFO(name);
      CHECK_MESSAGE(r.passed, r.message());
    }
  }
}
