// Grader of exercise 12: random paged batches (shuffled page ids, partly filled last
// pages, decode and prefill rows, requests with no queries or no pages), several Br,
// causal or not, with or without a window; your build_view() against the reference's
// build_block_sparse, field by field.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::BlockSparseView build_view(const std::vector<int32_t>& qo_indptr, const std::vector<int32_t>& kv_indptr,
                                const std::vector<int32_t>& kv_indices, const std::vector<int32_t>& kv_last_page_len,
                                int64_t page_size, int64_t num_pages, int64_t Br, bool causal, int window_left);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "block_sparse_view", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 40; ++c) {
      const int64_t batch = random_int(rng, 1, 4), page_size = random_int(rng, 1, 4);
      const int64_t Br = random_int(rng, 1, 5);
      const bool causal = c % 2 == 0;
      const int window_left = c % 3 == 0 ? static_cast<int>(random_int(rng, 0, 6)) : -1;
      std::vector<int32_t> qo_lens, page_counts, kv_last_page_len;
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t kv_len = random_int(rng, 0, 12);
        qo_lens.push_back(static_cast<int32_t>(random_int(rng, 0, std::max<int64_t>(kv_len, 1))));
        page_counts.push_back(static_cast<int32_t>((kv_len + page_size - 1) / page_size));
        kv_last_page_len.push_back(
            static_cast<int32_t>(kv_len == 0 ? 0 : kv_len - (page_counts.back() - 1) * page_size));
      }
      const std::vector<int32_t> qo_indptr = indptr_of(qo_lens), kv_indptr = indptr_of(page_counts);
      const int64_t num_pages = kv_indptr.back() + 2;
      std::vector<int32_t> ids(static_cast<size_t>(num_pages));
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      const std::vector<int32_t> kv_indices(ids.begin(), ids.begin() + kv_indptr.back());
      g.at("case " + std::to_string(c + 1) + " of 40: Br " + std::to_string(Br) + ", page_size (Bc) " +
           std::to_string(page_size) + (causal ? ", causal" : ", not causal") + ", window_left " +
           std::to_string(window_left) + "\n  qo_indptr " + list_text(qo_indptr) + ", kv_indptr " +
           list_text(kv_indptr) + ", kv_indices " + list_text(kv_indices) + ", kv_last_page_len " +
           list_text(kv_last_page_len));
      const ref::BlockSparseView expected = ref::build_block_sparse(qo_indptr, kv_indptr, kv_indices, kv_last_page_len,
                                                                    page_size, num_pages, Br, causal, window_left);
      const ref::BlockSparseView yours = build_view(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, page_size,
                                                    num_pages, Br, causal, window_left);
      g.same("Br", yours.Br, expected.Br);
      g.same("Bc", yours.Bc, expected.Bc);
      g.same("num_pages", yours.num_pages, expected.num_pages);
      g.same("causal", int64_t{yours.causal}, int64_t{expected.causal});
      g.same("window_left", int64_t{yours.window_left}, int64_t{expected.window_left});
      g.same("qo_indptr", yours.qo_indptr, expected.qo_indptr);
      g.same("kv_len", yours.kv_len, expected.kv_len);
      g.same("row_indptr", yours.row_indptr, expected.row_indptr);
      g.same("row_request", yours.row_request, expected.row_request);
      g.same("indptr", yours.indptr, expected.indptr);
      g.same("indices", yours.indices, expected.indices);
      g.same("block_kv_start", yours.block_kv_start, expected.block_kv_start);
      g.same("block_kv_len", yours.block_kv_len, expected.block_kv_len);
      g.passed_case();
    }
  });
}
