// `flashstep validate`, `flashstep bench` and the tour's GPU part.
//
// They run the CUDA stages through the stage registry and the validation harness
// (flashstep::stages), which exist only in a CUDA build (FLASHSTEP_CLI_HAVE_STAGES). A
// build without them, or a machine without a GPU, says so and exits 77 ("skipped").
#include "commands.hpp"

#ifdef FLASHSTEP_CLI_HAVE_STAGES

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iomanip>
#include <map>
#include <future>
#include <optional>
#include <thread>
#include <sstream>

#include <flashstep/reference/errors.hpp>

#include "harness/cases.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "text_table.hpp"
#ifdef FLASHSTEP_CLI_HAVE_SAMPLING
#include "06_sampling/sampling.hpp"
#endif

namespace flashstep::cli {

namespace {

using stages::StageInfo;
using stages::harness::CaseSpec;

// The grids `validate` runs. Quick: the small cases the GPU suite runs under
// compute-sanitizer (every dtype, layout, head_dim, page sizes 1/16/64, GQA 7, an empty
// request). Full: every grid of the GPU suite.
std::vector<CaseSpec> case_grid(bool quick) {
  namespace g = stages::harness::grids;
  std::vector<std::vector<CaseSpec>> parts;
  if (quick) {
    parts = {g::decode_sanitizer_grid(), g::prefill_sanitizer_grid(), g::tensor_core_sanitizer_grid(),
             g::cascade_sanitizer_grid(), g::rope_sanitizer_grid()};
  } else {
    parts = {g::decode_edge_grid(),       g::decode_long_grid(),         g::decode_batch128_grid(),
             g::decode_group_grid(),      g::decode_ragged_grid(),       g::prefill_grid(),
             g::decode_contiguous_grid(), g::tensor_core_prefill_grid(), g::tensor_core_decode_grid(),
             g::cascade_grid(),           g::rope_decode_grid(),         g::rope_prefill_grid()};
  }
  std::vector<CaseSpec> all;
  for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

std::string sci(double x) {
  std::ostringstream os;
  os << std::setprecision(2) << std::scientific << x;
  return os.str();
}

// Whether a case of the grid is one the stage can take. A spec the stage's storage
// cannot express at all (e.g. an HND layout for ragged KV) is refused by make_layout with
// InvalidArgument: such a case does not apply either.
bool applies(const StageInfo& stage, const CaseSpec& spec, uint64_t seed) {
  std::mt19937_64 layout_rng(seed);
  try {
    return stage.supports(stages::harness::make_layout(spec, stage.storage, layout_rng).shape);
  } catch (const ref::InvalidArgument&) {
    return false;
  }
}

struct StageTally {
  int cases = 0;
  int failed = 0;
  double max_err_o = 0;
  double max_err_lse = 0;
  double seconds = 0;
};

// Validates `chosen` stages on `grid`; prints failures as they happen, progress to
// `progress`, and the table to `os`. Returns 0 if every case passed, 1 otherwise.
int validate_stages(const std::vector<const StageInfo*>& chosen, const std::vector<CaseSpec>& grid, uint64_t seed,
                    std::ostream& os, std::ostream& progress) {
  using namespace stages::harness;
  os << "Device: " << device_description() << "\n";
  os << "Run seed " << seed << " (reproduce with --seed " << seed << "); " << grid.size() << " cases in the grid.\n";
  std::map<std::string, StageTally> tally;
  int shown_failures = 0;
  size_t done = 0;
  auto last_report = std::chrono::steady_clock::now();
  // Building a case computes the reference answer in double on the CPU, which takes far
  // longer than the stage itself: build the next chunk of cases on every core while the
  // GPU runs them one by one.
  const size_t chunk = std::max(1u, std::thread::hardware_concurrency());
  for (size_t first = 0; first < grid.size(); first += chunk) {
    const size_t last = std::min(grid.size(), first + chunk);
    struct Built {
      uint64_t seed;
      std::optional<HostCase> host[2];  // per storage kind, only if some stage needs it
    };
    std::vector<std::future<Built>> futures;
    for (size_t i = first; i < last; ++i)
      futures.push_back(std::async(std::launch::async, [&, i] {
        Built b;
        b.seed = case_seed(seed, grid[i].describe());
        for (const StageInfo* stage : chosen) {
          auto& host = b.host[stage->storage == stages::KVStorage::paged ? 1 : 0];
          // (every registry stage that rotates under RoPE rounds the same way: for_stage)
          if (!host && applies(*stage, grid[i], b.seed))
            host = build_case(stages::harness::for_stage(grid[i], *stage), stage->storage, b.seed);
        }
        return b;
      }));
    for (size_t i = first; i < last; ++i) {
      const Built b = futures[i - first].get();
      for (const StageInfo* stage : chosen) {
        if (!applies(*stage, grid[i], b.seed)) continue;
        const HostCase& host = *b.host[stage->storage == stages::KVStorage::paged ? 1 : 0];
        const auto start = std::chrono::steady_clock::now();
        const ValidationReport report = run_and_compare(*stage, host);
        StageTally& t = tally[stage->name];
        t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        ++t.cases;
        t.max_err_o = std::max(t.max_err_o, report.o.max_abs_err);
        t.max_err_lse = std::max(t.max_err_lse, report.lse.max_abs_err);
        if (!report.passed) {
          ++t.failed;
          if (shown_failures++ < 5) os << report.message() << "\n";
        }
      }
      ++done;
      const auto now = std::chrono::steady_clock::now();
      if (now - last_report > std::chrono::seconds(2) || done == grid.size()) {
        progress << "\r[validate] " << done << "/" << grid.size() << " cases" << std::flush;
        last_report = now;
      }
    }
  }
  progress << "\n";

  TextTable table({"stage", "cases", "max error", "pass", "time"});
  bool all_pass = true;
  for (const StageInfo* stage : chosen) {
    const auto it = tally.find(stage->name);
    if (it == tally.end()) {
      table.add({stage->name, "0", "-", "no case fits", "-"});
      continue;
    }
    const StageTally& t = it->second;
    all_pass &= t.failed == 0;
    std::ostringstream secs;
    secs << std::fixed << std::setprecision(2) << t.seconds << " s";
    table.add({stage->name, std::to_string(t.cases), "o " + sci(t.max_err_o) + ", lse " + sci(t.max_err_lse),
               t.failed == 0 ? "PASS" : "FAIL (" + std::to_string(t.failed) + ")", secs.str()});
  }
  os << "\n";
  table.print(os, "  ");
  os << "  (max error: largest |stage - reference| over the cases; a case passes by the per-dtype\n"
        "   tolerance table, element-wise and norm-wise. time: the stage's plan, run and the\n"
        "   comparison, summed over its cases; the reference is computed beforehand.)\n";
  return all_pass ? 0 : 1;
}

bool gpu_ready(std::ostream& os, const char* what) {
  std::string why;
  if (usable_gpu(&why)) return true;
  os << what << why << ".\n";
  return false;
}

}  // namespace

bool usable_gpu(std::string* why) {
  std::string runtime_why;
  if (stages::harness::gpu_available(&runtime_why)) return true;
  // gpu_available says "no CUDA GPU found" where the machine has none; anything else is
  // the runtime's own error, worth quoting.
  *why = runtime_why == "no CUDA GPU found" ? runtime_why : "no usable GPU here (" + runtime_why + ")";
  return false;
}

bool stages_built() { return true; }

int tour_gpu_part(bool quick, uint64_t seed, std::ostream& os, std::string* why_skipped) {
  std::string why;
  if (!usable_gpu(&why)) {
    os << "GPU part skipped: " << why << ".\n";
    if (why_skipped) *why_skipped = why;
    return kExitSkipped;
  }
  std::vector<const StageInfo*> all;
  for (const StageInfo& s : stages::registry()) all.push_back(&s);
  os << "Every registered stage against the CPU reference, on the " << (quick ? "quick" : "full") << " case grid:\n";
  std::ostringstream progress;  // the tour prints no progress line
  return validate_stages(all, case_grid(quick), seed, os, progress);
}

namespace {

// Stages outside the attention registry, which `validate` cannot run, and where each
// one is validated instead.
struct OtherStage {
  const char* name;
  const char* where;
};
const OtherStage kOtherStages[] = {
    {"06_sampling",
     "its operators are not attention: flashstep_sampling_tests (in the build's bin/ folder, "
     "and under `ctest -L gpu`) checks them token for token against the reference"},
    {"08_context_parallel",
     "it runs one batch on several GPUs at once: flashstep_cp_tests checks it against the "
     "reference, on a machine with two or more GPUs (scripts/gpu-cp.sh)"},
    {"09_engine",
     "it runs the other stages step by step: flashstep_engine_tests (`ctest -L engine`) checks "
     "its host side, the 09_engine cases of flashstep_stage_tests (`ctest -L gpu`) its tokens "
     "against the reference's; `flashstep serve` runs it"},
    {"10_mla",
     "its batch is not the registry's (queries and two latent pools): the mla cases of "
     "flashstep_stage_tests (`ctest -L gpu`) check both of its kernels against the reference; "
     "flashstep.cuda's BatchMLAPagedAttentionWrapper runs it"},
};

const OtherStage* other_stage(const std::string& name) {
  for (const OtherStage& s : kOtherStages) {
    const std::string full = s.name;
    if (name == full || name == full.substr(0, full.find('_'))) return &s;
  }
  return nullptr;
}

// `validate --list`, for a terminal of 80 columns: one block per stage, lines wrapped.
constexpr size_t kListWidth = 80;

void list_stages(std::ostream& os) {
  os << "Attention stages (validate --stage NAME, or its number, runs one):\n";
  for (const StageInfo& s : stages::registry()) {
    os << "\n  " << s.name << "\n"
       << wrap_words(s.summary, kListWidth, "    ", "    ")
       << wrap_words("supports: " + s.capabilities(), kListWidth, "    ", "      ");
  }
  os << "\nValidated elsewhere:\n";
  for (const OtherStage& s : kOtherStages) {
    os << "\n  " << s.name << "\n" << wrap_words(s.where, kListWidth, "    ", "    ");
#ifdef FLASHSTEP_CLI_HAVE_SAMPLING
    if (std::string(s.name) == "06_sampling")
      for (const auto& op : stages::sampling::operators())
        os << wrap_words(op.name + " (" + op.input + " -> " + op.output + "): " + op.summary, kListWidth, "    - ",
                         "      ");
#endif
  }
}

}  // namespace

int run_validate(const ValidateOptions& opt, std::ostream& os, std::ostream& progress) {
  if (opt.list) {
    list_stages(os);
    return 0;
  }
  std::vector<const StageInfo*> chosen;
  bool asked_for_other = false;
  for (const std::string& name : opt.stages) {
    if (const OtherStage* other = other_stage(name)) {
      os << "flashstep validate: " << other->name << " is not validated by this command: " << other->where << ".\n";
      asked_for_other = true;
      continue;
    }
    try {
      chosen.push_back(&stages::find_stage(name));
    } catch (const ref::InvalidArgument& e) {  // "find_stage: no stage named ..." -> the flag
      const std::string what = e.what();
      throw ref::InvalidArgument("--stage: " + what.substr(what.find(": ") + 2));
    }
  }
  if (chosen.empty() && asked_for_other) return kExitSkipped;  // nothing left to run here
  if (chosen.empty())
    for (const StageInfo& s : stages::registry()) chosen.push_back(&s);
  if (!gpu_ready(os, "flashstep validate: nothing to validate: ")) return kExitSkipped;
  const int rc = validate_stages(chosen, case_grid(opt.quick), opt.seed, os, progress);
  os << (rc == 0 ? "PASS" : "FAIL") << ": " << chosen.size() << " stage" << (chosen.size() == 1 ? "" : "s")
     << " against the reference\n";
  return rc;
}

}  // namespace flashstep::cli

#else  // no CUDA stages in this build

namespace flashstep::cli {

namespace {
const char* kNoStages =
    "this build has no CUDA stages (no nvcc was found when it was configured, or it was "
    "configured with -DFLASHSTEP_ENABLE_CUDA=OFF)";
}

bool stages_built() { return false; }

int tour_gpu_part(bool, uint64_t, std::ostream& os, std::string* why_skipped) {
  os << "GPU part skipped: " << kNoStages << ".\n";
  if (why_skipped) *why_skipped = "this build has no CUDA stages";
  return kExitSkipped;
}

int run_validate(const ValidateOptions&, std::ostream& os, std::ostream&) {
  os << "flashstep validate: nothing to validate: " << kNoStages << ".\n";
  return kExitSkipped;
}

}  // namespace flashstep::cli

#endif
