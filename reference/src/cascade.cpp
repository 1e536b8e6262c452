// Cascade levels from shared prefix pages, attention merged level by level, and a printer.
#include "flashstep/reference/cascade.hpp"

#include <algorithm>
#include <sstream>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/merge.hpp"

namespace flashstep::ref {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Validates the flat batch; returns per-request (pages, kv_len, full pages).
struct RequestShape {
  int64_t pages, kv_len, full_pages, qo_len;
};

std::vector<RequestShape> check_batch(const char* fn, const std::vector<int32_t>& qo_indptr,
                                      const std::vector<int32_t>& kv_indptr, const std::vector<int32_t>& kv_indices,
                                      const std::vector<int32_t>& kv_last_page_len, int64_t page_size) {
  require(page_size >= 1, fn, "page_size must be >= 1, got " + str(page_size));
  check_indptr(fn, "qo_indptr", qo_indptr, -1, -1);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  require(batch >= 1, fn, "the batch must hold at least one request");
  check_indptr(fn, "kv_indptr", kv_indptr, batch + 1, static_cast<int64_t>(kv_indices.size()));
  require(static_cast<int64_t>(kv_last_page_len.size()) == batch, fn,
          "kv_last_page_len must have length batch_size = " + str(batch));
  // (per-element checks build their message only on failure: plan() of stage 05 runs
  // these every step, and a string per page id cost milliseconds a step)
  for (size_t n = 0; n < kv_indices.size(); ++n)
    require_lazy(kv_indices[n] >= 0, fn,
                 [&] { return "kv_indices[" + str(static_cast<int64_t>(n)) + "] must be >= 0"; });
  std::vector<RequestShape> shapes;
  shapes.reserve(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t pages = kv_indptr[r + 1] - kv_indptr[r];
    const int32_t lpl = kv_last_page_len[r];
    require_lazy(pages > 0 ? (lpl >= 1 && lpl <= page_size) : lpl == 0, fn, [&] {
      return "kv_last_page_len[" + str(r) + "] = " + str(lpl) +
             (pages > 0 ? " must be in 1..page_size" : " must be 0 for a request with no pages");
    });
    RequestShape s;
    s.pages = pages;
    s.kv_len = pages == 0 ? 0 : (pages - 1) * page_size + lpl;
    s.full_pages = pages == 0 ? 0 : (lpl == page_size ? pages : pages - 1);
    s.qo_len = qo_indptr[r + 1] - qo_indptr[r];
    shapes.push_back(s);
  }
  return shapes;
}

// A CascadeLevels' own consistency (hand-built ones included), before anything indexes it.
void check_levels(const char* fn, const CascadeLevels& c) {
  require(!c.levels.empty(), fn, "levels must hold at least one level");
  require(c.page_size >= 1, fn, "levels.page_size must be >= 1");
  check_indptr(fn, "levels.qo_indptr", c.qo_indptr, -1, -1);
  const int64_t batch = static_cast<int64_t>(c.qo_indptr.size()) - 1;
  for (size_t l = 0; l < c.levels.size(); ++l) {
    const CascadeLevel& level = c.levels[l];
    const std::string at = "level " + str(static_cast<int64_t>(l)) + " ";
    const int64_t groups = static_cast<int64_t>(level.kv_last_page_len.size());
    check_indptr(fn, (at + "qo_indptr").c_str(), level.qo_indptr, groups + 1, c.qo_indptr.back());
    check_indptr(fn, (at + "kv_indptr").c_str(), level.kv_indptr, groups + 1,
                 static_cast<int64_t>(level.kv_indices.size()));
    check_indptr(fn, (at + "request_indptr").c_str(), level.request_indptr, groups + 1, batch);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t pages = level.kv_indptr[g + 1] - level.kv_indptr[g];
      const int32_t lpl = level.kv_last_page_len[g];
      require_lazy(pages > 0 ? (lpl >= 1 && lpl <= c.page_size) : lpl == 0, fn, [&] {
        return at + "kv_last_page_len[" + str(g) + "] = " + str(lpl) + " does not fit its " + str(pages) + " pages";
      });
      require_lazy(level.qo_indptr[g] == c.qo_indptr[level.request_indptr[g]] &&
                       level.qo_indptr[g + 1] == c.qo_indptr[level.request_indptr[g + 1]],
                   fn, [&] { return at + "group " + str(g) + "'s queries are not those of its requests"; });
    }
    for (size_t n = 0; n < level.kv_indices.size(); ++n)
      require_lazy(level.kv_indices[n] >= 0, fn, [&] { return at + "kv_indices must be >= 0"; });
  }
}

}  // namespace

CascadeLevels build_cascade_levels(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                                   const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                                   int64_t page_size, const std::vector<std::vector<int32_t>>& level_page_ends,
                                   bool causal) {
  const char* fn = "build_cascade_levels";
  const auto shapes = check_batch(fn, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size);
  const int64_t batch = static_cast<int64_t>(shapes.size());
  const int64_t num_levels = static_cast<int64_t>(level_page_ends.size()) + 1;
  // start[l][r], end[l][r]: request r's pages [start, end) at level l.
  std::vector<std::vector<int64_t>> start(static_cast<size_t>(num_levels)), end(static_cast<size_t>(num_levels));
  for (int64_t l = 0; l < num_levels; ++l) {
    const bool last = l + 1 == num_levels;
    if (!last)
      require_lazy(static_cast<int64_t>(level_page_ends[l].size()) == batch, fn, [&] {
        return "level_page_ends[" + str(l) + "] must have one entry per request (" + str(batch) + ")";
      });
    start[l].reserve(static_cast<size_t>(batch));
    end[l].reserve(static_cast<size_t>(batch));
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t s = l == 0 ? 0 : end[l - 1][r];
      const int64_t e = last ? shapes[r].pages : level_page_ends[l][r];
      if (!last) {
        require_lazy(e >= s, fn, [&] {
          return "level_page_ends[" + str(l) + "][" + str(r) + "] = " + str(e) +
                 " must not be below the previous level's end " + str(s);
        });
        require_lazy(e <= shapes[r].full_pages, fn, [&] {
          return "level_page_ends[" + str(l) + "][" + str(r) + "] = " + str(e) + " exceeds request " + str(r) + "'s " +
                 str(shapes[r].full_pages) + " full pages (a partly filled page cannot be shared)";
        });
      }
      start[l].push_back(s);
      end[l].push_back(e);
    }
  }
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t suffix_pages = end.back()[r] - start.back()[r];
    const int64_t suffix_len = suffix_pages == 0 ? 0 : shapes[r].kv_len - start.back()[r] * page_size;
    require_lazy(!causal || shapes[r].qo_len <= suffix_len, fn, [&] {
      return "request " + str(r) + " has " + str(shapes[r].qo_len) + " queries but only " + str(suffix_len) +
             " keys in its last level: with causal, every query must come after the shared pages "
             "(shared levels are not masked, so a query inside them would see later keys); share fewer pages";
    });
  }

  // request r's pages at level l, in place
  auto seg_begin = [&](int64_t l, int64_t r) { return kv_indices.begin() + kv_indptr[r] + start[l][r]; };
  auto seg_end = [&](int64_t l, int64_t r) { return kv_indices.begin() + kv_indptr[r] + end[l][r]; };
  CascadeLevels out;
  out.page_size = page_size;
  out.qo_indptr = qo_indptr;
  std::vector<int64_t> parent(static_cast<size_t>(batch), 0);  // group id at the level above
  for (int64_t l = 0; l < num_levels; ++l) {
    const bool last = l + 1 == num_levels;
    CascadeLevel level;
    level.causal = last && causal;
    level.qo_indptr.push_back(0);
    level.kv_indptr.push_back(0);
    level.request_indptr.push_back(0);
    std::vector<int64_t> group(static_cast<size_t>(batch));
    for (int64_t r = 0; r < batch; ++r) {
      // Request r joins r-1's group iff same parent and identical pages at this level.
      const bool joins = r > 0 && !last && parent[r] == parent[r - 1] &&
                         std::equal(seg_begin(l, r), seg_end(l, r), seg_begin(l, r - 1), seg_end(l, r - 1));
      if (!joins) {
        if (r > 0) {
          level.qo_indptr.push_back(qo_indptr[r]);
          level.request_indptr.push_back(static_cast<int32_t>(r));
        }
        level.kv_indices.insert(level.kv_indices.end(), seg_begin(l, r), seg_end(l, r));
        level.kv_indptr.push_back(static_cast<int32_t>(level.kv_indices.size()));
        const bool has_last_page = last && end[l][r] == shapes[r].pages;
        const bool empty = end[l][r] == start[l][r];
        level.kv_last_page_len.push_back(
            empty ? 0 : (has_last_page ? kv_last_page_len[r] : static_cast<int32_t>(page_size)));
      }
      group[r] = static_cast<int64_t>(level.kv_last_page_len.size()) - 1;
    }
    level.qo_indptr.push_back(qo_indptr[batch]);
    level.request_indptr.push_back(static_cast<int32_t>(batch));
    parent = group;
    out.levels.push_back(std::move(level));
  }
  return out;
}

std::vector<std::vector<int32_t>> derive_cascade_level_ends(const std::vector<int32_t>& qo_indptr,
                                                            const std::vector<int32_t>& kv_indptr,
                                                            const std::vector<int32_t>& kv_indices,
                                                            const std::vector<int32_t>& kv_last_page_len,
                                                            int64_t page_size, int64_t num_levels, bool causal) {
  const char* fn = "derive_cascade_level_ends";
  const auto shapes = check_batch(fn, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size);
  require(num_levels >= 1, fn, "num_levels must be >= 1, got " + str(num_levels));
  const int64_t batch = static_cast<int64_t>(shapes.size());
  // Pages each request may share: whole pages, and with causal only those that end at or
  // before its first query's position (kv_len - qo_len).
  std::vector<int64_t> shareable(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) {
    int64_t n = shapes[r].full_pages;
    if (causal) n = std::min(n, std::max<int64_t>(0, shapes[r].kv_len - shapes[r].qo_len) / page_size);
    shareable[r] = n;
  }
  auto page = [&](int64_t r, int64_t k) { return kv_indices[static_cast<size_t>(kv_indptr[r] + k)]; };
  std::vector<std::vector<int32_t>> ends;
  std::vector<int64_t> cur(static_cast<size_t>(batch), 0);
  std::vector<std::pair<int64_t, int64_t>> groups{{0, batch}};
  for (int64_t l = 0; l + 1 < num_levels; ++l) {
    std::vector<std::pair<int64_t, int64_t>> next_groups;
    for (const auto& [a, b] : groups) {
      for (int64_t r = a; r < b;) {
        // Within a group every request starts at the same page count (it shared all above).
        int64_t s = r + 1;
        if (cur[r] < shareable[r])
          while (s < b && cur[s] < shareable[s] && page(s, cur[s]) == page(r, cur[r])) ++s;
        int64_t lcp = 0;
        if (s - r >= 2) {
          bool same = true;
          while (same) {
            for (int64_t x = r; x < s && same; ++x)
              same = cur[x] + lcp < shareable[x] && page(x, cur[x] + lcp) == page(r, cur[r] + lcp);
            if (same) ++lcp;
          }
        }
        for (int64_t x = r; x < s; ++x) cur[x] += lcp;
        next_groups.push_back({r, s});
        r = s;
      }
    }
    ends.emplace_back(cur.begin(), cur.end());
    groups = next_groups;
  }
  return ends;
}

CascadeResult cascade_attention(const Tensor& q, const CascadeLevels& levels, const Tensor& paged_kv_cache,
                                KVLayout layout, const AttentionOptions& opt) {
  const char* fn = "cascade_attention";
  check_levels(fn, levels);
  require(opt.causal == levels.levels.back().causal, fn,
          "opt.causal must equal the last level's causal (" + str(levels.levels.back().causal) + ")");
  require(opt.window_left == -1, fn,
          "window_left must be -1: a sliding window needs key positions, which shared levels do not carry");
  CascadeResult out;
  for (size_t l = 0; l < levels.levels.size(); ++l) {
    const CascadeLevel& level = levels.levels[l];
    PagedKVCache cache;
    cache.pages = paged_kv_cache;
    cache.layout = layout;
    cache.kv_indptr = level.kv_indptr;
    cache.kv_indices = level.kv_indices;
    cache.kv_last_page_len = level.kv_last_page_len;
    require(cache.pages.rank() == 5 && cache.page_size() == levels.page_size, fn,
            "paged_kv_cache must be a rank-5 pool with page_size " + str(levels.page_size) + ", got shape " +
                shape_string(paged_kv_cache.shape));
    AttentionOptions level_opt = opt;
    level_opt.causal = level.causal;
    try {
      out.level.push_back(batch_prefill_with_paged_kv_cache(q, level.qo_indptr, cache, level_opt));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(fn) + ": level " + str(static_cast<int64_t>(l)) + ": " + e.what());
    }
  }
  // FlashInfer's order: the last level's state, then each shared level merged into it.
  out.o = out.level.back().o;
  out.lse = out.level.back().lse;
  for (size_t l = 0; l + 1 < out.level.size(); ++l) {
    MergedState m = merge_state(out.o, out.lse, out.level[l].o, out.level[l].lse);
    out.o = std::move(m.v);
    out.lse = std::move(m.s);
  }
  return out;
}

std::string draw_cascade(const CascadeLevels& levels, const BlockSparseDrawOptions& options) {
  const char* fn = "draw_cascade";
  check_levels(fn, levels);
  const int64_t batch = static_cast<int64_t>(levels.qo_indptr.size()) - 1;
  require(options.request_names.empty() || static_cast<int64_t>(options.request_names.size()) == batch, fn,
          "request_names must be empty or hold batch_size = " + str(batch) + " names");
  // Whole-sequence length of each request: its pages over all levels.
  std::vector<int64_t> kv_len(static_cast<size_t>(batch), 0);
  int32_t max_page = 0;
  for (const CascadeLevel& level : levels.levels) {
    for (size_t g = 0; g + 1 < level.request_indptr.size(); ++g) {
      const int64_t pages = level.kv_indptr[g + 1] - level.kv_indptr[g];
      const int64_t len = pages == 0 ? 0 : (pages - 1) * levels.page_size + level.kv_last_page_len[g];
      for (int32_t r = level.request_indptr[g]; r < level.request_indptr[g + 1]; ++r)
        kv_len[static_cast<size_t>(r)] += len;
    }
    for (int32_t p : level.kv_indices) max_page = std::max(max_page, p);
  }
  std::vector<std::string> rows;
  for (int64_t r = 0; r < batch; ++r) {
    const std::string name = options.request_names.empty()
                                 ? (r < 26 ? std::string(1, static_cast<char>('A' + r)) : "R" + str(r))
                                 : options.request_names[static_cast<size_t>(r)];
    const int64_t qo_len = levels.qo_indptr[r + 1] - levels.qo_indptr[r];
    for (int64_t i = 0; i < qo_len; ++i)
      rows.push_back(name + ", pos " + str(kv_len[static_cast<size_t>(r)] - qo_len + i));
  }
  std::ostringstream os;
  for (size_t l = 0; l < levels.levels.size(); ++l) {
    const CascadeLevel& level = levels.levels[l];
    const bool last = l + 1 == levels.levels.size();
    const int64_t groups = static_cast<int64_t>(level.kv_last_page_len.size());
    int64_t tallest = 1;
    for (int64_t g = 0; g < groups; ++g)
      tallest = std::max<int64_t>(tallest, level.qo_indptr[g + 1] - level.qo_indptr[g]);
    BlockSparseDrawOptions draw;
    // Labels for the pool's pages; the view's pool is at least as large as the labels.
    const int64_t num_pages = std::max<int64_t>(max_page + 1, static_cast<int64_t>(options.page_labels.size()));
    draw.page_labels = options.page_labels;
    if (!draw.page_labels.empty()) draw.page_labels.resize(static_cast<size_t>(num_pages), "?");
    draw.show_sharing = false;
    draw.row_names = rows;
    draw.one_line_per_query = !last;
    draw.skip_empty_rows = last;
    const int64_t Br = last ? 1 : tallest;
    os << "level " << l << (last ? " (each request's own pages, Br = 1" : " (shared pages, one row block per group")
       << (level.causal ? ", causal" : ", not masked") << "):\n";
    const BlockSparseView view = build_block_sparse(level.qo_indptr, level.kv_indptr, level.kv_indices,
                                                    level.kv_last_page_len, levels.page_size, num_pages, Br,
                                                    level.causal);
    if (view.nnz_blocks() == 0) {
      os << "  (no pages at this level)\n";
      continue;
    }
    os << draw_block_sparse(view, draw);
  }
  return os.str();
}

}  // namespace flashstep::ref
