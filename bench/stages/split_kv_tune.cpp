// flashstep_split_kv_tune — stage 03's knobs, timed like flashstep_bench times the stages
// (CUDA events, L2 flushed before every call, median of 5 repetitions; bench/stages/timing.hpp),
// so that the defaults in stages/03_split_kv are chosen from measurements:
//
//   auto            the registry's runner: graph plan, timed as a replay of a captured run()
//   unsplit         stage 02's kernel always (PathChoice::unsplit)
//   split_kernel    the planner's chunks always, merged by the merge kernel (PathChoice::split)
//   split_kernel_no_pdl  the same, the merge kernel launched plainly (no programmatic launch)
//   kernel_minN     split_kernel with chunks of at least N tokens instead of 128
//   stagesS         pipeline depth S of the chunk kernel (32 KB stages; the default is 2)
//   ctas1           the planner told 1 block per SM (half the work items, longer chunks)
//   ctas4, ctas6    the planner told 4 or 6 blocks per SM while 2 run: the split path over a
//                   grid of 2 or 3 waves (finer chunks where one wave cannot cut a request)
//   eager           FlashInfer's default plan (no graph flag), run() called directly
//   chunk_unsplit   the planner told the device holds 1 block, the split path forced: the
//                   chunk kernel with no split (stage 02's schedule without its two halves)
//   auto_clean_l2   "auto", but the L2 is evicted by reading (split_kv_flush.cu) instead of by
//                   writing: no dirty lines to write back during the timed call
//
//   flashstep_split_kv_tune [--shapes=bench/shapes_split_kv.csv] [Google Benchmark flags]
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"
#include "shapes.hpp"
#include "split_kv_flush.hpp"
#include "timing.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::bench;
using stages::harness::DeviceBuffer;
using stages::split_kv::SplitKVOptions;
using stages::split_kv::SplitKVRunner;

cudaStream_t g_stream = nullptr;
double g_copy_gbps = 0;

/// Device inputs of one shape, shared by all its variants (built on first use).
struct ShapeInputs {
  std::string name;
  stages::BatchShape shape;
  DeviceBuffer q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, pool, o, lse;
  stages::DeviceBatch batch;
  double bytes = 0;
};
std::unique_ptr<ShapeInputs> g_inputs;

ShapeInputs& inputs_for(const BenchShape& bs) {
  if (g_inputs && g_inputs->name == bs.name) return *g_inputs;
  g_inputs.reset();
  auto in = std::make_unique<ShapeInputs>();
  in->name = bs.name;
  std::mt19937_64 rng(20240607);
  const stages::harness::CaseLayout layout = stages::harness::make_layout(bs.spec, stages::KVStorage::paged, rng);
  const stages::BatchShape& s = in->shape = layout.shape;
  const size_t elem = stages::dtype_bytes(s.dtype);
  const size_t q_elems = size_t(s.nnz_qo()) * s.num_qo_heads * s.head_dim;
  const size_t kv_elems = size_t(s.total_kv_len()) * s.num_kv_heads * s.head_dim;
  const size_t pool_elems = size_t(s.num_pages) * 2 * s.page_size * s.num_kv_heads * s.head_dim;
  in->q = DeviceBuffer(q_elems * elem);
  fill_uniform(s.dtype, in->q.get(), q_elems, 1, -3.f, 3.f, nullptr);
  in->qo_indptr = stages::harness::upload(s.qo_indptr);
  in->kv_indptr = stages::harness::upload(s.kv_indptr);
  in->kv_indices = stages::harness::upload(layout.kv_indices);
  in->kv_last_page_len = stages::harness::upload(s.kv_last_page_len);
  in->pool = DeviceBuffer(pool_elems * elem);
  fill_uniform(s.dtype, in->pool.get(), pool_elems, 2, -1.f, 1.f, nullptr);
  in->o = DeviceBuffer(q_elems * elem);
  in->lse = DeviceBuffer(size_t(s.nnz_qo()) * s.num_qo_heads * sizeof(float));
  in->batch = {in->q.get(),
               in->qo_indptr.as<int32_t>(),
               in->kv_indptr.as<int32_t>(),
               in->pool.get(),
               in->kv_indices.as<int32_t>(),
               in->kv_last_page_len.as<int32_t>(),
               nullptr,
               nullptr,
               in->o.get(),
               in->lse.as<float>()};
  in->bytes = double(elem) * (2.0 * q_elems + 2.0 * kv_elems) + 4.0 * s.nnz_qo() * s.num_qo_heads;
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  g_inputs = std::move(in);
  return *g_inputs;
}

struct Variant {
  std::string name;
  SplitKVOptions options;
  bool graph = false;
};

std::vector<Variant> variants() {
  // Every variant but "eager" plans for a graph and is timed as a replay of run()
  // captured once, as flashstep_bench times the registry's runner.
  auto graph = [](SplitKVOptions o) {
    o.enable_cuda_graph = true;
    return o;
  };
  std::vector<Variant> v;
  v.push_back({"auto", graph({}), true});
  SplitKVOptions o;
  o.path = stages::split_kv::PathChoice::unsplit;
  v.push_back({"unsplit", graph(o), true});
  o.path = stages::split_kv::PathChoice::split;
  v.push_back({"split_kernel", graph(o), true});
  for (int min_tokens : {32, 64, 256}) {
    SplitKVOptions m = o;
    m.min_kv_chunk_tokens = min_tokens;
    v.push_back({"kernel_min" + std::to_string(min_tokens), graph(m), true});
  }
  o.programmatic_launch = false;
  v.push_back({"split_kernel_no_pdl", graph(o), true});
  SplitKVOptions stages3;
  stages3.num_stages = 3;
  stages3.path = stages::split_kv::PathChoice::split;
  v.push_back({"stages3", graph(stages3), true});
  SplitKVOptions ctas1;
  ctas1.ctas_per_sm = 1;
  ctas1.path = stages::split_kv::PathChoice::split;
  v.push_back({"ctas1", graph(ctas1), true});
  v.push_back({"eager", SplitKVOptions{}, false});
  for (int virtual_ctas : {4, 6}) {  // the planner told 4 or 6 blocks per SM: a grid of 2 or 3 waves
    SplitKVOptions waves;
    waves.ctas_per_sm = virtual_ctas;
    waves.path = stages::split_kv::PathChoice::split;
    v.push_back({"ctas" + std::to_string(virtual_ctas), graph(waves), true});
  }
  SplitKVOptions chunk_unsplit;
  chunk_unsplit.num_sm = 1;
  chunk_unsplit.ctas_per_sm = 1;
  chunk_unsplit.path = stages::split_kv::PathChoice::split;
  v.push_back({"chunk_unsplit", graph(chunk_unsplit), true});
  return v;
}

void register_variant(const BenchShape& shape, const Variant& variant) {
  const std::string name = "tune03/" + variant.name + "/" + shape.name;
  benchmark::RegisterBenchmark(name.c_str(),
                               [shape, variant](benchmark::State& state) {
                                 ShapeInputs& in = inputs_for(shape);
                                 SplitKVRunner runner(variant.options);
                                 DeviceBuffer workspace(runner.workspace_bytes(in.shape));
                                 runner.plan(in.shape, workspace.get(), workspace.bytes(), g_stream);
                                 cudaGraphExec_t exec = nullptr;
                                 cudaGraph_t graph = nullptr;
                                 if (variant.graph) {
                                   FLASHSTEP_CUDA_CHECK(
                                       cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
                                   runner.run(in.batch, g_stream);
                                   FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
                                   FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
                                 }
                                 static GpuTimer timer(g_stream);
                                 run_timed(
                                     state, timer,
                                     [&] {
                                       if (exec) FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
                                       else runner.run(in.batch, g_stream);
                                     },
                                     in.bytes, 0, g_copy_gbps);
                                 const ref::SplitKVPlan& p = runner.split_plan();
                                 state.counters["work_items"] = p.num_work_items;
                                 state.counters["chunk_pages"] = p.kv_chunk_size_in_pages;
                                 state.counters["num_stages"] = runner.num_stages();
                                 state.counters["ctas_per_sm"] = double(runner.planner_config().ctas_per_sm);
                                 state.counters["path"] = double(static_cast<int>(runner.path()));  // DecodePath
                                 state.counters["est_unsplit_us"] = runner.estimate().unsplit_seconds * 1e6;
                                 state.counters["est_split_us"] = runner.estimate().split_seconds * 1e6;
                                 if (exec) {
                                   FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
                                   FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
                                 }
                               })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.05)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

/// Events around one call after a read-only L2 flush (split_kv_flush.cu).
class CleanTimer {
 public:
  CleanTimer() {
    FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start_));
    FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop_));
    int device = 0, l2 = 0;
    FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
    FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    flush_ = DeviceBuffer(2 * static_cast<size_t>(l2));
    fill_uniform(stages::DType::f32, flush_.get(), flush_.bytes() / 4, 11, -1.f, 1.f, nullptr);
  }
  ~CleanTimer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  float time_once(const std::function<void()>& body) {
    read_flush(flush_.get(), flush_.bytes(), sink_.as<uint32_t>(), g_stream);
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start_, g_stream));
    body();
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop_, g_stream));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  DeviceBuffer flush_, sink_{4};
};

/// The registry's runner (graph plan, replayed), timed after a read-only flush.
void register_clean(const BenchShape& shape) {
  const std::string name = "tune03/auto_clean_l2/" + shape.name;
  benchmark::RegisterBenchmark(
      name.c_str(),
      [shape](benchmark::State& state) {
        ShapeInputs& in = inputs_for(shape);
        SplitKVOptions options;
        options.enable_cuda_graph = true;
        SplitKVRunner runner(options);
        DeviceBuffer workspace(runner.workspace_bytes(in.shape));
        runner.plan(in.shape, workspace.get(), workspace.bytes(), g_stream);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
        runner.run(in.batch, g_stream);
        FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
        FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        static CleanTimer timer;
        auto body = [&] { FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, g_stream)); };
        for (int i = 0; i < 3; ++i) body();
        FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(g_stream));
        double total_s = 0;
        int64_t n = 0;
        for (auto _ : state) {
          const double t = timer.time_once(body) * 1e-3;
          state.SetIterationTime(t);
          total_s += t;
          ++n;
        }
        if (n && total_s > 0) {
          state.counters["GB/s"] = in.bytes / (total_s / n) * 1e-9;
          state.counters["pct_of_ceiling"] = 100.0 * in.bytes / (total_s / n) * 1e-9 / g_copy_gbps;
        }
        FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
        FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
      })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.05)
      ->Repetitions(5)
      ->ReportAggregatesOnly(true);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_path = "bench/shapes_split_kv.csv";
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--shapes=", 0) == 0) shapes_path = a.substr(9);
    else rest.push_back(argv[i]);
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  std::string why;
  if (!stages::harness::gpu_available(&why)) {
    std::fprintf(stderr, "flashstep_split_kv_tune: no usable CUDA GPU (%s)\n", why.c_str());
    return 1;
  }
  try {
    FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
    {
      // The copy ceiling, as flashstep_bench measures it: 1 GiB device to device, counted twice.
      const size_t bytes = size_t{1} << 30;
      DeviceBuffer src(bytes), dst(bytes);
      fill_uniform(stages::DType::f32, src.get(), bytes / 4, 7, -1.f, 1.f, nullptr);
      GpuTimer timer(g_stream);
      std::vector<double> t;
      for (int i = 0; i < 23; ++i) {
        const double ms = timer.time_once([&] {
          FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, g_stream));
        });
        if (i >= 3) t.push_back(ms);
      }
      g_copy_gbps = 2.0 * bytes / (median(t) * 1e-3) * 1e-9;
    }
    benchmark::AddCustomContext("device", stages::harness::device_description());
    benchmark::AddCustomContext("copy_ceiling_GB/s", std::to_string(g_copy_gbps));
    // Every shape of the file (the sweep, the goals, the layout checks), every variant.
    for (const BenchShape& shape : load_shapes(shapes_path)) {
      for (const Variant& v : variants()) register_variant(shape, v);
      register_clean(shape);
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_inputs.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashstep_split_kv_tune: %s\n", e.what());
    return 1;
  }
  return 0;
}
