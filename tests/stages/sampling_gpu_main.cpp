// doctest's main for the stage 06 suites (flashstep_sampling_tests and the GPU
// statistics). Like gpu_main.cpp, but without the attention harness, so the sampling
// suites build without the attention stages: with no CUDA device only suite "host"
// runs, and a run left with no test case exits 77 (CTest: Skipped), saying why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "sampling_support.hpp"
#include "support/random.hpp"

namespace {

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
REGISTER_LISTENER("flashstep_sampling_selected", 1, SelectedCounter);

constexpr int kSkipReturnCode = 77;

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--list", 0) == 0 || arg.rfind("-ltc", 0) == 0 || arg.rfind("-lts", 0) == 0) return context.run();
  }
  std::printf("flashstep sampling tests: random seed %llu (reproduce with FLASHSTEP_SEED=%llu)\n",
              static_cast<unsigned long long>(flashstep::test::run_seed()),
              static_cast<unsigned long long>(flashstep::test::run_seed()));
  std::string why;
  const bool gpu = flashstep::test::cuda_device_present(&why);
  if (!gpu) context.addFilter("test-suite", "host");
  const int rc = context.run();
  if (SelectedCounter::selected == 0) {
    if (!gpu) {
      std::printf("SKIPPED: no usable CUDA GPU (%s); this GPU test needs one\n", why.c_str());
      return kSkipReturnCode;
    }
    std::printf("FAIL: no test case matched the filters\n");
    return 2;
  }
  return rc;
}
