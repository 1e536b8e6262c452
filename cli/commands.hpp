// The four subcommands of `flashstep`, as functions of parsed options (main.cpp owns the
// command line; these own the work). Each returns the process exit code:
//   0 every check passed, 1 a check failed, 77 nothing could run here (no GPU / no CUDA
//   build; the test-suite convention for "skipped").
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace flashstep::cli {

/// Exit code of a command that had nothing it could run on this machine.
constexpr int kExitSkipped = 77;

/// Sections of `flashstep tour`, in the order they are told.
const std::vector<std::string>& tour_sections();
/// Sections of `flashstep explain` (the tour's, less the worked-example-only ones).
const std::vector<std::string>& explain_sections();

/// Options of `flashstep tour`.
struct TourOptions {
  std::vector<std::string> sections;  ///< empty = all, in tour order
  bool no_gpu = false;                ///< skip the GPU part even where a GPU is present
  uint64_t seed = 0;                  ///< seed of every random value the tour draws
};
/// Runs the tour; prints PASS/FAIL last.
int run_tour(const TourOptions& opt, std::ostream& os);

/// Options of `flashstep explain`.
struct ExplainOptions {
  std::vector<std::string> prompts;   ///< one request per prompt
  int page_size = 1;                  ///< tokens per KV page (Bc)
  int br = 4;                         ///< the larger query tile shown next to Br = 1
  std::vector<std::string> sections;  ///< empty = all
  uint64_t seed = 0;                  ///< seed of the random K/V used by the checks
};
/// Prints the tour's views for any prompts; prints PASS/FAIL last.
int run_explain(const ExplainOptions& opt, std::ostream& os);

/// Options of `flashstep validate`.
struct ValidateOptions {
  std::vector<std::string> stages;  ///< empty = every registered stage
  bool quick = false;               ///< the quick case grid
  bool list = false;                ///< only list the registered stages
  uint64_t seed = 0;                ///< seed of the random cases
};
/// Validates stages against the reference; progress goes to `progress`, the table to `os`.
int run_validate(const ValidateOptions& opt, std::ostream& os, std::ostream& progress);

/// Options of `flashstep bench`.
struct BenchOptions {
  std::string out;                          ///< results JSON path
  bool quick = false;                       ///< fewer shapes and repeats
  std::string filter;                       ///< only benchmarks whose name matches (regex)
  std::string shapes = "bench/shapes.csv";  ///< shapes file, relative to the source tree or absolute
};
/// Runs the benchmark and writes the results JSON.
int run_bench(const BenchOptions& opt, std::ostream& os);

/// Options of `flashstep serve` (stage 09's engine on a seeded workload).
struct ServeOptions {
  int64_t requests = 64;                                           ///< requests in the arrival schedule
  uint64_t seed = 0;                                               ///< schedule and sampling seed
  double arrivals_per_step = 8;                                    ///< Poisson mean of arrivals per step
  int64_t min_prompt = 16, max_prompt = 128;                       ///< own prompt length range
  int64_t min_new = 16, max_new = 64;                              ///< new tokens range
  int64_t shared_prefix_len = 0;                                   ///< > 0: two shared prefixes of this length
  double shared_fraction = 0.75;                                   ///< of prompts opening with one
  int64_t d_model = 1024, layers = 4, qo_heads = 8, kv_heads = 2;  ///< the model
  std::string dtype = "f16";                                       ///< f16 or bf16
  int64_t page_size = 16;                                          ///< tokens per page
  int64_t num_pages = 0;                                           ///< 0: room for every request at once
  int64_t max_running = 64;                                        ///< requests running at once
  int64_t budget = 2048;                                           ///< query tokens per step
  bool no_sharing = false;                                         ///< turn prefix sharing off
  std::string sampling = "greedy";                                 ///< greedy or sample
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  std::string decode_stage, prefill_stage;  ///< empty: the default rule
  bool profile = false;                     ///< per-step phase timing (CUDA events)
  bool cascade = false;                     ///< decode rows sharing pages go to stage 05
  bool one_launch = false;                  ///< a mixed step's attention in one launch (POD)
  bool default_gemms = false;               ///< projections by cublasGemmEx's default algorithm, untuned
  bool fused_rope = false;                  ///< RoPE in the attention stages' loads, no RoPE kernel
  int64_t show_step = -1;                   ///< >= 0: print this step's arrays, stages and tokens
  bool cuda_graphs = false;                 ///< decode steps as CUDA graphs at padded batch sizes
  int64_t shared_prefixes = 2;              ///< distinct shared prefixes (with shared_prefix_len)
  /// Measure and write a results file here (serve_measure.cpp): each variant run twice
  /// (without events: the time of each step; with: its phases), the read ceiling and the
  /// launch floor measured in the same process, the floor of each decode step, the goals.
  std::string json;
  std::string what = "serve";  ///< the workload's name in the results (rows, file)
  std::string note;            ///< recorded with the results
  /// The variants to measure: eager and CUDA graphs (default), or, with prefix_study,
  /// prefix sharing with the cascade, sharing alone and no sharing, each eager and with
  /// CUDA graphs (the first request alone at step 0, the others at step 1, so that they
  /// find its prefix cached).
  bool prefix_study = false;
  std::string command;  ///< the command line, recorded in the results
};
/// Runs the engine; prints the run (and the timing split with profile).
int run_serve(const ServeOptions& opt, std::ostream& os);

/// Options of `flashstep exercise` (list, check, hint).
struct ExerciseOptions {
  std::string action;            ///< "list", "check" or "hint"
  std::string which;             ///< check, hint: the exercise's number or name
  std::optional<uint64_t> seed;  ///< check: the seed of a CPU exercise's random inputs
};
/// Lists the exercises, runs one's built program (returning its exit code) or prints its hint.
int run_exercise_command(const ExerciseOptions& opt, std::ostream& os);

/// The part of the tour that needs a GPU: validate every registered stage (on the quick
/// grid when `quick`) and print a table (stage, cases, max error, pass, time), or say why
/// it was skipped.
/// \param why_skipped if given, set to the reason when the part is skipped
/// \return 0 pass, 1 fail, kExitSkipped skipped
int tour_gpu_part(bool quick, uint64_t seed, std::ostream& os, std::string* why_skipped = nullptr);

/// Whether this build has the CUDA stages compiled in.
bool stages_built();

/// Whether a CUDA GPU can run the stages; if not, `why` says so in a user's words ("no
/// CUDA GPU found" where the machine has no NVIDIA device). Only in builds with stages.
bool usable_gpu(std::string* why);

}  // namespace flashstep::cli
