#include "shapes.hpp"

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
  bool header_seen = false;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.empty() || line[0] == '#') continue;
    if (!header_seen) {  // the column names; order is fixed, see the file
      header_seen = true;
      continue;
    }
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) f.push_back(cell);
    const std::string where = path + ":" + std::to_string(line_no);
    ref::require(f.size() == 11, fn, where + ": expected 11 fields, got " + std::to_string(f.size()));
    auto number = [&](size_t i, const char* what) {
      try {
        return std::stoi(f[i]);
      } catch (const std::exception&) {
        throw ref::InvalidArgument(std::string(fn) + ": " + where + ": " + what + " is not a number (\"" + f[i] + "\")");
      }
    };
    BenchShape s;
    s.name = f[0];
    s.set = f[1];
    s.spec.mode = stages::Mode::decode;
    s.spec.batch_size = number(2, "batch");
    s.spec.kv_len = number(3, "kv_len");
    s.spec.num_qo_heads = number(4, "num_qo_heads");
    s.spec.num_kv_heads = number(5, "num_kv_heads");
    s.spec.head_dim = number(6, "head_dim");
    s.spec.page_size = number(7, "page_size");
    s.spec.dtype = stages::parse_dtype(f[8]);
    s.spec.kv_layout = ref::parse_kv_layout(f[9]);
    ref::require(f[10] == "sequential" || f[10] == "shuffled", fn,
                 where + ": page_order must be sequential or shuffled (got \"" + f[10] + "\")");
    s.spec.page_order = f[10] == "sequential" ? stages::harness::PageOrder::sequential
                                              : stages::harness::PageOrder::shuffled;
    s.spec.lengths = stages::harness::LengthPolicy::uniform;
    shapes.push_back(s);
  }
  return shapes;
}

}  // namespace flashstep::bench
