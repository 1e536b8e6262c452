// Stage 08 — context-parallel decode: the communicator, the per-rank plan/run, the two
// exchanges, and the thread-per-GPU driver.
//
// Nothing here computes attention: stage 03 attends each rank's shard into an fp32 state
// (SplitKVOptions::fp32_states), and stage 03's merge block, over the gathered rows
// (merge_gathered.cuh), folds the exchanged states. What this file adds is where the
// states travel: an NCCL all-gather, or an all-to-all by heads followed by an all-gather
// of the merged outputs.
//
// How to run it: `ctest -L gpu -R context_parallel` validates it (on 1 GPU, and on 2
// where there are two); `flashstep_cp_bench` times it; scripts/gpu-cp.sh runs both.
#include "08_context_parallel/context_parallel.hpp"

#include <cuda_runtime.h>

#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "08_context_parallel/merge_gathered.hpp"
#include "08_context_parallel/nccl_library.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::context_parallel {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// Stage 03's options on a rank: the caller's knobs, the graph flag, and fp32 states on
/// the context-parallel path (a state to exchange) or not (single GPU: straight into o).
split_kv::SplitKVOptions stage03_options(const ContextParallelOptions& o, bool fp32_states) {
  split_kv::SplitKVOptions s = o.split_kv;
  s.enable_cuda_graph = o.enable_cuda_graph;
  s.fp32_states = fp32_states;
  return s;
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky-free error and report none
    return 0;
  }
  return n;
}

void run_on_ranks(int world_size, const std::function<void(int rank)>& body) {
  const int devices = device_count();
  ref::require(world_size >= 1 && world_size <= devices, "run_on_ranks",
               "world_size must be 1.." + str(devices) + " (the CUDA devices visible), got " + str(world_size));
  std::exception_ptr first;
  std::mutex mutex;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        FLASHSTEP_CUDA_CHECK(cudaSetDevice(rank));
        body(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// ---- Communicator -------------------------------------------------------------------

ncclUniqueId Communicator::make_id() {
  ncclUniqueId id;
  nccl_check(nccl().GetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

Communicator::Communicator(const ncclUniqueId& id, int rank, int world_size) : rank_(rank), world_size_(world_size) {
  const char* fn = "Communicator";
  const int devices = device_count();
  ref::require(world_size >= 1 && world_size <= devices, fn,
               "world_size must be 1.." + str(devices) + " (the CUDA devices visible), got " + str(world_size));
  ref::require(rank >= 0 && rank < world_size, fn,
               "rank must be 0..world_size-1 = " + str(world_size - 1) + ", got " + str(rank));
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device_));
  nccl_check(nccl().CommInitRank(&comm_, world_size, id, rank), "ncclCommInitRank");
}

Communicator::~Communicator() {
  if (comm_) nccl().CommDestroy(comm_);  // no throw from a destructor
}

const char* to_string(Path path) { return path == Path::context_parallel ? "context_parallel" : "single_gpu"; }

// ---- ContextParallelRank ------------------------------------------------------------

ContextParallelRank::ContextParallelRank(Communicator& comm, ContextParallelOptions options)
    : comm_(comm), options_(options) {}

ContextParallelRank::~ContextParallelRank() = default;

size_t ContextParallelRank::workspace_bytes(const BatchShape& global) const { return layout_for(global).bytes; }

WorkspaceLayout ContextParallelRank::layout_for(const BatchShape& global) const {
  const char* fn = "ContextParallelRank::workspace_bytes";
  ref::require(global.mode == Mode::decode && global.storage == KVStorage::paged, fn,
               "stage 08 runs paged decode only; got " + global.describe());
  const int W = comm_.world_size();
  ref::require(options_.exchange != Exchange::all_to_all || global.num_qo_heads % W == 0, fn,
               "options.exchange all_to_all splits the query heads over the ranks: num_qo_heads (" +
                   str(global.num_qo_heads) + ") must be a multiple of world_size (" + str(W) + ")");
  // Either path's stage 03 fits (the plan may choose either).
  size_t stage03 = 0;
  for (bool fp32 : {false, true})
    stage03 = std::max(stage03, split_kv::SplitKVRunner(stage03_options(options_, fp32)).workspace_bytes(global));
  const size_t rows = size_t(global.batch_size) * global.num_qo_heads, D = size_t(global.head_dim);
  const size_t elt = dtype_bytes(global.dtype);
  size_t at = align_up(stage03);
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at = align_up(at + bytes);
    return here;
  };
  WorkspaceLayout w;
  w.stage03 = 0;
  w.stage03_bytes = stage03;
  w.states_o = take(sizeof(float) * W * rows * D);
  w.states_lse = take(sizeof(float) * W * rows);
  w.local_o = take(sizeof(float) * rows * D);
  w.local_lse = take(sizeof(float) * rows);
  w.send_o = take(sizeof(float) * rows * D);
  w.send_lse = take(sizeof(float) * rows);
  w.merged_o = take(elt * rows * D);
  w.merged_lse = take(sizeof(float) * rows);
  w.bytes = at;
  return w;
}

void ContextParallelRank::plan(const BatchShape& global, const std::vector<PageTable>& shards, void* workspace,
                               size_t workspace_size, cudaStream_t stream) {
  const char* fn = "ContextParallelRank::plan";
  const int W = comm_.world_size(), rank = comm_.rank();
  ref::require(int(shards.size()) == W, fn,
               "shards must have one page table per rank (world_size " + str(W) + "), got " +
                   str(int64_t(shards.size())));
  check_shards(page_table_of(global), global.page_size, shards, fn);
  const WorkspaceLayout layout = layout_for(global);
  ref::require(workspace != nullptr && workspace_size >= layout.bytes, fn,
               "workspace_size is " + str(int64_t(workspace_size)) + " bytes; this shape needs " +
                   str(int64_t(layout.bytes)) + " (workspace_bytes(global))");

  // ---- the path: every rank derives the same one from the same host tables.
  int holders = 0, holder = 0;
  for (int k = 0; k < W; ++k)
    if (!shards[size_t(k)].kv_indices.empty()) {
      ++holders;
      holder = k;
    }
  const Path path = holders <= 1 ? Path::single_gpu : Path::context_parallel;
  ref::require(!captured_ || path == captured_path_, fn,
               std::string("run() was captured into a CUDA graph on the ") + to_string(captured_path_) +
                   " path; this plan needs the " + to_string(path) +
                   " path, which that graph cannot replay. Capture again after this plan.");

  // ---- stage 03 on this rank's shard: fp32 states to exchange, or straight into o.
  const bool fp32 = path == Path::context_parallel;
  if (!stage03_ || stage03_fp32_ != fp32) {
    stage03_ = std::make_unique<split_kv::SplitKVRunner>(stage03_options(options_, fp32));
    stage03_fp32_ = fp32;
  }
  workspace_ = static_cast<uint8_t*>(workspace);
  layout_ = layout;
  stage03_->plan(shard_shape(global, shards[size_t(rank)]), workspace_ + layout_.stage03, layout_.stage03_bytes,
                 stream);
  global_ = global;
  path_ = path;
  holder_ = holder;
  planned_ = true;
}

const float* ContextParallelRank::local_state_o() const {
  if (!planned_ || path_ != Path::context_parallel) return nullptr;
  const size_t rows = size_t(global_.batch_size) * global_.num_qo_heads;
  return options_.exchange == Exchange::all_gather ? at_f32(layout_.states_o) + comm_.rank() * rows * global_.head_dim
                                                   : at_f32(layout_.local_o);
}

const float* ContextParallelRank::local_state_lse() const {
  if (!planned_ || path_ != Path::context_parallel) return nullptr;
  const size_t rows = size_t(global_.batch_size) * global_.num_qo_heads;
  return options_.exchange == Exchange::all_gather ? at_f32(layout_.states_lse) + comm_.rank() * rows
                                                   : at_f32(layout_.local_lse);
}

void ContextParallelRank::run(const DeviceBatch& batch, cudaStream_t stream) {
  const char* fn = "ContextParallelRank::run";
  ref::require(planned_, fn, "call plan() before run()");
  ref::require(batch.o != nullptr && batch.lse != nullptr, fn, "batch.o and batch.lse must not be null");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    ref::require(options_.enable_cuda_graph, fn,
                 "the stream is being captured into a CUDA graph, but this rank plans without "
                 "ContextParallelOptions::enable_cuda_graph; make it with enable_cuda_graph = true");
    captured_ = true;
    captured_path_ = path_;
  }
  const BatchShape& g = global_;
  const size_t rows = size_t(g.batch_size) * g.num_qo_heads, D = size_t(g.head_dim);

  if (path_ == Path::single_gpu) {
    // One rank holds every key: stage 03 there, straight into o; the others receive it.
    if (comm_.rank() == holder_) stage03_->run(batch, stream);
    if (comm_.world_size() > 1) {
      const NcclLibrary& n = nccl();
      nccl_check(n.GroupStart(), "ncclGroupStart");
      nccl_check(
          n.Broadcast(batch.o, batch.o, rows * D * dtype_bytes(g.dtype), ncclUint8, holder_, comm_.get(), stream),
          "ncclBroadcast(o)");
      nccl_check(n.Broadcast(batch.lse, batch.lse, rows, ncclFloat32, holder_, comm_.get(), stream),
                 "ncclBroadcast(lse)");
      nccl_check(n.GroupEnd(), "ncclGroupEnd");
    }
    return;
  }

  // 1. This rank's shard -> its fp32 state, written where the exchange reads it.
  DeviceBatch local = batch;
  local.o = const_cast<float*>(local_state_o());
  local.lse = const_cast<float*>(local_state_lse());
  stage03_->run(local, stream);

  const int W = comm_.world_size();
  if (options_.exchange == Exchange::all_gather) {
    // 2. Every rank's state on every rank (rows j B .. j B + B - 1 from rank j) ...
    exchange_states(stream);
    // 3. ... merged there, all heads: W states per request.
    merge_gathered_states(at_f32(layout_.states_o), at_f32(layout_.states_lse), W, g.batch_size, g.num_qo_heads,
                          g.head_dim, g.dtype, batch.o, batch.lse, stream);
    return;
  }
  // all_to_all: 2. head group k of every rank's state to rank k ...
  exchange_states(stream);
  // 3. ... merged there (W states per request of Hq / W heads) into this rank's slot of
  // the merged outputs, 4. which an all-gather puts on every rank.
  const int h = g.num_qo_heads / W;
  const size_t elt = dtype_bytes(g.dtype);
  const size_t slot_o = size_t(g.batch_size) * h * D * elt, slot_lse = size_t(g.batch_size) * h;
  // With one request the gathered layout (W, 1, Hq/W, D) is o's (1, Hq, D): gather into o.
  uint8_t* merged_o = g.batch_size == 1 ? static_cast<uint8_t*>(batch.o) : workspace_ + layout_.merged_o;
  float* merged_lse = g.batch_size == 1 ? batch.lse : at_f32(layout_.merged_lse);
  merge_gathered_states(at_f32(layout_.states_o), at_f32(layout_.states_lse), W, g.batch_size, h, g.head_dim, g.dtype,
                        merged_o + comm_.rank() * slot_o, merged_lse + comm_.rank() * slot_lse, stream);
  exchange_outputs(merged_o, merged_lse, stream);
  if (g.batch_size == 1) return;
  // (W, B, Hq/W, D) -> (B, Hq, D): rank k's group lands at heads k h .. k h + h - 1 of every request.
  for (int k = 0; k < W; ++k) {
    FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<uint8_t*>(batch.o) + k * h * D * elt, g.num_qo_heads * D * elt,
                                           merged_o + k * slot_o, h * D * elt, h * D * elt, g.batch_size,
                                           cudaMemcpyDeviceToDevice, stream));
    FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(batch.lse + k * h, g.num_qo_heads * sizeof(float), merged_lse + k * slot_lse,
                                           h * sizeof(float), h * sizeof(float), g.batch_size, cudaMemcpyDeviceToDevice,
                                           stream));
  }
}

void ContextParallelRank::exchange_states(cudaStream_t stream) {
  const BatchShape& g = global_;
  const int W = comm_.world_size(), rank = comm_.rank();
  const size_t rows = size_t(g.batch_size) * g.num_qo_heads, D = size_t(g.head_dim);
  const NcclLibrary& n = nccl();
  if (options_.exchange == Exchange::all_gather) {
    // In place: this rank's state already sits in its slot of the gather buffers. The two
    // gathers in one group are one NCCL launch.
    float* o = at_f32(layout_.states_o);
    float* lse = at_f32(layout_.states_lse);
    nccl_check(n.GroupStart(), "ncclGroupStart");
    nccl_check(n.AllGather(o + rank * rows * D, o, rows * D, ncclFloat32, comm_.get(), stream), "ncclAllGather(o)");
    nccl_check(n.AllGather(lse + rank * rows, lse, rows, ncclFloat32, comm_.get(), stream), "ncclAllGather(lse)");
    nccl_check(n.GroupEnd(), "ncclGroupEnd");
    return;
  }
  // all_to_all: what goes to rank k is head group k of every request, contiguous. With one
  // request the state (1, Hq, D) is already in that order; otherwise pack it first.
  const int h = g.num_qo_heads / W;
  const float* send_o = at_f32(layout_.local_o);
  const float* send_lse = at_f32(layout_.local_lse);
  if (g.batch_size > 1) {
    for (int k = 0; k < W; ++k) {
      FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(at_f32(layout_.send_o) + k * g.batch_size * h * D, h * D * sizeof(float),
                                             send_o + k * h * D, g.num_qo_heads * D * sizeof(float),
                                             h * D * sizeof(float), g.batch_size, cudaMemcpyDeviceToDevice, stream));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy2DAsync(at_f32(layout_.send_lse) + k * g.batch_size * h, h * sizeof(float),
                                             send_lse + k * h, g.num_qo_heads * sizeof(float), h * sizeof(float),
                                             g.batch_size, cudaMemcpyDeviceToDevice, stream));
    }
    send_o = at_f32(layout_.send_o);
    send_lse = at_f32(layout_.send_lse);
  }
  // Received from rank j: its group (B, h, D) at rows j B .. of (W B, h, D): merge_gathered_states' layout.
  const size_t part_o = size_t(g.batch_size) * h * D, part_lse = size_t(g.batch_size) * h;
  float* recv_o = at_f32(layout_.states_o);
  float* recv_lse = at_f32(layout_.states_lse);
  nccl_check(n.GroupStart(), "ncclGroupStart");
  for (int k = 0; k < W; ++k) {
    nccl_check(n.Send(send_o + k * part_o, part_o, ncclFloat32, k, comm_.get(), stream), "ncclSend(o)");
    nccl_check(n.Recv(recv_o + k * part_o, part_o, ncclFloat32, k, comm_.get(), stream), "ncclRecv(o)");
    nccl_check(n.Send(send_lse + k * part_lse, part_lse, ncclFloat32, k, comm_.get(), stream), "ncclSend(lse)");
    nccl_check(n.Recv(recv_lse + k * part_lse, part_lse, ncclFloat32, k, comm_.get(), stream), "ncclRecv(lse)");
  }
  nccl_check(n.GroupEnd(), "ncclGroupEnd");
}

void ContextParallelRank::exchange_outputs(void* o, float* lse, cudaStream_t stream) {
  const BatchShape& g = global_;
  const int W = comm_.world_size(), rank = comm_.rank();
  const int h = g.num_qo_heads / W;
  const size_t count_o = size_t(g.batch_size) * h * g.head_dim * dtype_bytes(g.dtype),
               count_lse = size_t(g.batch_size) * h;
  const NcclLibrary& n = nccl();
  nccl_check(n.GroupStart(), "ncclGroupStart");
  nccl_check(n.AllGather(static_cast<uint8_t*>(o) + rank * count_o, o, count_o, ncclUint8, comm_.get(), stream),
             "ncclAllGather(merged o)");
  nccl_check(n.AllGather(lse + rank * count_lse, lse, count_lse, ncclFloat32, comm_.get(), stream),
             "ncclAllGather(merged lse)");
  nccl_check(n.GroupEnd(), "ncclGroupEnd");
}

void ContextParallelRank::exchange_only(cudaStream_t stream) {
  ref::require(planned_, "ContextParallelRank::exchange_only", "call plan() before exchange_only()");
  if (path_ == Path::single_gpu) {
    if (comm_.world_size() == 1) return;
    const size_t rows = size_t(global_.batch_size) * global_.num_qo_heads;
    const NcclLibrary& n = nccl();
    uint8_t* o = workspace_ + layout_.merged_o;
    nccl_check(n.GroupStart(), "ncclGroupStart");
    nccl_check(n.Broadcast(o, o, rows * global_.head_dim * dtype_bytes(global_.dtype), ncclUint8, holder_, comm_.get(),
                           stream),
               "ncclBroadcast(o)");
    nccl_check(n.Broadcast(at_f32(layout_.merged_lse), at_f32(layout_.merged_lse), rows, ncclFloat32, holder_,
                           comm_.get(), stream),
               "ncclBroadcast(lse)");
    nccl_check(n.GroupEnd(), "ncclGroupEnd");
    return;
  }
  exchange_states(stream);
  if (options_.exchange == Exchange::all_to_all)
    exchange_outputs(workspace_ + layout_.merged_o, at_f32(layout_.merged_lse), stream);
}

}  // namespace flashstep::stages::context_parallel
