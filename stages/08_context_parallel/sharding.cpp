// Stage 08's host half: cutting page tables by sequence position, checking a cut, and
// the cost model that chooses how many GPUs a batch is spread over.
#include "08_context_parallel/sharding.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::context_parallel {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_table(const PageTable& t, int page_size, const char* fn, const std::string& name) {
  ref::require(page_size >= 1, fn, "page_size must be >= 1, got " + str(page_size));
  const size_t b = t.kv_last_page_len.size();
  ref::require(t.kv_indptr.size() == b + 1, fn,
               name + ".kv_indptr must have batch_size + 1 = " + str(int64_t(b) + 1) + " entries, got " +
                   str(int64_t(t.kv_indptr.size())));
  ref::require(t.kv_indptr[0] == 0, fn, name + ".kv_indptr[0] must be 0");
  for (size_t r = 0; r < b; ++r) {
    const int32_t pages = t.kv_indptr[r + 1] - t.kv_indptr[r];
    ref::require_lazy(pages >= 0, fn,
                      [&] { return name + ".kv_indptr must not decrease (request " + str(int64_t(r)) + ")"; });
    const int32_t last = t.kv_last_page_len[r];
    ref::require_lazy(pages == 0 ? (last >= 0 && last <= page_size) : (last >= 1 && last <= page_size), fn, [&] {
      return name + ".kv_last_page_len[" + str(int64_t(r)) + "] is " + str(last) + "; it must be 1.." + str(page_size) +
             " for a request with pages (0 allowed for one without)";
    });
  }
  ref::require(t.kv_indices.size() == size_t(t.kv_indptr[b]), fn,
               name + ".kv_indices must have kv_indptr[batch_size] = " + str(t.kv_indptr[b]) + " entries, got " +
                   str(int64_t(t.kv_indices.size())));
}

}  // namespace

int64_t PageTable::kv_len(int r, int page_size) const {
  const int64_t pages = kv_indptr[r + 1] - kv_indptr[r];
  return pages == 0 ? 0 : (pages - 1) * page_size + kv_last_page_len[r];
}

PageTable page_table_of(const BatchShape& shape) {
  return PageTable{shape.kv_indptr, shape.kv_indices, shape.kv_last_page_len};
}

BatchShape shard_shape(const BatchShape& global, const PageTable& shard) {
  BatchShape s = global;
  s.kv_indptr = shard.kv_indptr;
  s.kv_indices = shard.kv_indices;
  s.kv_last_page_len = shard.kv_last_page_len;
  return s;
}

std::vector<std::vector<int32_t>> even_page_splits(const PageTable& table, int world_size) {
  const char* fn = "even_page_splits";
  ref::require(world_size >= 1, fn, "world_size must be >= 1, got " + str(world_size));
  ref::require(table.kv_indptr.size() == table.kv_last_page_len.size() + 1, fn,
               "table.kv_indptr must have batch_size + 1 entries");
  std::vector<std::vector<int32_t>> splits(table.kv_last_page_len.size());
  for (size_t r = 0; r < splits.size(); ++r) {
    const int64_t n = table.kv_indptr[r + 1] - table.kv_indptr[r];
    for (int k = 0; k <= world_size; ++k) splits[r].push_back(static_cast<int32_t>(n * k / world_size));
  }
  return splits;
}

std::vector<PageTable> shard_page_table(const PageTable& table, int page_size,
                                        const std::vector<std::vector<int32_t>>& page_splits) {
  const char* fn = "shard_page_table";
  check_table(table, page_size, fn, "table");
  const int batch = table.batch_size();
  ref::require(page_splits.size() == size_t(batch), fn,
               "page_splits must have one entry per request (" + str(batch) + "), got " +
                   str(int64_t(page_splits.size())));
  const int world_size = batch ? static_cast<int>(page_splits[0].size()) - 1 : 1;
  ref::require(world_size >= 1, fn, "page_splits[0] must have world_size + 1 >= 2 entries");
  for (int r = 0; r < batch; ++r) {
    const std::vector<int32_t>& s = page_splits[size_t(r)];
    auto name = [&] { return "page_splits[" + str(r) + "]"; };  // built only for a message
    const int32_t pages = table.kv_indptr[r + 1] - table.kv_indptr[r];
    ref::require_lazy(s.size() == size_t(world_size) + 1, fn, [&] {
      return name() + " has " + str(int64_t(s.size())) +
             " entries; every request needs world_size + 1 = " + str(world_size + 1);
    });
    ref::require_lazy(s.front() == 0 && s.back() == pages, fn, [&] {
      return name() + " must start at page 0 and end at the request's page count " + str(pages) +
             " (the shards must cover the request), got " + str(s.front()) + " .. " + str(s.back());
    });
    for (int k = 0; k < world_size; ++k)
      ref::require_lazy(s[size_t(k)] <= s[size_t(k) + 1], fn, [&] {
        return name() + " must not decrease (rank " + str(k) + ": " + str(s[size_t(k)]) + " > " +
               str(s[size_t(k) + 1]) + ")";
      });
  }
  std::vector<PageTable> shards(static_cast<size_t>(world_size));
  for (int k = 0; k < world_size; ++k) {
    PageTable& t = shards[size_t(k)];
    t.kv_indptr.push_back(0);
    for (int r = 0; r < batch; ++r) {
      const std::vector<int32_t>& s = page_splits[size_t(r)];
      const int32_t begin = s[size_t(k)], end = s[size_t(k) + 1];
      const int32_t pages = table.kv_indptr[r + 1] - table.kv_indptr[r];
      const auto first = table.kv_indices.begin() + table.kv_indptr[r];
      t.kv_indices.insert(t.kv_indices.end(), first + begin, first + end);
      t.kv_indptr.push_back(t.kv_indptr.back() + (end - begin));
      // Only the request's last page may be partial: whoever holds it gets its length.
      t.kv_last_page_len.push_back(end == begin ? 0 : (end == pages ? table.kv_last_page_len[size_t(r)] : page_size));
    }
  }
  return shards;
}

std::vector<PageTable> shard_page_table(const PageTable& table, int page_size, int world_size) {
  return shard_page_table(table, page_size, even_page_splits(table, world_size));
}

void check_shards(const PageTable& table, int page_size, const std::vector<PageTable>& shards, const char* fn) {
  check_table(table, page_size, fn, "the batch's page table");
  ref::require(!shards.empty(), fn, "shards is empty; it needs one page table per rank");
  const int batch = table.batch_size();
  for (size_t k = 0; k < shards.size(); ++k) {
    check_table(shards[k], page_size, fn, "shards[" + str(int64_t(k)) + "]");
    ref::require(shards[k].batch_size() == batch, fn,
                 "shards[" + str(int64_t(k)) + "] has " + str(shards[k].batch_size()) + " requests; the batch has " +
                     str(batch));
  }
  for (int r = 0; r < batch; ++r) {
    // The shards' pages of request r, in rank order, must be the request's pages.
    std::vector<int32_t> joined;
    int last_holder = -1;
    for (size_t k = 0; k < shards.size(); ++k) {
      const PageTable& t = shards[k];
      const auto first = t.kv_indices.begin() + t.kv_indptr[r];
      joined.insert(joined.end(), first, t.kv_indices.begin() + t.kv_indptr[r + 1]);
      if (t.kv_indptr[r + 1] > t.kv_indptr[r]) last_holder = static_cast<int>(k);
    }
    const auto first = table.kv_indices.begin() + table.kv_indptr[r];
    const std::vector<int32_t> pages(first, table.kv_indices.begin() + table.kv_indptr[r + 1]);
    ref::require(joined == pages, fn,
                 "shards do not cover request " + str(r) + ": its " + str(int64_t(pages.size())) +
                     " pages are not the concatenation of the shards' pages in rank order (" +
                     str(int64_t(joined.size())) + " pages)");
    for (size_t k = 0; k < shards.size(); ++k) {
      const PageTable& t = shards[k];
      if (t.kv_indptr[r + 1] == t.kv_indptr[r]) continue;
      const int32_t want = static_cast<int>(k) == last_holder ? table.kv_last_page_len[size_t(r)] : page_size;
      ref::require(t.kv_last_page_len[size_t(r)] == want, fn,
                   "shards[" + str(int64_t(k)) + "].kv_last_page_len[" + str(r) + "] is " +
                       str(t.kv_last_page_len[size_t(r)]) + ", expected " + str(want) +
                       " (only the last non-empty shard of a request may end on a partial page)");
    }
  }
}

const char* to_string(Exchange exchange) { return exchange == Exchange::all_gather ? "all_gather" : "all_to_all"; }

Exchange parse_exchange(const std::string& name) {
  if (name == "all_gather") return Exchange::all_gather;
  if (name == "all_to_all") return Exchange::all_to_all;
  throw ref::InvalidArgument("parse_exchange: exchange must be all_gather or all_to_all, got \"" + name + "\"");
}

StepEstimate estimate_step(const BatchShape& global, const std::vector<PageTable>& shards, Exchange exchange,
                           const DeviceModel& device, const CostModel& cost) {
  ref::require(device.read_bytes_per_second > 0, "estimate_step", "device.read_bytes_per_second must be positive");
  StepEstimate e;
  const double elt = static_cast<double>(dtype_bytes(global.dtype));
  const double kv_bytes_per_token = 2.0 * global.num_kv_heads * global.head_dim * elt;
  int holders = 0;
  double worst = 0;
  for (const PageTable& t : shards) {
    double tokens = 0;
    for (int r = 0; r < t.batch_size(); ++r) tokens += static_cast<double>(t.kv_len(r, global.page_size));
    worst = std::max(worst, tokens);
    holders += tokens > 0;
  }
  e.world_size = static_cast<int>(shards.size());
  e.read_seconds = worst * kv_bytes_per_token / device.read_bytes_per_second;
  if (e.world_size > 1 && holders > 0) {
    const double W = e.world_size;
    const double rows = double(global.batch_size) * global.num_qo_heads;
    const double state_bytes = rows * (global.head_dim + 1) * 4.0;  // fp32 o and lse, one rank's
    // A collective's latency grows with the ranks it must hear from: log2 W steps, as a
    // tree-shaped small-message collective takes (2 GPUs: one collective_seconds).
    const double latency = cost.collective_seconds * std::log2(W);
    if (exchange == Exchange::all_gather) {
      e.exchange_seconds = latency + (W - 1) * state_bytes / cost.link_bytes_per_second;
    } else {  // an all-to-all of the states, then an all-gather of the merged outputs
      const double out_bytes = rows * (global.head_dim * elt + 4.0);
      e.exchange_seconds = 2 * latency + (W - 1) / W * (state_bytes + out_bytes) / cost.link_bytes_per_second;
    }
    e.merge_seconds = cost.merge_seconds;
  }
  e.total_seconds = e.read_seconds + cost.stage03_seconds + e.exchange_seconds + e.merge_seconds;
  return e;
}

ShardPlan plan_shards(const BatchShape& global, int world_size, Exchange exchange, const DeviceModel& device,
                      const CostModel& cost) {
  const char* fn = "plan_shards";
  ref::require(world_size >= 1, fn, "world_size must be >= 1, got " + str(world_size));
  const PageTable table = page_table_of(global);
  check_table(table, global.page_size, fn, "global");
  ShardPlan plan;
  double best = 0;
  for (int w = 1; w <= world_size; ++w) {
    const StepEstimate e = estimate_step(global, shard_page_table(table, global.page_size, w), exchange, device, cost);
    plan.estimates.push_back(e);
    if (w == 1 || e.total_seconds < best) {  // strictly faster than every smaller spread
      best = e.total_seconds;
      plan.ranks_used = w;
    }
  }
  // Pages on ranks 0..ranks_used-1, evenly; the other ranks hold nothing of this batch.
  std::vector<std::vector<int32_t>> splits = even_page_splits(table, plan.ranks_used);
  for (auto& s : splits) s.resize(size_t(world_size) + 1, s.back());
  plan.shards = shard_page_table(table, global.page_size, splits);
  return plan;
}

}  // namespace flashstep::stages::context_parallel
