// `flashstep serve --json FILE`: the engine measured on a workload (serve_measure.cpp).
// Only in builds with the CUDA engine.
#pragma once

#include <ostream>
#include <vector>

#include "09_engine/arrival_schedule.hpp"
#include "09_engine/engine.hpp"
#include "commands.hpp"

namespace flashstep::cli {

/// Measures the variants of `opt` (eager and CUDA graphs, or the prefix study) on
/// `requests` with the engine `config` (serve's, built from `opt`), prints a summary and
/// the goals (MET / MISS), and writes the results file opt.json
/// (bench/serve/serve_results.hpp). Returns 0, or 1 where the file cannot be written.
int run_serve_measure(const ServeOptions& opt, const std::vector<stages::engine::Request>& requests,
                      const stages::engine::EngineConfig& config, std::ostream& os);

}  // namespace flashstep::cli
