// flashstep_cp_bench — stage 08 (context parallel) against stage 03 on one GPU.
//
// For each shape (bf16, 32/8 heads, head_dim 128, pages of 16, sequential page ids):
//   stage03        stage 03 alone on GPU 0 (its registry options: a CUDA graph), into o
//   cp_w1          stage 08 with world_size 1 (the single_gpu path: stage 03, no exchange)
//   cp_w2_<x>      stage 08 on 2 GPUs, the whole step, exchange x = all_gather | all_to_all
//   exchange_w2_<x> the same step's collectives alone (their share of the step)
// Every variant is a captured CUDA graph replayed; each repetition flushes the L2 of
// every GPU, waits for all ranks (a host barrier), then records CUDA events around one
// replay per rank; a repetition's time is the slowest rank's, the result the median of
// the repetitions after warm-up. The model's estimate (plan_shards' CostModel, with
// device_model()'s read rate) is stored beside each measurement. Writes JSON (--out) and prints a table.
//
//   flashstep_cp_bench [--out FILE] [--reps N] [--warmup N] [--source-state FILE] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "08_context_parallel/context_parallel.hpp"
#include "08_context_parallel/nccl_library.hpp"
#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::context_parallel;
using stages::harness::DeviceBuffer;

namespace {

struct Shape {
  int batch;
  int kv_len;
  std::string name() const { return "b" + std::to_string(batch) + "_kv" + std::to_string(kv_len); }
};

/// A reusable barrier for the rank threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const unsigned gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != gen_; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  unsigned gen_ = 0;
};

BatchShape make_shape(const Shape& sh) {
  BatchShape s;
  s.mode = Mode::decode;
  s.storage = KVStorage::paged;
  s.dtype = DType::bf16;
  s.batch_size = sh.batch;
  s.num_qo_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.page_size = 16;
  const int pages = sh.kv_len / 16;
  for (int i = 0; i <= sh.batch; ++i) s.qo_indptr.push_back(i);
  for (int i = 0; i <= sh.batch; ++i) s.kv_indptr.push_back(i * pages);
  s.kv_last_page_len.assign(size_t(sh.batch), 16);
  s.num_pages = int64_t(sh.batch) * pages;
  for (int32_t p = 0; p < s.num_pages; ++p) s.kv_indices.push_back(p);
  return s;
}

/// One rank's inputs for a shape: q, the whole pool (its pages are what it reads), its
/// shard's page table, o and lse.
struct RankInputs {
  DeviceBuffer q, pool, kv_indptr, kv_indices, kv_last_page_len, o, lse, flush;
  DeviceBatch batch;
  RankInputs(const BatchShape& s, const PageTable& t, cudaStream_t stream) {
    const size_t rows = size_t(s.batch_size) * s.num_qo_heads;
    q = DeviceBuffer(rows * s.head_dim * 2);
    pool = DeviceBuffer(size_t(s.num_pages) * 2 * s.page_size * s.num_kv_heads * s.head_dim * 2);
    bench::fill_uniform(s.dtype, q.get(), rows * s.head_dim, 1, -3.f, 3.f, stream);
    bench::fill_uniform(s.dtype, pool.get(), pool.bytes() / 2, 2, -1.f, 1.f, stream);
    kv_indptr = stages::harness::upload(t.kv_indptr);
    kv_indices = stages::harness::upload(t.kv_indices);
    kv_last_page_len = stages::harness::upload(t.kv_last_page_len);
    o = DeviceBuffer(rows * s.head_dim * 2);
    lse = DeviceBuffer(rows * sizeof(float));
    int device = 0, l2 = 0;
    FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
    FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    flush = DeviceBuffer(2 * size_t(l2));
    batch = {q.get(),
             nullptr,
             kv_indptr.as<int32_t>(),
             pool.get(),
             kv_indices.as<int32_t>(),
             kv_last_page_len.as<int32_t>(),
             nullptr,
             nullptr,
             o.get(),
             lse.as<float>()};
  }
};

cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& body) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  body();
  FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(g));
  return exec;
}

struct Timing {
  std::vector<double> reps_us;  ///< per repetition: the slowest rank's time
  double median_us = 0;
};

/// Times `graphs[rank]` replayed on every rank together (see the file comment).
/// Called by every rank thread; rank 0's `out` gets the result.
void time_ranks(int rank, int world, Barrier& barrier, std::vector<double>& slot, cudaGraphExec_t graph,
                cudaStream_t stream, DeviceBuffer& flush, int warmup, int reps, Timing* out) {
  cudaEvent_t start, stop;
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start));
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(graph, stream));
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int i = 0; i < reps; ++i) {
    bench::fill_bytes(flush.get(), flush.bytes(), static_cast<uint8_t>(i + 1), stream);
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
    barrier.wait();  // every rank's flush done: start together
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start, stream));
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(graph, stream));
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop, stream));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    slot[size_t(rank)] = ms * 1e3;
    barrier.wait();
    if (rank == 0) out->reps_us.push_back(*std::max_element(slot.begin(), slot.begin() + world));
    barrier.wait();
  }
  if (rank == 0) {
    std::vector<double> v = out->reps_us;
    std::sort(v.begin(), v.end());
    out->median_us = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  FLASHSTEP_CUDA_CHECK(cudaEventDestroy(start));
  FLASHSTEP_CUDA_CHECK(cudaEventDestroy(stop));
}

struct Row {
  std::string shape, variant, exchange;
  int batch = 0, kv_len = 0, world_size = 1;
  double kv_bytes = 0;
  Timing t;
  double model_us = 0;
};

/// Stage 03 alone on GPU 0, as its registry entry runs it (CUDA graph), into o.
Row time_stage03(const Shape& sh, int warmup, int reps) {
  Row row{sh.name(), "stage03", "-", sh.batch, sh.kv_len, 1};
  run_on_ranks(1, [&](int) {
    const BatchShape s = make_shape(sh);
    cudaStream_t stream;
    FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      RankInputs in(s, page_table_of(s), stream);
      split_kv::SplitKVOptions options;
      options.enable_cuda_graph = true;
      split_kv::SplitKVRunner runner(options);
      DeviceBuffer ws(runner.workspace_bytes(s));
      runner.plan(s, ws.get(), ws.bytes(), stream);
      cudaGraphExec_t g = capture(stream, [&] { runner.run(in.batch, stream); });
      Barrier barrier(1);
      std::vector<double> slot(1);
      time_ranks(0, 1, barrier, slot, g, stream, in.flush, warmup, reps, &row.t);
      FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(g));
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  return row;
}

/// Stage 08 on `world` GPUs with `exchange`: the whole step, and (world > 1) the exchange alone.
std::vector<Row> time_cp(const Shape& sh, int world, Exchange exchange, int warmup, int reps) {
  const BatchShape s = make_shape(sh);
  const std::vector<PageTable> shards = shard_page_table(page_table_of(s), s.page_size, world);
  std::vector<Row> rows;
  const std::string suffix = world == 1 ? "" : std::string("_") + to_string(exchange);
  rows.push_back(
      Row{sh.name(), "cp_w" + std::to_string(world) + suffix, to_string(exchange), sh.batch, sh.kv_len, world});
  if (world > 1)
    rows.push_back(
        Row{sh.name(), "exchange_w" + std::to_string(world) + suffix, to_string(exchange), sh.batch, sh.kv_len, world});
  const ncclUniqueId id = Communicator::make_id();
  Barrier barrier(world);
  std::vector<double> slot(static_cast<size_t>(world));
  run_on_ranks(world, [&](int rank) {
    Communicator comm(id, rank, world);
    cudaStream_t stream;
    FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      RankInputs in(s, shards[size_t(rank)], stream);
      ContextParallelOptions options;
      options.exchange = exchange;
      options.enable_cuda_graph = true;
      ContextParallelRank cp(comm, options);
      DeviceBuffer ws(cp.workspace_bytes(s));
      cp.plan(s, shards, ws.get(), ws.bytes(), stream);
      // Eager first: NCCL connects on a communicator's first collective and send/recv,
      // which must not happen inside a capture.
      cp.run(in.batch, stream);
      cp.exchange_only(stream);
      FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaGraphExec_t step = capture(stream, [&] { cp.run(in.batch, stream); });
      time_ranks(rank, world, barrier, slot, step, stream, in.flush, warmup, reps, &rows[0].t);
      FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(step));
      if (world > 1) {
        cudaGraphExec_t ex = capture(stream, [&] { cp.exchange_only(stream); });
        time_ranks(rank, world, barrier, slot, ex, stream, in.flush, warmup, reps, &rows[1].t);
        FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(ex));
      }
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  return rows;
}

std::string source_state(const std::string& path, std::string* tree) {
  std::ifstream f(path);
  std::string line, commit = "unknown";
  *tree = "unknown";
  while (std::getline(f, line)) {
    if (line.rfind("commit=", 0) == 0) commit = line.substr(7);
    if (line.rfind("tree=", 0) == 0) *tree = line.substr(5);
  }
  return commit + (*tree == "modified" ? "-dirty" : "");
}

std::string json_list(const std::vector<double>& v) {
  std::ostringstream s;
  s << '[';
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  return s.str() + ']';
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "cp_bench.json", state_path, command = "flashstep_cp_bench";
  int reps = 21, warmup = 5;
  bool quick = false;
  {
    const std::string exe = argv[0];
    const size_t slash = exe.rfind('/');
    state_path = (slash == std::string::npos ? std::string(".") : exe.substr(0, slash)) + "/../source-state.txt";
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name);
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (i > 0) command += " " + a;
    if (a == "--out") out_path = value("--out");
    else if (a == "--reps") reps = std::stoi(value("--reps"));
    else if (a == "--warmup") warmup = std::stoi(value("--warmup"));
    else if (a == "--source-state") state_path = value("--source-state");
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr,
                   "usage: flashstep_cp_bench [--out FILE] [--reps N] [--warmup N] [--source-state FILE] [--quick]\n");
      return 2;
    }
  }
  std::string why;
  if (!stages::harness::gpu_available(&why)) {
    std::printf("SKIPPED: no usable CUDA GPU (%s)\n", why.c_str());
    return 77;
  }
  if (!nccl_library(&why)) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  const int devices = device_count();
  std::vector<Shape> shapes = {{1, 1 << 20}, {1, 131072}, {8, 262144}};
  if (quick) shapes = {{1, 131072}};
  const CostModel cost;
  // one GPU as the planners see it (this program measures no read ceiling of its own)
  const stages::DeviceModel device = stages::device_model();
  std::vector<Row> rows;
  for (const Shape& sh : shapes) {
    std::printf("shape %s ...\n", sh.name().c_str());
    std::fflush(stdout);
    rows.push_back(time_stage03(sh, warmup, reps));
    for (Row& r : time_cp(sh, 1, Exchange::all_gather, warmup, reps)) rows.push_back(r);
    if (devices >= 2)
      for (Exchange e : {Exchange::all_gather, Exchange::all_to_all})
        for (Row& r : time_cp(sh, 2, e, warmup, reps)) rows.push_back(r);
  }
  // The model beside each measurement, and the bytes each row's slowest GPU reads.
  for (Row& r : rows) {
    const BatchShape s = make_shape({r.batch, r.kv_len});
    const ShardPlan plan = plan_shards(
        s, r.world_size, r.exchange == "all_to_all" ? Exchange::all_to_all : Exchange::all_gather, device, cost);
    const StepEstimate& e = plan.estimates.back();
    r.kv_bytes = double(r.batch) * r.kv_len * 2.0 * s.num_kv_heads * s.head_dim * 2 / r.world_size;
    r.model_us = 1e6 * (r.variant.rfind("exchange", 0) == 0 ? e.exchange_seconds : e.total_seconds);
  }

  std::string tree;
  const std::string commit = source_state(state_path, &tree);
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S+00:00", std::gmtime(&now));
  std::ostringstream j;
  j.precision(6);
  j << "{\n  \"context\": {\"device\": \"" << stages::harness::device_description() << "\", \"devices\": " << devices
    << ", \"nccl\": \"" << nccl_version() << "\", \"commit\": \"" << commit << "\", \"tree\": \"" << tree
    << "\", \"date\": \"" << date << "\", \"command\": \"" << command << "\", \"repetitions\": " << reps
    << ", \"warmup\": " << warmup << ", \"l2_flushed\": true, \"dtype\": \"bf16\", \"num_qo_heads\": 32, "
    << "\"num_kv_heads\": 8, \"head_dim\": 128, \"page_size\": 16},\n";
  j << "  \"cost_model\": {\"bytes_per_second\": " << device.read_bytes_per_second
    << ", \"stage03_seconds\": " << cost.stage03_seconds << ", \"collective_seconds\": " << cost.collective_seconds
    << ", \"link_bytes_per_second\": " << cost.link_bytes_per_second << ", \"merge_seconds\": " << cost.merge_seconds
    << "},\n  \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    j << "    {\"shape\": \"" << r.shape << "\", \"variant\": \"" << r.variant << "\", \"exchange\": \"" << r.exchange
      << "\", \"batch\": " << r.batch << ", \"kv_len\": " << r.kv_len << ", \"world_size\": " << r.world_size
      << ", \"kv_bytes_per_gpu\": " << r.kv_bytes << ", \"median_us\": " << r.t.median_us
      << ", \"model_us\": " << r.model_us << ", \"repetitions_us\": " << json_list(r.t.reps_us) << "}"
      << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  j << "  ]\n}\n";
  std::ofstream(out_path) << j.str();

  std::printf("\n%s, NCCL %s, commit %s; median of %d repetitions (L2 flushed), CUDA graph replays\n",
              stages::harness::device_description().c_str(), nccl_version().c_str(), commit.c_str(), reps);
  std::printf("%-18s %-26s %4s %12s %12s %10s\n", "shape", "variant", "GPUs", "median us", "model us", "GB/s/GPU");
  for (const Row& r : rows)
    std::printf("%-18s %-26s %4d %12.1f %12.1f %10.0f\n", r.shape.c_str(), r.variant.c_str(), r.world_size,
                r.t.median_us, r.model_us,
                r.variant.rfind("exchange", 0) == 0 ? 0.0 : r.kv_bytes / (r.t.median_us * 1e-6) / 1e9);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
