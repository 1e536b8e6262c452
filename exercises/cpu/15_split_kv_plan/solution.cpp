// Exercise 15's solution: count work items per chunk size, take the smallest that fits.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::SplitKVConfig;
using flashstep::ref::SplitKVPlan;

SplitKVPlan plan_split(const std::vector<int32_t>& kv_page_counts, const SplitKVConfig& config) {
  const int64_t batch = static_cast<int64_t>(kv_page_counts.size());
  const int64_t G = config.num_sm * config.ctas_per_sm, H = config.num_kv_heads;
  int64_t max_pages = 1;
  for (int32_t p : kv_page_counts) max_pages = std::max<int64_t>(max_pages, p);
  // chunks of request i: ceil(max(pages_i, 1) / c); an empty request still writes its empty state
  auto tiles = [](int64_t pages, int64_t c) { return (std::max<int64_t>(pages, 1) + c - 1) / c; };
  auto items = [&](int64_t c) {
    int64_t n = 0;
    for (int32_t p : kv_page_counts) n += tiles(p, c);
    return n;
  };
  SplitKVPlan plan;
  plan.max_grid_size = static_cast<int32_t>(G);
  plan.enable_cuda_graph = config.enable_cuda_graph;
  int64_t chunk = max_pages;
  if (batch * H < G) {
    // items(c) never grows with c, so the first c that fits is the smallest; the last one
    // (one chunk per request, batch_size items) always fits here
    chunk = std::max<int64_t>(config.min_kv_chunk_tokens / config.page_size, 1);
    while (chunk < max_pages && items(chunk) * H > G) ++chunk;
    plan.split_kv = items(chunk) > batch || config.enable_cuda_graph;
  }
  plan.kv_chunk_size_in_pages = static_cast<int32_t>(chunk);
  plan.num_work_items = static_cast<int32_t>(items(chunk));
  plan.padded_batch_size = static_cast<int32_t>(config.enable_cuda_graph ? (plan.split_kv ? G / H : batch)
                                                                         : plan.num_work_items);
  plan.o_indptr = {0};
  for (int64_t i = 0; i < batch; ++i) {
    for (int64_t t = 0; t < tiles(kv_page_counts[i], chunk); ++t) {
      plan.request_indices.push_back(static_cast<int32_t>(i));
      plan.kv_tile_indices.push_back(static_cast<int32_t>(t));
    }
    plan.o_indptr.push_back(static_cast<int32_t>(plan.request_indices.size()));
  }
  plan.block_valid_mask.assign(plan.request_indices.size(), 1);
  plan.request_indices.resize(static_cast<size_t>(plan.padded_batch_size), 0);
  plan.kv_tile_indices.resize(static_cast<size_t>(plan.padded_batch_size), 0);
  plan.block_valid_mask.resize(static_cast<size_t>(plan.padded_batch_size), 0);
  return plan;
}
