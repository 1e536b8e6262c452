// Grader of exercise 9: random batches stored in a page pool with the pages handed out in
// a shuffled order (and spare pages that belong to nobody), NHD or HND; your
// gather_request() against the reference's gather_paged_kv for every request.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
std::pair<Tensor, Tensor> gather_request(const ref::PagedKVCache& cache, int64_t r);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "gather_paged_kv", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 20; ++c) {
      const int64_t batch = random_int(rng, 1, 4), page_size = random_int(rng, 1, 4);
      const int64_t heads = random_int(rng, 1, 3), head_dim = random_int(rng, 1, 6);
      std::vector<Tensor> k, v;
      int64_t pages_needed = 0;
      for (int64_t i = 0; i < batch; ++i) {
        const int64_t kv_len = random_int(rng, 0, 11);
        k.push_back(random_tensor(rng, {kv_len, heads, head_dim}));
        v.push_back(random_tensor(rng, {kv_len, heads, head_dim}));
        pages_needed += (kv_len + page_size - 1) / page_size;
      }
      const int64_t num_pages = pages_needed + 3;  // spare pages: a wrong walk reads garbage
      std::vector<int32_t> order(static_cast<size_t>(num_pages));
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      const ref::KVLayout layout = c % 2 ? ref::KVLayout::HND : ref::KVLayout::NHD;
      ref::PagedKVCache cache = ref::make_paged_kv_cache(k, v, page_size, layout, order, num_pages);
      for (int64_t p = 0; p < num_pages; ++p)  // fill the unused slots too, so that reading one shows
        for (int64_t s = 0; s < page_size; ++s)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < head_dim; ++d)
              if (cache.at(p, 0, s, h, d) == 0.0) cache.at(p, 0, s, h, d) = cache.at(p, 1, s, h, d) = 1e6;
      for (int64_t r = 0; r < batch; ++r) {
        g.at("case " + std::to_string(c + 1) + " of 20: " + ref::to_string(layout) + ", page_size " +
             std::to_string(page_size) + ", kv_indptr " + list_text(cache.kv_indptr) + ", kv_indices " +
             list_text(cache.kv_indices) + ", kv_last_page_len " + list_text(cache.kv_last_page_len) + "; request " +
             std::to_string(r));
        const auto expected = ref::gather_paged_kv(cache, r);
        const auto yours = gather_request(cache, r);
        g.close("k", yours.first, expected.first, {"token", "kv head", "dim"});
        g.close("v", yours.second, expected.second, {"token", "kv head", "dim"});
      }
      g.passed_case();
    }
  });
}
