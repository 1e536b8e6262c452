// KV caches: contiguous append, paged append through batch_indices/positions, gather.
#include <doctest/doctest.h>

#include <algorithm>
#include <flashstep/reference.hpp>
#include <numeric>

#include "support/random.hpp"

using namespace flashstep;
using ref::KVLayout;
using ref::Tensor;

TEST_CASE("get_batch_indices_positions follows FlashInfer's definition") {
  // Request 0 appends 2 tokens to reach length 5; request 1 appends 3 to reach 3.
  const auto [b, p] = ref::get_batch_indices_positions({0, 2, 5}, {5, 3}, 5);
  CHECK(b == std::vector<int32_t>{0, 0, 1, 1, 1});
  CHECK(p == std::vector<int32_t>{3, 4, 0, 1, 2});
}

TEST_CASE("appending token by token into pages, then gathering, returns the contiguous cache") {
  auto rng = test::case_rng("append-gather");
  CAPTURE(test::run_seed());
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    const int64_t batch = 3, heads = 2, dim = 4, page_size = 3, num_pages = 24;
    std::vector<int32_t> free_pages(num_pages);
    std::iota(free_pages.begin(), free_pages.end(), 0);
    std::shuffle(free_pages.begin(), free_pages.end(), rng);
    ref::PagedKVCache cache;
    cache.layout = layout;
    cache.pages = layout == KVLayout::NHD ? Tensor({num_pages, 2, page_size, heads, dim}, NAN)
                                          : Tensor({num_pages, 2, heads, page_size, dim}, NAN);
    std::vector<std::vector<int32_t>> table(batch);
    std::vector<int32_t> lens(batch, 0);
    std::vector<ref::ContiguousKVCache> expected(batch, ref::ContiguousKVCache(heads, dim));
    for (int step = 0; step < 6; ++step) {
      // Each step appends 1..3 tokens per request (a prefill chunk or a decode token).
      std::vector<int32_t> append_indptr{0};
      for (int64_t b = 0; b < batch; ++b)
        append_indptr.push_back(append_indptr.back() + static_cast<int32_t>(test::random_int(rng, 1, 3)));
      const int64_t nnz = append_indptr.back();
      const Tensor k_new = test::random_tensor(rng, {nnz, heads, dim});
      const Tensor v_new = test::random_tensor(rng, {nnz, heads, dim});
      // Grow the page table first (as FlashInfer requires), then append.
      for (int64_t b = 0; b < batch; ++b) {
        lens[b] += append_indptr[b + 1] - append_indptr[b];
        while (static_cast<int64_t>(table[b].size()) * page_size < lens[b]) {
          table[b].push_back(free_pages.back());
          free_pages.pop_back();
        }
      }
      cache.kv_indptr = {0};
      cache.kv_indices.clear();
      cache.kv_last_page_len.clear();
      for (int64_t b = 0; b < batch; ++b) {
        cache.kv_indices.insert(cache.kv_indices.end(), table[b].begin(), table[b].end());
        cache.kv_indptr.push_back(static_cast<int32_t>(cache.kv_indices.size()));
        cache.kv_last_page_len.push_back(static_cast<int32_t>(lens[b] - (table[b].size() - 1) * page_size));
      }
      const auto [bi, pos] = ref::get_batch_indices_positions(append_indptr, lens, nnz);
      ref::append_paged_kv_cache(k_new, v_new, bi, pos, cache);
      for (int64_t b = 0; b < batch; ++b) {
        const int64_t n0 = append_indptr[b], n1 = append_indptr[b + 1], row = heads * dim;
        expected[b].append(Tensor({n1 - n0, heads, dim},
                                  std::vector<double>(k_new.data.begin() + n0 * row, k_new.data.begin() + n1 * row)),
                           Tensor({n1 - n0, heads, dim},
                                  std::vector<double>(v_new.data.begin() + n0 * row, v_new.data.begin() + n1 * row)));
      }
    }
    ref::check_paged_kv_cache("test", cache);  // every readable slot was written (no NaN left)
    for (int64_t b = 0; b < batch; ++b) {
      const auto [k, v] = ref::gather_paged_kv(cache, b);
      CHECK(k.shape == expected[b].k().shape);
      CHECK(k.data == expected[b].k().data);
      CHECK(v.data == expected[b].v().data);
    }
  }
}

TEST_CASE("ContiguousKVCache grows by rows and counts bytes as fp16") {
  ref::ContiguousKVCache c(2, 4);
  c.append(Tensor({3, 2, 4}, 1.0), Tensor({3, 2, 4}, 2.0));
  c.append(Tensor({1, 2, 4}, 3.0), Tensor({1, 2, 4}, 4.0));
  CHECK(c.kv_len() == 4);
  CHECK(c.k()({3, 1, 3}) == 3.0);
  CHECK(c.v()({0, 0, 0}) == 2.0);
  CHECK(c.bytes_fp16() == 2 /*K and V*/ * 4 * 2 * 4 * 2 /*bytes*/);
}
