// Exercise 8's solution: per request, length before -> pages needed after -> new pages.
#include <cstdint>
#include <deque>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::PageTable;

PageTable append_tokens(const PageTable& table, const std::vector<int32_t>& append_lens,
                        std::deque<int32_t>& free_pages, int32_t page_size) {
  PageTable out;
  out.kv_indptr.push_back(0);
  for (size_t i = 0; i < append_lens.size(); ++i) {
    const int32_t first = table.kv_indptr[i], pages = table.kv_indptr[i + 1] - first;
    const int32_t len = pages == 0 ? 0 : (pages - 1) * page_size + table.kv_last_page_len[i];
    const int32_t new_len = len + append_lens[i];
    // the request's old pages, in order, then as many new ones as ceil(new_len / page_size) needs
    out.kv_indices.insert(out.kv_indices.end(), table.kv_indices.begin() + first,
                          table.kv_indices.begin() + first + pages);
    for (int32_t p = pages; p < (new_len + page_size - 1) / page_size; ++p) {
      out.kv_indices.push_back(free_pages.front());
      free_pages.pop_front();
    }
    out.kv_indptr.push_back(static_cast<int32_t>(out.kv_indices.size()));
    // 1 .. page_size tokens in the last page; 0 only when there is no page at all
    out.kv_last_page_len.push_back(new_len == 0 ? 0 : new_len - (new_len - 1) / page_size * page_size);
  }
  return out;
}
