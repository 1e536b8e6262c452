// The validation harness: one function every check of a stage goes through.
#include "harness/validate.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <sstream>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "harness/device.hpp"

namespace flashstep::stages::harness {

std::string ValidationReport::message() const {
  std::ostringstream s;
  s << (passed ? "PASS " : "FAIL ") << stage << " on " << case_text << " (case seed " << seed << ")\n"
    << "  " << o.summary() << "\n  " << lse.summary() << "\n";
  return s.str();
}

ValidationReport run_and_compare(const StageInfo& stage, const HostCase& host, cudaStream_t stream) {
  const BatchShape& shape = host.layout.shape;
  const std::string reason = stage.unsupported_reason(shape);
  ref::require(reason.empty(), "run_and_compare", "stage cannot run " + shape.describe() + ": " + reason);
  ref::require(host.spec.rope_rounded == for_stage(host.spec, stage).rope_rounded, "run_and_compare",
               "the case's reference rounds the rotated q and k " + std::string(host.spec.rope_rounded ? "" : "not ") +
                   "to the dtype, " + stage.name + " does the opposite: build it from for_stage(spec, stage)");

  ref::require(!host.spec.sinks || stage.sinks, "run_and_compare",
               stage.name + " does not implement attention sinks; the case has them: " + host.spec.describe());

  DeviceCase dev(host);
  std::unique_ptr<StageRunner> runner = stage.make_runner();
  DeviceBuffer workspace(runner->workspace_bytes(shape));
  runner->plan(shape, workspace.get(), workspace.bytes(), stream);
  dev.poison_outputs(stream);
  runner->run(dev.batch(), stream);
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));

  return compare_outputs(stage.name, host, dev.output(), dev.lse());
}

ValidationReport compare_outputs(const std::string& stage, const HostCase& host, const std::vector<double>& o,
                                 const std::vector<double>& lse) {
  const BatchShape& shape = host.layout.shape;
  ValidationReport r;
  r.stage = stage;
  r.case_text = host.spec.describe();
  r.seed = host.seed;
  const DTypeTolerance& tol = tolerance_for(shape.dtype, shape.resolved_kv_dtype());
  r.o = compare("o", o, host.expected.o.data, tol.o,
                output_label(shape.qo_indptr, shape.num_qo_heads, shape.resolved_head_dim_vo()));
  r.lse = compare("lse", lse, host.expected.lse.data, tol.lse, lse_label(shape.qo_indptr, shape.num_qo_heads));
  r.passed = r.o.passed && r.lse.passed;
  return r;
}

ValidationReport validate(const StageInfo& stage, const CaseSpec& spec, uint64_t seed, cudaStream_t stream) {
  return run_and_compare(stage, build_case(for_stage(spec, stage), stage.storage, seed), stream);
}

int run_exercise(const StageInfo& stage, const std::vector<CaseSpec>& cases, uint64_t seed) {
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("SKIPPED: the exercise needs a CUDA GPU (%s)\n", why.c_str());
    return 77;
  }
  int failed = 0;
  for (const CaseSpec& spec : cases) {
    const ValidationReport report = validate(stage, spec, case_seed(seed, spec.describe()));
    std::printf("%s", report.message().c_str());
    failed += !report.passed;
  }
  std::printf("%s: %d of %zu cases failed\n", failed ? "FAIL" : "PASS", failed, cases.size());
  return failed ? 1 : 0;
}

}  // namespace flashstep::stages::harness
