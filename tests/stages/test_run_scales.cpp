// The scales of a run (DeviceBatch::k_scale / v_scale): one plan of stages 02, 03 and 04,
// made with scales that none of its runs uses, serves runs on FP8 pools stored under
// different scales (a model's layers), each checked against the reference's attention of
// its own pool and scales; and StageInfo::unsupported_run_reason, on the host.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"
#include "harness/case.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep::stages;
using harness::CaseSpec;

namespace {

void check_one_plan_many_scales(const std::string& stage_name, CaseSpec spec) {
  const StageInfo& stage = find_stage(stage_name);
  const uint64_t seed = harness::case_seed(flashstep::test::run_seed(), "run scales " + spec.describe());
  CAPTURE(stage_name);
  CAPTURE(spec.describe());
  // The plan's scales: none of the runs below uses them.
  spec.k_scale = 0.5, spec.v_scale = 2.0;
  const harness::HostCase planned = harness::build_case(spec, stage.storage, seed);
  const BatchShape& shape = planned.layout.shape;
  REQUIRE(stage.unsupported_reason(shape).empty());
  std::unique_ptr<StageRunner> runner = stage.make_runner();
  harness::DeviceBuffer workspace(runner->workspace_bytes(shape));
  runner->plan(shape, workspace.get(), workspace.bytes(), nullptr);
  for (const std::pair<double, double>& scales :
       {std::pair{1.0 / 200, 0.0123}, std::pair{3.7, 1.0 / 3}, std::pair{1.0, 1.0}}) {
    spec.k_scale = scales.first, spec.v_scale = scales.second;
    CAPTURE(spec.k_scale);
    CAPTURE(spec.v_scale);
    const harness::HostCase host = harness::build_case(spec, stage.storage, seed);  // same lengths and pages
    REQUIRE(host.layout.shape.kv_indptr == shape.kv_indptr);
    REQUIRE(host.layout.kv_indices == planned.layout.kv_indices);
    const harness::DeviceCase dev(host);
    DeviceBatch batch = dev.batch();
    batch.k_scale = host.layout.shape.k_scale;  // the float scales the reference used
    batch.v_scale = host.layout.shape.v_scale;
    REQUIRE(stage.unsupported_run_reason(batch).empty());
    dev.poison_outputs(nullptr);
    runner->run(batch, nullptr);
    FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
    const harness::ValidationReport report = harness::compare_outputs(stage.name, host, dev.output(), dev.lse());
    CHECK_MESSAGE(report.passed, report.message());
  }
}

CaseSpec decode_spec(DType kv_dtype, int kv_len) {
  CaseSpec c;
  c.kv_dtype = kv_dtype;
  c.batch_size = 5;
  c.kv_len = kv_len;
  return c;
}

}  // namespace

TEST_CASE("run scales: one plan of 02_paged, 03_split_kv and 04_tensor_core serves runs with other scales") {
  for (const char* stage : {"02_paged", "03_split_kv", "04_tensor_core"}) {
    check_one_plan_many_scales(stage, decode_spec(DType::e4m3, 300));
    check_one_plan_many_scales(stage, decode_spec(DType::e5m2, 4000));  // long: stage 03 splits
  }
  CaseSpec prefill;
  prefill.mode = Mode::prefill;
  prefill.kv_dtype = DType::e4m3;
  prefill.batch_size = 3;
  prefill.qo_len = 70;
  prefill.kv_len = 500;
  prefill.causal = true;
  prefill.kv_layout = KVLayout::HND;
  check_one_plan_many_scales("04_tensor_core", prefill);
}

TEST_SUITE("host") {
TEST_CASE("run scales: unsupported_run_reason refuses bad scales, and scales where a stage applies none") {
  DeviceBatch b;
  const StageInfo& paged = find_stage("02_paged");
  const StageInfo& cascade = find_stage("05_cascade");
  CHECK(paged.unsupported_run_reason(b).empty());  // none given
  CHECK(cascade.unsupported_run_reason(b).empty());
  b.k_scale = 0.25f;
  CHECK(paged.unsupported_run_reason(b).empty());
  CHECK(cascade.unsupported_run_reason(b).find("does not apply k_scale or v_scale") != std::string::npos);
  b.k_scale = 1.f, b.v_scale = 1.f;  // 1 is no scale: any stage takes it
  CHECK(cascade.unsupported_run_reason(b).empty());
  for (float bad : {-1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    b.k_scale = 1.f, b.v_scale = bad;
    CHECK(paged.unsupported_run_reason(b).find("positive finite") != std::string::npos);
  }
}
}  // TEST_SUITE("host")
