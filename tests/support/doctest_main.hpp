// What every flashstep test main shares: the seed line, and the rule that a run whose
// filters select no test case never passes (a CTest name that doctest cannot match,
// e.g. one CMake split at a ';', would otherwise run nothing and pass). Include it from
// the one file of a program that defines DOCTEST_CONFIG_IMPLEMENT.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "support/random.hpp"

namespace flashstep::test {

/// Remembers how many test cases passed the filters of the run.
struct SelectedCounter : doctest::IReporter {
  static inline unsigned selected = 0;
  explicit SelectedCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override { selected = stats.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("flashstep_selected_counter", 1, SelectedCounter);

constexpr int kSkipReturnCode = 77;  ///< CTest's SKIP_RETURN_CODE for the GPU suites

/// Whether the command line only asks doctest to list tests or suites.
inline bool listing_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--list", 0) == 0 || arg.rfind("-ltc", 0) == 0 || arg.rfind("-lts", 0) == 0) return true;
  }
  return false;
}

/// "<suite>: random seed N (reproduce with FLASHSTEP_SEED=N)".
inline void print_seed(const char* suite) {
  const auto seed = static_cast<unsigned long long>(run_seed());
  std::printf("%s: random seed %llu (reproduce with FLASHSTEP_SEED=%llu)\n", suite, seed, seed);
}

/// Runs `context`; a run that selected no test case fails with 2.
inline int run_selected(doctest::Context& context) {
  const int rc = context.run();
  if (SelectedCounter::selected == 0) {
    std::printf("FAIL: no test case matched the filters\n");
    return 2;
  }
  return rc;
}

/// A GPU suite: with a GPU, run_selected(); without one, only suite "host" runs and a run
/// left with no test case exits kSkipReturnCode, saying why (`why`).
inline int run_gpu_suite(doctest::Context& context, bool gpu, const std::string& why) {
  if (gpu) return run_selected(context);
  context.addFilter("test-suite", "host");
  const int rc = context.run();
  if (SelectedCounter::selected == 0) {
    std::printf("SKIPPED: no usable CUDA GPU (%s); this GPU test needs one\n", why.c_str());
    return kSkipReturnCode;
  }
  return rc;
}

}  // namespace flashstep::test
