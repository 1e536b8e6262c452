// Exercise 9 (chapter 5, "The page table as CSR"): find a request's tokens in the page pool.
//
// Fill in gather_request() below: copy request r's keys and values out of the paged cache
// into contiguous tensors, token by token, walking its page table. The pool may be in
// layout NHD or HND; cache.at(page, k_or_v, slot, head, dim) reads an element of either.
// The grader compares your tensors with the reference's gather_paged_kv.
//
//     cmake --build build --target flashstep_exercise_cpu_09_gather_paged_kv
//     flashstep exercise check 9          (or run build/bin/flashstep_exercise_cpu_09_gather_paged_kv)
//
// Stuck? `flashstep exercise hint 9`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <utility>

#include <flashstep/reference.hpp>

using flashstep::ref::PagedKVCache;
using flashstep::ref::Tensor;

/// Request `r`'s keys and values, gathered from its pages.
/// \param cache the pool and its CSR page table (kv_indptr, kv_indices, kv_last_page_len);
///        cache.page_size(), cache.num_kv_heads() and cache.head_dim() give the sizes
/// \param r a request of the batch
/// \return (k, v), each (kv_len, num_kv_heads, head_dim): token t of the request is slot
///         t % page_size of its (t / page_size)-th page
std::pair<Tensor, Tensor> gather_request(const PagedKVCache& cache, int64_t r) {
  Tensor k, v;
  // TODO(exercise): fill k and v.
  return {k, v};
}
