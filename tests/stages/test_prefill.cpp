// Prefill grids through every stage that supports prefill (01_naive today), plus the
// check of stage 01's one intermediate: the probabilities it materializes.
#include <doctest/doctest.h>

#include <cmath>

#include "01_naive/naive.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/attention.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"
#include "harness/device.hpp"

using namespace flashstep;
using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

TEST_CASE(
    "prefill: grid, batch {1,5} x qo_len {1,7,17} x kv_len {1,17,97} x causal x 3 head configs x head_dim {64,128,256}") {
  CHECK(check_grid(grids::prefill_grid()).count("01_naive") == 1);
}

TEST_CASE("prefill: sanitizer subset") { CHECK(check_grid(grids::prefill_sanitizer_grid()).count("01_naive") == 1); }

TEST_CASE("01_naive: its probabilities are the softmax of the reference's scores") {
  using namespace stages;
  using namespace stages::harness;
  CaseSpec spec;
  spec.mode = Mode::prefill;
  spec.dtype = DType::f32;
  spec.batch_size = 3;
  spec.qo_len = 6;
  spec.kv_len = 23;
  spec.causal = true;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.lengths = LengthPolicy::ragged_with_empty;
  const uint64_t seed = case_seed(test::run_seed(), "naive probabilities " + spec.describe());
  CAPTURE(seed);
  const HostCase host = build_case(spec, KVStorage::ragged, seed);
  const BatchShape& s = host.layout.shape;

  DeviceCase dev(host);
  naive::NaiveRunner runner;
  DeviceBuffer workspace(runner.workspace_bytes(s));
  FLASHSTEP_CUDA_CHECK(cudaMemset(workspace.get(), 0xff, workspace.bytes()));  // NaN-poison
  runner.plan(s, workspace.get(), workspace.bytes(), nullptr);
  dev.poison_outputs(nullptr);
  runner.run(dev.batch(), nullptr);
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());

  const int64_t total = runner.score_indptr().back();
  std::vector<float> probs(static_cast<size_t>(total));
  FLASHSTEP_CUDA_CHECK(
      cudaMemcpy(probs.data(), runner.probabilities(), probs.size() * sizeof(float), cudaMemcpyDeviceToHost));
  // Expected: softmax, in double, of the reference's masked score matrix per (request, head).
  std::vector<double> got, expected;
  ref::AttentionOptions opt;
  opt.causal = true;
  opt.sm_scale = s.sm_scale;
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t q0 = s.qo_indptr[b], qo_len = s.qo_indptr[b + 1] - q0;
    const int64_t k0 = s.kv_indptr[b], kv_len = s.kv_len(b);
    ref::Tensor q({qo_len, s.num_qo_heads, s.head_dim});
    std::copy(host.q.data.begin() + q0 * s.num_qo_heads * s.head_dim,
              host.q.data.begin() + (q0 + qo_len) * s.num_qo_heads * s.head_dim, q.data.begin());
    ref::Tensor k({kv_len, s.num_kv_heads, s.head_dim});
    std::copy(host.k.data.begin() + k0 * s.num_kv_heads * s.head_dim,
              host.k.data.begin() + (k0 + kv_len) * s.num_kv_heads * s.head_dim, k.data.begin());
    for (int h = 0; h < s.num_qo_heads; ++h) {
      const ref::Tensor scores = kv_len ? ref::attention_scores(q, k, h, opt) : ref::Tensor({qo_len, 0});
      for (int64_t i = 0; i < qo_len; ++i) {
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < kv_len; ++j) m = std::max(m, scores({i, j}));
        for (int64_t j = 0; j < kv_len; ++j) sum += m == -INFINITY ? 0 : std::exp(scores({i, j}) - m);
        for (int64_t j = 0; j < kv_len; ++j) {
          expected.push_back(m == -INFINITY ? 0 : std::exp(scores({i, j}) - m) / sum);
          got.push_back(probs[static_cast<size_t>(runner.score_indptr()[b] + (h * qo_len + i) * kv_len + j)]);
        }
      }
    }
  }
  REQUIRE(static_cast<int64_t>(got.size()) == total);
  const Comparison c = compare("probabilities", got, expected, tolerance_for(DType::f32).o,
                               [](int64_t i) { return "(score " + std::to_string(i) + ")"; });
  CHECK_MESSAGE(c.passed, c.summary());
}
