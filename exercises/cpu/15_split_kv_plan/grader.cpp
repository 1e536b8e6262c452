// Grader of exercise 15: random decode batches (a few long requests, many short ones,
// empty ones), random devices (1 to 132 SMs, 1 to 4 blocks each), page sizes, chunk
// floors, with and without CUDA graphs; your plan_split() against the reference's
// plan_split_kv, field by field.
#include <string>
#include <vector>

#include "grade.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
ref::SplitKVPlan plan_split(const std::vector<int32_t>& kv_page_counts, const ref::SplitKVConfig& config);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "split_kv_plan", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 60; ++c) {
      std::vector<int32_t> pages;
      for (int64_t n = random_int(rng, 1, c % 3 == 0 ? 40 : 6); n > 0; --n)
        pages.push_back(
            static_cast<int32_t>(random_int(rng, 0, 3) == 0 ? random_int(rng, 0, 2) : random_int(rng, 1, 600)));
      ref::SplitKVConfig config;
      config.page_size = random_int(rng, 1, 32);
      config.num_kv_heads = random_int(rng, 1, 8);
      config.num_sm = random_int(rng, 1, 132);
      config.ctas_per_sm = random_int(rng, 1, 4);
      config.enable_cuda_graph = c % 4 == 3;
      config.min_kv_chunk_tokens = std::vector<int64_t>{0, 16, 128, 256}[static_cast<size_t>(random_int(rng, 0, 3))];
      g.at("case " + std::to_string(c + 1) + " of 60: kv_page_counts " + list_text(pages) + "\n  page_size " +
           std::to_string(config.page_size) + ", num_kv_heads " + std::to_string(config.num_kv_heads) + ", num_sm " +
           std::to_string(config.num_sm) + ", ctas_per_sm " + std::to_string(config.ctas_per_sm) +
           ", min_kv_chunk_tokens " + std::to_string(config.min_kv_chunk_tokens) +
           (config.enable_cuda_graph ? ", CUDA graph" : ""));
      const ref::SplitKVPlan e = ref::plan_split_kv(pages, config);
      const ref::SplitKVPlan y = plan_split(pages, config);
      g.same("split_kv", int64_t{y.split_kv}, int64_t{e.split_kv});
      g.same("kv_chunk_size_in_pages", y.kv_chunk_size_in_pages, e.kv_chunk_size_in_pages);
      g.same("num_work_items", y.num_work_items, e.num_work_items);
      g.same("padded_batch_size", y.padded_batch_size, e.padded_batch_size);
      g.same("max_grid_size", y.max_grid_size, e.max_grid_size);
      g.same("enable_cuda_graph", int64_t{y.enable_cuda_graph}, int64_t{e.enable_cuda_graph});
      g.same("request_indices", y.request_indices, e.request_indices);
      g.same("kv_tile_indices", y.kv_tile_indices, e.kv_tile_indices);
      g.same("o_indptr", y.o_indptr, e.o_indptr);
      g.same("block_valid_mask", std::vector<int32_t>(y.block_valid_mask.begin(), y.block_valid_mask.end()),
             std::vector<int32_t>(e.block_valid_mask.begin(), e.block_valid_mask.end()));
      g.passed_case();
    }
  });
}
