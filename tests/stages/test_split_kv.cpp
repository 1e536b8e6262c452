// Stage 03 (split-KV) beyond what the registry's decode grids check: the partial states
// of every chunk against the reference's split phase, splits forced on short requests,
// the workspace layout, the schedule being the reference planner's, CUDA-graph capture
// and replay after re-planning, and the refusals (capture without the graph flag, plan()
// under capture, a graph replayed for another batch size, a small workspace).
//
// The registry entry already runs the stage over every decode grid of cases.hpp with
// the default options (o and lse checked); here the runner is made with options that
// split short requests into many chunks, so the chunk and merge kernels meet every edge
// of the page table, and each partial state is compared too.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "fixed_batch.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/merge.hpp"
#include "flashstep/reference/split_plan.hpp"
#include "harness/case.hpp"
#include "harness/cases.hpp"
#include "harness/compare.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::harness;
using flashstep::test::FixedBatch;
using split_kv::DecodePath;
using split_kv::PathChoice;
using split_kv::SplitKVOptions;
using split_kv::SplitKVRunner;
using split_kv::WorkspaceLayout;
namespace grids = flashstep::stages::harness::grids;

namespace {

/// Names element `flat` of a (work items, heads, dim) partial tensor by its work item.
ElementLabel partial_label(const ref::SplitKVPlan& plan, int num_heads, int head_dim) {
  return [plan, num_heads, head_dim](int64_t flat) {
    const int64_t row = flat / head_dim, item = row / num_heads;
    const std::string dim = head_dim > 1 ? std::to_string(flat % head_dim) : "-";
    return "(work item " + std::to_string(item) + " = request " + std::to_string(plan.request_indices[item]) +
           " chunk " + std::to_string(plan.kv_tile_indices[item]) + ", head " + std::to_string(row % num_heads) +
           ", dim " + dim + ")";
  };
}

/// The outcome of one stage-03 run on one case: outputs and (when split) partials.
struct SplitReport {
  std::string text;
  ref::SplitKVPlan plan;
  DecodePath path = DecodePath::split;
  Comparison o, lse, partial_o, partial_lse;
  bool checked_partials = false;
  bool passed = false;
  std::string message() const {
    std::string m = std::string(passed ? "PASS" : "FAIL") + " 03_split_kv (" + split_kv::to_string(path) + ") on " +
                    text + "\n  " + o.summary() + "\n  " + lse.summary();
    if (checked_partials) m += "\n  " + partial_o.summary() + "\n  " + partial_lse.summary();
    return m + "\n";
  }
};

std::vector<float> download_floats(const float* ptr, size_t count) {
  std::vector<float> out(count);
  if (count) FLASHSTEP_CUDA_CHECK(cudaMemcpy(out.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

/// The reference's partial states for `plan`: each work item's chunk of keys (positions
/// [t c P, min((t + 1) c P, kv_len)) of its request, read through the page table into
/// contiguous rows) attended by the reference's batch_prefill_with_ragged_kv_cache, all
/// work items in one call. That is ref::split_kv_partials' definition, computed through
/// the reference's ragged path, which does not walk the pool element by element (the
/// paged walk takes seconds on a 16k-token case). The host test "split_kv reference
/// partials" checks this shortcut against ref::split_kv_partials on small cases. A scaled
/// (FP8) cache's rows are read as stored * k_scale and stored * v_scale, in double: the
/// reference's FP8 semantics (reference/fp8.hpp), which the chunk kernel's partial rows
/// follow (it folds v_scale into each chunk's normalisation).
ref::SplitKVPartials reference_partials(const HostCase& host, const ref::SplitKVPlan& plan) {
  const BatchShape& s = host.layout.shape;
  const ref::PagedKVCache& cache = host.paged;
  const int64_t H = s.num_kv_heads, D = s.head_dim, P = s.page_size, Hq = s.num_qo_heads;
  const int64_t chunk_tokens = int64_t{plan.kv_chunk_size_in_pages} * P;
  const int items = plan.num_work_items;
  std::vector<int32_t> qo_indptr(static_cast<size_t>(items) + 1), kv_indptr(1, 0);
  std::iota(qo_indptr.begin(), qo_indptr.end(), 0);
  ref::Tensor q({items, Hq, D});
  std::vector<double> k, v;
  for (int item = 0; item < items; ++item) {
    const int r = plan.request_indices[item], t = plan.kv_tile_indices[item];
    std::copy_n(host.q.data.begin() + int64_t{r} * Hq * D, Hq * D, q.data.begin() + int64_t{item} * Hq * D);
    const int64_t kv_len = s.kv_len(r);
    const int64_t j0 = std::min(kv_len, t * chunk_tokens), j1 = std::min(kv_len, j0 + chunk_tokens);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t page = cache.kv_indices[static_cast<size_t>(cache.kv_indptr[r] + j / P)], slot = j % P;
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t src = s.kv_layout == KVLayout::HND ? (((page * 2 + kv) * H + h) * P + slot) * D
                                                           : (((page * 2 + kv) * P + slot) * H + h) * D;
          std::vector<double>& dst = kv ? v : k;
          const double scale = kv ? double(s.v_scale) : double(s.k_scale);
          for (int64_t d = 0; d < D; ++d) dst.push_back(cache.pages.data[static_cast<size_t>(src + d)] * scale);
        }
    }
    kv_indptr.push_back(kv_indptr.back() + static_cast<int32_t>(j1 - j0));
  }
  const int64_t nnz_kv = kv_indptr.back();
  ref::AttentionOptions opt;
  opt.sm_scale = s.sm_scale;
  opt.kv_layout = KVLayout::NHD;
  ref::AttentionResult chunks = ref::batch_prefill_with_ragged_kv_cache(
      q, qo_indptr, ref::Tensor({nnz_kv, H, D}, std::move(k)), ref::Tensor({nnz_kv, H, D}, std::move(v)), kv_indptr,
      opt);
  ref::SplitKVPartials out{std::move(chunks.o), std::move(chunks.lse)};
  return out;
}

/// The partial rows' tolerance on o: the fp32 row, except for the tensor-core kernel
/// (mma_decode.cuh), which rounds each weight p to its operand type before P V (fp16 over
/// an FP8 cache or fp16 K/V, bf16 over bf16 K/V) while its row sum adds the unrounded
/// weights. A weight then carries up to u of relative error (2^-11 fp16, 2^-8 bf16), so o
/// moves by at most u x the weighted mean of |v|. The harness draws v * v_scale in
/// [-1, 1]; stored in q's dtype it stays within 1, and the FP8 value stored for it is off
/// by at most 2^-3 relative (e5m2's two significand bits), so |v| <= 1.125. Scores (and
/// lse) are products of exact operands summed in fp32: the fp32 row.
Tolerance partial_o_tolerance(const SplitKVRunner& runner, const BatchShape& s) {
  const Tolerance f32 = tolerance_for(DType::f32).o;
  if (!runner.tensor_cores()) return f32;
  const bool fp8 = is_fp8(s.resolved_kv_dtype());
  const double u = std::ldexp(1.0, !fp8 && s.dtype == DType::bf16 ? -8 : -11);
  const double v_max = fp8 ? 1.125 : 1.0;
  return {f32.atol + v_max * u, f32.rtol, f32.norm + u};
}

/// Compares the stage's o and lse with the reference and, when the plan split, every
/// real partial row with ref::split_kv_partials for the same plan. When split, the final
/// o and lse are compared with the reference's own split-and-merge of those partials
/// (ref::merge_split_kv; equal to the unsplit decode, which the CPU suite checks), else
/// with the unsplit decode. Partials are fp32 in the workspace: the fp32 tolerance row.
void compare_all(SplitReport& r, const HostCase& host, const SplitKVRunner& runner, const std::vector<double>& o,
                 const std::vector<double>& lse) {
  const BatchShape& s = host.layout.shape;
  r.plan = runner.split_plan();
  r.path = runner.path();
  r.checked_partials = r.plan.split_kv && r.path != DecodePath::unsplit;
  const DTypeTolerance& tol = tolerance_for(s.dtype, s.resolved_kv_dtype());
  const ref::AttentionResult* expected = &host.expected;
  ref::AttentionResult merged;
  if (r.checked_partials) {
    const ref::SplitKVPartials partials = reference_partials(host, r.plan);
    merged = ref::merge_split_kv(partials, r.plan);
    expected = &merged;
    const size_t rows = size_t(r.plan.num_work_items) * s.num_qo_heads;
    const std::vector<float> po = download_floats(runner.partial_o(), rows * s.head_dim);
    const std::vector<float> pl = download_floats(runner.partial_lse(), rows);
    const std::vector<double> got_o(po.begin(), po.end()), got_lse(pl.begin(), pl.end());
    const DTypeTolerance& f32 = tolerance_for(DType::f32);
    r.partial_o = compare("partial_o", got_o, partials.v.data, partial_o_tolerance(runner, s),
                          partial_label(r.plan, s.num_qo_heads, s.head_dim));
    r.partial_lse = compare("partial_lse", got_lse, partials.s.data, f32.lse, partial_label(r.plan, s.num_qo_heads, 1));
  }
  r.o = compare("o", o, expected->o.data, tol.o, output_label(s.qo_indptr, s.num_qo_heads, s.head_dim));
  r.lse = compare("lse", lse, expected->lse.data, tol.lse, lse_label(s.qo_indptr, s.num_qo_heads));
  r.passed = r.o.passed && r.lse.passed && (!r.checked_partials || (r.partial_o.passed && r.partial_lse.passed));
}

/// Fills the workspace's partial rows with NaN, so a row the chunk kernel skips fails.
void poison_partials(const SplitKVRunner& runner, void* workspace, cudaStream_t stream) {
  const WorkspaceLayout& w = runner.layout();
  FLASHSTEP_CUDA_CHECK(
      cudaMemsetAsync(static_cast<uint8_t*>(workspace) + w.partial_o, 0xff, w.bytes - w.partial_o, stream));
}

/// plan, poison, run, compare: one case through a runner made with `options`.
SplitReport check_case(const HostCase& host, const SplitKVOptions& options) {
  SplitReport r;
  r.text = host.spec.describe() + " (case seed " + std::to_string(host.seed) + ", min_kv_chunk_tokens " +
           std::to_string(options.min_kv_chunk_tokens) + ", num_sm " + std::to_string(options.num_sm) + ")";
  DeviceCase dev(host);
  SplitKVRunner runner(options);
  DeviceBuffer workspace(runner.workspace_bytes(host.layout.shape));
  runner.plan(host.layout.shape, workspace.get(), workspace.bytes(), nullptr);
  dev.poison_outputs(nullptr);
  poison_partials(runner, workspace.get(), nullptr);
  runner.run(dev.batch(), nullptr);
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  compare_all(r, host, runner, dev.output(), dev.lse());
  return r;
}

/// Options that split short requests: the split path whatever the cost model says, chunks
/// down to one page, and (cycling) a smaller pretend device and deeper pipelines, so chunk
/// counts and pipeline wraps differ from case to case.
SplitKVOptions forcing_options(int n) {
  SplitKVOptions o;
  o.path = PathChoice::split;
  o.min_kv_chunk_tokens = n % 3 == 2 ? 16 : 0;
  if (n % 2 == 1) {
    o.num_sm = 13;  // G = 26: few chunks per request, and batches that do not split at all
    o.ctas_per_sm = 2;
  }
  if (n % 4 == 3) o.num_stages = 3;  // deeper pipelines wrap differently over short chunks
  if (n % 5 == 4) o.num_stages = 4;
  return o;
}

struct GridTally {
  int cases = 0, split = 0, multi_chunk = 0, failures = 0;
};

/// Runs `grid` (every `stride`-th case) through forced splits; stops after 10 failures.
GridTally check_forced(const std::vector<CaseSpec>& grid, int stride = 1) {
  GridTally t;
  for (size_t i = 0; i < grid.size(); i += static_cast<size_t>(stride)) {
    const CaseSpec& spec = grid[i];
    const uint64_t seed = case_seed(test::run_seed(), "split_kv forced " + spec.describe());
    const HostCase host = build_case(spec, KVStorage::paged, seed);
    const SplitReport r = check_case(host, forcing_options(static_cast<int>(i)));
    ++t.cases;
    t.split += r.plan.split_kv;
    t.multi_chunk += r.plan.num_work_items > spec.batch_size;
    CHECK_MESSAGE(r.passed, r.message());
    if (!r.passed && ++t.failures >= 10) {
      FAIL("stopping this grid after 10 failures");
      break;
    }
  }
  std::printf("  03_split_kv forced splits: %d cases, %d split, %d with more chunks than requests\n", t.cases, t.split,
              t.multi_chunk);
  return t;
}

BatchShape small_shape(int batch_size) {
  BatchShape s;
  s.mode = Mode::decode;
  s.storage = KVStorage::paged;
  s.dtype = DType::bf16;
  s.batch_size = batch_size;
  s.num_qo_heads = 32;
  s.num_kv_heads = 8;
  s.head_dim = 128;
  s.page_size = 16;
  s.num_pages = 64;
  s.sm_scale = 0.088f;
  for (int i = 0; i <= batch_size; ++i) s.qo_indptr.push_back(i);
  for (int i = 0; i <= batch_size; ++i) s.kv_indptr.push_back(2 * i);
  s.kv_last_page_len.assign(static_cast<size_t>(batch_size), 7);
  return s;
}

/// Captures run() once (after planning `specs[0]`), then for every spec: new inputs in
/// the same buffers, plan(), replay twice, compare o, lse and partials. Returns the distinct
/// chunk sizes the replays ran with.
std::set<int32_t> capture_and_replay(const std::vector<CaseSpec>& specs, const SplitKVOptions& options,
                                     const std::string& salt) {
  REQUIRE(options.enable_cuda_graph);
  std::vector<uint64_t> seeds;
  size_t max_pages = 1;
  for (const CaseSpec& spec : specs) {
    seeds.push_back(case_seed(test::run_seed(), salt + spec.describe()));
    std::mt19937_64 rng(seeds.back());
    max_pages = std::max(max_pages, size_t(make_layout(spec, KVStorage::paged, rng).shape.num_pages));
  }
  cudaStream_t stream;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HostCase first = build_case(specs[0], KVStorage::paged, seeds[0]);
  FixedBatch fixed(first.layout.shape, max_pages);
  SplitKVRunner runner(options);
  DeviceBuffer workspace(runner.workspace_bytes(first.layout.shape));
  runner.plan(first.layout.shape, workspace.get(), workspace.bytes(), stream);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  runner.run(fixed.batch, stream);  // captured, not executed
  FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  std::set<int32_t> chunk_sizes;
  for (size_t i = 0; i < specs.size(); ++i) {
    const HostCase host = i == 0 ? std::move(first) : build_case(specs[i], KVStorage::paged, seeds[i]);
    fixed.load(host, stream);
    runner.plan(host.layout.shape, workspace.get(), workspace.bytes(), stream);  // new lengths, same buffers
    poison_partials(runner, workspace.get(), stream);
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    // A second replay of the same plan, its outputs poisoned first: a replay computes
    // again from the schedule and the partial rows alone, and leaves nothing behind.
    fixed.poison(stream);
    FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));

    const BatchShape& s = host.layout.shape;
    SplitReport r;
    r.text = "graph replay " + std::to_string(i) + " of " + host.spec.describe() + " (case seed " +
             std::to_string(host.seed) + ", kv_chunk_size_in_pages " +
             std::to_string(runner.split_plan().kv_chunk_size_in_pages) + ", " +
             std::to_string(runner.split_plan().num_work_items) + " of " +
             std::to_string(runner.split_plan().padded_batch_size) + " work items)";
    compare_all(r, host, runner, fixed.output(s.dtype), fixed.lse_values());
    CHECK_MESSAGE(r.passed, r.message());
    chunk_sizes.insert(r.plan.kv_chunk_size_in_pages);
  }
  FLASHSTEP_CUDA_CHECK(cudaGraphExecDestroy(exec));
  FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
  return chunk_sizes;
}

/// One shard of a case's requests: pages [cut[r], end) of request r when `upper`, else
/// [begin, cut[r]). Whole pages; only the request's last page may be partial, so it goes
/// with the upper shard; a shard may be empty (0 pages, last_page_len 0).
ref::PagedKVCache shard_of(const ref::PagedKVCache& full, const std::vector<int32_t>& cut, bool upper) {
  ref::PagedKVCache s;
  s.pages = full.pages;
  s.layout = full.layout;
  s.kv_indptr.push_back(0);
  const int64_t P = full.page_size();
  for (int64_t r = 0; r < full.batch_size(); ++r) {
    const int32_t b = full.kv_indptr[r], e = full.kv_indptr[r + 1], c = b + cut[size_t(r)];
    const int32_t lo = upper ? c : b, hi = upper ? e : c;
    s.kv_indices.insert(s.kv_indices.end(), full.kv_indices.begin() + lo, full.kv_indices.begin() + hi);
    s.kv_indptr.push_back(s.kv_indptr.back() + (hi - lo));
    const bool last = hi == e && hi > lo;
    s.kv_last_page_len.push_back(hi == lo ? 0 : last ? full.kv_last_page_len[size_t(r)] : int32_t(P));
  }
  return s;
}

CaseSpec graph_spec(int batch, int kv_len, LengthPolicy lengths) {
  CaseSpec c;
  c.batch_size = batch;
  c.kv_len = kv_len;
  c.lengths = lengths;
  return c;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("split_kv workspace: sections in order, aligned, disjoint, sized by batch and G only") {
  const WorkspaceLayout w = split_kv::make_workspace_layout(3, 32, 8, 128, 264);
  CHECK(w.capacity == 33);      // G / H = 264 / 8 work items at most
  CHECK(w.partial_rows == 33);  // 3 * 8 < 264: this batch may split
  const std::vector<size_t> starts = {
      w.header,       w.request_indices,  w.kv_tile_indices, w.o_indptr,    w.kv_page_begin,
      w.kv_chunk_len, w.block_valid_mask, w.partial_o,       w.partial_lse, w.bytes};
  for (size_t i = 0; i < starts.size(); ++i) CHECK(starts[i] % kWorkspaceAlignment == 0);
  CHECK(w.request_indices >= w.header + sizeof(split_kv::SplitKVHeader));
  CHECK(w.kv_tile_indices >= w.request_indices + 4 * 33);
  CHECK(w.o_indptr >= w.kv_tile_indices + 4 * 33);
  CHECK(w.kv_page_begin >= w.o_indptr + 4 * 4);
  CHECK(w.kv_chunk_len >= w.kv_page_begin + 4 * 33);
  CHECK(w.block_valid_mask >= w.kv_chunk_len + 4 * 33);
  CHECK(w.schedule_bytes >= w.block_valid_mask + 33);
  CHECK(w.partial_o == w.schedule_bytes);
  CHECK(w.partial_lse >= w.partial_o + sizeof(float) * 33 * 32 * 128);
  CHECK(w.bytes >= w.partial_lse + sizeof(float) * 33 * 32);
  CHECK(w.bytes < w.partial_lse + sizeof(float) * 33 * 32 + kWorkspaceAlignment);
  // A batch that fills the device alone never splits: no partial rows, capacity = batch.
  const WorkspaceLayout big = split_kv::make_workspace_layout(40, 32, 8, 128, 264);
  CHECK(big.capacity == 40);
  CHECK(big.partial_rows == 0);
  CHECK(big.partial_lse == big.partial_o);
  CHECK_THROWS_WITH_AS(split_kv::make_workspace_layout(0, 32, 8, 128, 264),
                       doctest::Contains("make_workspace_layout: batch_size"), ref::InvalidArgument);
}

/// The cost model on a batch of `batch` requests of `len` keys, bf16, 32/8 heads, D 128,
/// page 16, on an H100 (kFallbackDeviceModel: 2.9 TB/s over 132 SMs) with 2 blocks per SM,
/// planned for a graph.
split_kv::PathEstimate estimate_uniform(int batch, int64_t len) {
  ref::SplitKVConfig c;
  c.page_size = 16;
  c.num_kv_heads = 8;
  c.num_sm = 132;
  c.ctas_per_sm = 2;
  c.enable_cuda_graph = true;
  const ref::SplitKVPlan plan = ref::plan_split_kv(std::vector<int32_t>(size_t(batch), int32_t((len + 15) / 16)), c);
  return split_kv::estimate_paths(std::vector<int64_t>(size_t(batch), len), plan, 16, 8, 32, 128, 2,
                                  kernels::kFallbackDeviceModel, split_kv::DecodeCostModel{});
}

TEST_CASE("split_kv: the tensor-core kernel's plan cuts a grid of over one wave until its waves are full") {
  using split_kv::mma_planned_ctas_per_sm;
  // An H200 at the default depth: the kernel fits 3 blocks an SM (396 slots), the chunk
  // kernel under the sinks policy 2, which the plan otherwise counts. 8 kv heads: batch b
  // is 8 b blocks; k chunks a request keep (8 b k) / (396 ceil(8 b k / 396)) of the slots busy.
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 64, 8) == 12);   // 512 blocks, 1.29 waves: 3 chunks, 97% busy
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 128, 8) == 24);  // 1024, 2.59 waves: 3 chunks (2 stay at 86%)
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 74, 8) == 9);    // 592, 1.49 waves: 2 chunks, 99.7%
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 75, 8) == 32);   // 600: 7 chunks, the first at 95% or more
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 50, 8) == 25);   // 400, 1.01 waves: none reaches 95%, 8 the best
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 96, 8) == 2);    // 768, 1.94 waves: 97% unsplit
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 16, 8) == 2);    // 128: under one wave, split as ever
  CHECK(mma_planned_ctas_per_sm(2, 3, 132, 49, 8) == 2);    // 392: one wave, no tail
  CHECK(mma_planned_ctas_per_sm(3, 3, 132, 64, 8) == 12);   // no sinks kernel: the same
}

TEST_CASE("split_kv: the tensor-core kernel takes three stages over one wave, unless they split more") {
  using split_kv::mma_num_stages;
  using split_kv::mma_wave_chunks;
  // An H200 with 16-bit K/V: 3 blocks an SM at two stages (396 slots), 2 at three (264); 8
  // kv heads, so batch b is 8 b blocks.
  CHECK(mma_num_stages(3, 2, 132, 16, 8) == 2);  // 128 blocks: one wave
  CHECK(mma_num_stages(3, 2, 132, 49, 8) == 2);  // 392: one wave
  CHECK(mma_wave_chunks(3, 132, 64, 8) == 3);    // 512: 3 chunks at two stages (97% busy) ...
  CHECK(mma_wave_chunks(2, 132, 64, 8) == 1);    // ... none at three (512 / 528)
  CHECK(mma_num_stages(3, 2, 132, 64, 8) == 3);
  CHECK(mma_num_stages(3, 2, 132, 128, 8) == 3);  // 1024: 3 chunks against none
  CHECK(mma_num_stages(3, 2, 132, 50, 8) == 3);   // 400: 8 chunks against 7
  CHECK(mma_wave_chunks(3, 132, 148, 8) == 1);    // 1184 on 396 slots: 2.99 waves, unsplit ...
  CHECK(mma_wave_chunks(2, 132, 148, 8) == 2);    // ... on 264: 4.48 waves, 2 chunks
  CHECK(mma_num_stages(3, 2, 132, 148, 8) == 2);
  // A kernel that fits 5 blocks an SM at two stages and 4 at three (660 and 528 slots).
  CHECK(mma_num_stages(5, 4, 132, 64, 8) == 2);   // 512: one wave
  CHECK(mma_num_stages(5, 4, 132, 128, 8) == 3);  // 1024: 5 chunks against none
}

TEST_CASE("split_kv cost model: the wave arithmetic, by hand") {
  const double rate = 2.9e12 / 132;           // one SM's share of the read rate
  const double block = 4096.0 * 2 * 128 * 2;  // one (request, kv head) of 4096 keys: K and V, bf16
  // Batch 16: 128 blocks on 132 SMs, one wave. The planner's split (2 chunks per request,
  // 256 items) leaves 124 SMs with two half-blocks: the same busiest SM, plus the merge.
  split_kv::PathEstimate e = estimate_uniform(16, 4096);
  CHECK(e.unsplit_seconds == doctest::Approx(block / rate));
  CHECK(e.split_seconds > e.unsplit_seconds);
  CHECK(e.path == DecodePath::unsplit);
  // Batch 8: 64 blocks leave 68 SMs idle; 4 chunks per request spread 256 items two per SM.
  e = estimate_uniform(8, 4096);
  CHECK(e.unsplit_seconds == doctest::Approx(block / rate));
  const double partials = 2.0 * 8 * 4 * 32 * 129 * 4;  // 32 rows of 32 heads x (128 + 1) floats, out and in
  CHECK(e.split_seconds == doctest::Approx(2 * block / 4 / rate + partials / 2.9e12 + 4.0e-6));
  CHECK(e.path == DecodePath::split);
  // Batch 20: 160 blocks, two waves on some SMs; G / H = 33 items allow no second chunk,
  // so the split is the same blocks plus a merge.
  e = estimate_uniform(20, 4096);
  CHECK(e.unsplit_seconds == doctest::Approx(2 * block / rate));
  CHECK(e.path == DecodePath::unsplit);
  // Batch 1: 8 blocks; 33 chunks per kv head.
  CHECK(estimate_uniform(1, 4096).path == DecodePath::split);
  // Lengths known (no graph): one long request among short ones is split even at batch 16.
  ref::SplitKVConfig c;
  c.page_size = 16;
  c.num_kv_heads = 8;
  c.num_sm = 132;
  c.ctas_per_sm = 2;
  std::vector<int64_t> lens(16, 64);
  lens[3] = 65536;
  std::vector<int32_t> pages;
  for (int64_t l : lens) pages.push_back(int32_t((l + 15) / 16));
  const ref::SplitKVPlan plan = ref::plan_split_kv(pages, c);
  REQUIRE(plan.split_kv);
  e = split_kv::estimate_paths(lens, plan, 16, 8, 32, 128, 2, kernels::kFallbackDeviceModel,
                               split_kv::DecodeCostModel{});
  CHECK(e.unsplit_seconds == doctest::Approx(65536.0 * 512 / rate));
  CHECK(e.path == DecodePath::split);
  CHECK_THROWS_WITH_AS(split_kv::estimate_paths({1, 2}, plan, 16, 8, 32, 128, 2, kernels::kFallbackDeviceModel,
                                                split_kv::DecodeCostModel{}),
                       doctest::Contains("kv_lens has 2 requests, the plan 16"), ref::InvalidArgument);
}

TEST_CASE("split_kv reference partials: the ragged shortcut equals ref::split_kv_partials") {
  int n = 0;
  for (const CaseSpec& spec : grids::decode_ragged_grid()) {
    CaseSpec c = spec;
    c.kv_len = 40;
    c.head_dim = 64;
    c.num_qo_heads = 7;
    c.num_kv_heads = 1;
    const uint64_t seed = case_seed(test::run_seed(), "reference partials " + c.describe());
    CAPTURE(seed);
    CAPTURE(c.describe());
    const HostCase host = build_case(c, KVStorage::paged, seed);
    ref::SplitKVConfig config;
    config.page_size = c.page_size;
    config.num_kv_heads = c.num_kv_heads;
    config.num_sm = 40 + n++;  // G > batch: the planner splits
    config.min_kv_chunk_tokens = 0;
    const ref::SplitKVPlan plan = ref::plan_split_kv(ref::kv_page_counts_from_indptr(host.layout.shape.kv_indptr),
                                                     config);
    ref::AttentionOptions opt;
    opt.sm_scale = host.layout.shape.sm_scale;
    const ref::SplitKVPartials direct = ref::split_kv_partials(host.q, host.paged, plan, opt);
    const ref::SplitKVPartials shortcut = reference_partials(host, plan);
    REQUIRE(direct.v.data.size() == shortcut.v.data.size());
    REQUIRE(direct.s.data.size() == shortcut.s.data.size());
    for (size_t i = 0; i < direct.v.data.size(); ++i) CHECK(std::abs(direct.v.data[i] - shortcut.v.data[i]) <= 1e-12);
    for (size_t i = 0; i < direct.s.data.size(); ++i) {
      if (std::isinf(direct.s.data[i])) CHECK(shortcut.s.data[i] == direct.s.data[i]);
      else CHECK(std::abs(direct.s.data[i] - shortcut.s.data[i]) <= 1e-12);
    }
    if (c.page_size < c.kv_len) CHECK(plan.num_work_items > c.batch_size);  // the chunks really cut the requests
  }
}

TEST_CASE("split_kv workspace: every plan of a batch size fits its layout, whatever the lengths") {
  auto rng = test::case_rng("split_kv workspace property");
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = static_cast<int>(test::random_int(rng, 1, 40));
    ref::SplitKVConfig config;
    config.page_size = test::random_int(rng, 1, 64);
    config.num_kv_heads = test::random_int(rng, 1, 8);
    config.num_sm = test::random_int(rng, 1, 140);
    config.ctas_per_sm = test::random_int(rng, 1, 3);
    config.enable_cuda_graph = trial % 2 == 0;
    config.min_kv_chunk_tokens = test::random_int(rng, 0, 256);
    std::vector<int32_t> pages(static_cast<size_t>(batch));
    for (int32_t& p : pages) p = static_cast<int32_t>(test::random_int(rng, 0, trial % 3 ? 50 : 5000));
    const ref::SplitKVPlan plan = ref::plan_split_kv(pages, config);
    const WorkspaceLayout w = split_kv::make_workspace_layout(batch, 4 * int(config.num_kv_heads),
                                                              int(config.num_kv_heads), 64, plan.max_grid_size);
    CAPTURE(trial);
    CHECK(plan.padded_batch_size <= w.capacity);
    if (plan.split_kv) CHECK(plan.padded_batch_size <= w.partial_rows);
  }
}

}  // TEST_SUITE("host")

TEST_CASE("split_kv: the runner's schedule is the reference planner's, for the device's G") {
  BatchShape s = small_shape(3);
  s.kv_indptr = {0, 700, 701, 701};  // 700 pages, 1 page, an empty request
  s.kv_last_page_len = {5, 16, 0};
  s.num_pages = 800;
  SplitKVRunner runner;
  DeviceBuffer workspace(runner.workspace_bytes(s));
  runner.plan(s, workspace.get(), workspace.bytes(), nullptr);
  const ref::SplitKVConfig& c = runner.planner_config();
  int device = 0, sms = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CHECK(c.num_sm == sms);
  CHECK(c.ctas_per_sm >= 1);
  CHECK(c.min_kv_chunk_tokens == 128);
  const ref::SplitKVPlan expected = ref::plan_split_kv({700, 1, 0}, c);
  const ref::SplitKVPlan& got = runner.split_plan();
  CHECK(got.split_kv);
  CHECK(got.kv_chunk_size_in_pages == expected.kv_chunk_size_in_pages);
  CHECK(got.num_work_items == expected.num_work_items);
  CHECK(got.padded_batch_size == expected.padded_batch_size);
  CHECK(got.request_indices == expected.request_indices);
  CHECK(got.kv_tile_indices == expected.kv_tile_indices);
  CHECK(got.o_indptr == expected.o_indptr);
  CHECK(got.block_valid_mask == expected.block_valid_mask);
  CHECK(int64_t(got.num_work_items) * s.num_kv_heads <= int64_t(c.num_sm) * c.ctas_per_sm);  // one wave
  // The one copy put the schedule in the workspace: read it back.
  const std::vector<uint8_t> bytes = workspace.download();
  const WorkspaceLayout& w = runner.layout();
  split_kv::SplitKVHeader header;
  std::memcpy(&header, bytes.data() + w.header, sizeof header);
  CHECK(header.kv_chunk_size_in_pages == expected.kv_chunk_size_in_pages);
  CHECK(header.num_work_items == expected.num_work_items);
  CHECK(header.split_kv == 1);
  std::vector<int32_t> o_indptr(4);
  std::memcpy(o_indptr.data(), bytes.data() + w.o_indptr, 4 * sizeof(int32_t));
  CHECK(o_indptr == expected.o_indptr);
  std::vector<int32_t> request_indices(size_t(expected.padded_batch_size));
  std::memcpy(request_indices.data(), bytes.data() + w.request_indices, request_indices.size() * sizeof(int32_t));
  CHECK(request_indices == expected.request_indices);
  // Each real item's first page and length, worked out here from the page counts:
  // request 0 has 700 pages (last page 5 tokens), request 1 one page of 16, request 2 none.
  const int32_t cp = expected.kv_chunk_size_in_pages;
  std::vector<int32_t> page_begin(size_t(expected.num_work_items)), chunk_len(page_begin.size());
  std::memcpy(page_begin.data(), bytes.data() + w.kv_page_begin, page_begin.size() * sizeof(int32_t));
  std::memcpy(chunk_len.data(), bytes.data() + w.kv_chunk_len, chunk_len.size() * sizeof(int32_t));
  const int32_t chunks0 = (700 + cp - 1) / cp;
  REQUIRE(expected.num_work_items == chunks0 + 2);
  for (int32_t t = 0; t < chunks0; ++t) {
    CAPTURE(t);
    CHECK(page_begin[size_t(t)] == t * cp);
    const int32_t pages = std::min(cp, 700 - t * cp);
    CHECK(chunk_len[size_t(t)] == (t == chunks0 - 1 ? (pages - 1) * 16 + 5 : pages * 16));
  }
  CHECK(page_begin[size_t(chunks0)] == 700);
  CHECK(chunk_len[size_t(chunks0)] == 16);
  CHECK(page_begin[size_t(chunks0) + 1] == 701);
  CHECK(chunk_len[size_t(chunks0) + 1] == 0);
}

TEST_CASE("split_kv: forced splits over the decode edge grid, partial states checked") {
  const GridTally t = check_forced(grids::decode_edge_grid(), 4);
  CHECK(t.multi_chunk > t.cases / 2);
}

TEST_CASE("split_kv: forced splits over GQA groups 1..8, ragged/empty requests and long sequences") {
  GridTally t = check_forced(grids::decode_group_grid());
  CHECK(t.multi_chunk > 0);
  t = check_forced(grids::decode_ragged_grid());
  CHECK(t.multi_chunk > 0);
  t = check_forced(grids::decode_long_grid());
  CHECK(t.multi_chunk > t.cases / 2);  // (a pretend device of G = 26 leaves batch 12 x 8 heads unsplit)
}

TEST_CASE("split_kv: default options split a long request and leave a full batch alone") {
  CaseSpec lone;
  lone.batch_size = 1;
  lone.kv_len = 16384;
  lone.dtype = DType::bf16;
  const uint64_t seed = case_seed(test::run_seed(), "split_kv default lone");
  SplitReport r = check_case(build_case(lone, KVStorage::paged, seed), SplitKVOptions{});
  CHECK_MESSAGE(r.passed, r.message());
  CHECK(r.plan.split_kv);
  CHECK(r.plan.num_work_items > 8);
  CHECK(r.path == DecodePath::split);
  CaseSpec full;
  full.batch_size = 128;
  full.kv_len = 64;
  full.lengths = LengthPolicy::uniform;
  r = check_case(build_case(full, KVStorage::paged, case_seed(test::run_seed(), "split_kv default full")),
                 SplitKVOptions{});
  CHECK_MESSAGE(r.passed, r.message());
  CHECK_FALSE(r.plan.split_kv);  // 128 x 8 blocks fill the chip: the stage 02 path
  CHECK(r.plan.num_work_items == 128);
  CHECK(r.path == DecodePath::unsplit);
  // Forced: stage 02's kernel on a lone request.
  SplitKVOptions unsplit;
  unsplit.path = PathChoice::unsplit;
  r = check_case(build_case(lone, KVStorage::paged, seed), unsplit);
  CHECK_MESSAGE(r.passed, r.message());
  CHECK(r.path == DecodePath::unsplit);
}

TEST_CASE("split_kv: fp32 states of two shards of every request merge into the whole request's") {
  // Each request's pages are cut in two at a random page (the lower part may be empty,
  // and so may the upper one when the cut is at the end); a runner with fp32_states writes
  // each shard's state, every shard's state is checked against the reference over that
  // shard's keys, and the two, merged by the reference's merge_state, are checked against
  // the reference over the whole request. (Stage 08 merges such states on the GPU; its
  // suite checks that merge.)
  auto rng = test::case_rng("split_kv fp32 states");
  int cases = 0;
  for (const CaseSpec& base :
       {graph_spec(5, 700, LengthPolicy::ragged_with_empty), graph_spec(3, 2048, LengthPolicy::ragged),
        graph_spec(1, 40, LengthPolicy::uniform), graph_spec(130, 64, LengthPolicy::ragged)}) {
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
      CaseSpec spec = base;
      spec.dtype = dtype;
      if (dtype == DType::f16) {
        spec.kv_layout = KVLayout::HND;
        spec.page_size = 1;
        spec.head_dim = 64;
        spec.num_qo_heads = 8;  // group 8
      } else if (dtype == DType::f32) {
        spec.head_dim = 256;
        spec.num_qo_heads = 8;  // group 1
      }
      const uint64_t seed = case_seed(test::run_seed(), "split_kv fp32 states " + spec.describe());
      const HostCase host = build_case(spec, KVStorage::paged, seed);
      const BatchShape& full = host.layout.shape;
      const int B = full.batch_size, Hq = full.num_qo_heads, D = full.head_dim;
      std::vector<int32_t> cut;
      for (int r = 0; r < B; ++r) {
        const int pages = full.kv_indptr[size_t(r) + 1] - full.kv_indptr[size_t(r)];
        cut.push_back(std::uniform_int_distribution<int>(0, pages)(rng));
      }
      const size_t rows = size_t(B) * Hq;
      DeviceCase dev(host);
      DeviceBuffer states_o(2 * rows * D * sizeof(float)), states_lse(2 * rows * sizeof(float));
      FLASHSTEP_CUDA_CHECK(cudaMemset(states_o.get(), 0xff, states_o.bytes()));
      FLASHSTEP_CUDA_CHECK(cudaMemset(states_lse.get(), 0xff, states_lse.bytes()));
      SplitKVOptions options;
      options.fp32_states = true;
      options.min_kv_chunk_tokens = 0;                  // chunks of any size, so shards split too
      Tolerance state_o = tolerance_for(DType::f32).o;  // the tensor-core kernel's, when it ran
      const std::string text = spec.describe() + " (case seed " + std::to_string(seed) + ")";
      for (int part = 0; part < 2; ++part) {
        const ref::PagedKVCache cache = shard_of(host.paged, cut, part == 1);
        BatchShape shape = full;
        shape.kv_indptr = cache.kv_indptr;
        shape.kv_indices = cache.kv_indices;
        shape.kv_last_page_len = cache.kv_last_page_len;
        DeviceBuffer indptr = upload(cache.kv_indptr), last = upload(cache.kv_last_page_len);
        DeviceBuffer indices = upload(cache.kv_indices.empty() ? std::vector<int32_t>{0} : cache.kv_indices);
        DeviceBatch batch = dev.batch();
        batch.kv_indptr = indptr.as<int32_t>();
        batch.kv_indices = indices.as<int32_t>();
        batch.kv_last_page_len = last.as<int32_t>();
        float* shard_o = states_o.as<float>() + part * rows * D;
        float* shard_lse = states_lse.as<float>() + part * rows;
        batch.o = shard_o;
        batch.lse = shard_lse;
        SplitKVRunner runner(options);
        DeviceBuffer workspace(runner.workspace_bytes(shape));
        runner.plan(shape, workspace.get(), workspace.bytes(), nullptr);
        poison_partials(runner, workspace.get(), nullptr);
        runner.run(batch, nullptr);
        FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
        // The shard's state, fp32, against the reference over the shard's keys.
        ref::AttentionOptions opt;
        opt.sm_scale = full.sm_scale;
        opt.kv_layout = full.kv_layout;
        const ref::AttentionResult want = ref::batch_decode_with_paged_kv_cache(host.q, cache, opt);
        const std::vector<float> go = download_floats(shard_o, rows * D), gl = download_floats(shard_lse, rows);
        const DTypeTolerance& f32 = tolerance_for(DType::f32);
        state_o = partial_o_tolerance(runner, full);
        const Comparison co = compare("shard o", std::vector<double>(go.begin(), go.end()), want.o.data, state_o,
                                      output_label(full.qo_indptr, Hq, D));
        const Comparison cl = compare("shard lse", std::vector<double>(gl.begin(), gl.end()), want.lse.data, f32.lse,
                                      lse_label(full.qo_indptr, Hq));
        CHECK_MESSAGE((co.passed && cl.passed),
                      "shard " << part << " of " << text << "\n  " << co.summary() << "\n  " << cl.summary());
      }
      // Both shards' states, merged on the host by the reference's exact merge.
      auto host_state = [&](int part) {
        const std::vector<float> o = download_floats(states_o.as<float>() + part * rows * D, rows * D);
        const std::vector<float> l = download_floats(states_lse.as<float>() + part * rows, rows);
        return std::make_pair(ref::Tensor({B, Hq, D}, std::vector<double>(o.begin(), o.end())),
                              ref::Tensor({B, Hq}, std::vector<double>(l.begin(), l.end())));
      };
      const auto [o0, lse0] = host_state(0);
      const auto [o1, lse1] = host_state(1);
      const ref::MergedState merged = ref::merge_state(o0, lse0, o1, lse1);
      const DTypeTolerance& tol = tolerance_for(DType::f32);
      const Comparison co = compare("o", merged.v.data, host.expected.o.data, state_o,
                                    output_label(full.qo_indptr, Hq, D));
      const Comparison cl = compare("lse", merged.s.data, host.expected.lse.data, tol.lse,
                                    lse_label(full.qo_indptr, Hq));
      CHECK_MESSAGE((co.passed && cl.passed), "merged " << text << "\n  " << co.summary() << "\n  " << cl.summary());
      ++cases;
    }
  }
  CHECK(cases == 12);
}

TEST_CASE("split_kv: a CUDA graph captured once replays correctly after re-planning for new lengths") {
  SplitKVOptions graph;
  graph.enable_cuda_graph = true;
  SUBCASE("batch 4, bf16 NHD page 16: lengths 1000, 37, 2048 uniform, with an empty request, 1 uniform") {
    const std::set<int32_t> sizes = capture_and_replay(
        {graph_spec(4, 1000, LengthPolicy::ragged), graph_spec(4, 37, LengthPolicy::ragged),
         graph_spec(4, 2048, LengthPolicy::uniform), graph_spec(4, 500, LengthPolicy::ragged_with_empty),
         graph_spec(4, 1, LengthPolicy::uniform)},
        graph, "graph bf16 ");
    // The replays really ran different schedules: 2048 uniform needs chunks of 16 pages
    // (4 x 128 pages in G / H = 33 items or fewer, on any G up to 132 x 8), 37 needs one.
    CHECK(sizes.size() >= 2);
  }
  SUBCASE("batch 3, fp16 HND page 1, group 7, head_dim 64, forced chunks of one page") {
    std::vector<CaseSpec> specs;
    for (int kv_len : {300, 45, 97, 1}) {
      CaseSpec c = graph_spec(3, kv_len, kv_len == 300 ? LengthPolicy::uniform : LengthPolicy::ragged);
      c.dtype = DType::f16;
      c.kv_layout = KVLayout::HND;
      c.page_size = 1;
      c.num_qo_heads = 7;
      c.num_kv_heads = 1;
      c.head_dim = 64;
      specs.push_back(c);
    }
    SplitKVOptions forced = graph;
    forced.min_kv_chunk_tokens = 0;
    CHECK(capture_and_replay(specs, forced, "graph f16 ").size() >= 2);  // 900 pages need c > 1
  }
  SUBCASE("a batch that fills the (pretend) device: the unsplit kernel, grid = batch_size") {
    SplitKVOptions small = graph;
    small.num_sm = 4;
    small.ctas_per_sm = 1;
    CHECK(capture_and_replay({graph_spec(5, 200, LengthPolicy::ragged), graph_spec(5, 17, LengthPolicy::ragged)}, small,
                             "graph unsplit ")
              .size() == 2);
  }
}

TEST_CASE("split_kv: run() under capture without enable_cuda_graph is refused, and so is plan() under capture") {
  const BatchShape s = small_shape(2);
  cudaStream_t stream;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer dummy(1 << 20);
  DeviceBatch batch;  // never dereferenced: nothing runs
  SplitKVRunner plain;
  DeviceBuffer workspace(plain.workspace_bytes(s));
  plain.plan(s, workspace.get(), workspace.bytes(), stream);
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaGraph_t graph = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CHECK_THROWS_WITH_AS(plain.run(batch, stream),
                       doctest::Contains("SplitKVRunner::run: the stream is being captured into a CUDA graph, "
                                         "but this runner plans without SplitKVOptions::enable_cuda_graph"),
                       ref::InvalidArgument);
  SplitKVOptions graph_options;
  graph_options.enable_cuda_graph = true;
  SplitKVRunner graph_runner(graph_options);
  CHECK_THROWS_WITH_AS(graph_runner.plan(s, workspace.get(), workspace.bytes(), stream),
                       doctest::Contains("SplitKVRunner::plan: the stream is being captured"), ref::InvalidArgument);
  FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));  // nothing was captured
  size_t nodes = 99;
  FLASHSTEP_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  CHECK(nodes == 0);
  FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST_CASE("split_kv: a graph-captured runner refuses a plan its graph cannot replay") {
  SplitKVOptions options;
  options.enable_cuda_graph = true;
  SplitKVRunner runner(options);
  const BatchShape two = small_shape(2);
  const BatchShape three = small_shape(3);
  DeviceBuffer workspace(std::max(runner.workspace_bytes(two), runner.workspace_bytes(three)));
  DeviceBuffer q(2 * 32 * 128 * 2), o(2 * 32 * 128 * 2), lse(2 * 32 * 4);
  runner.plan(two, workspace.get(), workspace.bytes(), nullptr);
  cudaStream_t stream;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBatch batch;
  batch.q = q.get();
  batch.o = o.get();
  batch.lse = lse.as<float>();
  cudaGraph_t graph = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  runner.run(batch, stream);  // captured only; the graph is never launched
  FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  FLASHSTEP_CUDA_CHECK(cudaGraphDestroy(graph));
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
  CHECK_NOTHROW(runner.plan(two, workspace.get(), workspace.bytes(), nullptr));  // same batch size: fine
  CHECK_THROWS_WITH_AS(runner.plan(three, workspace.get(), workspace.bytes(), nullptr),
                       doctest::Contains("captured into a CUDA graph for batch_size 2"), ref::InvalidArgument);
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("split_kv: bad calls are InvalidArgument naming the rule") {
  BatchShape s = small_shape(2);
  SplitKVRunner runner;
  DeviceBatch batch;
  CHECK_THROWS_WITH_AS(runner.run(batch, nullptr), doctest::Contains("SplitKVRunner::run: call plan() before run()"),
                       ref::InvalidArgument);
  const size_t need = runner.workspace_bytes(s);
  DeviceBuffer small(need - 1);
  CHECK_THROWS_WITH_AS(
      runner.plan(s, small.get(), small.bytes(), nullptr),
      doctest::Contains(("SplitKVRunner::plan: workspace_size is " + std::to_string(need - 1)).c_str()),
      ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(runner.plan(s, nullptr, need, nullptr), doctest::Contains("workspace is null"),
                       ref::InvalidArgument);
  s.head_dim = 96;
  CHECK_THROWS_WITH_AS(runner.plan(s, small.get(), small.bytes(), nullptr),
                       doctest::Contains("03_split_kv is not built for head_dim 96"), ref::InvalidArgument);
  s = small_shape(2);
  s.kv_last_page_len.pop_back();
  DeviceBuffer ok(need);
  CHECK_THROWS_WITH_AS(runner.plan(s, ok.get(), ok.bytes(), nullptr),
                       doctest::Contains("kv_last_page_len must have batch_size = 2 entries"), ref::InvalidArgument);
  SplitKVOptions bad;
  bad.num_stages = 1;
  SplitKVRunner bad_runner(bad);
  CHECK_THROWS_WITH_AS(bad_runner.workspace_bytes(small_shape(2)),
                       doctest::Contains("num_stages must be 0 (auto) or 2..8"), ref::InvalidArgument);
}

TEST_CASE("split_kv: sanitizer subset, forced splits and a graph replay over every dtype and head_dim") {
  // Small sizes: compute-sanitizer slows the kernels 10-100x.
  const GridTally t = check_forced(grids::decode_sanitizer_grid());
  CHECK(t.multi_chunk > 0);
  SplitKVOptions graph;
  graph.enable_cuda_graph = true;
  graph.min_kv_chunk_tokens = 0;
  graph.num_sm = 8;  // G = 16 (2 per SM): at most 2 chunks per kv head of the one request
  graph.ctas_per_sm = 2;
  CaseSpec a = graph_spec(1, 150, LengthPolicy::uniform), b = graph_spec(1, 9, LengthPolicy::uniform);
  a.num_qo_heads = b.num_qo_heads = 16;
  capture_and_replay({a, b}, graph, "sanitizer graph ");
}

TEST_CASE("split_kv fp8: forced splits over the FP8 grids, partial states checked") {
  GridTally t = check_forced(grids::decode_fp8_grid(), 3);
  CHECK(t.multi_chunk > 0);
  t = check_forced(grids::decode_fp8_long_grid());
  CHECK(t.multi_chunk > 0);
}

TEST_CASE("split_kv fp8: a CUDA graph over an FP8 cache replays correctly after re-planning") {
  SplitKVOptions graph;
  graph.enable_cuda_graph = true;
  graph.ctas_per_sm = 2;  // the planner's grid of the CUDA-core kernel, whichever kernel runs: chunk sizes vary
  std::vector<CaseSpec> specs;
  for (int kv_len : {1000, 37, 2048, 1}) {
    CaseSpec c = graph_spec(4, kv_len, kv_len == 2048 ? LengthPolicy::uniform : LengthPolicy::ragged);
    c.kv_dtype = DType::e4m3;
    c.k_scale = 1.0 / 200;
    c.v_scale = 0.0123;
    specs.push_back(c);
  }
  CHECK(capture_and_replay(specs, graph, "graph fp8 ").size() >= 2);
}

namespace {

/// Stage 03 with `options` (graph planning on, as the registry's runner), under `name`.
StageInfo split_kv_stage_with(SplitKVOptions options, const std::string& name) {
  StageInfo stage = find_stage("03_split_kv");
  stage.name = name;
  options.enable_cuda_graph = true;
  stage.make_runner = [options] { return std::make_unique<SplitKVRunner>(options); };
  return stage;
}

/// Every case of `specs` through stage 03 with the tensor-core kernel off (named
/// `cores_name`), and forced to split into small chunks with it on where it applies.
void check_both_kernels(const std::vector<CaseSpec>& specs, const std::string& cores_name) {
  SplitKVOptions cores;
  cores.tensor_cores = false;
  SplitKVOptions forced_split;
  forced_split.path = PathChoice::split;
  forced_split.min_kv_chunk_tokens = 0;
  forced_split.num_sm = 4;
  forced_split.ctas_per_sm = 1;
  for (const auto& [options, name] :
       {std::pair{cores, cores_name}, std::pair{forced_split, std::string("03_split_kv[forced_split]")}}) {
    const StageInfo stage = split_kv_stage_with(options, name);
    for (const CaseSpec& spec : specs) {
      CAPTURE(name);
      const auto report = validate(stage, spec, case_seed(flashstep::test::run_seed(), spec.describe()));
      CHECK_MESSAGE(report.passed, report.message());
    }
  }
}

}  // namespace

TEST_CASE("split_kv fp8: the tensor-core kernel and the CUDA-core loop on the same cases") {
  // The registry's runner takes the tensor-core kernel wherever it applies (head_dim 128,
  // group <= 8); the CUDA-core loop must stay right for the shapes it still serves and
  // when asked for. Both on the sanitizer grid and a few long cases.
  std::vector<CaseSpec> specs = grids::decode_fp8_sanitizer_grid();
  for (const CaseSpec& c : grids::decode_fp8_long_grid())
    if (c.kv_len <= 256) specs.push_back(c);  // batch 128: blocks in waves
  check_both_kernels(specs, "03_split_kv[fp8_cuda_cores]");
}

TEST_CASE("split_kv: the tensor-core kernel and the CUDA-core loop on the same 16-bit cases") {
  // fp16/bf16 K/V at head_dim 128 with a group of at most 8 runs mma_decode.cuh's kernel
  // (SameAsQ); with tensor_cores off the same cases run the chunk kernel, which still serves
  // every other head_dim, group, RoPE and the soft cap. Both, forced to split and not.
  std::vector<CaseSpec> specs;
  for (const auto& grid : {grids::decode_sanitizer_grid(), grids::decode_group_grid(), grids::decode_ragged_grid()})
    for (const CaseSpec& c : grid)
      if (c.head_dim == 128 && c.dtype != DType::f32) specs.push_back(c);
  REQUIRE(specs.size() >= 8);
  check_both_kernels(specs, "03_split_kv[cuda_cores]");
  // The registry's runner takes the tensor-core kernel for these shapes, and not for the rest.
  SplitKVRunner runner;
  for (const CaseSpec& spec : specs) {
    std::mt19937_64 rng(1);
    const BatchShape shape = make_layout(spec, KVStorage::paged, rng).shape;
    DeviceBuffer workspace(runner.workspace_bytes(shape));
    runner.plan(shape, workspace.get(), workspace.bytes(), nullptr);
    CHECK_MESSAGE(runner.tensor_cores() == (shape.group_size() <= 8 && shape.page_size >= split_kv::kMmaMinPageSize),
                  spec.describe());
  }
}

TEST_CASE("split_kv fp8: q of every size (the tensor-core kernel scales q by a power of two into fp16)") {
  // fp16 q reaches 65504; bf16 q goes far past fp16's range (here to 3e8) and below its
  // normal range. The kernel brings each block's largest |q| under 2^15 by a power of two.
  // (Scores near 1e12 and beyond are past what the decode paths handle, the CUDA-core loop
  // included: the chapter's "Known limits".)
  std::vector<CaseSpec> specs;
  int n = 0;
  for (DType q : {DType::f16, DType::bf16})
    for (double range : {1e-7, 1e-3, 30.0, 2e4, 1e6, 1e8}) {
      if (q == DType::f16 && range > 2e4) continue;  // 3 x range must be an fp16 value
      CaseSpec c;
      c.dtype = q;
      c.kv_dtype = n % 2 ? DType::e5m2 : DType::e4m3;
      c.q_range = range;
      c.batch_size = 3;
      c.kv_len = 200;
      c.page_size = 16;
      c.lengths = LengthPolicy::ragged;
      ++n;
      specs.push_back(c);
    }
  const StageInfo& stage = find_stage("03_split_kv");
  for (const CaseSpec& spec : specs) {
    const auto report = validate(stage, spec, case_seed(flashstep::test::run_seed(), spec.describe()));
    CHECK_MESSAGE(report.passed, report.message());
  }
}
