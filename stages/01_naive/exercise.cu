// Stage 01 exercise — write naive decode attention yourself, in three passes.
//
// The program below is complete except for the three kernel bodies marked TODO. As
// shipped it writes zeros, so every check FAILs; fill in the passes until it prints
// PASS for every case. Build and run (on a machine with a GPU):
//
//     cmake --build build --target flashstep_exercise_01_naive
//     build/bin/flashstep_exercise_01_naive
//
// Setting: decode (one query token per request), fp32, ragged contiguous K/V in NHD
// layout, GQA. The harness builds random cases, runs your kernels, and compares with
// the CPU reference exactly as the GPU tests do (NaN-poisoned outputs, the fp32
// tolerance row, the first mismatches named by (request, head, token, dim)).
// Compare your code with naive.cu afterwards; it also handles prefill and causal masks.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;

/// What your kernels get. Decode: request b has one query row (row b).
struct ExerciseParams {
  const float* q;            ///< (batch_size, num_qo_heads, head_dim)
  const float* k;            ///< (nnz_kv, num_kv_heads, head_dim)
  const float* v;            ///< (nnz_kv, num_kv_heads, head_dim)
  const int32_t* kv_indptr;  ///< (batch_size + 1): request b owns K/V rows kv_indptr[b]..kv_indptr[b+1]
  float* scores;             ///< (batch_size, num_qo_heads, max_kv_len) scratch, yours to use
  float* o;                  ///< (batch_size, num_qo_heads, head_dim)
  float* lse;                ///< (batch_size, num_qo_heads), natural log
  int num_qo_heads, num_kv_heads, head_dim, max_kv_len;
  float sm_scale;
};

// Pass 1. Block (h, b), thread t: for j = t, t + blockDim.x, ... < kv_len of request b,
//   scores[(b * num_qo_heads + h) * max_kv_len + j] = sm_scale * dot(q[b, h, :], k[kv_indptr[b] + j, kv_head, :])
// where kv_head = h / (num_qo_heads / num_kv_heads).
__global__ void exercise_scores(ExerciseParams p) {
  // TODO(exercise): compute the scores of request blockIdx.y, query head blockIdx.x.
}

// Pass 2. Block (h, b): replace the row of scores by its softmax, and write
//   lse[b * num_qo_heads + h] = max + log(sum_j exp(score_j - max)).
// A request with kv_len 0 sees no key: its lse is -INFINITY (and its output, in pass 3, 0).
// Hint: thread 0 alone may do the whole row; it is slow, and that is fine here.
__global__ void exercise_softmax(ExerciseParams p) {
  // TODO(exercise): normalize the row and write lse.
  if (threadIdx.x == 0) p.lse[blockIdx.y * p.num_qo_heads + blockIdx.x] = 0.f;  // placeholder: wrong
}

// Pass 3. Block (h, b), thread d < head_dim: o[b, h, d] = sum_j P[j] * v[kv_indptr[b] + j, kv_head, d].
__global__ void exercise_output(ExerciseParams p) {
  // TODO(exercise): weight the V rows by the probabilities.
  for (int d = threadIdx.x; d < p.head_dim; d += blockDim.x)
    p.o[(blockIdx.y * p.num_qo_heads + blockIdx.x) * p.head_dim + d] = 0.f;  // placeholder: wrong
}

/// The plan/run wrapper around your kernels (complete; nothing to do here).
class ExerciseRunner : public StageRunner {
 public:
  size_t workspace_bytes(const BatchShape& s) const override {
    return size_t(s.batch_size) * s.num_qo_heads * max_kv_len(s) * sizeof(float);
  }
  void plan(const BatchShape& s, void* workspace, size_t, cudaStream_t) override {
    shape_ = s;
    scores_ = static_cast<float*>(workspace);
  }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    ExerciseParams p{static_cast<const float*>(batch.q),
                     static_cast<const float*>(batch.k),
                     static_cast<const float*>(batch.v),
                     batch.kv_indptr,
                     scores_,
                     static_cast<float*>(batch.o),
                     batch.lse,
                     shape_.num_qo_heads,
                     shape_.num_kv_heads,
                     shape_.head_dim,
                     max_kv_len(shape_),
                     shape_.resolved_sm_scale()};
    const dim3 grid(shape_.num_qo_heads, shape_.batch_size);
    exercise_scores<<<grid, 128, 0, stream>>>(p);
    kernels::check_launch("exercise_scores");
    exercise_softmax<<<grid, 128, 0, stream>>>(p);
    kernels::check_launch("exercise_softmax");
    exercise_output<<<grid, 128, 0, stream>>>(p);
    kernels::check_launch("exercise_output");
  }

 private:
  static int max_kv_len(const BatchShape& s) {
    int m = 1;
    for (int b = 0; b < s.batch_size; ++b) m = std::max(m, int(s.kv_len(b)));
    return m;
  }
  BatchShape shape_;
  float* scores_ = nullptr;
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "01_naive_exercise";
  stage.modes = {Mode::decode};
  stage.storage = KVStorage::ragged;
  stage.dtypes = {DType::f32};
  stage.head_dims = {64, 128};
  stage.kv_layouts = {KVLayout::NHD};
  stage.max_group_size = 8;
  stage.make_runner = [] { return std::make_unique<ExerciseRunner>(); };

  // Small ragged edge cases first: kv_len 1, GQA 1/4/7, a batch with an empty request.
  const std::vector<stages::harness::CaseSpec> cases = {
      {Mode::decode, DType::f32, KVLayout::NHD, 1, 1, 1, stages::harness::LengthPolicy::uniform, 8, 8, 64},
      {Mode::decode, DType::f32, KVLayout::NHD, 5, 97, 1, stages::harness::LengthPolicy::ragged, 32, 8, 128},
      {Mode::decode, DType::f32, KVLayout::NHD, 3, 54, 1, stages::harness::LengthPolicy::ragged, 7, 1, 64},
      {Mode::decode, DType::f32, KVLayout::NHD, 4, 17, 1, stages::harness::LengthPolicy::ragged_with_empty, 8, 2, 128},
  };
  const uint64_t seed = 20240601;
  return stages::harness::run_exercise(stage, cases, seed);
}
