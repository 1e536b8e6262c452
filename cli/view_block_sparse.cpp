// Section "block-sparse": FlashInfer's view of the batch as a block-sparse matrix for
// Br = 1 and a larger Br (and, in the tour, Bc = 2), each checked two ways: its block
// count against a count made here from the lengths alone, and attention computed by
// walking the blocks against batch attention through the page table.
#include <algorithm>
#include <cmath>

#include <flashstep/reference/block_sparse.hpp>

#include "story.hpp"
#include "text_table.hpp"

namespace flashstep::cli {

namespace {

// Non-zero blocks of a causal prefill batch (qo_len == kv_len per request): a row block
// of queries [i0, i1] needs the pages covering keys 0..i1. Counted from lengths only.
int64_t expected_blocks(const Scenario& s, int64_t Br, int64_t page_size) {
  int64_t n = 0;
  for (const auto& toks : s.tokens) {
    const int64_t len = static_cast<int64_t>(toks.size());
    for (int64_t i0 = 0; i0 < len; i0 += Br) {
      const int64_t i1 = std::min(i0 + Br, len) - 1;
      n += i1 / page_size + 1;
    }
  }
  return n;
}

// Draws the view for (Br, page_size) and checks it; returns the number of blocks.
int64_t show_view(const Scenario& s, const PagedBatch& b, int64_t Br, std::ostream& os, Ledger& ledger, bool lookup) {
  const int64_t page_size = b.cache.page_size();
  const ref::BlockSparseView view = ref::build_block_sparse(b.qo_indptr, b.cache, Br, true);
  ref::BlockSparseDrawOptions draw;
  draw.request_names = s.names;
  draw.page_labels = b.page_labels;
  os << indent_lines(ref::draw_block_sparse(view, draw), "  ");
  if (lookup)
    os << "\nStored as a lookup table, row by row:\n" << indent_lines(ref::draw_block_sparse_lookup(view, draw), "  ");

  const std::string what = "Br=" + std::to_string(Br) + ", Bc=" + std::to_string(page_size);
  ledger.expect(view.nnz_blocks() == expected_blocks(s, Br, page_size),
                what + ": " + std::to_string(expected_blocks(s, Br, page_size)) +
                    " non-zero blocks, as the lengths say");
  const auto walked = ref::block_sparse_attention(b.q, b.cache, view, b.opt);
  const auto batch = ref::batch_prefill_with_paged_kv_cache(b.q, b.qo_indptr, b.cache, b.opt);
  const double diff = std::max(max_abs_diff(walked.o, batch.o), max_abs_diff(walked.lse, batch.lse));
  // Both are exact double-precision computations of the same sums in different orders.
  constexpr double kTolerance = 1e-12;
  os << "  " << count_of(view.nnz_blocks(), "block")
     << "; attention by walking them vs batch attention: max |diff| = " << diff << "\n";
  ledger.expect(diff <= kTolerance, what + ": walking the blocks gives batch attention");
  return view.nnz_blocks();
}

}  // namespace

void show_block_sparse(const Scenario& s, std::ostream& os, Ledger& ledger) {
  os << "Rows are the packed query positions, columns the pages; a cell names the page a\n"
        "row block loads. Bc is the page size ("
     << s.page_size << " here).\n";
  const PagedBatch b = make_paged_batch(s, s.page_size);
  os << "\nBr = 1 (decode-like: one query per row; the table itself encodes the causal mask):\n";
  const int64_t blocks1 = show_view(s, b, 1, os, ledger, true);
  if (s.br > 1) {
    os << "\nBr = " << s.br
       << " (a request's queries share a row block: each page is loaded once\n"
          "for the whole block, and the causal mask must now be applied inside it):\n";
    const int64_t blocks_br = show_view(s, b, s.br, os, ledger, false);
    os << "  " << count_of(blocks1, "block") << " with Br = 1, " << blocks_br << " with Br = " << s.br << ".\n";
  }
  if (s.prompts.size() == 2 && s.prompts[0] == "The cat sat" && s.page_size == 1) {
    os << "\nBc = 2: the same tokens repacked two per page (fewer, larger blocks; some keys\n"
          "loaded by a row are masked, e.g. \"A, pos 0\" loads \"cat\" with \"The\"):\n";
    show_view(s, make_paged_batch(s, 2), 1, os, ledger, false);
  }
}

}  // namespace flashstep::cli
