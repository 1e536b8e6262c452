// Grader of exercise 14: random batches of "families" of adjacent requests that start on
// the same prefix pages (as requests reusing a cached prompt do), each request with pages
// of its own after them; level 0 takes all or part of each request's prefix. Your
// two_levels() against the reference's build_cascade_levels, array by array.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::CascadeLevels two_levels(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                              const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                              int64_t page_size, const std::vector<int32_t>& shared_pages, bool causal);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "cascade_levels", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 30; ++c) {
      const int64_t page_size = random_int(rng, 1, 4);
      const bool causal = c % 2 == 0;
      std::vector<int32_t> ids(200);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      size_t next_id = 0;
      std::vector<int32_t> qo_lens, page_counts, kv_indices, kv_last_page_len, shared_pages;
      for (int64_t families = random_int(rng, 1, 3); families > 0; --families) {
        std::vector<int32_t> prefix;  // full pages every request of the family starts with
        for (int64_t n = random_int(rng, 0, 3); n > 0; --n) prefix.push_back(ids[next_id++]);
        for (int64_t members = random_int(rng, 1, 3); members > 0; --members) {
          const int64_t own_tokens = random_int(rng, 1, 3 * page_size);  // at least one token of its own
          const int64_t own_pages = (own_tokens + page_size - 1) / page_size;
          kv_indices.insert(kv_indices.end(), prefix.begin(), prefix.end());
          for (int64_t p = 0; p < own_pages; ++p) kv_indices.push_back(ids[next_id++]);
          page_counts.push_back(static_cast<int32_t>(prefix.size() + own_pages));
          kv_last_page_len.push_back(static_cast<int32_t>(own_tokens - (own_pages - 1) * page_size));
          // decode or a short append after the prefix: queries come after the shared pages
          qo_lens.push_back(static_cast<int32_t>(random_int(rng, 1, std::min<int64_t>(own_tokens, 3))));
          const bool all = random_int(rng, 0, 3) > 0;
          shared_pages.push_back(static_cast<int32_t>(all ? prefix.size() : random_int(rng, 0, prefix.size())));
        }
      }
      const std::vector<int32_t> qo_indptr = indptr_of(qo_lens), kv_indptr = indptr_of(page_counts);
      g.at("case " + std::to_string(c + 1) + " of 30: page_size " + std::to_string(page_size) +
           (causal ? ", causal" : ", not causal") + "\n  qo_indptr " + list_text(qo_indptr) + ", kv_indptr " +
           list_text(kv_indptr) + ", kv_indices " + list_text(kv_indices) + ", kv_last_page_len " +
           list_text(kv_last_page_len) + ", shared_pages " + list_text(shared_pages));
      const ref::CascadeLevels expected = ref::build_cascade_levels(qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                                                    page_size, {shared_pages}, causal);
      const ref::CascadeLevels yours = two_levels(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size,
                                                  shared_pages, causal);
      g.same("page_size", yours.page_size, expected.page_size);
      g.same("qo_indptr", yours.qo_indptr, expected.qo_indptr);
      g.same("number of levels", static_cast<int64_t>(yours.levels.size()), 2);
      for (size_t l = 0; l < 2; ++l) {
        const ref::CascadeLevel &y = yours.levels[l], &e = expected.levels[l];
        const std::string name = "level " + std::to_string(l) + " ";
        g.same(name + "qo_indptr", y.qo_indptr, e.qo_indptr);
        g.same(name + "request_indptr", y.request_indptr, e.request_indptr);
        g.same(name + "kv_indptr", y.kv_indptr, e.kv_indptr);
        g.same(name + "kv_indices", y.kv_indices, e.kv_indices);
        g.same(name + "kv_last_page_len", y.kv_last_page_len, e.kv_last_page_len);
        g.same(name + "causal", int64_t{y.causal}, int64_t{e.causal});
      }
      g.passed_case();
    }
  });
}
