// Stage 09 exercise — one engine step's metadata, built by hand from the page tables.
//
// The program runs a small workload through the Scheduler and, at every step, builds the
// arrays FlashInfer's wrappers take from what the allocator holds (each request's page
// list and length, read through PagedSequences) and compares them with the StepBatch the
// Scheduler produced. Two holes, marked TODO:
//   1. qo_indptr: the offsets of each row's new tokens (decodes have one, a prefill chunk
//      as many as the chunk);
//   2. the CSR page table: kv_indptr, kv_indices and kv_last_page_len of the rows, from
//      each request's pages and length after this step's append.
// As shipped it FAILs at the first step; fill in the holes until it prints PASS. Then read
// scheduler.cpp's next_step() to see the same arrays built with the append slots and the
// rows that sample.
//
//     cmake --build build --target flashstep_exercise_09_engine
//     build/bin/flashstep_exercise_09_engine
#include <cstdio>
#include <vector>

#include "09_engine/scheduler.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages::engine;

struct Csr {
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

/// `qo_lens[i]`: new tokens of row i; `pages[i]`, `kv_lens[i]`: row i's page list and
/// KV length after the append; `page_size`: slots per page.
Csr build_metadata(const std::vector<int32_t>& qo_lens, const std::vector<std::vector<int32_t>>& pages,
                   const std::vector<int32_t>& kv_lens, int32_t page_size) {
  Csr out;
  // TODO 1: out.qo_indptr, batch + 1 entries starting at 0.
  // TODO 2: out.kv_indptr (batch + 1), out.kv_indices (every row's pages in order) and
  //         out.kv_last_page_len (batch): tokens in each row's last page, 1 .. page_size.
  (void)qo_lens;
  (void)pages;
  (void)kv_lens;
  (void)page_size;
  return out;
}

}  // namespace

int main() {
  ArrivalParams p;
  p.seed = 9;
  p.num_requests = 6;
  p.arrivals_per_step = 0.7;
  p.min_prompt_len = 3;
  p.max_prompt_len = 11;
  p.min_new_tokens = 2;
  p.max_new_tokens = 5;
  SchedulerConfig c;
  c.num_pages = 12;
  c.page_size = 4;
  c.max_tokens_per_step = 8;
  c.max_running = 4;
  Scheduler sched(c, ArrivalSchedule::make(p));
  while (!sched.done()) {
    const StepBatch b = sched.next_step();
    std::vector<int32_t> qo_lens, kv_lens;
    std::vector<std::vector<int32_t>> pages;
    for (int32_t i = 0; i < b.batch_size(); ++i) {
      const RequestState& s = sched.state(b.request_ids[i]);
      qo_lens.push_back(b.qo_indptr[i + 1] - b.qo_indptr[i]);
      pages.push_back(sched.sequences().pages(s.sequence));
      kv_lens.push_back(static_cast<int32_t>(sched.sequences().seq_len(s.sequence)));
    }
    const Csr mine = build_metadata(qo_lens, pages, kv_lens, static_cast<int32_t>(c.page_size));
    if (mine.qo_indptr != b.qo_indptr || mine.kv_indptr != b.kv_indptr || mine.kv_indices != b.kv_indices ||
        mine.kv_last_page_len != b.kv_last_page_len) {
      std::printf("%s", b.describe().c_str());
      std::printf("FAIL: step %lld: your arrays differ from the scheduler's (printed above)\n",
                  static_cast<long long>(b.step));
      return 1;
    }
    sched.complete_step(std::vector<int32_t>(b.sample_rows.size(), 7));
  }
  std::printf("PASS: %lld steps, every qo_indptr and page table as the scheduler built them\n",
              static_cast<long long>(sched.steps()));
  return 0;
}
