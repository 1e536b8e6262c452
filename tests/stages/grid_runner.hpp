// Runs every registry stage that can take a case on it, through the harness. Each test
// case of the GPU suite is one grid; a stage joins a grid by declaring (in its registry
// entry) that it supports the grid's shapes, so a new stage is tested without touching
// the tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "04_tensor_core/tensor_core.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

namespace flashstep::test {

/// Validates every supporting stage on every case of `grid`; returns how many
/// (stage, case) pairs ran per stage. Each failure prints the harness's report (stage,
/// case, seed, first five mismatches); after 10 failures the grid stops early.
inline std::map<std::string, int> check_grid(const std::vector<stages::harness::CaseSpec>& grid) {
  using namespace stages;
  using namespace stages::harness;
  std::map<std::string, int> ran;
  int failures = 0;
  for (const CaseSpec& spec : grid) {
    const std::string text = spec.describe();
    const uint64_t seed = case_seed(run_seed(), text);
    // one per storage kind and RoPE rounding (for_stage), built only if some stage needs it
    std::optional<HostCase> built[2][2];
    for (const StageInfo& stage : registry()) {
      const auto& layouts = stage.kv_layouts;
      if (std::find(layouts.begin(), layouts.end(), spec.kv_layout) == layouts.end()) continue;
      // Rows of contiguous (ragged) K/V cannot be shared: a shared-prefix case is paged only.
      if (stage.storage == KVStorage::ragged && (spec.shared_prefix > 0 || spec.group_prefix > 0)) continue;
      if (spec.sinks && !stage.sinks) continue;  // a run-time input, which StageInfo::sinks declares
      std::mt19937_64 layout_rng(seed);
      if (!stage.supports(make_layout(spec, stage.storage, layout_rng).shape)) continue;
      const CaseSpec stage_spec = for_stage(spec, stage);
      auto& host = built[stage.storage == KVStorage::paged ? 1 : 0][stage_spec.rope_rounded ? 1 : 0];
      if (!host) host = build_case(stage_spec, stage.storage, seed);
      const auto t0 = std::chrono::steady_clock::now();
      const ValidationReport report = run_and_compare(stage, *host);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (seconds > 2.0) std::printf("  slow: %.1f s for %s on %s\n", seconds, stage.name.c_str(), text.c_str());
      ++ran[stage.name];
      CHECK_MESSAGE(report.passed, report.message());
      if (!report.passed && ++failures >= 10) {
        FAIL("stopping this grid after 10 failures");
        return ran;
      }
    }
  }
  for (const auto& [name, count] : ran) std::printf("  %s: %d cases\n", name.c_str(), count);
  return ran;
}

/// Stage 03's runner on a small pretend device (4 SMs) told to split, into chunks of one page
/// and up: every batch splits, and every chunk but a request's first starts past key 0.
inline std::function<std::unique_ptr<stages::StageRunner>()> split_kv_forced_split() {
  stages::split_kv::SplitKVOptions options;
  options.min_kv_chunk_tokens = 16;
  options.num_sm = 4;
  options.path = stages::split_kv::PathChoice::split;
  return [options] { return std::make_unique<stages::split_kv::SplitKVRunner>(options); };
}

/// Stage 04's runner over `storage` with the KV cut into chunks of 64 keys.
inline std::function<std::unique_ptr<stages::StageRunner>()> tensor_core_forced_split(stages::KVStorage storage) {
  return [storage] {
    return std::make_unique<stages::tensor_core::TensorCoreRunner>(storage,
                                                                   stages::tensor_core::TensorCoreOptions{0, 64});
  };
}

/// Validates `stage`, its runner made by `make` (one with options that force what the test
/// is about: a split, a small ring), on every case of `grid` with at least `min_kv_len` keys;
/// returns how many ran. Each case's seed comes from `tag` and its text; after 5 failures it
/// stops early.
inline int check_with_runner(stages::StageInfo stage, std::function<std::unique_ptr<stages::StageRunner>()> make,
                             const std::vector<stages::harness::CaseSpec>& grid, int min_kv_len,
                             const std::string& tag) {
  using namespace stages::harness;
  stage.make_runner = std::move(make);
  int ran = 0, failures = 0;
  for (const CaseSpec& spec : grid) {
    if (spec.kv_len < min_kv_len) continue;
    const auto& layouts = stage.kv_layouts;
    if (std::find(layouts.begin(), layouts.end(), spec.kv_layout) == layouts.end()) continue;
    const ValidationReport r = validate(stage, spec,
                                        case_seed(run_seed(), tag + " " + stage.name + " " + spec.describe()));
    ++ran;
    CHECK_MESSAGE(r.passed, r.message());
    if (!r.passed && ++failures >= 5) break;
  }
  std::printf("  %s, %s: %d cases\n", stage.name.c_str(), tag.c_str(), ran);
  return ran;
}

}  // namespace flashstep::test
