// `flashstep validate`, `flashstep bench` and the tour's GPU part. They need the CUDA
// stages (the registry and validation harness of issue 5); a build without them says so.
#include "commands.hpp"

namespace flashstep::cli {

bool stages_built() { return false; }

namespace {
const char* kNoStages =
    "this build has no CUDA stages (no nvcc was found when it was configured, or the stage "
    "registry has not landed yet)";
}

int tour_gpu_part(bool, uint64_t, std::ostream& os) {
  os << "GPU part skipped: " << kNoStages << ".\n";
  return kExitSkipped;
}

int run_validate(const ValidateOptions&, std::ostream& os, std::ostream&) {
  os << "flashstep validate: nothing to validate: " << kNoStages << ".\n";
  return kExitSkipped;
}

int run_bench(const BenchOptions&, std::ostream& os) {
  os << "flashstep bench: nothing to benchmark: " << kNoStages << ".\n";
  return kExitSkipped;
}

}  // namespace flashstep::cli
