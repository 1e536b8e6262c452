// doctest's main for the GPU suite. Where no CUDA device is present, only the test
// cases of suite "host" (pure host code: comparison, tolerance table, case building)
// run; a GPU test case prints why it cannot run and exits with 77, which CTest's
// SKIP_RETURN_CODE reports as "Skipped", never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "harness/device.hpp"
#include "support/random.hpp"

namespace {

/// Remembers how many test cases passed the filters of the run.
struct FilterCounter : doctest::IReporter {
  static inline unsigned selected = 0;
  explicit FilterCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    selected = stats.numTestCasesPassingFilters;
  }
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
REGISTER_LISTENER("flashstep_filter_counter", 1, FilterCounter);

constexpr int kSkipReturnCode = 77;  // tests/stages/CMakeLists.txt: SKIP_RETURN_CODE

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  bool listing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--list", 0) == 0 || arg.rfind("-ltc", 0) == 0 || arg.rfind("-lts", 0) == 0) listing = true;
  }
  if (listing) return context.run();

  std::string why;
  const bool gpu = flashstep::stages::harness::gpu_available(&why);
  std::printf("flashstep GPU tests: random seed %llu (reproduce with FLASHSTEP_SEED=%llu)\n",
              static_cast<unsigned long long>(flashstep::test::run_seed()),
              static_cast<unsigned long long>(flashstep::test::run_seed()));
  if (gpu) {
    std::printf("device: %s\n", flashstep::stages::harness::device_description().c_str());
    const int rc = context.run();
    if (FilterCounter::selected == 0) {  // a filter that matches nothing must not pass
      std::printf("FAIL: no test case matched the filters\n");
      return 2;
    }
    return rc;
  }
  context.addFilter("test-suite", "host");
  const int rc = context.run();
  if (FilterCounter::selected == 0) {
    std::printf("SKIPPED: no usable CUDA GPU (%s); this GPU test needs one\n", why.c_str());
    return kSkipReturnCode;
  }
  return rc;
}
