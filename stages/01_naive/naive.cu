// Stage 01 — naive attention, three passes over materialized scores.
//
// What it does: for each request b and query head h (one thread block each),
//   pass 1  S[i][j] = sm_scale * q_i . k_j, or -inf where the causal mask hides j
//   pass 2  P[i][j] = exp(S[i][j] - max_j S[i]) / sum_j exp(...), and lse_i = log sum_j exp(S[i][j])
//   pass 3  o_i = sum_j P[i][j] v_j
// exactly the formula of the course, in fp32, with the (qo_len x kv_len) score matrix of
// every (request, head) written to device memory between the passes.
//
// Why it exists: it is obviously right. Every later stage is checked against the CPU
// reference, and this one is the GPU version a reader can check by eye.
//
// Why it is slow (on purpose): the scores make a round trip through HBM, which for
// decode is as many bytes as reading K once more; each query head re-reads its group's
// K and V (GQA saves nothing); in pass 1 each thread walks a whole K row alone, so the
// 32 threads of a warp touch 32 different rows per load instead of one contiguous run;
// and everything is fp32, twice the bytes of bf16. Stage 02 removes each of these.
//
// How to run it: `ctest -L gpu` validates it; `flashstep_bench --benchmark_filter=01_naive`
// times it.
#include <cuda_runtime.h>

#include <cmath>
#include <numeric>

#include "01_naive/naive.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::naive {

namespace {

constexpr int kThreads = 256;

/// Pass 1: one block per (query head, request); thread t computes scores t, t + 256, ...
__global__ void scores_kernel(NaiveParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = p.qo_indptr[b], qo_len = p.qo_indptr[b + 1] - q0;
  const int k0 = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - k0;
  const int kv_head = h / (p.num_qo_heads / p.num_kv_heads);  // GQA
  float* S = p.scores + p.score_indptr[b] + int64_t{h} * qo_len * kv_len;
  for (int64_t idx = threadIdx.x; idx < int64_t{qo_len} * kv_len; idx += blockDim.x) {
    const int i = static_cast<int>(idx / kv_len), j = static_cast<int>(idx % kv_len);
    // Bottom-right aligned causal mask: query i is token kv_len - qo_len + i of the sequence.
    const bool visible = !p.causal || j <= i + (kv_len - qo_len);
    float s = -INFINITY;
    if (visible) {
      const float* q = p.q + (int64_t{q0 + i} * p.num_qo_heads + h) * p.head_dim;
      const float* k = p.k + (int64_t{k0 + j} * p.num_kv_heads + kv_head) * p.head_dim;
      float dot = 0.f;
      for (int d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
      s = dot * p.sm_scale;
    }
    S[idx] = s;
  }
}

__device__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// Pass 2: one warp per score row: max, then sum of exponentials, then normalize in
/// place. A row that sees no key (max = -inf) gets P = 0 and lse = -inf.
__global__ void softmax_kernel(NaiveParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = p.qo_indptr[b], qo_len = p.qo_indptr[b + 1] - q0;
  const int kv_len = p.kv_indptr[b + 1] - p.kv_indptr[b];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  for (int i = warp; i < qo_len; i += num_warps) {
    float* row = p.scores + p.score_indptr[b] + (int64_t{h} * qo_len + i) * kv_len;
    float m = -INFINITY;
    for (int j = lane; j < kv_len; j += 32) m = fmaxf(m, row[j]);
    m = warp_max(m);
    float sum = 0.f;
    if (m != -INFINITY)
      for (int j = lane; j < kv_len; j += 32) sum += expf(row[j] - m);
    sum = warp_sum(sum);
    for (int j = lane; j < kv_len; j += 32) row[j] = m == -INFINITY ? 0.f : expf(row[j] - m) / sum;
    if (lane == 0) p.lse[int64_t{q0 + i} * p.num_qo_heads + h] = m == -INFINITY ? -INFINITY : m + logf(sum);
  }
}

/// Pass 3: thread t computes output elements t, t + 256, ... of the (qo_len, head_dim) block.
__global__ void output_kernel(NaiveParams p) {
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = p.qo_indptr[b], qo_len = p.qo_indptr[b + 1] - q0;
  const int k0 = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - k0;
  const int kv_head = h / (p.num_qo_heads / p.num_kv_heads);
  for (int idx = threadIdx.x; idx < qo_len * p.head_dim; idx += blockDim.x) {
    const int i = idx / p.head_dim, d = idx % p.head_dim;
    const float* P = p.scores + p.score_indptr[b] + (int64_t{h} * qo_len + i) * kv_len;
    float acc = 0.f;
    for (int j = 0; j < kv_len; ++j) acc += P[j] * p.v[(int64_t{k0 + j} * p.num_kv_heads + kv_head) * p.head_dim + d];
    p.o[(int64_t{q0 + i} * p.num_qo_heads + h) * p.head_dim + d] = acc;
  }
}

}  // namespace

void launch_naive(const NaiveParams& p, cudaStream_t stream) {
  if (p.batch_size == 0) return;
  const dim3 grid(p.num_qo_heads, p.batch_size);
  scores_kernel<<<grid, kThreads, 0, stream>>>(p);
  kernels::check_launch("naive scores_kernel");
  softmax_kernel<<<grid, kThreads, 0, stream>>>(p);
  kernels::check_launch("naive softmax_kernel");
  output_kernel<<<grid, kThreads, 0, stream>>>(p);
  kernels::check_launch("naive output_kernel");
}

namespace {
/// Bytes of the offset table at the head of the workspace, rounded up to 256 so the
/// scores that follow start aligned.
size_t table_bytes(int batch_size) {
  const size_t raw = (static_cast<size_t>(batch_size) + 1) * sizeof(int64_t);
  return (raw + 255) / 256 * 256;
}

std::vector<int64_t> make_score_indptr(const BatchShape& s) {
  std::vector<int64_t> indptr(static_cast<size_t>(s.batch_size) + 1, 0);
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
    indptr[b + 1] = indptr[b] + qo_len * s.kv_len(b) * s.num_qo_heads;
  }
  return indptr;
}
}  // namespace

size_t NaiveRunner::workspace_bytes(const BatchShape& shape) const {
  return table_bytes(shape.batch_size) + static_cast<size_t>(make_score_indptr(shape).back()) * sizeof(float);
}

void NaiveRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  const char* fn = "NaiveRunner::plan";
  ref::require(shape.storage == KVStorage::ragged && shape.dtype == DType::f32, fn,
               "stage 01 takes ragged fp32 KV (got " + shape.describe() + ")");
  ref::require(workspace_size >= workspace_bytes(shape), fn,
               "workspace_size must be >= workspace_bytes(shape) = " + std::to_string(workspace_bytes(shape)) +
                   " (got " + std::to_string(workspace_size) + ")");
  shape_ = shape;
  score_indptr_ = make_score_indptr(shape);
  score_indptr_dev_ = static_cast<int64_t*>(workspace);
  scores_ = reinterpret_cast<float*>(static_cast<char*>(workspace) + table_bytes(shape.batch_size));
  FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(score_indptr_dev_, score_indptr_.data(), score_indptr_.size() * sizeof(int64_t),
                                       cudaMemcpyHostToDevice, stream));
}

void NaiveRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  NaiveParams p;
  p.q = static_cast<const float*>(batch.q);
  p.k = static_cast<const float*>(batch.k);
  p.v = static_cast<const float*>(batch.v);
  p.qo_indptr = batch.qo_indptr;
  p.kv_indptr = batch.kv_indptr;
  p.score_indptr = score_indptr_dev_;
  p.scores = scores_;
  p.o = static_cast<float*>(batch.o);
  p.lse = batch.lse;
  p.batch_size = shape_.batch_size;
  p.num_qo_heads = shape_.num_qo_heads;
  p.num_kv_heads = shape_.num_kv_heads;
  p.head_dim = shape_.head_dim;
  p.sm_scale = shape_.resolved_sm_scale();
  p.causal = shape_.causal;
  launch_naive(p, stream);
}

StageInfo stage_info() {
  StageInfo s;
  s.name = "01_naive";
  s.summary = "scores materialized, three passes, fp32: slow on purpose and obviously right";
  s.modes = {Mode::decode, Mode::prefill};
  s.storage = KVStorage::ragged;
  s.dtypes = {DType::f32};
  s.head_dims = {64, 128, 256};
  s.kv_layouts = {KVLayout::NHD};
  s.max_group_size = 64;
  s.causal = true;
  s.cuda_graph = true;  // grid (heads, batch_size); lengths are read on the device
  s.make_runner = [] { return std::make_unique<NaiveRunner>(); };
  return s;
}

}  // namespace flashstep::stages::naive
