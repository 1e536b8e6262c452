/// \file context_parallel.hpp
/// \brief Stage 08 — context-parallel decode: one batch's KV pages sharded over GPUs by
/// sequence position; every GPU runs stage 03 on its shard into fp32 (o, lse) states,
/// the states are exchanged with NCCL and merged exactly with stage 03's merge kernel.
///
/// One process drives all GPUs, one host thread per GPU (run_on_ranks): each thread is
/// what one process of a multi-process server would run, with its own communicator from
/// ncclCommInitRank and a shared ncclUniqueId. The chapter (README.md) says why.
///
/// A rank's step, on its own stream, all of it capturable in one CUDA graph:
///
///     stage 03 on the rank's shard -> fp32 state (B, Hq, D) + lse (B, Hq)
///     all_gather: NCCL all-gather of every rank's state -> (W B, Hq, D); merge all heads
///     all_to_all: NCCL send/recv of head group k to rank k -> (W B, Hq / W, D); merge that
///                 group; NCCL all-gather of the merged outputs -> (B, Hq, D)
///
/// Every rank ends with the whole batch's o and lse (the next layer's tensor-parallel
/// projection needs them on every GPU). Where only one rank holds keys (world_size 1, or
/// a batch plan_shards() kept on one GPU) the step is stage 03 on that rank straight into
/// o, then an NCCL broadcast of o and lse to the others.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "08_context_parallel/sharding.hpp"
#include "stage.hpp"

namespace flashstep::stages::context_parallel {

/// CUDA devices visible to this process (0 where there is no driver or device).
int device_count();

/// Runs body(rank) for rank = 0..world_size-1, each on its own host thread, after
/// cudaSetDevice(rank); returns when all have returned and rethrows the first exception.
/// Throws ref::InvalidArgument naming `world_size` unless 1 <= world_size <= device_count().
/// A rank that throws while the others wait in a collective leaves them waiting: every
/// check of the stage that can fail is made identically on every rank before any collective.
void run_on_ranks(int world_size, const std::function<void(int rank)>& body);

/// One rank's NCCL communicator (ncclCommInitRank / ncclCommDestroy).
class Communicator {
 public:
  /// A new group's id (ncclGetUniqueId): make it once, give the same to every rank.
  static ncclUniqueId make_id();
  /// Joins the group as `rank` of `world_size` on the current device; blocks until every
  /// rank has joined. Throws ref::InvalidArgument naming `rank` or `world_size`, and
  /// std::runtime_error when NCCL cannot be loaded or fails.
  Communicator(const ncclUniqueId& id, int rank, int world_size);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  ncclComm_t get() const { return comm_; }        ///< the NCCL communicator
  int rank() const { return rank_; }              ///< this rank, 0..world_size-1
  int world_size() const { return world_size_; }  ///< ranks in the group
  int device() const { return device_; }          ///< the CUDA device it was made on

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_size_ = 1, device_ = 0;
};

/// How a rank plans.
struct ContextParallelOptions {
  Exchange exchange = Exchange::all_gather;  ///< the collective (see Exchange)
  /// Plan for a captured CUDA graph: stage 03 is made with enable_cuda_graph, so a graph of
  /// the whole step (stage 03, collectives, merge) replays after later plans of the same
  /// batch size and path.
  bool enable_cuda_graph = false;
  /// Stage 03's knobs on every rank; enable_cuda_graph and fp32_states are set by the rank.
  split_kv::SplitKVOptions split_kv;
};

/// Which step run() launches.
enum class Path {
  context_parallel,  ///< stage 03 into fp32 states on every rank, exchange, merge
  single_gpu,        ///< one rank holds every key: stage 03 there into o, broadcast o and lse
};
/// "context_parallel" or "single_gpu".
const char* to_string(Path path);

/// Where the rank's buffers live in its workspace (bytes from its start). A function of
/// the batch size, heads, head_dim, dtype and world_size only.
///
///     stage03     stage 03's own workspace (schedule, partial chunks)
///     states_o    fp32 (W B, Hq, D)  all_gather: every rank's state, rank j at rows j B ..
///                                    all_to_all: the received head groups (W B, Hq / W, D)
///     states_lse  fp32 (W B, Hq)     likewise
///     local_o     fp32 (B, Hq, D)    all_to_all: stage 03's state; send_o its packed copy
///     local_lse   fp32 (B, Hq)       ... and send_lse
///     merged_o    dtype (W B, Hq/W, D) all_to_all: every rank's merged head group
///     merged_lse  fp32 (W B, Hq / W)
struct WorkspaceLayout {
  size_t stage03 = 0, stage03_bytes = 0;
  size_t states_o = 0, states_lse = 0, local_o = 0, local_lse = 0, send_o = 0, send_lse = 0;
  size_t merged_o = 0, merged_lse = 0;
  size_t bytes = 0;  ///< the whole workspace
};

/// One rank's plan/run of stage 08. Make one per rank, on that rank's thread and device.
class ContextParallelRank {
 public:
  /// \param comm this rank's communicator (outlives the rank object)
  explicit ContextParallelRank(Communicator& comm, ContextParallelOptions options = {});
  ~ContextParallelRank();
  ContextParallelRank(const ContextParallelRank&) = delete;
  ContextParallelRank& operator=(const ContextParallelRank&) = delete;

  /// Device workspace this rank needs for batches shaped like `global` (any lengths).
  size_t workspace_bytes(const BatchShape& global) const;
  /// Host planning, identical on every rank: checks `shards` against `global`'s page table
  /// (check_shards), chooses the path, plans stage 03 on this rank's shard.
  /// \param global the whole batch: sizes, dtype and its host page table (kv_indices too)
  /// \param shards world_size page tables, rank order (shard_page_table or plan_shards)
  /// \param workspace device buffer of workspace_bytes(global) bytes, this rank's device
  /// \param stream where stage 03's schedule copy is ordered
  void plan(const BatchShape& global, const std::vector<PageTable>& shards, void* workspace, size_t workspace_size,
            cudaStream_t stream);
  /// The step on this rank (stage 03, exchange, merge). Only launches and NCCL calls:
  /// capturable when planned with enable_cuda_graph. Run it once uncaptured before the
  /// first capture: NCCL connects the ranks on a communicator's first collective (and
  /// first send/recv), which it cannot do inside a capture.
  /// \param batch this rank's device pointers: q (B, Hq, D), the same on every rank;
  ///        kv_indptr, kv_indices, kv_last_page_len: device copies of this rank's shard;
  ///        kv_pool: this rank's pool (the shard's page ids index it); o (B, Hq, D) in
  ///        dtype and lse (B, Hq), written on every rank
  void run(const DeviceBatch& batch, cudaStream_t stream);
  /// The collectives of the planned path alone, on the workspace's buffers (whatever they
  /// hold): what the benchmark times as the exchange's share of the step.
  void exchange_only(cudaStream_t stream);

  Path path() const { return path_; }                                   ///< the planned path
  int holder() const { return holder_; }                                ///< single_gpu: the rank with the keys
  const WorkspaceLayout& layout() const { return layout_; }             ///< the planned workspace layout
  const split_kv::SplitKVRunner& stage03() const { return *stage03_; }  ///< this rank's stage 03
  /// context_parallel, after run(): this rank's own fp32 state (B, Hq, D) and lse (B, Hq)
  /// on the device (the intermediates the tests compare).
  const float* local_state_o() const;
  const float* local_state_lse() const;

 private:
  WorkspaceLayout layout_for(const BatchShape& global) const;
  void exchange_states(cudaStream_t stream);
  void exchange_outputs(void* o, float* lse, cudaStream_t stream);
  float* at_f32(size_t offset) const { return reinterpret_cast<float*>(workspace_ + offset); }

  Communicator& comm_;
  ContextParallelOptions options_;
  BatchShape global_;
  bool planned_ = false;
  Path path_ = Path::context_parallel;
  int holder_ = 0;
  std::unique_ptr<split_kv::SplitKVRunner> stage03_;
  bool stage03_fp32_ = false;
  WorkspaceLayout layout_;
  uint8_t* workspace_ = nullptr;
  bool captured_ = false;
  Path captured_path_ = Path::context_parallel;
};

}  // namespace flashstep::stages::context_parallel
