// Exercise 8 (chapter 5, "Paging the KV cache"): grow a batch's CSR page table.
//
// Fill in append_tokens() below. Each request holds its tokens in pages of page_size
// slots, listed in the CSR page table (kv_indptr, kv_indices, kv_last_page_len). Appending
// tokens fills the free slots of a request's last page first and takes a new page from
// the front of the free list only when the last page is full. The grader runs the same
// appends through the reference's PageAllocator and PagedSequences and compares the page
// tables and what is left of the free list.
//
//     cmake --build build --target flashstep_exercise_cpu_08_page_table_append
//     flashstep exercise check 8          (or run build/bin/flashstep_exercise_cpu_08_page_table_append)
//
// Stuck? `flashstep exercise hint 8`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <deque>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::PageTable;

/// The page table after appending append_lens[i] tokens to request i, for i = 0, 1, ...
/// in that order (so request 0 takes its new pages first).
/// \param table kv_indptr (batch + 1), kv_indices, kv_last_page_len (batch): tokens in
///        each request's last page, 1 .. page_size, or 0 for a request with no pages.
///        A request holds (pages - 1) * page_size + last_page_len tokens.
/// \param append_lens (batch) tokens to append to each request, >= 0
/// \param free_pages the free list: new pages are taken from its front (and removed)
/// \param page_size slots per page
/// \return the batch's page table after the appends
PageTable append_tokens(const PageTable& table, const std::vector<int32_t>& append_lens,
                        std::deque<int32_t>& free_pages, int32_t page_size) {
  PageTable out;
  // TODO(exercise): fill out.kv_indptr, out.kv_indices and out.kv_last_page_len.
  return out;
}
