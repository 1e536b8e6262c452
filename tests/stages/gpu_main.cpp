// doctest's main for the GPU suite. Where no CUDA device is present, only the test
// cases of suite "host" (pure host code: comparison, tolerance table, case building)
// run; a GPU test case prints why it cannot run and exits with 77, which CTest's
// SKIP_RETURN_CODE reports as "Skipped", never as passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

#include <cstdio>
#include <string>

#include "harness/device.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (flashstep::test::listing_only(argc, argv)) return context.run();
  std::string why;
  const bool gpu = flashstep::stages::harness::gpu_available(&why);
  flashstep::test::print_seed("flashstep GPU tests");
  if (gpu) std::printf("device: %s\n", flashstep::stages::harness::device_description().c_str());
  return flashstep::test::run_gpu_suite(context, gpu, why);
}
