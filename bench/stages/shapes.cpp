#include "shapes.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include "flashstep/reference/errors.hpp"

namespace flashstep::bench {

std::vector<BenchShape> load_shapes(const std::string& path) {
  const char* fn = "load_shapes";
  std::ifstream in(path);
  ref::require(in.good(), fn, "cannot open " + path);
  std::vector<BenchShape> shapes;
  std::string line;
  bool header_seen = false, prefill_format = false, shared_prefix = false, kv_columns = false, vo_column = false;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty() || line[0] == '#') continue;
    if (!header_seen) {  // the column names; order is fixed, see the files
      header_seen = true;
      prefill_format = line.rfind("name,set,mode,", 0) == 0;
      // bench/shapes_cascade.csv: the prefill columns and a last one, shared_prefix
      shared_prefix = prefill_format && line.size() >= 14 && line.compare(line.size() - 14, 14, ",shared_prefix") == 0;
      // bench/shapes_fp8.csv (decode columns) and bench/shapes_fp8_prefill.csv (prefill
      // columns): three last ones, the K/V dtype and scales
      const std::string kv_tail = ",kv_dtype,k_scale,v_scale";
      kv_columns = !shared_prefix && line.size() >= kv_tail.size() &&
                   line.compare(line.size() - kv_tail.size(), kv_tail.size(), kv_tail) == 0;
      // bench/shapes_mla_prefill.csv: the prefill columns and a last one, head_dim_vo
      const std::string vo_tail = ",head_dim_vo";
      vo_column = prefill_format && line.size() >= vo_tail.size() &&
                  line.compare(line.size() - vo_tail.size(), vo_tail.size(), vo_tail) == 0;
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    const std::string where = path + ":" + std::to_string(line_no);
    const size_t fields = shared_prefix || vo_column ? 16 : (prefill_format ? 15 : 11) + (kv_columns ? 3 : 0);
    ref::require(f.size() == fields, fn,
                 where + ": expected " + std::to_string(fields) + " fields, got " + std::to_string(f.size()));
    auto number = [&](size_t i, const char* what) {
      try {
        return std::stoi(f[i]);
      } catch (const std::exception&) {
        throw ref::InvalidArgument(std::string(fn) + ": " + where + ": " + what + " is not a number (\"" + f[i] +
                                   "\")");
      }
    };
    // The prefill format has mode and qo_len after set, causal and lengths at the end.
    const size_t o = prefill_format ? 2 : 0;
    BenchShape s;
    s.name = f[0];
    s.set = f[1];
    s.spec.mode = stages::Mode::decode;
    s.spec.lengths = stages::harness::LengthPolicy::uniform;
    if (prefill_format) {
      ref::require(f[2] == "decode" || f[2] == "prefill", fn,
                   where + ": mode must be decode or prefill (got \"" + f[2] + "\")");
      s.spec.mode = f[2] == "prefill" ? stages::Mode::prefill : stages::Mode::decode;
      s.spec.qo_len = number(4, "qo_len");
      s.spec.causal = number(13, "causal") != 0;
      ref::require(f[14] == "uniform" || f[14] == "spread", fn,
                   where + ": lengths must be uniform or spread (got \"" + f[14] + "\")");
      if (f[14] == "spread") s.spec.lengths = stages::harness::LengthPolicy::spread;
    }
    s.spec.batch_size = number(2 + (o ? 1 : 0), "batch");
    s.spec.kv_len = number(3 + o, "kv_len");
    s.spec.num_qo_heads = number(4 + o, "num_qo_heads");
    s.spec.num_kv_heads = number(5 + o, "num_kv_heads");
    s.spec.head_dim = number(6 + o, "head_dim");
    s.spec.page_size = number(7 + o, "page_size");
    s.spec.dtype = stages::parse_dtype(f[8 + o]);
    s.spec.kv_layout = ref::parse_kv_layout(f[9 + o]);
    ref::require(f[10 + o] == "sequential" || f[10 + o] == "shuffled", fn,
                 where + ": page_order must be sequential or shuffled (got \"" + f[10 + o] + "\")");
    s.spec.page_order = f[10 + o] == "sequential" ? stages::harness::PageOrder::sequential
                                                  : stages::harness::PageOrder::shuffled;
    if (kv_columns) {
      const size_t k = prefill_format ? 15 : 11;  // the K/V dtype's column
      const stages::DType kv = stages::parse_dtype(f[k]);
      if (kv != s.spec.dtype) s.spec.kv_dtype = kv;
      for (size_t i : {k + 1, k + 2}) {
        double scale = 0;
        try {
          scale = std::stod(f[i]);
        } catch (const std::exception&) {
        }
        ref::require(std::isfinite(scale) && scale > 0, fn,
                     where + ": " + (i == k + 1 ? "k_scale" : "v_scale") + " must be a positive number (got \"" + f[i] +
                         "\")");
        (i == k + 1 ? s.spec.k_scale : s.spec.v_scale) = scale;
      }
    }
    if (vo_column) {
      s.spec.head_dim_vo = number(15, "head_dim_vo");
      ref::require(s.spec.head_dim_vo >= 1, fn, where + ": head_dim_vo must be >= 1");
    }
    if (shared_prefix) {
      s.spec.shared_prefix = number(15, "shared_prefix");
      ref::require(s.spec.shared_prefix >= 0, fn, where + ": shared_prefix must be >= 0");
    }
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace flashstep::bench
