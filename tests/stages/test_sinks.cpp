// Attention sinks (stages/sinks/: a per-head logit in the softmax's denominator, FlashInfer's
// run(sinks=)), taken by stage 03's chunk kernel, stage 04's prefill kernel and stage 07's
// Hopper kernel through the on_state hook of kernels/attention_policy.cuh. The harness draws the sinks, the reference adds them
// (ref::AttentionOptions::sinks), and the stage must agree within the dtype's tolerances:
// on the grid, on plans forced to split (only the chunk that starts at key 0 may add the
// sink, or the merge would count it twice), and with the stages and shapes that refuse
// them saying so.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "04_tensor_core/tensor_core.hpp"
#include "07_hopper/hopper.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "flashstep/reference/errors.hpp"
#include "registry.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

TEST_SUITE("host") {

TEST_CASE("sinks: the stages that take them say so, and the rest refuse a run that gives them") {
  DeviceBatch batch;
  const float fake = 0.f;
  batch.sinks = &fake;  // never read: only whether it is given
  int taking = 0;
  for (const StageInfo& stage : registry()) {
    const std::string why = stage.unsupported_run_reason(batch);
    CAPTURE(stage.name);
    if (stage.sinks) {
      ++taking;
      CHECK(why.empty());
      CHECK(stage.capabilities().find("sinks") != std::string::npos);
    } else {
      CHECK(why == stage.name + " does not implement attention sinks");
    }
  }
  CHECK(find_stage("03_split_kv").sinks);
  CHECK(taking >= 1);
}

}  // TEST_SUITE("host")

TEST_CASE("sinks decode: every stage that takes them against the reference") {
  const auto ran = check_grid(grids::sinks_decode_grid());
  CHECK(ran.count("03_split_kv") == 1);
  for (const auto& [name, n] : ran) CHECK_MESSAGE(find_stage(name).sinks, name << " ran a sinks case");
}

TEST_CASE("sinks prefill: every stage that takes them against the reference") {
  const auto ran = check_grid(grids::sinks_prefill_grid());
  CHECK(ran.count("04_tensor_core") == 1);
  CHECK(ran.count("04_tensor_core_ragged") == 1);
  if (hopper::hopper_unavailable_reason().empty()) {  // a Hopper GPU: stage 07's kernel under the policy
    CHECK(ran.count("07_hopper") == 1);
    CHECK(ran.count("07_hopper_ragged") == 1);
  }
  for (const auto& [name, n] : ran) CHECK_MESSAGE(find_stage(name).sinks, name << " ran a sinks case");
}

TEST_CASE("sinks: forced splits (chunks that start past key 0 add no sink)") {
  int ran = test::check_with_runner(split_kv::stage_info(), test::split_kv_forced_split(), grids::sinks_decode_grid(),
                                    300, "sinks split");
  for (KVStorage storage : {KVStorage::paged, KVStorage::ragged})
    ran += test::check_with_runner(
        storage == KVStorage::paged ? tensor_core::stage_info() : tensor_core::ragged_stage_info(),
        test::tensor_core_forced_split(storage), grids::sinks_prefill_grid(), 100, "sinks split");
  if (hopper::hopper_unavailable_reason().empty())  // stage 07 in chunks of one key tile
    for (KVStorage storage : {KVStorage::paged, KVStorage::ragged}) {
      const StageInfo stage = storage == KVStorage::paged ? hopper::stage_info() : hopper::ragged_stage_info();
      std::vector<harness::CaseSpec> takes;  // the cases the entry takes (no group of 7, no paged head_dim 64)
      std::mt19937_64 rng(1);
      for (const harness::CaseSpec& c : grids::sinks_prefill_grid()) {
        const auto& layouts = stage.kv_layouts;  // (ragged K/V is NHD only)
        if (std::find(layouts.begin(), layouts.end(), c.kv_layout) == layouts.end()) continue;
        if (stage.unsupported_reason(harness::make_layout(harness::for_stage(c, stage), storage, rng).shape).empty())
          takes.push_back(c);
      }
      ran += test::check_with_runner(
          stage,
          [] {
            hopper::HopperOptions options;
            options.kv_chunk_size = 128;
            return std::make_unique<hopper::HopperRunner>(options);
          },
          takes, 200, "sinks split");
    }
  CHECK(ran > 10);
}

TEST_CASE("sinks: 03_split_kv's run refuses the shapes its sinks policy is not built for, by name") {
  using namespace stages::harness;
  for (const auto& [dtype, kv_dtype, want] : {std::tuple{DType::f32, DType::f32, "sinks need fp16 or bf16 q"},
                                              std::tuple{DType::bf16, DType::e4m3, "batch.sinks is given, but"}}) {
    CaseSpec spec;
    spec.mode = Mode::decode;
    spec.dtype = dtype;
    if (kv_dtype != dtype) spec.kv_dtype = kv_dtype;
    spec.batch_size = 2;
    spec.kv_len = 40;
    spec.sinks = true;
    const StageInfo& stage = find_stage("03_split_kv");
    const HostCase host = build_case(for_stage(spec, stage), stage.storage, 7);
    DeviceCase dev(host);
    std::unique_ptr<StageRunner> runner = stage.make_runner();
    DeviceBuffer ws(runner->workspace_bytes(host.layout.shape));
    runner->plan(host.layout.shape, ws.get(), ws.bytes(), nullptr);
    CHECK_THROWS_WITH_AS(runner->run(dev.batch(), nullptr), doctest::Contains(want), ref::InvalidArgument);
    CHECK_THROWS_WITH_AS(runner->run(dev.batch(), nullptr), doctest::Contains("SplitKVRunner::run"),
                         ref::InvalidArgument);
  }
}

TEST_CASE("sinks: 07_hopper's run refuses sinks with a soft cap (one policy a run), by name") {
  if (!hopper::hopper_unavailable_reason().empty()) return;  // stage 07 runs on Hopper only
  using namespace stages::harness;
  CaseSpec spec;
  spec.mode = Mode::prefill;
  spec.dtype = DType::bf16;
  spec.batch_size = 2;
  spec.qo_len = 5;
  spec.kv_len = 40;
  spec.causal = true;
  spec.sinks = true;
  spec.logits_soft_cap = 30.0;
  const StageInfo stage = hopper::ragged_stage_info();
  const HostCase host = build_case(for_stage(spec, stage), stage.storage, 7);
  DeviceCase dev(host);
  std::unique_ptr<StageRunner> runner = stage.make_runner();
  DeviceBuffer ws(runner->workspace_bytes(host.layout.shape));
  runner->plan(host.layout.shape, ws.get(), ws.bytes(), nullptr);
  CHECK_THROWS_WITH_AS(runner->run(dev.batch(), nullptr),
                       doctest::Contains("sinks and logits_soft_cap do not combine in stage 07"), ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(runner->run(dev.batch(), nullptr), doctest::Contains("HopperRunner::run"), ref::InvalidArgument);
}

TEST_CASE("sinks: small cases of each stage that takes them (the sanitizer subset)") {
  using namespace stages::harness;
  std::vector<CaseSpec> cases;
  for (Mode mode : {Mode::decode, Mode::prefill})
    for (int kv_len : {1, 40, 300}) {
      CaseSpec c;
      c.mode = mode;
      c.sinks = true;
      c.batch_size = 3;
      c.kv_len = kv_len;
      c.qo_len = mode == Mode::prefill ? std::min(kv_len, 33) : 1;
      c.causal = mode == Mode::prefill;
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = kv_len == 40 ? 64 : 128;
      c.dtype = kv_len == 300 ? DType::bf16 : DType::f16;
      c.lengths = LengthPolicy::ragged_with_empty;
      cases.push_back(c);
    }
  const auto ran = check_grid(cases);
  CHECK(ran.count("03_split_kv") == 1);
  CHECK(ran.count("04_tensor_core") == 1);
}
