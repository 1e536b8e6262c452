// Section "cascade": the batch's shared prefix as its own level (one tall row block that
// reads the shared pages once), each request's own tokens as the last level, and the
// exact merge of the levels' (o, lse) states, checked against flat attention.
//
// The queries are each request's tokens *after* its shared prefix: the prefix was
// prefilled once, when it was first cached, and the batch now appends the rest. That is
// the case where cascade is exact with the causal mask (every query comes after every
// shared page), and it is the course's "unique suffix" picture.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include <flashstep/reference/block_sparse.hpp>
#include <flashstep/reference/cascade.hpp>
#include <flashstep/reference/merge.hpp>

#include "story.hpp"
#include "text_table.hpp"

namespace flashstep::cli {

namespace {

// Tokens of request r shared with some other request, rounded down to whole pages, and
// kept below the request's length so that it has at least one query of its own.
int64_t shared_prefix(const Scenario& s, size_t r) {
  int64_t best = 0;
  for (size_t e = 0; e < s.tokens.size(); ++e) {
    if (e == r) continue;
    size_t n = 0;
    while (n < s.tokens[e].size() && n < s.tokens[r].size() && s.tokens[e][n] == s.tokens[r][n]) ++n;
    best = std::max<int64_t>(best, static_cast<int64_t>(n));
  }
  best = best / s.page_size * s.page_size;
  return std::min<int64_t>(best, static_cast<int64_t>(s.tokens[r].size()) - 1);
}

std::string vec2(const ref::Tensor& t, int64_t row) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(4) << "[" << t({row, 0, 0}) << ", " << t({row, 0, 1}) << "]";
  return os.str();
}

std::string num(double x) {
  std::ostringstream os;
  if (std::isinf(x)) os << (x < 0 ? "-inf" : "inf");
  else os << std::fixed << std::setprecision(4) << x;
  return os.str();
}

}  // namespace

void show_cascade(const Scenario& s, std::ostream& os, Ledger& ledger) {
  const PagedBatch b = make_paged_batch(s, s.page_size);

  // The append batch: each request's queries start after its shared prefix.
  std::vector<int32_t> qo_indptr{0};
  std::vector<int64_t> first_query;
  std::vector<int64_t> rows;  // packed rows of b.q that are queries now
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const int64_t start = shared_prefix(s, r);
    first_query.push_back(start);
    for (int64_t j = start; j < static_cast<int64_t>(s.tokens[r].size()); ++j) rows.push_back(b.qo_indptr[r] + j);
    qo_indptr.push_back(static_cast<int32_t>(rows.size()));
  }
  ref::Tensor q({static_cast<int64_t>(rows.size()), 1, 2});
  for (size_t i = 0; i < rows.size(); ++i)
    for (int d = 0; d < 2; ++d) q({static_cast<int64_t>(i), 0, d}) = b.q({rows[i], 0, d});

  os << "The shared prefix was prefilled once, when it was first cached; the batch now appends\n"
        "each request's own tokens. Their queries:\n";
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const int64_t last = static_cast<int64_t>(s.tokens[r].size()) - 1;
    os << "  " << s.names[r] << ": "
       << (first_query[r] == last ? "position " + std::to_string(last)
                                  : "positions " + std::to_string(first_query[r]) + ".." + std::to_string(last))
       << " (";
    for (size_t j = static_cast<size_t>(first_query[r]); j < s.tokens[r].size(); ++j)
      os << (j > static_cast<size_t>(first_query[r]) ? " " : "") << s.vocab[static_cast<size_t>(s.tokens[r][j])];
    os << ")\n";
  }

  const int64_t num_levels = s.tokens.size() >= 3 ? 3 : 2;
  const auto& c = b.cache;
  const auto ends = ref::derive_cascade_level_ends(qo_indptr, c.kv_indptr, c.kv_indices, c.kv_last_page_len,
                                                   s.page_size, num_levels, true);
  const ref::CascadeLevels levels = ref::build_cascade_levels(qo_indptr, c.kv_indptr, c.kv_indices, c.kv_last_page_len,
                                                              s.page_size, ends, true);
  ref::BlockSparseDrawOptions draw;
  draw.request_names = s.names;
  draw.page_labels = b.page_labels;
  os << "\n"
     << levels.levels.size() << " levels, each a block-sparse matrix over the same pages:\n"
     << indent_lines(ref::draw_cascade(levels, draw), "  ");

  // Attention level by level, merged, against attention over all keys at once.
  const ref::CascadeResult casc = ref::cascade_attention(q, levels, c.pages, c.layout, b.opt);
  const ref::AttentionResult flat = ref::batch_prefill_with_paged_kv_cache(q, qo_indptr, c, b.opt);
  const double diff = std::max(max_abs_diff(casc.o, flat.o), max_abs_diff(casc.lse, flat.lse));
  os << "\nEach level gives every query a partial state (o, lse); merging them is exact:\n";
  TextTable t({"query", "level states (o, lse)", "merged o", "flat o"});
  for (size_t r = 0; r < s.tokens.size(); ++r)
    for (int32_t i = qo_indptr[r]; i < qo_indptr[r + 1]; ++i) {
      std::string states;
      for (const auto& lv : casc.level)
        states += (states.empty() ? "" : "  ") + vec2(lv.o, i) + " " + num(lv.lse({i, 0}));
      t.add({s.names[r] + ", pos " + std::to_string(first_query[r] + (i - qo_indptr[r])), states, vec2(casc.o, i),
             vec2(flat.o, i)});
    }
  t.print(os, "  ");
  os << "  max |cascade - flat| over o and lse: " << diff << "\n";
  // Both sides compute the same sums in double, in different orders.
  constexpr double kTolerance = 1e-12;
  ledger.expect(diff <= kTolerance, "cascade levels merged == flat attention");

  // Page loads of a kernel with one query per row block, against the cascade's.
  const ref::BlockSparseView flat_view = ref::build_block_sparse(qo_indptr, c, 1, true);
  int64_t cascade_loads = 0;
  for (const auto& lv : levels.levels) {
    int64_t tallest = 1;
    for (size_t g = 0; g + 1 < lv.qo_indptr.size(); ++g)
      tallest = std::max<int64_t>(tallest, lv.qo_indptr[g + 1] - lv.qo_indptr[g]);
    cascade_loads += ref::build_block_sparse(lv.qo_indptr, lv.kv_indptr, lv.kv_indices, lv.kv_last_page_len,
                                             s.page_size, c.num_pages(), lv.causal ? 1 : tallest, lv.causal)
                         .nnz_blocks();
  }
  os << "  page loads: " << flat_view.nnz_blocks() << " with one query per row block, " << cascade_loads
     << " with the cascade (each shared page once per group).\n";
  ledger.expect(cascade_loads <= flat_view.nnz_blocks(), "the cascade never loads more pages");
}

}  // namespace flashstep::cli
