// `flashstep bench`: the benchmark policy in one command. Runs the benchmark program
// (flashstep_bench: ceilings and every stage on bench/shapes.csv), the peers
// (bench/peers/attention.py: PyTorch SDPA where PyTorch is installed, FlashInfer's decode wrappers
// where it imports too) in the same call, and merges
// both into the results JSON that the docs' tables and plots are generated from
// (bench/reports/merge_results.py). Without a GPU, or in a build without the benchmark, it says
// so and exits 77.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "flashstep/reference/errors.hpp"

#ifdef FLASHSTEP_CLI_HAVE_STAGES
#include "harness/device.hpp"
#endif

namespace flashstep::cli {

namespace {

// Folder of this executable: flashstep_bench is built next to it (build/bin).
std::string own_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  std::string path(buf.data(), static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// Single-quotes an argument for /bin/sh.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Why `bench_exe` is absent, and what builds it (a command line ends the message). scripts/tour.sh builds only the command
// and the stages, so the target is named; where it cannot exist, the reason is given.
std::string missing_bench_program(const std::string& bench_exe) {
#if defined(FLASHSTEP_CLI_HAVE_STAGES)
  const std::string bin = own_dir();
  const std::string build = quoted(bin.substr(0, bin.find_last_of('/')));
#if defined(FLASHSTEP_CLI_BENCH_CONFIGURED)
  return "the benchmark program is not built yet (" + bench_exe + "); build it with\n  cmake --build " + build +
         " --target flashstep_bench";
#else
  return "this build was configured with -DFLASHSTEP_BUILD_BENCH=OFF, so it has no benchmark program; "
         "configure " +
         build + " with -DFLASHSTEP_BUILD_BENCH=ON, then build the target flashstep_bench.";
#endif
#else
  return "this build has no CUDA stages to benchmark (" + bench_exe +
         " needs nvcc when CMake configures the "
         "build, and a GPU to run).";
#endif
}

int shell(const std::string& cmd, std::ostream& os) {
  os << "$ " << cmd << "\n" << std::flush;
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

int run_bench(const BenchOptions& opt, std::ostream& os) {
  const std::string bench_exe = own_dir() + "/flashstep_bench";
  const std::string source = FLASHSTEP_SOURCE_DIR;
  const std::string shapes = opt.shapes.rfind('/', 0) == 0 ? opt.shapes : source + "/" + opt.shapes;
  if (!exists(shapes)) throw ref::InvalidArgument("--shapes: no shapes file " + shapes);
  if (!exists(bench_exe)) {
    os << "flashstep bench: nothing to benchmark: " << missing_bench_program(bench_exe) << "\n";
    return kExitSkipped;
  }
#ifdef FLASHSTEP_CLI_HAVE_STAGES
  std::string why;
  if (!usable_gpu(&why)) {
    os << "flashstep bench: nothing to benchmark: " << why << ".\n";
    return kExitSkipped;
  }
#endif
  if (!exists(source + "/bench/reports/merge_results.py")) {
    os << "flashstep bench: the benchmark's scripts are not at " << source
       << "/bench (they are read from the source tree).\n";
    return 1;
  }
  char tmpl[] = "/tmp/flashstep-bench-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    os << "flashstep bench: cannot create a temporary folder under /tmp.\n";
    return 1;
  }
  const std::string tmp = dir;
  const char* commit_env = std::getenv("FLASHSTEP_COMMIT");
  const std::string commit = commit_env ? commit_env : "unknown";

  // 1. Ceilings and stages, medians of CUDA-event-timed repetitions.
  std::string cmd = "FLASHSTEP_COMMIT=" + quoted(commit) + " " + quoted(bench_exe) + " --shapes=" + quoted(shapes) +
                    (opt.quick ? " --sets=target" : "") + " --benchmark_out=" + quoted(tmp + "/bench.json") +
                    " --benchmark_out_format=json";
  if (!opt.filter.empty()) cmd += " --benchmark_filter=" + quoted(opt.filter);
  if (shell(cmd, os) != 0) {
    os << "FAIL: the benchmark program failed (its output is above).\n";
    return 1;
  }
  // 2. Peers in the same call, where PyTorch is installed.
  const std::string peers = tmp + "/peers.json";
  if (shell("python3 -c 'import torch' 2>/dev/null", os) == 0) {
    if (shell("python3 " + quoted(source + "/bench/peers/attention.py") + " --shapes " + quoted(shapes) + " --out " +
                  quoted(peers),
              os) != 0) {
      os << "FAIL: bench/peers/attention.py failed (its output is above).\n";
      return 1;
    }
  } else {
    os << "peers skipped: PyTorch is not installed here; the results hold the stages and "
          "ceilings only.\n";
    std::ofstream(peers) << "{\"results\": [], \"note\": \"PyTorch not installed\"}\n";
  }
  // 3. One results JSON: Google Benchmark's, with device, commit, date and the targets.
  // merge_results.py reads the commit and the tree's state from the build folder's
  // source-state.txt (scripts/gpu-build.sh writes it), else from git here.
  std::string merge = "python3 " + quoted(source + "/bench/reports/merge_results.py") + " --bench " +
                      quoted(tmp + "/bench.json") + " --peers " + quoted(peers) + " --shapes " + quoted(shapes) +
                      " --out " + quoted(opt.out);
  const std::string source_state = own_dir() + "/../source-state.txt";
  if (exists(source_state)) merge += " --source-state " + quoted(source_state);
  if (shell(merge, os) != 0) {
    os << "FAIL: merging the results failed (see above).\n";
    return 1;
  }
  os << "PASS: results written to " << opt.out
     << " (copy it to its stage's folder of docs/results/, e.g. docs/results/02_paged/, to regenerate the docs'"
        " tables and plots)\n";
  return 0;
}

}  // namespace flashstep::cli
