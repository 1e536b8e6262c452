// Benchmark shapes, read from bench/shapes*.csv (the same files bench/peers/attention.py reads):
// decode (shapes.csv), prefill (shapes_prefill.csv), with a shared prefix
// (shapes_cascade.csv), and decode over an FP8 cache beside a bf16 one (shapes_fp8.csv:
// the decode columns, then kv_dtype, k_scale and v_scale).
#pragma once

#include <string>
#include <vector>

#include "harness/case.hpp"

namespace flashstep::bench {

/// One row of shapes.csv.
struct BenchShape {
  std::string name;                ///< e.g. "b128_kv8192_p16"
  std::string set;                 ///< "target", "sweep" or "extra"
  stages::harness::CaseSpec spec;  ///< the batch: mode, lengths, shared prefix, ...
};

/// Parses `path`; throws ref::InvalidArgument naming the file, line and field on a bad row.
std::vector<BenchShape> load_shapes(const std::string& path);

}  // namespace flashstep::bench
