/// \file sharding.hpp
/// \brief Stage 08's host half: how a batch's pages are cut over GPUs by sequence
/// position, and the cost model that says how many GPUs a batch is worth.
///
/// Context parallelism gives each GPU a contiguous slice of every request's pages:
/// rank 0 the first pages, rank 1 the next, ... Only whole pages move, so a shard is
/// itself a valid CSR page table over the same page ids, and only a request's last page
/// may be partly filled: the last non-empty shard of a request gets it, every other
/// non-empty shard ends on a full page. A shard may be empty (zero pages): its state is
/// the merge's identity (o = 0, lse = -inf). Nothing here touches a GPU or NCCL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::context_parallel {

/// A host CSR page table: the three index arrays of BatchShape/DeviceBatch.
struct PageTable {
  std::vector<int32_t> kv_indptr;         ///< (batch_size + 1) page offsets, kv_indptr[0] == 0
  std::vector<int32_t> kv_indices;        ///< (kv_indptr[batch_size]) page ids
  std::vector<int32_t> kv_last_page_len;  ///< (batch_size): 1..page_size, 0 for a request with no pages

  /// Requests in the table (kv_last_page_len.size()).
  int batch_size() const { return static_cast<int>(kv_last_page_len.size()); }
  /// Keys of request r: (pages - 1) * page_size + last_page_len, 0 without pages.
  int64_t kv_len(int r, int page_size) const;
};

/// The page table of a BatchShape (its kv_indptr, kv_indices, kv_last_page_len).
PageTable page_table_of(const BatchShape& shape);

/// `global` with its page table replaced by `shard`: what one rank's stage 03 plans for.
BatchShape shard_shape(const BatchShape& global, const PageTable& shard);

/// The balanced split: rank k of world_size gets pages [k n / W, (k + 1) n / W) of a
/// request of n pages (page offsets within the request). Returns, per request, the
/// world_size + 1 boundaries. Throws ref::InvalidArgument naming `world_size` (< 1) or
/// `table` (malformed).
std::vector<std::vector<int32_t>> even_page_splits(const PageTable& table, int world_size);

/// Each rank's page table, cut at `page_splits` (per request, world_size + 1 page
/// offsets within the request: 0 first, the request's page count last, non-decreasing).
/// Rank k's table holds, for every request, that request's pages
/// [page_splits[r][k], page_splits[r][k + 1]) in order; its last_page_len is the
/// request's where the slice holds the request's last page, page_size for any other
/// non-empty slice, 0 for an empty one.
/// \param table the batch's page table (host copy)
/// \param page_size tokens per page (for the checks on last_page_len)
/// \param page_splits as above; world_size = page_splits[r].size() - 1, the same for all r
/// \return world_size page tables, rank order
/// Throws ref::InvalidArgument naming `table`, `page_size` or `page_splits[r]`.
std::vector<PageTable> shard_page_table(const PageTable& table, int page_size,
                                        const std::vector<std::vector<int32_t>>& page_splits);

/// shard_page_table with even_page_splits(table, world_size).
std::vector<PageTable> shard_page_table(const PageTable& table, int page_size, int world_size);

/// Checks that `shards` (rank order) are whole-page, contiguous slices of `table` that
/// together hold every page of every request exactly once, in order, with the last
/// page's length on the last non-empty slice. Throws ref::InvalidArgument naming
/// `shards` and the first request and rank that break it.
void check_shards(const PageTable& table, int page_size, const std::vector<PageTable>& shards, const char* fn);

/// How the ranks exchange their partial states (the chapter compares the two).
enum class Exchange {
  all_gather,  ///< every rank gathers every rank's fp32 state and merges all heads itself
  all_to_all,  ///< rank k receives head group k from every rank, merges it, and the merged
               ///< outputs are all-gathered (num_qo_heads must be a multiple of world_size)
};
/// "all_gather" or "all_to_all".
const char* to_string(Exchange exchange);
/// Parses "all_gather" / "all_to_all"; throws ref::InvalidArgument naming `exchange`.
Exchange parse_exchange(const std::string& name);

/// What plan_shards() assumes of the machine beyond one GPU's read rate R (a DeviceModel,
/// kernels/device_model.hpp, no stage's own: stage 03 streaming K/V from HBM). The step on
/// W GPUs is modelled as
///
///     t(W) = max over ranks (K/V bytes of its shard) / R + stage03_seconds
///          + [W > 1] (collectives x collective_seconds x log2 W
///                     + state bytes / link_bytes_per_second + merge_seconds)
///
/// The defaults are round figures for an H200 pair on NVLink within one node (a small NCCL
/// collective's latency under a CUDA graph, one merge launch); flashstep_cp_bench measures
/// all of them, and the chapter refits the model from its JSON.
struct CostModel {
  double stage03_seconds = 8e-6;         ///< stage 03's launches and its own merge, per step
  double collective_seconds = 15e-6;     ///< fixed latency of one NCCL collective (a grouped call)
  double link_bytes_per_second = 100e9;  ///< what a small collective moves per second per GPU
  double merge_seconds = 4e-6;           ///< the merge of the gathered states, one launch
};

/// The model's estimate of one step.
struct StepEstimate {
  int world_size = 1;           ///< GPUs that hold keys
  double read_seconds = 0;      ///< the slowest shard's K/V read
  double exchange_seconds = 0;  ///< collectives: latency + bytes
  double merge_seconds = 0;     ///< the merge after the exchange
  double total_seconds = 0;     ///< the sum, with stage 03's fixed cost
};

/// The model for `shards` (world_size entries; a world of 1 is stage 03 alone).
/// \param global the batch (sizes, dtype; its page table is not read)
/// \param device one GPU: its read_bytes_per_second prices each shard's read
StepEstimate estimate_step(const BatchShape& global, const std::vector<PageTable>& shards, Exchange exchange,
                           const DeviceModel& device, const CostModel& cost);

/// The placement decision: how many of `world_size` GPUs to spread the batch over.
struct ShardPlan {
  int ranks_used = 1;                   ///< 1 when no spread is modelled faster than one GPU
  std::vector<PageTable> shards;        ///< world_size tables; ranks >= ranks_used are empty
  std::vector<StepEstimate> estimates;  ///< the model for every W in 1..world_size (even splits)
};

/// Evaluates the model for even splits over W = 1..world_size GPUs and keeps the fastest;
/// W > 1 only where it is modelled faster than one GPU (speedup above 1.0x). The shards
/// put the pages on ranks 0..ranks_used-1; the others get empty tables.
/// \param global the batch with its host page table (kv_indptr, kv_indices, kv_last_page_len)
/// \param device one GPU (every rank is one alike): device_model() for the current one
ShardPlan plan_shards(const BatchShape& global, int world_size, Exchange exchange, const DeviceModel& device,
                      const CostModel& cost = {});

}  // namespace flashstep::stages::context_parallel
