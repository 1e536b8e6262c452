// The split-KV planner (a pure function) and the reference split-attend-merge.
#include "flashstep/reference/split_plan.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/merge.hpp"

namespace flashstep::ref {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// items(c) = sum_i ceil(max(pages_i, 1) / c): the same count in the search and the plan.
int64_t work_items(const std::vector<int32_t>& pages, int64_t chunk) {
  int64_t n = 0;
  for (int32_t p : pages) n += ceil_div(std::max<int64_t>(p, 1), chunk);
  return n;
}

}  // namespace

SplitKVPlan plan_split_kv(const std::vector<int32_t>& kv_page_counts, const SplitKVConfig& config) {
  const char* fn = "plan_split_kv";
  const int64_t batch = static_cast<int64_t>(kv_page_counts.size());
  require(batch >= 1, fn, "kv_page_counts must describe at least one request");
  require(config.page_size >= 1, fn, "page_size must be >= 1, got " + str(config.page_size));
  require(config.num_kv_heads >= 1, fn, "num_kv_heads must be >= 1, got " + str(config.num_kv_heads));
  require(config.num_sm >= 1, fn, "num_sm must be >= 1, got " + str(config.num_sm));
  require(config.ctas_per_sm >= 1, fn, "ctas_per_sm must be >= 1, got " + str(config.ctas_per_sm));
  require(config.min_kv_chunk_tokens >= 0, fn,
          "min_kv_chunk_tokens must be >= 0, got " + str(config.min_kv_chunk_tokens));
  const int64_t G = config.num_sm * config.ctas_per_sm, H = config.num_kv_heads;
  require(G <= std::numeric_limits<int32_t>::max(), fn, "num_sm * ctas_per_sm must fit in int32");
  int64_t max_pages = 1;
  for (int64_t i = 0; i < batch; ++i) {
    require(kv_page_counts[i] >= 0, fn, "kv_page_counts[" + str(i) + "] = " + str(kv_page_counts[i]) + " must be >= 0");
    max_pages = std::max<int64_t>(max_pages, kv_page_counts[i]);
  }

  SplitKVPlan plan;
  plan.max_grid_size = static_cast<int32_t>(G);
  plan.enable_cuda_graph = config.enable_cuda_graph;
  int64_t chunk = max_pages;
  if (batch * H >= G) {
    // The requests alone fill the device: splitting would only add merge work.
    plan.split_kv = false;
  } else {
    const int64_t c_min = std::max<int64_t>(config.min_kv_chunk_tokens / config.page_size, 1);
    // Smallest chunk in [c_min, max(c_min, max_pages)] whose items fit in one wave.
    int64_t lo = c_min, hi = std::max(c_min, max_pages);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (work_items(kv_page_counts, mid) * H <= G) hi = mid;
      else lo = mid + 1;
    }
    chunk = lo;
    // A split that splits nothing is the plain kernel, except under CUDA graphs, where
    // the kernel must not change with the lengths.
    plan.split_kv = work_items(kv_page_counts, chunk) > batch || config.enable_cuda_graph;
  }
  const int64_t items = work_items(kv_page_counts, chunk);
  plan.kv_chunk_size_in_pages = static_cast<int32_t>(chunk);
  plan.num_work_items = static_cast<int32_t>(items);
  const int64_t padded = config.enable_cuda_graph ? (plan.split_kv ? G / H : batch) : items;
  plan.padded_batch_size = static_cast<int32_t>(padded);

  // Work items request by request, chunk by chunk; padding slots read (0, 0) and are masked.
  plan.o_indptr.push_back(0);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t tiles = ceil_div(std::max<int64_t>(kv_page_counts[i], 1), chunk);
    for (int64_t t = 0; t < tiles; ++t) {
      plan.request_indices.push_back(static_cast<int32_t>(i));
      plan.kv_tile_indices.push_back(static_cast<int32_t>(t));
    }
    plan.o_indptr.push_back(static_cast<int32_t>(plan.o_indptr.back() + tiles));
  }
  plan.block_valid_mask.assign(static_cast<size_t>(padded), 0);
  std::fill(plan.block_valid_mask.begin(), plan.block_valid_mask.begin() + items, 1);
  plan.request_indices.resize(static_cast<size_t>(padded), 0);
  plan.kv_tile_indices.resize(static_cast<size_t>(padded), 0);
  return plan;
}

std::vector<int32_t> kv_page_counts_from_indptr(const std::vector<int32_t>& kv_indptr) {
  check_indptr("kv_page_counts_from_indptr", "kv_indptr", kv_indptr, -1, -1);
  std::vector<int32_t> counts;
  for (size_t i = 0; i + 1 < kv_indptr.size(); ++i) counts.push_back(kv_indptr[i + 1] - kv_indptr[i]);
  return counts;
}

namespace {

// The plan must describe this cache's requests: same batch, same chunks per request.
void check_plan(const char* fn, const PagedKVCache& cache, const SplitKVPlan& plan) {
  const int64_t batch = cache.batch_size();
  require(static_cast<int64_t>(plan.o_indptr.size()) == batch + 1, fn,
          "the plan has " + str(static_cast<int64_t>(plan.o_indptr.size()) - 1) + " requests, the cache " + str(batch));
  require(plan.kv_chunk_size_in_pages >= 1, fn, "plan.kv_chunk_size_in_pages must be >= 1");
  check_indptr(fn, "plan.o_indptr", plan.o_indptr, batch + 1, plan.num_work_items);
  require(plan.num_work_items <= plan.padded_batch_size &&
              static_cast<int64_t>(plan.request_indices.size()) == plan.padded_batch_size &&
              static_cast<int64_t>(plan.kv_tile_indices.size()) == plan.padded_batch_size,
          fn, "plan.request_indices and plan.kv_tile_indices must have padded_batch_size entries");
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t pages = cache.kv_indptr[r + 1] - cache.kv_indptr[r];
    const int64_t tiles = ceil_div(std::max<int64_t>(pages, 1), plan.kv_chunk_size_in_pages);
    require(plan.o_indptr[r + 1] - plan.o_indptr[r] == tiles, fn,
            "request " + str(r) + " has " + str(pages) + " pages, which the plan's chunk of " +
                str(plan.kv_chunk_size_in_pages) + " pages cuts into " + str(tiles) + " tiles, but the plan has " +
                str(plan.o_indptr[r + 1] - plan.o_indptr[r]) + " (was it made for other lengths?)");
    for (int64_t t = 0; t < tiles; ++t)
      require(plan.request_indices[plan.o_indptr[r] + t] == r && plan.kv_tile_indices[plan.o_indptr[r] + t] == t, fn,
              "work item " + str(plan.o_indptr[r] + t) + " must be (request " + str(r) + ", tile " + str(t) + ")");
  }
}

}  // namespace

SplitKVPartials split_kv_partials(const Tensor& q, const PagedKVCache& cache, const SplitKVPlan& plan,
                                  const AttentionOptions& opt) {
  const char* fn = "split_kv_partials";
  check_rank(fn, "q", q, 3);
  check_finite(fn, "q", q);
  check_paged_kv_cache(fn, cache);
  require(q.dim(0) == cache.batch_size(), fn,
          "q dimension 0 (batch_size) must equal the cache's batch size " + str(cache.batch_size()));
  check_dim(fn, "paged_kv_cache", cache.pages, 4, q.dim(2), "head_dim, must match q");
  check_head_dim(fn, q.dim(2));
  check_heads(fn, q.dim(1), cache.num_kv_heads());
  check_attention_options(fn, opt);
  check_plan(fn, cache, plan);

  const int64_t heads = q.dim(1), head_dim = q.dim(2), group = heads / cache.num_kv_heads();
  const int64_t ps = cache.page_size(), c = plan.kv_chunk_size_in_pages;
  const double sm_scale = resolved_sm_scale(opt, head_dim);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  SplitKVPartials out{Tensor({plan.num_work_items, heads, head_dim}, nan), Tensor({plan.num_work_items, heads}, nan)};
  for (int64_t k = 0; k < plan.num_work_items; ++k) {
    const int64_t r = plan.request_indices[k], t = plan.kv_tile_indices[k];
    const int64_t kv_len = cache.kv_len(r);
    // Keys of this chunk, by position in the whole request.
    const int64_t j0 = std::min(kv_len, t * c * ps), j1 = std::min(kv_len, (t + 1) * c * ps);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kv_head = h / group;
      std::vector<double> s;
      std::vector<int64_t> keys;
      for (int64_t j = j0; j < j1; ++j) {
        // The decode query is the request's last token: query 0 of qo_len 1.
        if (!key_visible(0, j, 1, kv_len, false, opt.window_left)) continue;
        const int32_t page = cache.kv_indices[cache.kv_indptr[r] + j / ps];
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += q({r, h, d}) * cache.at(page, 0, j % ps, kv_head, d);
        double sj = dot * sm_scale;
        if (opt.logits_soft_cap > 0) sj = opt.logits_soft_cap * std::tanh(sj / opt.logits_soft_cap);
        s.push_back(sj);
        keys.push_back(j);
      }
      if (s.empty()) {  // the empty state, the identity of the merge
        out.s({k, h}) = -std::numeric_limits<double>::infinity();
        for (int64_t d = 0; d < head_dim; ++d) out.v({k, h, d}) = 0.0;
        continue;
      }
      const double m = *std::max_element(s.begin(), s.end());
      double denom = 0;
      for (double x : s) denom += std::exp(x - m);
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          const int32_t page = cache.kv_indices[cache.kv_indptr[r] + keys[n] / ps];
          acc += std::exp(s[n] - m) * cache.at(page, 1, keys[n] % ps, kv_head, d);
        }
        out.v({k, h, d}) = acc / denom;
      }
      out.s({k, h}) = m + std::log(denom);
    }
  }
  return out;
}

AttentionResult merge_split_kv(const SplitKVPartials& partials, const SplitKVPlan& plan) {
  const char* fn = "merge_split_kv";
  check_rank(fn, "partials.v", partials.v, 3);
  check_rank(fn, "partials.s", partials.s, 2);
  require(partials.v.dim(0) == plan.num_work_items && partials.s.dim(0) == plan.num_work_items &&
              partials.s.dim(1) == partials.v.dim(1),
          fn, "partials must hold num_work_items = " + str(plan.num_work_items) + " rows of matching heads");
  check_indptr(fn, "plan.o_indptr", plan.o_indptr, -1, plan.num_work_items);
  const int64_t batch = static_cast<int64_t>(plan.o_indptr.size()) - 1;
  const int64_t heads = partials.v.dim(1), head_dim = partials.v.dim(2);
  AttentionResult out{Tensor({batch, heads, head_dim}), Tensor({batch, heads})};
  for (int64_t r = 0; r < batch; ++r) {
    // Start from the empty state and merge the request's chunks in order.
    Tensor o({1, heads, head_dim}), lse({1, heads}, -std::numeric_limits<double>::infinity());
    for (int32_t k = plan.o_indptr[r]; k < plan.o_indptr[r + 1]; ++k) {
      Tensor vk({1, heads, head_dim}), sk({1, heads});
      std::copy_n(partials.v.data.begin() + k * heads * head_dim, heads * head_dim, vk.data.begin());
      std::copy_n(partials.s.data.begin() + k * heads, heads, sk.data.begin());
      MergedState m = merge_state(o, lse, vk, sk);
      o = std::move(m.v);
      lse = std::move(m.s);
    }
    std::copy(o.data.begin(), o.data.end(), out.o.data.begin() + r * heads * head_dim);
    std::copy(lse.data.begin(), lse.data.end(), out.lse.data.begin() + r * heads);
  }
  return out;
}

AttentionResult split_kv_decode(const Tensor& q, const PagedKVCache& cache, const SplitKVPlan& plan,
                                const AttentionOptions& opt) {
  return merge_split_kv(split_kv_partials(q, cache, plan, opt), plan);
}

}  // namespace flashstep::ref
