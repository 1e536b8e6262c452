// Stage 03 exercise — split the KV, attend each chunk, merge the partial states.
//
// The program below is a deliberately simple split-KV decode (bf16, head_dim 128, one
// warp per (work item, query head), no pipelining) built on the same reference planner
// as the real stage (ref::plan_split_kv). It has two holes marked TODO:
//   1. a work item's chunk: which tokens of its request does (request, tile) read?
//   2. the merge: fold one partial state (o_k, lse_k) into a running (o, lse).
// As shipped it FAILs every case; fill in the two holes until it prints PASS. Then read
// chunk_decode.cuh and merge_states.cuh to see what the real stage adds (the cp.async
// pipeline, GQA sharing, one workspace, one copy, CUDA graphs).
//
//     cmake --build build --target flashstep_exercise_03_split_kv
//     build/bin/flashstep_exercise_03_split_kv
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/reference/split_plan.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;
using bf16 = __nv_bfloat16;

constexpr int kHeadDim = 128;
constexpr int kPerLane = kHeadDim / 32;  // each lane of the warp owns 4 consecutive dims

struct ChunkParams {
  const bf16* q;                   ///< (batch_size, num_qo_heads, 128)
  kernels::PagedKV<bf16> kv;       ///< pool + CSR page table (kernels/paged_kv.cuh)
  const int32_t* request_indices;  ///< (num_work_items)
  const int32_t* kv_tile_indices;  ///< (num_work_items)
  int chunk_tokens;                ///< kv_chunk_size_in_pages * page_size
  float* partial_o;                ///< (num_work_items, num_qo_heads, 128)
  float* partial_lse;              ///< (num_work_items, num_qo_heads), natural log
  int num_qo_heads, group_size;
  float sm_scale;
};

/// TODO(exercise) 1 — the chunk of a work item. Tile `tile` of a request with kv_len keys
/// covers the tokens [start, end) of the tile-th block of chunk_tokens tokens, clipped to
/// kv_len (the last chunk is usually shorter; an empty request has one empty chunk).
__device__ void chunk_range(int kv_len, int tile, int chunk_tokens, int& start, int& end) {
  start = 0;  // placeholder: every chunk is empty
  end = 0;
}

__global__ void chunk_kernel(ChunkParams p) {
  const int h = blockIdx.x, item = blockIdx.y, lane = threadIdx.x;
  const int b = p.request_indices[item];
  const int kv_head = h / p.group_size;
  const bf16* q_row = p.q + (int64_t{b} * p.num_qo_heads + h) * kHeadDim + lane * kPerLane;
  float q[kPerLane];
  for (int e = 0; e < kPerLane; ++e) q[e] = __bfloat162float(q_row[e]) * p.sm_scale;

  int start, end;
  chunk_range(p.kv.kv_len(b), p.kv_tile_indices[item], p.chunk_tokens, start, end);
  // Online softmax over the chunk (stage 02's exercise, done for you).
  float m = -INFINITY, d = 0.f, o[kPerLane] = {};
  for (int t = start; t < end; ++t) {
    const bf16* k = p.kv.pool + p.kv.k_offset(b, static_cast<uint32_t>(t), kv_head) + lane * kPerLane;
    const bf16* v = k + p.kv.stride_kv;
    float s = 0.f;
    for (int e = 0; e < kPerLane; ++e) s += q[e] * __bfloat162float(k[e]);
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    const float m_new = fmaxf(m, s);
    const float scale = m == -INFINITY ? 0.f : expf(m - m_new);
    const float w = expf(s - m_new);
    d = d * scale + w;
    for (int e = 0; e < kPerLane; ++e) o[e] = o[e] * scale + w * __bfloat162float(v[e]);
    m = m_new;
  }
  // The chunk's normalized state: o / d and lse = m + log d (empty: 0 and -inf).
  const int64_t row = int64_t{item} * p.num_qo_heads + h;
  for (int e = 0; e < kPerLane; ++e) p.partial_o[row * kHeadDim + lane * kPerLane + e] = d > 0.f ? o[e] / d : 0.f;
  if (lane == 0) p.partial_lse[row] = d > 0.f ? m + logf(d) : -INFINITY;
}

/// TODO(exercise) 2 — the merge. (o, lse) is the normalized state of the keys seen so far,
/// (o_k, lse_k) that of a disjoint chunk (either may be empty: lse = -inf). Replace them
/// by the state of the union: lse' = log(exp(lse) + exp(lse_k)), and o' the average of o
/// and o_k weighted by exp(lse - lse') and exp(lse_k - lse'). Subtract the larger lse
/// before exponentiating, and never form (-inf) - (-inf).
__device__ void merge_into(float (&o)[kPerLane], float& lse, const float (&o_k)[kPerLane], float lse_k) {
  // placeholder: ignores the chunk
}

struct MergeParams {
  const float* partial_o;
  const float* partial_lse;
  const int32_t* o_indptr;  ///< (batch_size + 1): request r's partial rows
  bf16* o;                  ///< (batch_size, num_qo_heads, 128)
  float* lse;               ///< (batch_size, num_qo_heads)
  int num_qo_heads;
};

__global__ void merge_kernel(MergeParams p) {
  const int h = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
  float o[kPerLane] = {}, lse = -INFINITY;  // the empty state
  for (int k = p.o_indptr[r]; k < p.o_indptr[r + 1]; ++k) {
    const int64_t row = int64_t{k} * p.num_qo_heads + h;
    float o_k[kPerLane];
    for (int e = 0; e < kPerLane; ++e) o_k[e] = p.partial_o[row * kHeadDim + lane * kPerLane + e];
    merge_into(o, lse, o_k, p.partial_lse[row]);
  }
  const int64_t row = int64_t{r} * p.num_qo_heads + h;
  for (int e = 0; e < kPerLane; ++e) p.o[row * kHeadDim + lane * kPerLane + e] = __float2bfloat16_rn(o[e]);
  if (lane == 0) p.lse[row] = lse;
}

/// plan/run with a deliberately small chunk (32 tokens) so that every case splits.
class ExerciseRunner : public StageRunner {
 public:
  size_t workspace_bytes(const BatchShape& s) const override {
    const size_t rows = size_t(s.total_kv_len()) / 32 + s.batch_size + 1;  // >= any number of work items
    return rows * s.num_qo_heads * (kHeadDim + 1) * sizeof(float) + 3 * (rows + s.batch_size + 1) * sizeof(int32_t);
  }
  void plan(const BatchShape& s, void* workspace, size_t, cudaStream_t stream) override {
    shape_ = s;
    ref::SplitKVConfig config;
    config.page_size = s.page_size;
    config.num_kv_heads = s.num_kv_heads;
    config.num_sm = 1 << 20;  // a huge "device": the smallest chunk always fits
    config.min_kv_chunk_tokens = 32;
    plan_ = ref::plan_split_kv(ref::kv_page_counts_from_indptr(s.kv_indptr), config);
    // Carve the workspace: partial_o | partial_lse | request_indices | kv_tile_indices | o_indptr.
    const size_t items = size_t(plan_.num_work_items);
    auto* base = static_cast<uint8_t*>(workspace);
    partial_o_ = reinterpret_cast<float*>(base);
    partial_lse_ = partial_o_ + items * s.num_qo_heads * kHeadDim;
    auto* ints = reinterpret_cast<int32_t*>(partial_lse_ + items * s.num_qo_heads);
    std::vector<int32_t> schedule(plan_.request_indices.begin(), plan_.request_indices.begin() + items);
    schedule.insert(schedule.end(), plan_.kv_tile_indices.begin(), plan_.kv_tile_indices.begin() + items);
    schedule.insert(schedule.end(), plan_.o_indptr.begin(), plan_.o_indptr.end());
    request_indices_ = ints;
    kv_tile_indices_ = ints + items;
    o_indptr_ = ints + 2 * items;
    FLASHSTEP_CUDA_CHECK(
        cudaMemcpyAsync(ints, schedule.data(), schedule.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));  // `schedule` is pageable and dies here
  }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    ChunkParams p;
    p.q = static_cast<const bf16*>(batch.q);
    p.kv = kernels::make_paged_kv(static_cast<const bf16*>(batch.kv_pool), batch.kv_indptr, batch.kv_indices,
                                  batch.kv_last_page_len, shape_.page_size, shape_.num_kv_heads, kHeadDim,
                                  shape_.kv_layout == KVLayout::HND);
    p.request_indices = request_indices_;
    p.kv_tile_indices = kv_tile_indices_;
    p.chunk_tokens = plan_.kv_chunk_size_in_pages * shape_.page_size;
    p.partial_o = partial_o_;
    p.partial_lse = partial_lse_;
    p.num_qo_heads = shape_.num_qo_heads;
    p.group_size = shape_.group_size();
    p.sm_scale = shape_.resolved_sm_scale();
    chunk_kernel<<<dim3(shape_.num_qo_heads, plan_.num_work_items), 32, 0, stream>>>(p);
    kernels::check_launch("chunk_kernel");
    const MergeParams m{partial_o_, partial_lse_,       o_indptr_, static_cast<bf16*>(batch.o),
                        batch.lse,  shape_.num_qo_heads};
    merge_kernel<<<dim3(shape_.num_qo_heads, shape_.batch_size), 32, 0, stream>>>(m);
    kernels::check_launch("merge_kernel");
  }

 private:
  BatchShape shape_;
  ref::SplitKVPlan plan_;
  float* partial_o_ = nullptr;
  float* partial_lse_ = nullptr;
  int32_t* request_indices_ = nullptr;
  int32_t* kv_tile_indices_ = nullptr;
  int32_t* o_indptr_ = nullptr;
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "03_split_kv_exercise";
  stage.modes = {Mode::decode};
  stage.storage = KVStorage::paged;
  stage.dtypes = {DType::bf16};
  stage.head_dims = {kHeadDim};
  stage.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  stage.max_page_size = 64;
  stage.max_group_size = 8;
  stage.make_runner = [] { return std::make_unique<ExerciseRunner>(); };

  using stages::harness::CaseSpec;
  using stages::harness::LengthPolicy;
  // Long enough to split into several chunks; one case has an empty request.
  std::vector<CaseSpec> cases(4);
  cases[0].batch_size = 2, cases[0].kv_len = 300, cases[0].page_size = 16;
  cases[1].batch_size = 3, cases[1].kv_len = 97, cases[1].page_size = 1, cases[1].kv_layout = KVLayout::HND;
  cases[2].batch_size = 4, cases[2].kv_len = 200, cases[2].page_size = 8, cases[2].num_qo_heads = 28,
  cases[2].num_kv_heads = 4;
  cases[3].batch_size = 4, cases[3].kv_len = 129, cases[3].lengths = LengthPolicy::ragged_with_empty;
  const uint64_t seed = 20240603;
  return stages::harness::run_exercise(stage, cases, seed);
}
