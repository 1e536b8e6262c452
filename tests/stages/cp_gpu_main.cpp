// doctest's main for stage 08 (context parallel). Three kinds of test case, by suite:
//   "host"      sharding, checks and the cost model: always run
//   "one_gpu"   world_size 1 on any CUDA GPU, with NCCL
//   "two_gpus"  world_size 2: needs two CUDA GPUs and NCCL
// A case whose needs are not met is filtered out; a run left with no case exits 77
// (CTest's SKIP_RETURN_CODE) and says what was missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

#include <cstdio>
#include <string>

#include "08_context_parallel/context_parallel.hpp"
#include "08_context_parallel/nccl_library.hpp"
#include "harness/device.hpp"

int main(int argc, char** argv) {
  namespace cp = flashstep::stages::context_parallel;
  doctest::Context context(argc, argv);
  if (flashstep::test::listing_only(argc, argv)) return context.run();
  flashstep::test::print_seed("flashstep context-parallel tests");
  std::string why, nccl_why;
  const bool gpu = flashstep::stages::harness::gpu_available(&why);
  const bool nccl = cp::nccl_library(&nccl_why) != nullptr;
  const int devices = gpu ? cp::device_count() : 0;
  std::string missing;
  if (!gpu) {
    missing = "no usable CUDA GPU (" + why + ")";
  } else if (!nccl) {
    missing = nccl_why;
  } else {
    std::printf("devices: %d; device 0: %s; NCCL %s\n", devices,
                flashstep::stages::harness::device_description().c_str(), cp::nccl_version().c_str());
    if (devices < 2) missing = "this test needs 2 CUDA GPUs, found " + std::to_string(devices);
  }
  if (!gpu || !nccl) context.addFilter("test-suite", "host");
  else if (devices < 2) context.addFilter("test-suite-exclude", "two_gpus");
  const int rc = context.run();
  if (flashstep::test::SelectedCounter::selected == 0) {
    std::printf("SKIPPED: %s\n", missing.empty() ? "no test case matched the filters" : missing.c_str());
    return missing.empty() ? 2 : flashstep::test::kSkipReturnCode;
  }
  return rc;
}
