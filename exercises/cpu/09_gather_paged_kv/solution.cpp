// Exercise 9's solution: token t -> (page kv_indices[kv_indptr[r] + t / page_size], slot t % page_size).
#include <cstdint>
#include <utility>

#include <flashstep/reference.hpp>

using flashstep::ref::PagedKVCache;
using flashstep::ref::Tensor;

std::pair<Tensor, Tensor> gather_request(const PagedKVCache& cache, int64_t r) {
  const int64_t page_size = cache.page_size(), heads = cache.num_kv_heads(), head_dim = cache.head_dim();
  const int64_t pages = cache.kv_indptr[r + 1] - cache.kv_indptr[r];
  const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * page_size + cache.kv_last_page_len[r];
  Tensor k({kv_len, heads, head_dim}), v({kv_len, heads, head_dim});
  for (int64_t t = 0; t < kv_len; ++t) {
    const int64_t page = cache.kv_indices[cache.kv_indptr[r] + t / page_size], slot = t % page_size;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t d = 0; d < head_dim; ++d) {
        k({t, h, d}) = cache.at(page, 0, slot, h, d);
        v({t, h, d}) = cache.at(page, 1, slot, h, d);
      }
  }
  return {k, v};
}
