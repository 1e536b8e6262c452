// `flashstep bench`: runs the benchmark program of the CUDA build and writes its results
// JSON (the file the docs' tables and plots are generated from).
#include "commands.hpp"

namespace flashstep::cli {

int run_bench(const BenchOptions&, std::ostream& os) {
  os << "flashstep bench: nothing to benchmark: the benchmark program (bench/, issue 5) is not "
        "part of this build yet.\n";
  return kExitSkipped;
}

}  // namespace flashstep::cli
