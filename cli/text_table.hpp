// Aligned plain-text tables for the terminal (the CLI's tables, e.g. the validation
// table), and the "[a, b, c]" list format the course uses.
#pragma once

#include <algorithm>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace flashstep::cli {

/// A table of strings printed with columns padded to their widest cell.
class TextTable {
 public:
  /// \param header one title per column
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  /// Appends a row; it must have as many cells as the header.
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  /// Prints the header, a rule, then the rows; every line starts with `indent`.
  void print(std::ostream& os, const std::string& indent = "") const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (size_t c = 0; c < r.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], display_width(r[c]));
    auto line = [&](const std::vector<std::string>& r) {
      std::string out = indent;
      for (size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < r.size() ? r[c] : "";
        out += cell;
        if (c + 1 < width.size()) out += std::string(width[c] - display_width(cell) + 2, ' ');
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
      os << out << "\n";
    };
    line(rows_[0]);
    std::vector<std::string> rule;
    for (size_t w : width) rule.push_back(std::string(w, '-'));
    line(rule);
    for (size_t i = 1; i < rows_.size(); ++i) line(rows_[i]);
  }

  /// Terminal columns of UTF-8 text (counts code points, not bytes).
  static size_t display_width(const std::string& s) {
    size_t n = 0;
    for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
    return n;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// `text` with `pad` put in front of every line.
inline std::string indent_lines(const std::string& text, const std::string& pad) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) out += pad + line + "\n";
  return out;
}

/// "[1, 2, 3]" for any streamable element type.
template <typename Seq>
std::string format_list(const Seq& values) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const auto& v : values) {
    os << (first ? "" : ", ") << v;
    first = false;
  }
  os << "]";
  return os.str();
}

}  // namespace flashstep::cli
