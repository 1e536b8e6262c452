// The logits soft cap (stages/soft_cap/: every score s -> c tanh(s / c) before the softmax,
// FlashInfer's logits_soft_cap), taken by stage 03's chunk kernel through the on_logit hook
// of kernels/attention_policy.cuh: the harness's soft-cap decode grid against the reference
// (ref::AttentionOptions::logits_soft_cap), on the stage's own plans and on plans forced to
// split, and the shapes the stage does not cap refused by name.
#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

TEST_SUITE("host") {

TEST_CASE("soft cap: 03_split_kv caps fp16/bf16 logits and refuses the rest by name") {
  const StageInfo& stage = find_stage("03_split_kv");
  CHECK(stage.logits_soft_cap);
  BatchShape s;
  s.mode = Mode::decode;
  s.dtype = DType::f32;
  s.batch_size = 1;
  s.num_qo_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.page_size = 16;
  s.num_pages = 1;
  s.qo_indptr = {0, 1};
  s.kv_indptr = {0, 1};
  s.kv_last_page_len = {3};
  s.logits_soft_cap = 30.f;
  CHECK(stage.unsupported_reason(s).find("logits_soft_cap") != std::string::npos);
  s.dtype = DType::bf16;
  CHECK(stage.unsupported_reason(s).empty());
  s.pos_encoding = PosEncoding::rope_llama;
  CHECK(stage.unsupported_reason(s).find("does not combine logits_soft_cap") != std::string::npos);
}

}  // TEST_SUITE("host")

TEST_CASE("soft cap decode: every stage that caps against the reference") {
  const auto ran = check_grid(grids::soft_cap_decode_grid());
  CHECK(ran.count("03_split_kv") == 1);
  for (const auto& [name, n] : ran) CHECK_MESSAGE(find_stage(name).logits_soft_cap, name << " ran a capped case");
}

TEST_CASE("soft cap: forced splits (the cap on every chunk's scores, the merge unchanged)") {
  const int ran = test::check_with_runner(split_kv::stage_info(), test::split_kv_forced_split(),
                                          grids::soft_cap_decode_grid(), 300, "soft cap split");
  CHECK(ran > 5);
}

TEST_CASE("soft cap: small cases of each stage that caps (the sanitizer subset)") {
  using namespace stages::harness;
  std::vector<CaseSpec> cases;
  for (int kv_len : {1, 40, 300}) {
    CaseSpec c;
    c.mode = Mode::decode;
    c.logits_soft_cap = 5.0;
    c.q_range = 8.0;
    c.batch_size = 3;
    c.kv_len = kv_len;
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = kv_len == 40 ? 64 : 128;
    c.dtype = kv_len == 300 ? DType::bf16 : DType::f16;
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  const auto ran = check_grid(cases);
  CHECK(ran.count("03_split_kv") == 1);
}
