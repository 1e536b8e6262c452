/// \file validate.hpp
/// \brief The validation harness: run a stage on a case and compare with the reference.
/// Used by the GPU tests, `flashstep validate` and the notebooks alike.
///
///     HostCase host = build_case(spec, stage.storage, seed);   // inputs + reference answer
///     ValidationReport r = run_and_compare(stage, host);        // poison, plan, run, compare
///     if (!r.passed) std::cout << r.message();                  // names positions and the seed
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "harness/case.hpp"
#include "harness/compare.hpp"
#include "stage.hpp"

namespace flashstep::stages::harness {

/// The outcome of one stage on one case.
struct ValidationReport {
  std::string stage;      ///< stage name
  std::string case_text;  ///< CaseSpec::describe()
  uint64_t seed = 0;      ///< the case's seed (build_case(spec, storage, seed) rebuilds it)
  Comparison o;           ///< output check
  Comparison lse;         ///< lse check
  bool passed = false;    ///< o.passed && lse.passed

  /// PASS/FAIL line with stage, case and seed, then each comparison's summary.
  std::string message() const;
};

/// Runs `stage` on an already built case: fresh runner, workspace, plan, NaN-poisoned
/// outputs, run, synchronize, compare o and lse under the dtype's tolerances.
/// Throws ref::InvalidArgument if the stage does not support the case's shape.
ValidationReport run_and_compare(const StageInfo& stage, const HostCase& host, cudaStream_t stream = nullptr);

/// Compares a stage's output `o` (nnz_qo, Hq, D) and `lse` (nnz_qo, Hq), as doubles, with
/// the reference answer of `host` under the dtype's tolerances: the check of
/// run_and_compare, for callers that run the stage themselves (CUDA-graph replays).
ValidationReport compare_outputs(const std::string& stage, const HostCase& host, const std::vector<double>& o,
                                 const std::vector<double>& lse);

/// build_case for the stage's storage, then run_and_compare.
ValidationReport validate(const StageInfo& stage, const CaseSpec& spec, uint64_t seed, cudaStream_t stream = nullptr);

/// The body of every stage exercise's main(): without a GPU it prints why and returns 77
/// (CTest's skip code); otherwise it validates `stage` on each case (seed derived from
/// `seed` and the case text, so a failure names a reproducible case), prints every
/// report and a final PASS/FAIL line, and returns 0 only if every case passed.
/// \param stage the learner's stage (its runner is the exercise's kernel)
/// \param cases the cases to validate, small edge cases first
/// \param seed the exercise's fixed seed
int run_exercise(const StageInfo& stage, const std::vector<CaseSpec>& cases, uint64_t seed);

}  // namespace flashstep::stages::harness
