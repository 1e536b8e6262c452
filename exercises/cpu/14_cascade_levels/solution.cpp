// Exercise 14's solution: level 0 groups adjacent requests with equal shared pages,
// level 1 is one group per request.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::CascadeLevel;
using flashstep::ref::CascadeLevels;

CascadeLevels two_levels(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                         const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                         int64_t page_size, const std::vector<int32_t>& shared_pages, bool causal) {
  const int32_t batch = static_cast<int32_t>(shared_pages.size());
  auto pages_of = [&](int32_t r, int32_t begin, int32_t end) {  // request r's pages [begin, end)
    return std::vector<int32_t>(kv_indices.begin() + kv_indptr[r] + begin, kv_indices.begin() + kv_indptr[r] + end);
  };
  CascadeLevels out;
  out.page_size = page_size;
  out.qo_indptr = qo_indptr;
  CascadeLevel shared, own;
  for (CascadeLevel* level : {&shared, &own}) level->qo_indptr = level->kv_indptr = level->request_indptr = {0};
  own.causal = causal;
  for (int32_t r = 0; r < batch; ++r) {
    // level 0: a request whose shared pages equal its left neighbour's joins that group
    const std::vector<int32_t> mine = pages_of(r, 0, shared_pages[r]);
    if (r == 0 || mine != pages_of(r - 1, 0, shared_pages[r - 1])) {
      if (r > 0) {
        shared.qo_indptr.push_back(qo_indptr[r]);
        shared.request_indptr.push_back(r);
      }
      shared.kv_indices.insert(shared.kv_indices.end(), mine.begin(), mine.end());
      shared.kv_indptr.push_back(static_cast<int32_t>(shared.kv_indices.size()));
      shared.kv_last_page_len.push_back(mine.empty() ? 0 : static_cast<int32_t>(page_size));
    }
    // level 1: the request alone, with the rest of its pages (the last one as it is)
    const int32_t pages = kv_indptr[r + 1] - kv_indptr[r];
    const std::vector<int32_t> rest = pages_of(r, shared_pages[r], pages);
    own.kv_indices.insert(own.kv_indices.end(), rest.begin(), rest.end());
    own.kv_indptr.push_back(static_cast<int32_t>(own.kv_indices.size()));
    own.kv_last_page_len.push_back(rest.empty() ? 0 : kv_last_page_len[r]);
    own.qo_indptr.push_back(qo_indptr[r + 1]);
    own.request_indptr.push_back(r + 1);
  }
  shared.qo_indptr.push_back(qo_indptr[batch]);
  shared.request_indptr.push_back(batch);
  out.levels = {shared, own};
  return out;
}
