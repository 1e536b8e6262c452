// FlashInfer's block-sparse view of a paged batch, attention by walking it, and printers.
#include "flashstep/reference/block_sparse.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string str(int64_t v) { return std::to_string(v); }

void check_page_table(const char* fn, const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                      const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                      int64_t page_size, int64_t num_pages) {
  require(page_size >= 1, fn, "page_size (Bc) must be >= 1, got " + str(page_size));
  require(num_pages >= 1, fn, "num_pages must be >= 1, got " + str(num_pages));
  check_indptr(fn, "qo_indptr", qo_indptr, -1, -1);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  check_indptr(fn, "kv_indptr", kv_indptr, batch + 1, static_cast<int64_t>(kv_indices.size()));
  require(static_cast<int64_t>(kv_last_page_len.size()) == batch, fn,
          "kv_last_page_len must have length batch_size = " + str(batch) + ", got " +
              str(static_cast<int64_t>(kv_last_page_len.size())));
  for (size_t n = 0; n < kv_indices.size(); ++n)
    require_lazy(kv_indices[n] >= 0 && kv_indices[n] < num_pages, fn, [&] {
      return "kv_indices[" + str(static_cast<int64_t>(n)) + "] = " + str(kv_indices[n]) +
             " is out of range for a pool of " + str(num_pages) + " pages";
    });
  for (int64_t i = 0; i < batch; ++i) {
    const bool has_pages = kv_indptr[i + 1] > kv_indptr[i];
    const int32_t lpl = kv_last_page_len[i];
    require(has_pages ? (lpl >= 1 && lpl <= page_size) : lpl == 0, fn,
            "kv_last_page_len[" + str(i) + "] = " + str(lpl) +
                (has_pages ? " must be in 1..page_size (" + str(page_size) + ")"
                           : " must be 0 for a request with no pages"));
  }
}

// The view's own consistency, so that a hand-edited view cannot make a reader go out of
// bounds (the walk and the printers index every array through the others).
void check_view(const char* fn, const BlockSparseView& v) {
  require(v.Br >= 1 && v.Bc >= 1 && v.num_pages >= 1, fn, "view.Br, view.Bc and view.num_pages must be >= 1");
  check_indptr(fn, "view.qo_indptr", v.qo_indptr, static_cast<int64_t>(v.kv_len.size()) + 1, -1);
  check_indptr(fn, "view.row_indptr", v.row_indptr, v.num_row_blocks() + 1, v.qo_indptr.back());
  check_indptr(fn, "view.indptr", v.indptr, v.num_row_blocks() + 1, v.nnz_blocks());
  require(v.block_kv_start.size() == v.indices.size() && v.block_kv_len.size() == v.indices.size(), fn,
          "view.block_kv_start and view.block_kv_len must have one entry per block");
  for (size_t r = 0; r < v.kv_len.size(); ++r)
    require(v.kv_len[r] >= 0, fn, "view.kv_len[" + str(static_cast<int64_t>(r)) + "] must be >= 0");
  for (int64_t b = 0; b < v.num_row_blocks(); ++b) {
    const int32_t r = v.row_request[static_cast<size_t>(b)];
    require(r >= 0 && r < v.batch_size() && v.row_indptr[b] >= v.qo_indptr[r] &&
                v.row_indptr[b + 1] <= v.qo_indptr[r + 1],
            fn, "view.row_request[" + str(b) + "] does not own the rows of row block " + str(b));
  }
  for (int64_t n = 0; n < v.nnz_blocks(); ++n)
    require(v.indices[n] >= 0 && v.indices[n] < v.num_pages && v.block_kv_len[n] >= 1 && v.block_kv_len[n] <= v.Bc &&
                v.block_kv_start[n] >= 0,
            fn, "view block " + str(n) + " has a page id, start or length out of range");
}

std::string default_request_name(int64_t r) {
  return r < 26 ? std::string(1, static_cast<char>('A' + r)) : "R" + str(r);
}

// Display columns of UTF-8 text.
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string center(const std::string& s, size_t width) {
  const size_t len = columns(s);
  if (len >= width) return s;
  const size_t left = (width - len) / 2;
  return std::string(left, ' ') + s + std::string(width - len - left, ' ');
}

std::string pad_right(const std::string& s, size_t width) {
  const size_t len = columns(s);
  return len >= width ? s : s + std::string(width - len, ' ');
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

struct Labels {
  std::vector<std::string> request;  // per request
  std::vector<std::string> row;      // per packed query row
};

Labels make_labels(const char* fn, const BlockSparseView& v, const BlockSparseDrawOptions& o) {
  check_view(fn, v);
  const int64_t batch = v.batch_size();
  const int64_t nnz_qo = v.qo_indptr.empty() ? 0 : v.qo_indptr.back();
  require(o.request_names.empty() || static_cast<int64_t>(o.request_names.size()) == batch, fn,
          "request_names must be empty or hold batch_size = " + str(batch) + " names");
  require(o.row_names.empty() || static_cast<int64_t>(o.row_names.size()) == nnz_qo, fn,
          "row_names must be empty or hold one name per query row (" + str(nnz_qo) + ")");
  Labels l;
  for (int64_t r = 0; r < batch; ++r)
    l.request.push_back(o.request_names.empty() ? default_request_name(r) : o.request_names[static_cast<size_t>(r)]);
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t qo_len = v.qo_indptr[r + 1] - v.qo_indptr[r];
    for (int64_t i = 0; i < qo_len; ++i)
      l.row.push_back(l.request[static_cast<size_t>(r)] + ", pos " + str(v.kv_len[r] - qo_len + i));
  }
  if (!o.row_names.empty()) l.row = o.row_names;
  return l;
}

// "A, pos 0-2" for a row block (or the custom names of its first and last rows).
std::string row_block_label(const BlockSparseView& v, const Labels& l, const BlockSparseDrawOptions& o, int64_t b) {
  const int32_t first = v.row_indptr[b], last = v.row_indptr[b + 1] - 1;
  if (first == last) return l.row[static_cast<size_t>(first)];
  if (!o.row_names.empty()) return l.row[static_cast<size_t>(first)] + " .. " + l.row[static_cast<size_t>(last)];
  const int64_t r = v.row_request[b];
  const int64_t shift = v.kv_len[r] - (v.qo_indptr[r + 1] - v.qo_indptr[r]) - v.qo_indptr[r];
  return l.request[static_cast<size_t>(r)] + ", pos " + str(first + shift) + "-" + str(last + shift);
}

}  // namespace

BlockSparseView build_block_sparse(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                                   const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                                   int64_t page_size, int64_t num_pages, int64_t Br, bool causal, int window_left) {
  const char* fn = "build_block_sparse";
  check_page_table(fn, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size, num_pages);
  require(Br >= 1, fn, "Br must be >= 1, got " + str(Br));
  require(window_left >= -1, fn, "window_left must be -1 (off) or >= 0, got " + str(window_left));
  BlockSparseView v;
  v.Br = Br;
  v.Bc = page_size;
  v.num_pages = num_pages;
  v.causal = causal;
  v.window_left = window_left;
  v.qo_indptr = qo_indptr;
  v.row_indptr.push_back(0);
  v.indptr.push_back(0);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t num_pages_r = kv_indptr[r + 1] - kv_indptr[r];
    const int64_t kv_len = num_pages_r == 0 ? 0 : (num_pages_r - 1) * page_size + kv_last_page_len[r];
    v.kv_len.push_back(static_cast<int32_t>(kv_len));
    const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r];
    // Row blocks of Br queries, never crossing into the next request.
    for (int64_t i0 = 0; i0 < qo_len; i0 += Br) {
      const int64_t i1 = std::min(qo_len, i0 + Br);
      v.row_indptr.push_back(static_cast<int32_t>(qo_indptr[r] + i1));
      v.row_request.push_back(static_cast<int32_t>(r));
      for (int64_t k = 0; k < num_pages_r; ++k) {
        const int64_t j0 = k * page_size, j1 = std::min(kv_len, j0 + page_size);
        // Non-zero iff some (query, key) pair of the block survives the mask.
        bool any = false;
        for (int64_t i = i0; i < i1 && !any; ++i)
          for (int64_t j = j0; j < j1 && !any; ++j) any = key_visible(i, j, qo_len, kv_len, causal, window_left);
        if (!any) continue;
        v.indices.push_back(kv_indices[static_cast<size_t>(kv_indptr[r] + k)]);
        v.block_kv_start.push_back(static_cast<int32_t>(j0));
        v.block_kv_len.push_back(static_cast<int32_t>(j1 - j0));
      }
      v.indptr.push_back(static_cast<int32_t>(v.indices.size()));
    }
  }
  return v;
}

BlockSparseView build_block_sparse(const std::vector<int32_t>& qo_indptr, const PagedKVCache& cache, int64_t Br,
                                   bool causal, int window_left) {
  require(cache.pages.rank() == 5, "build_block_sparse",
          "paged_kv_cache must have rank 5, got shape " + shape_string(cache.pages.shape));
  return build_block_sparse(qo_indptr, cache.kv_indptr, cache.kv_indices, cache.kv_last_page_len, cache.page_size(),
                            cache.num_pages(), Br, causal, window_left);
}

AttentionResult block_sparse_attention(const Tensor& q, const PagedKVCache& cache, const BlockSparseView& v,
                                       const AttentionOptions& opt) {
  const char* fn = "block_sparse_attention";
  check_rank(fn, "q", q, 3);
  check_finite(fn, "q", q);
  check_rank(fn, "paged_kv_cache", cache.pages, 5);
  require(cache.pages.dim(1) == 2, fn, "paged_kv_cache dimension 1 must be 2 (K and V)");
  check_dim(fn, "paged_kv_cache", cache.pages, 4, q.dim(2), "head_dim, must match q");
  check_head_dim(fn, q.dim(2));
  check_heads(fn, q.dim(1), cache.num_kv_heads());
  require(v.Bc == cache.page_size() && v.num_pages == cache.num_pages(), fn,
          "the view (Bc " + str(v.Bc) + ", " + str(v.num_pages) + " pages) was not built for this pool (page_size " +
              str(cache.page_size()) + ", " + str(cache.num_pages()) + " pages)");
  require(opt.causal == v.causal && opt.window_left == v.window_left, fn,
          "opt.causal and opt.window_left must be the ones the view was built with (causal " + str(v.causal) +
              ", window_left " + str(v.window_left) + ")");
  check_attention_options(fn, opt);
  check_view(fn, v);
  require(v.qo_indptr.back() == q.dim(0), fn,
          "q has " + str(q.dim(0)) + " rows but the view's batch has " + str(v.qo_indptr.back()) + " queries");

  const int64_t num_qo_heads = q.dim(1), head_dim = q.dim(2);
  const int64_t group = num_qo_heads / cache.num_kv_heads();
  const double sm_scale = resolved_sm_scale(opt, head_dim);
  const double cap = opt.logits_soft_cap;
  // NaN-filled, so that a row the walk forgets cannot pass as a result.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  AttentionResult out{Tensor({q.dim(0), num_qo_heads, head_dim}, nan), Tensor({q.dim(0), num_qo_heads}, nan)};

  for (int64_t b = 0; b < v.num_row_blocks(); ++b) {
    const int32_t r = v.row_request[b];
    const int64_t qo_len = v.qo_indptr[r + 1] - v.qo_indptr[r], kv_len = v.kv_len[r];
    const int64_t rows = v.row_indptr[b + 1] - v.row_indptr[b];
    // Running state of every (query row, head) of the tile: m (max), l (sum), o (output).
    std::vector<double> m(static_cast<size_t>(rows * num_qo_heads), kNegInf);
    std::vector<double> l(m.size(), 0.0);
    std::vector<double> acc(m.size() * static_cast<size_t>(head_dim), 0.0);
    for (int32_t n = v.indptr[b]; n < v.indptr[b + 1]; ++n) {
      const int32_t page = v.indices[n];
      for (int64_t slot = 0; slot < v.block_kv_len[n]; ++slot) {
        const int64_t j = v.block_kv_start[n] + slot;  // key position in the request
        for (int64_t h = 0; h < num_qo_heads; ++h) {
          const int64_t kv_head = h / group;
          for (int64_t t = 0; t < rows; ++t) {
            const int64_t row = v.row_indptr[b] + t, i = row - v.qo_indptr[r];
            // The mask inside the block: Br > 1 loads keys some rows must not see.
            if (!key_visible(i, j, qo_len, kv_len, v.causal, v.window_left)) continue;
            double s = 0;
            for (int64_t d = 0; d < head_dim; ++d) {
              const double kd = cache.at(page, 0, slot, kv_head, d);
              require_lazy(std::isfinite(kd), fn,
                           [&] { return "K of page " + str(page) + ", slot " + str(slot) + " is not finite"; });
              s += q({row, h, d}) * kd;
            }
            s *= sm_scale;
            if (cap > 0) s = cap * std::tanh(s / cap);
            // Online softmax: rescale what was accumulated under the old max.
            const size_t st = static_cast<size_t>(t * num_qo_heads + h);
            const double m_new = std::max(m[st], s);
            const double rescale = std::exp(m[st] - m_new), p = std::exp(s - m_new);
            l[st] = l[st] * rescale + p;
            for (int64_t d = 0; d < head_dim; ++d) {
              const double vd = cache.at(page, 1, slot, kv_head, d);
              require_lazy(std::isfinite(vd), fn,
                           [&] { return "V of page " + str(page) + ", slot " + str(slot) + " is not finite"; });
              double& a = acc[st * static_cast<size_t>(head_dim) + static_cast<size_t>(d)];
              a = a * rescale + p * vd;
            }
            m[st] = m_new;
          }
        }
      }
    }
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t h = 0; h < num_qo_heads; ++h) {
        const int64_t row = v.row_indptr[b] + t;
        const size_t st = static_cast<size_t>(t * num_qo_heads + h);
        const bool empty = l[st] == 0.0;  // no visible key: the empty state
        out.lse({row, h}) = empty ? kNegInf : m[st] + std::log(l[st]);
        for (int64_t d = 0; d < head_dim; ++d)
          out.o({row, h, d}) = empty ? 0.0 : acc[st * static_cast<size_t>(head_dim) + static_cast<size_t>(d)] / l[st];
      }
  }
  return out;
}

std::string draw_block_sparse(const BlockSparseView& v, const BlockSparseDrawOptions& o) {
  const Labels labels = make_labels("draw_block_sparse", v, o);
  require(o.page_labels.empty() || static_cast<int64_t>(o.page_labels.size()) == v.num_pages, "draw_block_sparse",
          "page_labels must be empty or hold one label per pool page (" + str(v.num_pages) + ")");
  // Columns: the pages some block uses, ascending; who uses each.
  std::map<int32_t, std::set<int32_t>> users;
  for (int64_t b = 0; b < v.num_row_blocks(); ++b)
    for (int32_t n = v.indptr[b]; n < v.indptr[b + 1]; ++n) users[v.indices[n]].insert(v.row_request[b]);
  std::vector<int32_t> cols;
  std::vector<std::vector<std::string>> headers;
  std::vector<size_t> width;
  for (const auto& [page, who] : users) {
    cols.push_back(page);
    std::vector<std::string> h{"P" + str(page)};
    if (!o.page_labels.empty()) h.push_back("(" + o.page_labels[static_cast<size_t>(page)] + ")");
    if (o.show_sharing)
      h.push_back(who.size() > 1 ? "shared" : labels.request[static_cast<size_t>(*who.begin())] + "-only");
    size_t w = 6;
    for (const auto& s : h) w = std::max(w, columns(s));
    headers.push_back(h);
    width.push_back(w);
  }
  // Rows: one per row block, or one per query.
  struct Line {
    std::string label;
    int64_t block;  // row block whose cells this line shows, -1 for none
    bool first_of_block;
  };
  std::vector<Line> lines;
  for (int64_t b = 0; b < v.num_row_blocks(); ++b) {
    if (o.skip_empty_rows && v.indptr[b] == v.indptr[b + 1]) continue;
    if (!o.one_line_per_query) {
      lines.push_back({row_block_label(v, labels, o, b), b, true});
      continue;
    }
    const int32_t first = v.row_indptr[b], count = v.row_indptr[b + 1] - first;
    for (int32_t t = 0; t < count; ++t)
      lines.push_back({labels.row[static_cast<size_t>(first + t)], t == (count - 1) / 2 ? b : -1, t == 0});
  }
  size_t label_width = 0;
  for (const auto& ln : lines) label_width = std::max(label_width, columns(ln.label));
  label_width += 4;

  std::ostringstream os;
  const size_t header_rows = headers.empty() ? 0 : headers[0].size();
  for (size_t hr = 0; hr < header_rows; ++hr) {
    std::string s = std::string(label_width, ' ') + " ";
    for (size_t c = 0; c < cols.size(); ++c) s += center(headers[c][hr], width[c]) + " ";
    while (!s.empty() && s.back() == ' ') s.pop_back();
    os << s << "\n";
  }
  auto rule = [&](const char* left, const char* mid, const char* right) {
    std::string s = std::string(label_width, ' ') + left;
    for (size_t c = 0; c < cols.size(); ++c) s += repeat("─", width[c]) + (c + 1 < cols.size() ? mid : right);
    if (cols.empty()) s += right;
    return s + "\n";
  };
  os << rule("┌", "┬", "┐");
  for (size_t li = 0; li < lines.size(); ++li) {
    if (li > 0 && lines[li].first_of_block) os << rule("├", "┼", "┤");
    std::string s = pad_right(lines[li].label, label_width) + "│";
    for (size_t c = 0; c < cols.size(); ++c) {
      std::string cell;
      const int64_t b = lines[li].block;
      if (b >= 0)
        for (int32_t n = v.indptr[b]; n < v.indptr[b + 1]; ++n)
          if (v.indices[n] == cols[c]) cell = "P" + str(cols[c]);
      s += center(cell, width[c]) + "│";
    }
    os << s << "\n";
  }
  os << rule("└", "┴", "┘");
  return os.str();
}

std::string draw_block_sparse_lookup(const BlockSparseView& v, const BlockSparseDrawOptions& o) {
  const Labels labels = make_labels("draw_block_sparse_lookup", v, o);
  std::ostringstream os;
  for (int64_t b = 0; b < v.num_row_blocks(); ++b) {
    if (o.skip_empty_rows && v.indptr[b] == v.indptr[b + 1]) continue;
    os << row_block_label(v, labels, o, b) << " → pages [";
    for (int32_t n = v.indptr[b]; n < v.indptr[b + 1]; ++n) os << (n > v.indptr[b] ? ", P" : "P") << v.indices[n];
    os << "]\n";
  }
  return os.str();
}

}  // namespace flashstep::ref
