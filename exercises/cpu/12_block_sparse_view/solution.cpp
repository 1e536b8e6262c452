// Exercise 12's solution: row blocks request by request, a block per page some pair sees.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::BlockSparseView;

BlockSparseView build_view(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                           const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                           int64_t page_size, int64_t num_pages, int64_t Br, bool causal, int window_left) {
  BlockSparseView view;
  view.Br = Br;
  view.Bc = page_size;
  view.num_pages = num_pages;
  view.causal = causal;
  view.window_left = window_left;
  view.qo_indptr = qo_indptr;
  view.row_indptr = {0};
  view.indptr = {0};
  for (size_t r = 0; r + 1 < qo_indptr.size(); ++r) {
    const int64_t pages = kv_indptr[r + 1] - kv_indptr[r];
    const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[r];
    const int64_t qo_len = qo_indptr[r + 1] - qo_indptr[r];
    view.kv_len.push_back(static_cast<int32_t>(kv_len));
    for (int64_t i0 = 0; i0 < qo_len; i0 += Br) {  // row block: queries i0 .. i1 of request r
      const int64_t i1 = std::min(qo_len, i0 + Br);
      view.row_indptr.push_back(static_cast<int32_t>(qo_indptr[r] + i1));
      view.row_request.push_back(static_cast<int32_t>(r));
      for (int64_t k = 0; k < pages; ++k) {  // column block: keys j0 .. j1 in page k
        const int64_t j0 = k * page_size, j1 = std::min(kv_len, j0 + page_size);
        bool seen = false;
        for (int64_t i = i0; i < i1 && !seen; ++i)
          for (int64_t j = j0; j < j1 && !seen; ++j)
            seen = flashstep::ref::key_visible(i, j, qo_len, kv_len, causal, window_left);
        if (!seen) continue;  // every pair masked: the block is zero and not stored
        view.indices.push_back(kv_indices[static_cast<size_t>(kv_indptr[r] + k)]);
        view.block_kv_start.push_back(static_cast<int32_t>(j0));
        view.block_kv_len.push_back(static_cast<int32_t>(j1 - j0));
      }
      view.indptr.push_back(static_cast<int32_t>(view.indices.size()));
    }
  }
  return view;
}
