// The CUDA-graph contract, for every stage of the registry: a graph captured after one
// plan() replays correctly after later plan()s of the same batch_size (and nnz_qo) with
// other lengths, empty requests and another page order, when the shape asks for a graph
// plan (BatchShape::cuda_graph) and the stage declares it (StageInfo::cuda_graph). A
// runner not planned for graphs refuses the re-plan instead (CapturedLaunch), and the
// check below is shown to catch a replay of a stale schedule.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "05_cascade/cascade.hpp"
#include "fixed_batch.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "harness/case.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::harness;
using flashstep::test::FixedBatch;

namespace {

/// A captured graph and the stream it replays on.
struct Graph {
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() { FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)); }
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
  }
  /// Captures runner.run(batch) (recorded, not executed).
  void capture(StageRunner& runner, const DeviceBatch& batch) {
    cudaGraph_t graph = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    runner.run(batch, stream);
    FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  void replay() {
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
};

/// The cases of one replay sequence, built from the run seed, with room for all of them.
struct Sequence {
  std::vector<HostCase> cases;
  size_t max_pages = 1, max_kv_rows = 1, max_indices = 1;
};

Sequence build_sequence(const std::vector<CaseSpec>& specs, KVStorage storage, const std::string& salt) {
  Sequence seq;
  for (const CaseSpec& spec : specs) {
    seq.cases.push_back(build_case(spec, storage, case_seed(test::run_seed(), salt + spec.describe())));
    BatchShape& s = seq.cases.back().layout.shape;
    s.cuda_graph = true;
    seq.max_pages = std::max(seq.max_pages, size_t(s.num_pages));
    seq.max_kv_rows = std::max(seq.max_kv_rows, size_t(std::max(1, s.kv_indptr.back())));
    seq.max_indices = std::max(seq.max_indices, seq.cases.back().layout.kv_indices.size());
  }
  return seq;
}

/// Plans cases[0], captures run(), then for every case: its inputs into the same buffers,
/// plan() into the same workspace, replay (twice, outputs poisoned before each), compare.
/// `make_runner`: the runner to check (default: the registry entry's).
void check_replays(const StageInfo& stage, const Sequence& seq,
                   const std::function<std::unique_ptr<StageRunner>()>& make_runner = {}) {
  const BatchShape& first = seq.cases[0].layout.shape;
  FixedBatch fixed(first, seq.max_pages, seq.max_kv_rows, seq.max_indices);
  std::unique_ptr<StageRunner> runner = make_runner ? make_runner() : stage.make_runner();
  size_t bytes = 0;
  for (const HostCase& host : seq.cases) bytes = std::max(bytes, runner->workspace_bytes(host.layout.shape));
  DeviceBuffer workspace(std::max<size_t>(bytes, 1));
  Graph graph;
  runner->plan(first, workspace.get(), workspace.bytes(), graph.stream);
  graph.capture(*runner, fixed.batch);
  for (size_t i = 0; i < seq.cases.size(); ++i) {
    const HostCase& host = seq.cases[i];
    INFO(stage.name << ": replay " << i << " of " << host.spec.describe() << " (case seed " << host.seed << ")");
    fixed.load(host, graph.stream);
    runner->plan(host.layout.shape, workspace.get(), workspace.bytes(), graph.stream);
    for (int replay = 0; replay < 2; ++replay) {
      fixed.poison(graph.stream);
      graph.replay();
      const ValidationReport r = compare_outputs(stage.name, host, fixed.output(host.layout.shape.dtype),
                                                 fixed.lse_values());
      CHECK_MESSAGE(r.passed, r.message());
    }
  }
}

CaseSpec graph_spec(Mode mode, DType dtype, int kv_len, LengthPolicy lengths, PageOrder order) {
  CaseSpec c;
  c.mode = mode;
  c.dtype = dtype;
  c.kv_len = kv_len;
  c.lengths = lengths;
  c.page_order = order;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  if (mode == Mode::decode) {
    c.batch_size = 6;
  } else {
    // the same nnz_qo in every plan of a sequence, as a captured prefill graph needs
    c.batch_size = 4;
    c.qo_len = 40;
    c.causal = true;
  }
  return c;
}

/// Lengths a graph must survive: shorter and longer than the first plan's, a request
/// with no keys, every request alike, pages in order and shuffled.
std::vector<CaseSpec> graph_specs(Mode mode, DType dtype) {
  using L = LengthPolicy;
  using P = PageOrder;
  if (mode == Mode::decode)
    return {graph_spec(mode, dtype, 300, L::ragged, P::shuffled),
            graph_spec(mode, dtype, 2000, L::ragged_with_empty, P::shuffled),
            graph_spec(mode, dtype, 17, L::ragged, P::sequential),
            graph_spec(mode, dtype, 1200, L::uniform, P::shuffled),
            graph_spec(mode, dtype, 5000, L::ragged, P::shuffled)};
  return {graph_spec(mode, dtype, 100, L::uniform, P::shuffled), graph_spec(mode, dtype, 700, L::uniform, P::shuffled),
          graph_spec(mode, dtype, 40, L::uniform, P::sequential),
          graph_spec(mode, dtype, 3000, L::uniform, P::shuffled)};
}

}  // namespace

TEST_CASE("every stage planned for CUDA graphs replays a captured run() after re-plans with new lengths") {
  int checked = 0;
  for (const StageInfo& stage : registry()) {
    if (!stage.cuda_graph) continue;
    const DType dtype = stage.supports(DType::bf16) ? DType::bf16 : stage.dtypes.front();
    for (Mode mode : stage.modes) {
      const std::vector<CaseSpec> specs = graph_specs(mode, dtype);
      const Sequence seq = build_sequence(specs, stage.storage, "graph replay " + stage.name);
      if (!stage.supports(seq.cases[0].layout.shape)) continue;
      MESSAGE(stage.name << " " << to_string(mode) << ": " << specs.size() << " plans replayed");
      check_replays(stage, seq);
      ++checked;
    }
  }
  // 01 (decode, prefill), 02, 03, 04 paged (decode, prefill), 04 ragged (decode, prefill)
  CHECK(checked >= 7);
}

TEST_CASE("the replay check catches a graph replaying a stale schedule") {
  // A stage 04 runner planned without BatchShape::cuda_graph sizes its grid and its KV
  // split from the lengths. A second runner plans new lengths into the same workspace (as
  // a wrapper that made a new runner would), and the graph captured from the first
  // replays its old grid over the new schedule: the comparison must fail.
  const StageInfo stage = find_stage("04_tensor_core");
  Sequence seq = build_sequence(
      {graph_spec(Mode::decode, DType::bf16, 64, LengthPolicy::uniform, PageOrder::shuffled),
       graph_spec(Mode::decode, DType::bf16, 4000, LengthPolicy::ragged, PageOrder::shuffled)},
      stage.storage, "stale schedule");
  for (HostCase& host : seq.cases) host.layout.shape.cuda_graph = false;
  FixedBatch fixed(seq.cases[0].layout.shape, seq.max_pages, 0, seq.max_indices);
  auto first = stage.make_runner(), second = stage.make_runner();
  DeviceBuffer workspace(
      std::max(first->workspace_bytes(seq.cases[0].layout.shape), second->workspace_bytes(seq.cases[1].layout.shape)));
  Graph graph;
  first->plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.capture(*first, fixed.batch);
  fixed.load(seq.cases[1], graph.stream);
  second->plan(seq.cases[1].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.replay();
  const ValidationReport r = compare_outputs(stage.name, seq.cases[1], fixed.output(DType::bf16), fixed.lse_values());
  CHECK_MESSAGE(!r.passed, "a stale grid replayed over a new schedule passed the check:\n" << r.message());
}

TEST_CASE("a runner not planned for CUDA graphs refuses a re-plan that a captured graph cannot replay") {
  const StageInfo stage = find_stage("04_tensor_core");
  Sequence seq = build_sequence(
      {graph_spec(Mode::decode, DType::bf16, 64, LengthPolicy::uniform, PageOrder::shuffled),
       graph_spec(Mode::decode, DType::bf16, 4000, LengthPolicy::ragged, PageOrder::shuffled)},
      stage.storage, "refused re-plan");
  for (HostCase& host : seq.cases) host.layout.shape.cuda_graph = false;
  FixedBatch fixed(seq.cases[0].layout.shape, seq.max_pages, 0, seq.max_indices);
  auto runner = stage.make_runner();
  DeviceBuffer workspace(
      std::max(runner->workspace_bytes(seq.cases[0].layout.shape), runner->workspace_bytes(seq.cases[1].layout.shape)));
  Graph graph;
  runner->plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  // Before a capture, any re-plan is fine.
  runner->plan(seq.cases[1].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  runner->plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.capture(*runner, fixed.batch);
  CHECK_THROWS_WITH_AS(runner->plan(seq.cases[1].layout.shape, workspace.get(), workspace.bytes(), graph.stream),
                       doctest::Contains("captured into a CUDA graph"), ref::InvalidArgument);
  // The same lengths again keep the captured launch: accepted, and the replay is right.
  fixed.load(seq.cases[0], graph.stream);
  runner->plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.replay();
  const ValidationReport r = compare_outputs(stage.name, seq.cases[0], fixed.output(DType::bf16), fixed.lse_values());
  CHECK_MESSAGE(r.passed, r.message());
}

TEST_CASE("05_cascade refuses a re-plan whose levels a captured graph cannot replay") {
  CaseSpec a = graph_spec(Mode::decode, DType::bf16, 200, LengthPolicy::ragged, PageOrder::shuffled);
  a.batch_size = 16;
  a.shared_prefix = 1024;
  CaseSpec b = a;
  b.shared_prefix = 4096;
  const StageInfo stage = find_stage("05_cascade");
  Sequence seq = build_sequence({a, b}, KVStorage::paged, "cascade refusal");
  cascade::CascadeOptions options;
  options.path = cascade::Path::cascade;
  cascade::CascadeRunner runner(options);
  FixedBatch fixed(seq.cases[0].layout.shape, seq.max_pages, 0, seq.max_indices);
  DeviceBuffer workspace(
      std::max(runner.workspace_bytes(seq.cases[0].layout.shape), runner.workspace_bytes(seq.cases[1].layout.shape)));
  Graph graph;
  fixed.load(seq.cases[0], graph.stream);
  runner.plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.capture(runner, fixed.batch);
  CHECK_THROWS_WITH_AS(runner.plan(seq.cases[1].layout.shape, workspace.get(), workspace.bytes(), graph.stream),
                       doctest::Contains("captured into a CUDA graph"), ref::InvalidArgument);
  runner.plan(seq.cases[0].layout.shape, workspace.get(), workspace.bytes(), graph.stream);
  graph.replay();
  const ValidationReport r = compare_outputs(stage.name, seq.cases[0], fixed.output(DType::bf16), fixed.lse_values());
  CHECK_MESSAGE(r.passed, r.message());
}

TEST_CASE("05_cascade with fixed_graph_launch replays a captured run() after re-plans with other prefixes") {
  // One graph per (batch_size, nnz_qo): the shared prefix grows, shrinks, vanishes (the
  // shared level then holds no page) and comes back, lengths and page orders change.
  // Small sizes: every request's copy of the prefix is drawn and answered on the host.
  const StageInfo stage = find_stage("05_cascade");
  auto make = [] {
    cascade::CascadeOptions options;
    options.fixed_graph_launch = true;
    return std::unique_ptr<StageRunner>(std::make_unique<cascade::CascadeRunner>(options));
  };
  auto small = [](CaseSpec c) {  // the engine's heads
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    return c;
  };
  for (Mode mode : {Mode::decode, Mode::prefill}) {
    std::vector<CaseSpec> specs;
    const int prefixes[] = {256, 1024, 0, 16, 512};
    const LengthPolicy lengths[] = {LengthPolicy::ragged, LengthPolicy::uniform, LengthPolicy::ragged,
                                    LengthPolicy::ragged_with_empty, LengthPolicy::ragged};
    for (int i = 0; i < 5; ++i) {
      if (mode == Mode::prefill && lengths[i] != LengthPolicy::uniform) continue;  // fixed nnz_qo
      CaseSpec c = small(graph_spec(mode, DType::bf16, 100 + 100 * i, lengths[i],
                                    i % 2 ? PageOrder::sequential : PageOrder::shuffled));
      if (mode == Mode::decode) c.batch_size = 8;
      c.shared_prefix = prefixes[i];
      specs.push_back(c);
    }
    if (mode == Mode::prefill) {  // a second and third uniform batch, prefix 0 and 128
      CaseSpec c = small(graph_spec(mode, DType::bf16, 300, LengthPolicy::uniform, PageOrder::shuffled));
      c.shared_prefix = 0;
      specs.push_back(c);
      c.shared_prefix = 128;
      c.kv_len = 500;
      specs.push_back(c);
    }
    Sequence seq = build_sequence(specs, KVStorage::paged, "cascade fixed graph " + std::string(to_string(mode)));
    // one pool for the whole sequence, as an engine has: the fixed launch is sized by it
    for (HostCase& host : seq.cases) host.layout.shape.num_pages = static_cast<int64_t>(seq.max_pages);
    MESSAGE("05_cascade fixed_graph_launch " << std::string(to_string(mode)) << ": " << specs.size()
                                             << " plans replayed");
    check_replays(stage, seq, make);
  }
}
