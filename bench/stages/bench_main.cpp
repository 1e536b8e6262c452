// flashstep_bench — every registry stage on every benchmark shape it supports, with the
// ceilings measured in the same process (the benchmark policy of ARCHITECTURE.md).
//
//   flashstep_bench [--shapes=bench/shapes.csv] [--sets=target,sweep,extra] [--tune]
//                   [Google Benchmark flags, e.g. --benchmark_out=r.json --benchmark_out_format=json]
//
// Rows: ceiling/copy_d2d (GB/s), ceiling/read_only (GB/s, bytes read), ceiling/gemm_bf16
// (TFLOP/s), then <stage>/<shape> with counters GB/s, pct_of_ceiling (% of the copy
// ceiling) and pct_of_read_ceiling (% of the read ceiling: decode almost only reads, so
// that is the most it can reach; the context's read_ceiling_config says which of the
// launches swept in bench/ceilings/read_ceiling.cu measured it). Each row is the median of 5
// repetitions; a repetition is the mean of event-timed calls, each after an L2 flush.
// A call replays run() captured once in a CUDA graph (the label says "eager" where a
// stage refuses capture), the way bench/peers/attention.py calls the peers.
// GB/s counts the bytes a decode must move at least: q, K and V of every token, o and
// lse (the page table, 4 bytes per page, is left out), K and V at the pool's element
// size (one byte for an FP8 cache: bench/shapes_fp8.csv). --tune adds pipeline-depth
// variants of 02_paged on the target shapes. Set FLASHSTEP_COMMIT to stamp the commit.
// Prefill shapes (bench/shapes_prefill.csv) report TFLOP/s instead: 4 * head_dim flops
// per (query, key) pair the mask lets through, per query head (2 (head_dim + head_dim_vo)
// where v is narrower: bench/shapes_mla_prefill.csv), and pct_of_ceiling against the
// cuBLAS bf16 GEMM measured in the same process.
// Shapes with a shared prefix (bench/shapes_cascade.csv) add two rows per shape for stage
// 05 with its path forced, 05_cascade[cascade] and 05_cascade[flat], beside the planner's
// own choice; a cascade row carries shared_flops (the shared levels' flops, so that a
// report can divide by the time) and its label names the path and levels.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "02_paged/paged.hpp"
#include "03_split_kv/split_kv.hpp"
#include "05_cascade/cascade.hpp"
#include "device_fill.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"
#include "launch_floor.hpp"
#include "measured_model.hpp"
#include "mla_rows.hpp"
#include "read_ceiling.hpp"
#include "registry.hpp"
#include "shapes.hpp"
#include "timing.hpp"

#ifndef FLASHSTEP_BENCH_SHAPES
#define FLASHSTEP_BENCH_SHAPES "bench/shapes.csv"
#endif

namespace {

using namespace flashstep;
using namespace flashstep::bench;
using stages::harness::DeviceBuffer;

#define FLASHSTEP_CUBLAS_CHECK(call)                                          \
  do {                                                                        \
    const cublasStatus_t status_ = (call);                                    \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                     \
      throw std::runtime_error(std::string(#call " failed: cuBLAS status ") + \
                               std::to_string(static_cast<int>(status_)));    \
  } while (0)

struct Ceilings {
  double copy_gbps = 0;    ///< device-to-device copy, bytes read + written
  double read_gbps = 0;    ///< read_only over kReadBytes, bytes read, the best launch swept
  ReadConfig read_config;  ///< that launch
  std::string read_text;   ///< that launch in words (ReadCeiling::describe)
  double gemm_tflops = 0;  ///< cuBLAS bf16 GEMM 8192^3, fp32 accumulation
};
Ceilings g_ceilings;

constexpr size_t kCopyBytes = size_t{1} << 30;
// 4 GiB: the timer's flush leaves up to one L2 of dirty lines to write back (50 MB on an
// H100), about 1% of this read, where it would be 5% of 1 GiB.
constexpr size_t kReadBytes = size_t{4} << 30;
constexpr int kGemmN = 8192;
// The launches the read ceiling is swept over (the best is kept): full occupancy in blocks
// of two sizes, and two 1024-thread blocks per SM.
constexpr ReadConfig kReadConfigs[] = {{256, 8}, {512, 4}, {1024, 2}};

/// The copy ceiling: one cudaMemcpyAsync of 1 GiB, counted as 2 GiB moved.
struct CopyCeiling {
  DeviceBuffer src{kCopyBytes}, dst{kCopyBytes};
  CopyCeiling() { fill_uniform(stages::DType::f32, src.get(), kCopyBytes / 4, 7, -1.f, 1.f, nullptr); }
  void run(cudaStream_t stream) const {
    FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), kCopyBytes, cudaMemcpyDeviceToDevice, stream));
  }
  static double bytes() { return 2.0 * kCopyBytes; }
};

/// The read ceiling: kReadBytes read once into registers by bench/ceilings/read_ceiling.cu's kernel,
/// counted once (the one word per block it writes is left out).
struct ReadCeiling {
  DeviceBuffer buffer{kReadBytes}, sink;
  ReadConfig config;
  int blocks;
  explicit ReadCeiling(ReadConfig c) : config(c), blocks(read_grid_blocks(c)) {
    sink = DeviceBuffer(size_t(blocks) * sizeof(uint32_t));
    fill_uniform(stages::DType::f32, buffer.get(), kReadBytes / 4, 10, -1.f, 1.f, nullptr);
  }
  void run(cudaStream_t stream) const {
    read_only(buffer.get(), kReadBytes, sink.as<uint32_t>(), blocks, config.threads, stream);
  }
  std::string describe() const {
    return to_string(config) + " (" + std::to_string(blocks) + " blocks), " + std::to_string(kReadLoadsInFlight) +
           " 16-byte loads in flight per thread, " + std::to_string(kReadBytes >> 30) + " GiB";
  }
  static double bytes() { return double(kReadBytes); }
};

/// The matrix ceiling: C = A B, bf16 8192 x 8192 operands, fp32 accumulation.
struct GemmCeiling {
  static constexpr size_t kElems = size_t{kGemmN} * kGemmN;
  DeviceBuffer a{kElems * 2}, b{kElems * 2}, c{kElems * 2};
  cublasHandle_t handle = nullptr;
  GemmCeiling() {
    fill_uniform(stages::DType::bf16, a.get(), kElems, 8, -1.f, 1.f, nullptr);
    fill_uniform(stages::DType::bf16, b.get(), kElems, 9, -1.f, 1.f, nullptr);
    FLASHSTEP_CUBLAS_CHECK(cublasCreate(&handle));
  }
  ~GemmCeiling() { cublasDestroy(handle); }
  void run(cudaStream_t stream) const {
    const float alpha = 1.f, beta = 0.f;
    FLASHSTEP_CUBLAS_CHECK(cublasSetStream(handle, stream));
    FLASHSTEP_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, kGemmN, kGemmN, kGemmN, &alpha, a.get(),
                                        CUDA_R_16BF, kGemmN, b.get(), CUDA_R_16BF, kGemmN, &beta, c.get(), CUDA_R_16BF,
                                        kGemmN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  static double flops() { return 2.0 * kGemmN * kGemmN * double(kGemmN); }
};

/// Device inputs of one (stage, shape): built once, reused by every call of its benchmark.
struct StageInputs {
  std::string key;
  stages::BatchShape shape;
  DeviceBuffer q, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, pool, v_pool, k, v, o, lse, workspace;
  stages::DeviceBatch batch;
  std::unique_ptr<stages::StageRunner> runner;
  cudaGraphExec_t graph = nullptr;  ///< run() captured once; null: the stage refused capture
  double bytes = 0;
  /// prefill: 2 (head_dim + head_dim_vo) * num_qo_heads per visible (query, key) pair (4
  /// head_dim where v is as wide as q and k)
  double flops = 0;
  ~StageInputs() {
    if (graph) cudaGraphExecDestroy(graph);
  }
  /// One call: a replay of the captured run() (how the peers are timed too), else run().
  void call(cudaStream_t stream) const {
    if (graph) FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(graph, stream));
    else runner->run(batch, stream);
  }
};

/// (query, key) pairs of the batch that the mask lets through, per query head: a causal
/// square counts about half, an append of a few queries on a long prefix almost all.
double visible_pairs(const stages::BatchShape& s) {
  double pairs = 0;
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b], kv_len = s.kv_len(b);
    for (int64_t i = 0; i < qo_len; ++i) {
      const int64_t diagonal = i + kv_len - qo_len;
      const int64_t hi = s.causal ? std::min(kv_len, diagonal + 1) : kv_len;
      const int64_t lo = s.window_left >= 0 ? std::max<int64_t>(0, diagonal - s.window_left) : 0;
      pairs += static_cast<double>(std::max<int64_t>(0, hi - lo));
    }
  }
  return pairs;
}

/// Captures run() in a CUDA graph, as serving engines run decode and as bench/peers/attention.py
/// times the peers, so that launch overheads are the same on both sides. A stage whose
/// run() refuses capture (stage 03 without its graph flag) is timed eagerly instead.
void capture(StageInputs& in) {
  cudaStream_t cs = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  cudaGraph_t g = nullptr;
  try {
    FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    in.runner->run(in.batch, cs);
    FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(cs, &g));
    FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&in.graph, g, 0));
  } catch (const std::exception&) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(cs, &partial);  // ends a capture the stage left open, if any
    if (partial) cudaGraphDestroy(partial);
    cudaGetLastError();
    in.graph = nullptr;
  }
  if (g) cudaGraphDestroy(g);
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(cs));
}
std::unique_ptr<StageInputs> g_inputs;  // one at a time: the previous shape's memory is freed first

StageInputs& inputs_for(const std::string& key, const stages::StageInfo& stage, const stages::harness::CaseSpec& spec,
                        stages::paged::PagedConfig tune) {
  if (g_inputs && g_inputs->key == key) return *g_inputs;
  g_inputs.reset();
  auto in = std::make_unique<StageInputs>();
  in->key = key;
  std::mt19937_64 rng(20240607);
  const stages::harness::CaseLayout layout = stages::harness::make_layout(spec, stage.storage, rng);
  const stages::BatchShape& s = in->shape = layout.shape;
  const size_t elem = stages::dtype_bytes(s.dtype);
  const size_t kv_elem = stages::dtype_bytes(s.resolved_kv_dtype());  // 1 for an FP8 cache
  const size_t q_elems = size_t(s.nnz_qo()) * s.num_qo_heads * s.head_dim;
  const size_t kv_elems = size_t(s.total_kv_len()) * s.num_kv_heads * s.head_dim;  // K (and V, but for MLA)
  const size_t v_elems = size_t(s.total_kv_len()) * s.num_kv_heads * s.resolved_head_dim_vo();
  const size_t o_elems = size_t(s.nnz_qo()) * s.num_qo_heads * s.resolved_head_dim_vo();
  in->q = DeviceBuffer(q_elems * elem);
  fill_uniform(s.dtype, in->q.get(), q_elems, 1, -3.f, 3.f, nullptr);
  in->qo_indptr = stages::harness::upload(s.qo_indptr);
  in->kv_indptr = stages::harness::upload(s.kv_indptr);
  if (s.storage == stages::KVStorage::paged) {
    in->kv_indices = stages::harness::upload(layout.kv_indices);
    in->kv_last_page_len = stages::harness::upload(s.kv_last_page_len);
    // V of its own width (MLA's prefill): K's pool holds K alone, V a pool of its own
    const bool own_v = s.resolved_head_dim_vo() != s.head_dim;
    const size_t page_rows = size_t(s.num_pages) * s.page_size * s.num_kv_heads;
    const size_t pool_elems = page_rows * (own_v ? 1 : 2) * s.head_dim;
    in->pool = DeviceBuffer(pool_elems * kv_elem);
    fill_uniform(s.resolved_kv_dtype(), in->pool.get(), pool_elems, 2, -1.f, 1.f, nullptr);
    if (own_v) {
      in->v_pool = DeviceBuffer(page_rows * s.resolved_head_dim_vo() * kv_elem);
      fill_uniform(s.resolved_kv_dtype(), in->v_pool.get(), page_rows * s.resolved_head_dim_vo(), 5, -1.f, 1.f,
                   nullptr);
    }
  } else {
    in->k = DeviceBuffer(kv_elems * kv_elem);
    in->v = DeviceBuffer(v_elems * kv_elem);
    fill_uniform(s.resolved_kv_dtype(), in->k.get(), kv_elems, 3, -1.f, 1.f, nullptr);
    fill_uniform(s.resolved_kv_dtype(), in->v.get(), v_elems, 4, -1.f, 1.f, nullptr);
  }
  in->o = DeviceBuffer(o_elems * elem);
  in->lse = DeviceBuffer(size_t(s.nnz_qo()) * s.num_qo_heads * sizeof(float));
  in->batch = {in->q.get(),
               in->qo_indptr.as<int32_t>(),
               in->kv_indptr.as<int32_t>(),
               in->pool.get(),
               in->kv_indices.as<int32_t>(),
               in->kv_last_page_len.as<int32_t>(),
               in->k.get(),
               in->v.get(),
               in->o.get(),
               in->lse.as<float>()};
  in->batch.v_pool = in->v_pool.get();  // null unless V has a pool of its own
  in->runner = tune.num_stages || tune.threads ? std::make_unique<stages::paged::PagedRunner>(tune)
                                               : stage.make_runner();
  in->workspace = DeviceBuffer(in->runner->workspace_bytes(s));
  in->runner->plan(s, in->workspace.get(), in->workspace.bytes(), nullptr);
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  capture(*in);
  in->bytes = double(elem) * (q_elems + o_elems) + double(kv_elem) * (kv_elems + v_elems) +
              4.0 * s.nnz_qo() * s.num_qo_heads;
  if (s.mode == stages::Mode::prefill)
    in->flops = visible_pairs(s) * 2.0 * (s.head_dim + s.resolved_head_dim_vo()) * s.num_qo_heads;
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  g_inputs = std::move(in);
  return *g_inputs;
}

/// A timed stage must also produce finite output (a cheap guard, not the validation:
/// that is the GPU test suite's job).
bool lse_is_finite(const StageInputs& in) {
  std::vector<float> lse(in.lse.bytes() / sizeof(float));
  FLASHSTEP_CUDA_CHECK(cudaMemcpy(lse.data(), in.lse.get(), in.lse.bytes(), cudaMemcpyDeviceToHost));
  for (float x : lse)
    if (!std::isfinite(x)) return false;
  return true;
}

benchmark::internal::Benchmark* configure(benchmark::internal::Benchmark* b) {
  return b->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05)->Repetitions(5)->ReportAggregatesOnly(true);
}

void register_stage(const stages::StageInfo& stage, const BenchShape& shape, const std::string& name,
                    stages::paged::PagedConfig tune = {}) {
  stages::harness::CaseSpec spec = shape.spec;
  std::string note;
  if (!stage.supports(spec.dtype)) {
    // A prefill shape is compute-bound: timing it in another dtype would say nothing of
    // this one (and 01_naive's fp32 score matrix of a 16k prefill does not fit).
    if (spec.mode == stages::Mode::prefill) return;
    note = std::string(stages::to_string(stage.dtypes.front())) + " (stage has no " + stages::to_string(spec.dtype) +
           ")";
    spec.dtype = stage.dtypes.front();
  }
  if (stage.storage == stages::KVStorage::ragged) {
    if (spec.shared_prefix > 0) return;  // contiguous K/V rows cannot be shared between requests
    spec.kv_layout = stages::KVLayout::NHD;
  }
  std::mt19937_64 rng(1);
  if (!stage.supports(stages::harness::make_layout(spec, stage.storage, rng).shape)) return;
  configure(benchmark::RegisterBenchmark(name.c_str(), [&stage, spec, name, note, tune](benchmark::State& state) {
    StageInputs& in = inputs_for(name, stage, spec, tune);
    static GpuTimer timer;
    // Prefill is compute-bound: TFLOP/s against the GEMM ceiling; decode: GB/s against the copy.
    if (in.flops > 0)
      run_timed(
          state, timer, [&] { in.call(nullptr); }, 0, in.flops, g_ceilings.gemm_tflops);
    else
      run_timed(
          state, timer, [&] { in.call(nullptr); }, in.bytes, 0, g_ceilings.copy_gbps, g_ceilings.read_gbps);
    if (!lse_is_finite(in)) state.SkipWithError("non-finite lse: the stage is broken on this shape");
    std::ostringstream label;
    label << stages::to_string(in.shape.dtype) << ' ' << stages::to_string(in.shape.storage) << ", "
          << (in.graph ? "cuda_graph" : "eager");
    if (in.shape.resolved_kv_dtype() != in.shape.dtype)
      label << "; kv " << stages::to_string(in.shape.resolved_kv_dtype());
    if (in.shape.k_scale != 1.f || in.shape.v_scale != 1.f)
      label << ", k_scale " << in.shape.k_scale << ", v_scale " << in.shape.v_scale;
    if (!note.empty()) label << "; runs " << note;
    if (const auto* c = dynamic_cast<const stages::cascade::CascadeRunner*>(in.runner.get())) {
      const stages::cascade::CascadePlan& plan = c->cascade_plan();
      if (plan.path == stages::cascade::Path::cascade) {
        label << "; cascade, " << plan.levels.levels.size() << " levels";
        double shared_flops = 0;
        for (size_t l = 0; l + 1 < plan.levels.levels.size(); ++l) {
          const auto& lv = plan.levels.levels[l];
          for (size_t g = 0; g + 1 < lv.qo_indptr.size(); ++g) {
            const double pages = lv.kv_indptr[g + 1] - lv.kv_indptr[g];
            const double keys = pages == 0 ? 0 : (pages - 1) * plan.levels.page_size + lv.kv_last_page_len[g];
            shared_flops += double(lv.qo_indptr[g + 1] - lv.qo_indptr[g]) * in.shape.num_qo_heads * keys * 4.0 *
                            in.shape.head_dim;
          }
        }
        state.counters["shared_flops"] = shared_flops;
      } else {
        label << "; flat via " << plan.flat_stage;
      }
    }
    state.SetLabel(label.str());
  }));
}

/// Median of `reps` timed runs, for the context fields (the rows are measured again by
/// Google Benchmark below).
template <typename Body>
double median_ms(GpuTimer& timer, Body body, int reps) {
  for (int i = 0; i < 3; ++i) body();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(timer.time_once(body));
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_path = FLASHSTEP_BENCH_SHAPES;
  std::set<std::string> sets = {"target", "sweep", "extra"};
  bool tune = false;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--shapes=", 0) == 0) {
      shapes_path = a.substr(9);
    } else if (a.rfind("--sets=", 0) == 0) {
      sets.clear();
      std::stringstream ss(a.substr(7));
      for (std::string s; std::getline(ss, s, ',');) sets.insert(s);
    } else if (a == "--tune") {
      tune = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  std::string why;
  if (!stages::harness::gpu_available(&why)) {
    std::fprintf(stderr, "flashstep_bench: no usable CUDA GPU (%s)\n", why.c_str());
    return 1;
  }
  try {
    // bench/shapes_mla.csv has columns of its own: MLA's rows (mla_rows.hpp) and the ceilings
    const bool mla_file = is_mla_shapes_file(shapes_path);
    const std::vector<BenchShape> shapes = mla_file ? std::vector<BenchShape>{} : load_shapes(shapes_path);
    {
      GpuTimer timer;
      {
        const CopyCeiling copy;
        g_ceilings.copy_gbps = CopyCeiling::bytes() /
                               (median_ms(
                                    timer, [&] { copy.run(nullptr); }, 20) *
                                1e-3) *
                               1e-9;
      }
      std::ostringstream sweep;
      for (const ReadConfig& config : kReadConfigs) {
        const ReadCeiling read(config);
        const double gbps = ReadCeiling::bytes() /
                            (median_ms(
                                 timer, [&] { read.run(nullptr); }, 20) *
                             1e-3) *
                            1e-9;
        sweep << (sweep.tellp() > 0 ? "; " : "") << read.describe() << ": " << std::to_string(gbps) << " GB/s";
        if (gbps > g_ceilings.read_gbps) {
          g_ceilings.read_gbps = gbps;
          g_ceilings.read_config = config;
          g_ceilings.read_text = read.describe();
        }
      }
      benchmark::AddCustomContext("read_ceiling_sweep", sweep.str());
      double launch_floor_1_us = 0;
      for (int kernels : {1, 2}) {
        const LaunchFloor floor(kernels);
        const double us = median_ms(
                              timer, [&] { floor.run(timer.stream()); }, 50) *
                          1e3;
        if (kernels == 1) launch_floor_1_us = us;
        benchmark::AddCustomContext("launch_floor_" + std::to_string(kernels) + "_us", std::to_string(us));
      }
      // The stages' planners price with what was just measured on this GPU.
      stages::use_device_model(measured_device_model(stages::device_model(), g_ceilings.read_gbps, launch_floor_1_us));
      const GemmCeiling gemm;
      g_ceilings.gemm_tflops = GemmCeiling::flops() /
                               (median_ms(
                                    timer, [&] { gemm.run(nullptr); }, 10) *
                                1e-3) *
                               1e-12;
    }
    const char* commit = std::getenv("FLASHSTEP_COMMIT");
    benchmark::AddCustomContext("device", stages::harness::device_description());
    benchmark::AddCustomContext("commit", commit ? commit : "unknown");
    benchmark::AddCustomContext("copy_ceiling_GB/s", std::to_string(g_ceilings.copy_gbps));
    benchmark::AddCustomContext("read_ceiling_GB/s", std::to_string(g_ceilings.read_gbps));
    benchmark::AddCustomContext("read_ceiling_config", g_ceilings.read_text);
    benchmark::AddCustomContext("gemm_bf16_ceiling_TFLOP/s", std::to_string(g_ceilings.gemm_tflops));
    benchmark::AddCustomContext("shapes_file", shapes_path);

    configure(benchmark::RegisterBenchmark("ceiling/copy_d2d", [](benchmark::State& state) {
      static GpuTimer timer;
      static const CopyCeiling copy;
      run_timed(
          state, timer, [&] { copy.run(nullptr); }, CopyCeiling::bytes(), 0, g_ceilings.copy_gbps);
    }));
    configure(benchmark::RegisterBenchmark("ceiling/read_only", [](benchmark::State& state) {
      static GpuTimer timer;
      const ReadCeiling read(g_ceilings.read_config);  // per repetition: 4 GiB not held while the stages run
      run_timed(
          state, timer, [&] { read.run(nullptr); }, ReadCeiling::bytes(), 0, g_ceilings.copy_gbps,
          g_ceilings.read_gbps);
      state.SetLabel(read.describe());
    }));
    // The launch floor: a graph of one or two empty kernels, timed like a stage (no bytes:
    // the row's time is the floor; context launch_floor_1_us / launch_floor_2_us).
    for (int kernels : {1, 2}) {
      const std::string name = "ceiling/launch_floor_" + std::to_string(kernels);
      configure(benchmark::RegisterBenchmark(name.c_str(), [kernels](benchmark::State& state) {
        static GpuTimer timer;
        const LaunchFloor floor(kernels);
        run_timed(
            state, timer, [&] { floor.run(timer.stream()); }, 0, 0, 0);
        state.SetLabel(std::to_string(kernels) + " empty kernel" + (kernels == 1 ? "" : "s") +
                       " in a CUDA graph, one 256-thread block per SM");
      }));
    }
    configure(benchmark::RegisterBenchmark("ceiling/gemm_bf16", [](benchmark::State& state) {
      static GpuTimer timer;
      static const GemmCeiling gemm;
      run_timed(
          state, timer, [&] { gemm.run(nullptr); }, 0, GemmCeiling::flops(), g_ceilings.gemm_tflops);
    }));

    if (mla_file) register_mla_rows(shapes_path, sets, configure, &g_ceilings.gemm_tflops, &g_ceilings.read_gbps);
    for (const stages::StageInfo& stage : stages::registry()) {
      std::set<std::string> seen;  // ragged stages ignore page size, layout and page order
      for (const BenchShape& shape : shapes) {
        if (!sets.count(shape.set)) continue;
        if (stage.storage == stages::KVStorage::ragged) {
          const auto& c = shape.spec;
          const stages::DType dtype = stage.supports(c.dtype) ? c.dtype : stage.dtypes.front();
          const std::string key = std::string(stages::to_string(c.mode)) + "/" + std::to_string(c.qo_len) + "/" +
                                  std::to_string(c.causal) + "/" + stages::harness::to_string(c.lengths) + "/" +
                                  std::to_string(c.batch_size) + "/" + std::to_string(c.kv_len) + "/" +
                                  std::to_string(c.num_qo_heads) + "/" + std::to_string(c.num_kv_heads) + "/" +
                                  std::to_string(c.head_dim) + "/" + stages::to_string(dtype);
          if (!seen.insert(key).second) continue;
        }
        register_stage(stage, shape, stage.name + "/" + shape.name);
      }
    }
    // Stage 05 with its path forced, on the shapes that share a prefix.
    static const auto forced = [](stages::cascade::Path path, const char* name) {
      stages::StageInfo info = stages::cascade::stage_info();
      info.name = name;
      info.make_runner = [path] {
        stages::cascade::CascadeOptions options;
        options.path = path;
        return std::make_unique<stages::cascade::CascadeRunner>(options);
      };
      return info;
    };
    static const stages::StageInfo cascade_forced[] = {forced(stages::cascade::Path::cascade, "05_cascade[cascade]"),
                                                       forced(stages::cascade::Path::flat, "05_cascade[flat]")};
    for (const stages::StageInfo& stage : cascade_forced)
      for (const BenchShape& shape : shapes)
        if (sets.count(shape.set) && shape.spec.shared_prefix > 0)
          register_stage(stage, shape, stage.name + "/" + shape.name);
    // Stage 03 with its CUDA-core loop (the tensor-core kernel off) on every decode shape
    // the tensor-core kernel takes (FP8 K/V, or fp16/bf16 at head_dim 128), and, with
    // --tune, the tensor-core kernel at other pipeline depths than its default, and planned
    // for 3, 6, 9, 12, 16, 24 or 40 blocks an SM (ctas_per_sm) where its default depth runs
    // 3 of 16-bit K/V: one to thirteen waves, so that a batch just over one wave is split into
    // chunks, and batch 128 x 8192 keys (2.6 waves unsplit) into 2, 3 or 5 chunks a request;
    // and with chunks of at least 64 keys rather than 128 (min_kv_chunk_tokens).
    static const auto split_kv_variant = [](const char* name, int num_stages, bool tensor_cores, int ctas_per_sm = 0,
                                            int min_kv_chunk_tokens = -1) {
      stages::StageInfo info = stages::split_kv::stage_info();
      info.name = name;
      info.make_runner = [num_stages, tensor_cores, ctas_per_sm, min_kv_chunk_tokens] {
        stages::split_kv::SplitKVOptions options;
        options.enable_cuda_graph = true;
        options.num_stages = num_stages;
        options.tensor_cores = tensor_cores;
        options.ctas_per_sm = ctas_per_sm;
        if (min_kv_chunk_tokens >= 0) options.min_kv_chunk_tokens = min_kv_chunk_tokens;
        return std::make_unique<stages::split_kv::SplitKVRunner>(options);
      };
      return info;
    };
    static const stages::StageInfo split_kv_variants[] = {split_kv_variant("03_split_kv[fp8_cuda_cores]", 0, false),
                                                          split_kv_variant("03_split_kv[cuda_cores]", 0, false),
                                                          split_kv_variant("03_split_kv[mma_s3]", 3, true),
                                                          split_kv_variant("03_split_kv[mma_s4]", 4, true),
                                                          split_kv_variant("03_split_kv[mma_s5]", 5, true),
                                                          split_kv_variant("03_split_kv[mma_ctas3]", 0, true, 3),
                                                          split_kv_variant("03_split_kv[mma_ctas6]", 0, true, 6),
                                                          split_kv_variant("03_split_kv[mma_ctas9]", 0, true, 9),
                                                          split_kv_variant("03_split_kv[mma_ctas12]", 0, true, 12),
                                                          split_kv_variant("03_split_kv[mma_ctas16]", 0, true, 16),
                                                          split_kv_variant("03_split_kv[mma_ctas24]", 0, true, 24),
                                                          split_kv_variant("03_split_kv[mma_ctas40]", 0, true, 40),
                                                          split_kv_variant("03_split_kv[mma_chunk64]", 0, true, 0, 64)};
    for (const BenchShape& shape : shapes) {
      const stages::harness::CaseSpec& c = shape.spec;
      if (!sets.count(shape.set) || c.mode != stages::Mode::decode) continue;
      std::mt19937_64 rng(1);
      const bool fp8 = c.kv_dtype && stages::is_fp8(*c.kv_dtype);
      const bool mma16 = !fp8 && stages::split_kv::tensor_core_decode_takes(
                                     stages::harness::make_layout(c, stages::KVStorage::paged, rng).shape);
      for (const stages::StageInfo& stage : split_kv_variants) {
        const bool cores_row = &stage == &split_kv_variants[0] ? fp8 : &stage == &split_kv_variants[1] && mma16;
        if (cores_row || (tune && &stage >= &split_kv_variants[2] && (fp8 || mma16)))
          register_stage(stage, shape, stage.name + "/" + shape.name);
      }
    }
    if (tune) {
      const stages::StageInfo& paged = stages::find_stage("02_paged");
      for (const BenchShape& shape : shapes)
        if (shape.set == "target")
          for (int threads : {256, 512})
            for (int s : {2, 3, 4}) {
              if (threads == 512 && s > 2) continue;  // 2 x 3 x 32 KB + merge: more shared memory than a block may have
              register_stage(paged, shape,
                             "tune/t" + std::to_string(threads) + "_s" + std::to_string(s) + "/" + shape.name,
                             stages::paged::PagedConfig{s, threads});
            }
    }
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_inputs.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashstep_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
