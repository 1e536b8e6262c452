// Aligned plain-text tables for the terminal (the CLI's tables, e.g. the validation
// table), the display width and escaping of user text in them, and the "[a, b, c]" list
// format.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace flashstep::cli {

/// Decodes one UTF-8 code point of `s` at `i` and advances `i`; an invalid byte comes
/// back as -1 (and `i` moves past it alone).
inline int32_t next_code_point(const std::string& s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + static_cast<size_t>(len) > s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if ((byte(i + static_cast<size_t>(k)) & 0xC0) != 0x80) {
      ++i;
      return -1;
    }
    cp = (cp << 6) | (byte(i + static_cast<size_t>(k)) & 0x3F);
  }
  i += static_cast<size_t>(len);
  return cp;
}

/// Terminal columns of one code point: 0 for combining marks and zero-width characters,
/// 2 for East Asian wide and full-width characters and emoji, 1 otherwise (the common
/// ranges of Unicode's East Asian Width property; enough for prompts in a table).
inline int code_point_width(int32_t cp) {
  if ((cp >= 0x0300 && cp <= 0x036F) || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x20D0 && cp <= 0x20FF) ||
      (cp >= 0xFE00 && cp <= 0xFE0F) || cp == 0xFEFF)
    return 0;
  if ((cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0x303E) || (cp >= 0x3041 && cp <= 0x33FF) ||
      (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xA000 && cp <= 0xA4CF) ||
      (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0xFE30 && cp <= 0xFE4F) ||
      (cp >= 0xFF00 && cp <= 0xFF60) || (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x1F300 && cp <= 0x1F64F) ||
      (cp >= 0x1F900 && cp <= 0x1F9FF) || (cp >= 0x1F680 && cp <= 0x1F6FF) || (cp >= 0x20000 && cp <= 0x3FFFD))
    return 2;
  return 1;
}

/// Terminal columns of UTF-8 text.
inline size_t display_width(const std::string& s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    const int32_t cp = next_code_point(s, i);
    n += cp < 0 ? 4 : static_cast<size_t>(code_point_width(cp));  // an invalid byte shows as \xNN
  }
  return n;
}

/// User text made safe for one line of a table: control characters escaped (newline as
/// \n, tab as \t, others and invalid UTF-8 bytes as \xNN), and, when it is wider than
/// `max_columns` (0: no limit), cut to that many columns ending in "..." plus its length,
/// e.g. "aaaaaaaa...(5000 chars)".
inline std::string display_text(const std::string& s, size_t max_columns = 0) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < s.size(); ++chars) {
    const size_t at = i;
    const int32_t cp = next_code_point(s, i);
    char buf[8];
    if (cp == '\n') out += "\\n";
    else if (cp == '\t') out += "\\t";
    else if (cp == '\r') out += "\\r";
    else if (cp < 0 || cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) {
      for (size_t k = at; k < i; ++k) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(s[k]));
        out += buf;
      }
    } else {
      out.append(s, at, i - at);
    }
  }
  if (max_columns == 0 || display_width(out) <= max_columns) return out;
  const std::string tail = "...(" + std::to_string(chars) + " chars)";
  const size_t keep = max_columns > tail.size() + 1 ? max_columns - tail.size() : 1;
  std::string cut;
  size_t width = 0;
  for (size_t i = 0; i < out.size();) {
    const size_t at = i;
    const int32_t cp = next_code_point(out, i);
    const size_t w = cp < 0 ? 4 : static_cast<size_t>(code_point_width(cp));
    if (width + w > keep) break;
    width += w;
    cut.append(out, at, i - at);
  }
  return cut + tail;
}

/// "1 page", "2 pages": a count and its noun, singular or plural.
inline std::string count_of(int64_t n, const std::string& singular, const std::string& plural = "") {
  return std::to_string(n) + " " + (n == 1 ? singular : plural.empty() ? singular + "s" : plural);
}

/// A table of strings printed with columns padded to their widest cell.
class TextTable {
 public:
  /// \param header one title per column
  explicit TextTable(std::vector<std::string> header) : rows_{std::move(header)} {}
  /// Appends a row; it must have as many cells as the header.
  /// Control characters in a cell are escaped (display_text), so a row stays one line.
  void add(std::vector<std::string> row) {
    for (auto& cell : row) cell = display_text(cell);
    rows_.push_back(std::move(row));
  }
  /// Prints the header, a rule, then the rows; every line starts with `indent`.
  void print(std::ostream& os, const std::string& indent = "") const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], display_width(r[c]));
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

  /// Terminal columns of UTF-8 text (see cli::display_width).
  static size_t display_width(const std::string& s) { return cli::display_width(s); }

 private:
  std::vector<std::vector<std::string>> rows_;
};

/// `text` broken at spaces into lines of at most `width` terminal columns, the first
/// line starting with `first` and the others with `rest` (a word wider than the room
/// left stays whole on its own line). Ends with a newline.
inline std::string wrap_words(const std::string& text, size_t width, const std::string& first,
                              const std::string& rest) {
  std::istringstream in(text);
  std::string out, line = first;
  bool empty_line = true;
  for (std::string word; in >> word;) {
    if (!empty_line && display_width(line) + 1 + display_width(word) > width) {
      out += line + "\n";
      line = rest;
      empty_line = true;
    }
    line += (empty_line ? "" : " ") + word;
    empty_line = false;
  }
  return out + line + "\n";
}

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
