// doctest's main for the stage 06 suites (flashstep_sampling_tests and the GPU
// statistics). Like gpu_main.cpp, but without the attention harness, so the sampling
// suites build without the attention stages: with no CUDA device only suite "host"
// runs, and a run left with no test case exits 77 (CTest: Skipped), saying why.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

#include <string>

#include "harness/gpu_present.hpp"
#include "sampling_support.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (flashstep::test::listing_only(argc, argv)) return context.run();
  flashstep::test::print_seed("flashstep sampling tests");
  std::string why;
  const bool gpu = flashstep::stages::harness::gpu_available(&why);
  return flashstep::test::run_gpu_suite(context, gpu, why);
}
