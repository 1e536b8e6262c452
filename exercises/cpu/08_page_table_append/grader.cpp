// Grader of exercise 8: a random batch of sequences in a PageAllocator (some sequences
// come and go first, so the free list is not in order), then random appends: your
// append_tokens() on the batch's page table against PagedSequences::append_tokens, the
// resulting page_table() and the allocator's free list.
#include <deque>
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::PageTable append_tokens(const ref::PageTable& table, const std::vector<int32_t>& append_lens,
                             std::deque<int32_t>& free_pages, int32_t page_size);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "page_table_append", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 25; ++c) {
      const int32_t page_size = static_cast<int32_t>(random_int(rng, 1, 5));
      ref::PageAllocator allocator(200, page_size);
      ref::PagedSequences sequences(allocator);
      // Sequences that start, grow and finish in random order leave the free list shuffled.
      std::vector<int32_t> batch;
      for (int k = 0; k < 12; ++k) {
        const int32_t s = sequences.add_sequence();
        sequences.append_tokens(s, random_int(rng, 0, 12));
        if (random_int(rng, 0, 2) == 0) sequences.free_sequence(s);
        else batch.push_back(s);
      }
      if (batch.empty()) batch.push_back(sequences.add_sequence());
      std::vector<int32_t> append_lens;
      for (size_t i = 0; i < batch.size(); ++i) append_lens.push_back(static_cast<int32_t>(random_int(rng, 0, 9)));

      const ref::PageTable before = sequences.page_table(batch);
      const std::vector<int32_t> free_list = allocator.free_pages();
      std::deque<int32_t> your_free_list(free_list.begin(), free_list.end());
      g.at("case " + std::to_string(c + 1) + " of 25: page_size " + std::to_string(page_size) + ", kv_indptr " +
           list_text(before.kv_indptr) + ", kv_last_page_len " + list_text(before.kv_last_page_len) + ", append_lens " +
           list_text(append_lens));
      const ref::PageTable yours = append_tokens(before, append_lens, your_free_list, page_size);
      for (size_t i = 0; i < batch.size(); ++i) sequences.append_tokens(batch[i], append_lens[i]);
      const ref::PageTable expected = sequences.page_table(batch);
      g.same("kv_indptr", yours.kv_indptr, expected.kv_indptr);
      g.same("kv_indices", yours.kv_indices, expected.kv_indices);
      g.same("kv_last_page_len", yours.kv_last_page_len, expected.kv_last_page_len);
      g.same("the free list after the appends", std::vector<int32_t>(your_free_list.begin(), your_free_list.end()),
             allocator.free_pages());
      g.passed_case();
    }
  });
}
