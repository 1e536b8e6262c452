// flashstep_sampling_bench: stage 06's operators on the shapes of bench/shapes_sampling.csv,
// timed as the peers in bench/peers/sampling.py are (benchmarks, not tests):
// each call is captured once in a CUDA graph and replayed; before every replay the L2 is
// evicted by a write of twice its size; CUDA events around the replay; Google Benchmark
// takes the per-replay times (manual time) and reports the median of the repetitions.
// Counters: GB/s (one read of the input rows per call), and the rejection rounds
// (mean and max over the batch, from one extra call) for the samplers.
//
//     flashstep_sampling_bench [--shapes bench/shapes_sampling.csv] [--sets target,extra]
//         [--min-time 0.05] --benchmark_repetitions=5 --benchmark_out=sampling.json
//         --benchmark_out_format=json
//
// The benchmarks are named 06_sampling/SHAPE.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/gpu_present.hpp"

namespace gpu = flashstep::stages::sampling;

namespace {

struct Shape {
  std::string name, set, op, order;
  int64_t batch = 0, vocab = 0, top_k = 0;
  double top_p = 0, min_p = 0;
};

std::vector<Shape> load_shapes(const std::string& path, const std::string& sets) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Shape> shapes;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    std::stringstream ss(line);
    std::vector<std::string> f;
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    f.resize(9);
    Shape s{f[0],           f[1], f[2], f[8], std::stoll(f[3]), std::stoll(f[4]), std::stoll(f[5]), std::stod(f[6]),
            std::stod(f[7])};
    if (("," + sets + ",").find("," + s.set + ",") != std::string::npos) shapes.push_back(s);
  }
  return shapes;
}

/// The inputs of a (batch, vocab): standard-normal logits and their softmax (made once
/// per size and kept, so that the shapes of one size share them).
struct HostRows {
  std::vector<float> logits, probs;
};
const HostRows& host_rows(int64_t batch, int64_t vocab) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<HostRows>> cache;
  auto& slot = cache[{batch, vocab}];
  if (slot) return *slot;
  slot = std::make_unique<HostRows>();
  const size_t n = static_cast<size_t>(batch * vocab);
  std::vector<float>& logits = slot->logits;
  std::vector<float>& probs = slot->probs;
  logits.resize(n), probs.resize(n);
  std::mt19937_64 rng(20240606 + static_cast<uint64_t>(batch * 7 + vocab));
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : logits) x = normal(rng);
  for (int64_t r = 0; r < batch; ++r) {
    const float* x = logits.data() + r * vocab;
    const float m = *std::max_element(x, x + vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(x[i] - m));
    for (int64_t i = 0; i < vocab; ++i)
      probs[static_cast<size_t>(r * vocab + i)] = float(std::exp(double(x[i] - m)) / sum);
  }
  return *slot;
}

/// Device inputs and outputs of one shape, and the call as a graph.
class Case {
 public:
  explicit Case(const Shape& s) : s_(s) {
    const size_t n = static_cast<size_t>(s.batch * s.vocab);
    const HostRows& host = host_rows(s.batch, s.vocab);
    const std::vector<float>& logits = host.logits;
    const std::vector<float>& probs = host.probs;
    const bool logit_input = s.op.find("logits") != std::string::npos;
    input_ = alloc<float>(n);
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpy(input_, (logit_input ? logits : probs).data(), n * sizeof(float), cudaMemcpyHostToDevice));
    out_rows_ = alloc<float>(n);
    samples_ = alloc<int32_t>(static_cast<size_t>(s.batch));
    rounds_ = alloc<int32_t>(static_cast<size_t>(s.batch));
    const auto order = s.order == "joint" ? gpu::FilterApplyOrder::joint : gpu::FilterApplyOrder::top_k_first;
    ws_bytes_ = gpu::workspace_bytes(s.op, s.batch, s.batch, s.vocab, order);
    workspace_ = ws_bytes_ ? alloc<uint8_t>(ws_bytes_) : nullptr;
    FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // one call with rounds, for the counters; the timed graph leaves rounds out
    call(rounds_);
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (draws()) {
      std::vector<int32_t> r(static_cast<size_t>(s.batch));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(r.data(), rounds_, r.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
      rounds_mean_ = std::accumulate(r.begin(), r.end(), 0.0) / static_cast<double>(r.size());
      rounds_max_ = *std::max_element(r.begin(), r.end());
    }
    FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    call(nullptr);
    FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    int device = 0, l2 = 0;
    FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
    FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    flush_bytes_ = 2 * static_cast<size_t>(l2);
    flush_ = alloc<uint8_t>(flush_bytes_);
    FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start_));
    FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Case() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
    for (void* p : owned_) cudaFree(p);
  }
  bool draws() const { return s_.op.find("sampling") != std::string::npos; }

  /// One replay after an L2 eviction, in seconds.
  double time_once() {
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(flush_, static_cast<int>(++flushes_ & 0xff), flush_bytes_, stream_));
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start_, stream_));
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }
  double bytes() const { return static_cast<double>(s_.batch * s_.vocab) * sizeof(float); }
  double rounds_mean_ = 0;
  int32_t rounds_max_ = 0;

 private:
  template <typename T>
  T* alloc(size_t n) {
    void* p = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  void call(int32_t* rounds) {
    const gpu::DeviceRows in{input_, s_.batch, s_.vocab};
    const gpu::SamplingOutputs out{samples_, rounds, nullptr};
    gpu::SamplingOptions opt;
    opt.seed = 42;
    const gpu::Workspace ws{workspace_, ws_bytes_};
    const auto order = s_.order == "joint" ? gpu::FilterApplyOrder::joint : gpu::FilterApplyOrder::top_k_first;
    const std::string& op = s_.op;
    if (op == "sampling_from_probs") gpu::sampling_from_probs(in, out, opt, stream_);
    else if (op == "sampling_from_logits") gpu::sampling_from_logits(in, out, ws, opt, stream_);
    else if (op == "top_k_sampling_from_probs") gpu::top_k_sampling_from_probs(in, s_.top_k, out, opt, stream_);
    else if (op == "top_p_sampling_from_probs") gpu::top_p_sampling_from_probs(in, s_.top_p, out, opt, stream_);
    else if (op == "min_p_sampling_from_probs") gpu::min_p_sampling_from_probs(in, s_.min_p, out, opt, stream_);
    else if (op == "top_k_top_p_sampling_from_probs")
      gpu::top_k_top_p_sampling_from_probs(in, s_.top_k, s_.top_p, order, out, ws, opt, stream_);
    else if (op == "top_k_top_p_sampling_from_logits")
      gpu::top_k_top_p_sampling_from_logits(in, s_.top_k, s_.top_p, order, out, ws, opt, stream_);
    else if (op == "top_k_renorm_probs") gpu::top_k_renorm_probs(in, s_.top_k, out_rows_, nullptr, stream_);
    else if (op == "top_p_renorm_probs") gpu::top_p_renorm_probs(in, s_.top_p, out_rows_, nullptr, stream_);
    else if (op == "top_k_mask_logits") gpu::top_k_mask_logits(in, s_.top_k, out_rows_, nullptr, stream_);
    else throw std::runtime_error("bench/shapes_sampling.csv: unknown operator " + op);
  }

  Shape s_;
  float* input_ = nullptr;
  float* out_rows_ = nullptr;
  int32_t* samples_ = nullptr;
  int32_t* rounds_ = nullptr;
  uint8_t* workspace_ = nullptr;
  size_t ws_bytes_ = 0;
  uint8_t* flush_ = nullptr;
  size_t flush_bytes_ = 0;
  unsigned flushes_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  std::vector<void*> owned_;
};

void run(benchmark::State& state, const Shape& s) {
  Case c(s);
  for (int i = 0; i < 3; ++i) c.time_once();  // warm-up
  double total = 0;
  int64_t n = 0;
  for (auto _ : state) {
    const double t = c.time_once();
    state.SetIterationTime(t);
    total += t;
    ++n;
  }
  const double t = n ? total / static_cast<double>(n) : 0;
  if (t > 0) state.counters["GB/s"] = c.bytes() / t * 1e-9;
  state.counters["batch"] = static_cast<double>(s.batch);
  state.counters["vocab"] = static_cast<double>(s.vocab);
  if (c.draws()) {
    state.counters["rounds_mean"] = c.rounds_mean_;
    state.counters["rounds_max"] = c.rounds_max_;
  }
  state.SetLabel(s.op + (s.order.empty() ? "" : " " + s.order));
}

}  // namespace

int main(int argc, char** argv) {
  std::string shapes_path = FLASHSTEP_SAMPLING_SHAPES, sets = "target,extra";
  double min_time = 0.05;  // seconds of replays per repetition
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shapes" && i + 1 < argc) {
      shapes_path = argv[++i];
    } else if (a == "--sets" && i + 1 < argc) {
      sets = argv[++i];
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  std::string why;
  if (!flashstep::stages::harness::gpu_available(&why)) {
    std::printf("SKIPPED: no usable CUDA GPU (%s); flashstep_sampling_bench needs one\n", why.c_str());
    return 77;
  }
  cudaDeviceProp prop{};
  FLASHSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  benchmark::AddCustomContext("device", prop.name);
  benchmark::AddCustomContext("flashstep.shapes_file", shapes_path);
  for (const Shape& s : load_shapes(shapes_path, sets))
    benchmark::RegisterBenchmark(("06_sampling/" + s.name).c_str(), [s](benchmark::State& st) { run(st, s); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(min_time > 0 ? min_time : 0.05);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
