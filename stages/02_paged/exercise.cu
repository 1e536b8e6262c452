// Stage 02 exercise — decode through a page table with an online softmax.
//
// The program below is a deliberately simple paged decode kernel (one warp per request
// and query head, bf16, head_dim 128, no pipelining) with two holes marked TODO:
//   1. the page-table walk: where does token t of request b live in the pool?
//   2. the online-softmax update: fold one more key into (m, d, o).
// As shipped it FAILs every case; fill in the two holes until it prints PASS. Then read
// paged_decode.cuh to see what the real stage adds (GQA sharing, cp.async pipeline).
//
//     cmake --build build --target flashstep_exercise_02_paged
//     build/bin/flashstep_exercise_02_paged
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/paged_kv.cuh"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;
using bf16 = __nv_bfloat16;

constexpr int kHeadDim = 128;
constexpr int kPerLane = kHeadDim / 32;  // each lane of the warp owns 4 consecutive dims

struct ExerciseParams {
  const bf16* q;              ///< (batch_size, num_qo_heads, 128)
  kernels::PagedKV<bf16> kv;  ///< pool + CSR page table (see kernels/paged_kv.cuh)
  bf16* o;                    ///< (batch_size, num_qo_heads, 128)
  float* lse;                 ///< (batch_size, num_qo_heads)
  int num_qo_heads, group_size;
  float sm_scale;
};

/// TODO(exercise) 1 — the page-table walk. Return the element offset, within the pool,
/// of K[token t of request b, kv head `head`, dim 0]. V is at that offset + kv.stride_kv.
/// Use kv.kv_indptr, kv.kv_indices, kv.page_size.divisor (or kv.page_size.divmod) and
/// the strides kv.stride_page, kv.stride_token, kv.stride_head.
__device__ int64_t token_offset(const kernels::PagedKV<bf16>& kv, int b, int t, int head) {
  return 0;  // placeholder: every token reads page 0, slot 0
}

/// Online softmax state of one query row (this lane's 4 dims of o).
struct RowState {
  float m = -INFINITY;     ///< max score so far
  float d = 0.f;           ///< sum of exp(score - m)
  float o[kPerLane] = {};  ///< sum of exp(score - m) * v
};

/// TODO(exercise) 2 — fold key j (score s, this lane's 4 values v) into the state:
/// raise m if s is larger (rescaling d and o by exp(old m - new m)), then add exp(s - m)
/// to d and exp(s - m) * v to o. Careful: exp(-inf - (-inf)) is NaN.
__device__ void online_update(RowState& st, float s, const float (&v)[kPerLane]) {
  // placeholder: ignores the key
}

__global__ void exercise_decode(ExerciseParams p) {
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  const int kv_head = h / p.group_size;
  const bf16* q_row = p.q + (int64_t{b} * p.num_qo_heads + h) * kHeadDim + lane * kPerLane;
  float q[kPerLane];
  for (int e = 0; e < kPerLane; ++e) q[e] = __bfloat162float(q_row[e]) * p.sm_scale;

  RowState st;
  const int kv_len = p.kv.kv_len(b);
  for (int t = 0; t < kv_len; ++t) {
    const int64_t off = token_offset(p.kv, b, t, kv_head);
    const bf16* k = p.kv.pool + off + lane * kPerLane;
    const bf16* v = k + p.kv.stride_kv;
    float s = 0.f;
    for (int e = 0; e < kPerLane; ++e) s += q[e] * __bfloat162float(k[e]);
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    float vf[kPerLane];
    for (int e = 0; e < kPerLane; ++e) vf[e] = __bfloat162float(v[e]);
    online_update(st, s, vf);
  }
  const float inv_d = st.d > 0.f ? 1.f / st.d : 0.f;
  bf16* o_row = p.o + (int64_t{b} * p.num_qo_heads + h) * kHeadDim + lane * kPerLane;
  for (int e = 0; e < kPerLane; ++e) o_row[e] = __float2bfloat16_rn(st.o[e] * inv_d);
  if (lane == 0) p.lse[int64_t{b} * p.num_qo_heads + h] = st.d > 0.f ? st.m + logf(st.d) : -INFINITY;
}

class ExerciseRunner : public StageRunner {
 public:
  void plan(const BatchShape& s, void*, size_t, cudaStream_t) override { shape_ = s; }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    ExerciseParams p;
    p.q = static_cast<const bf16*>(batch.q);
    p.kv = kernels::make_paged_kv(static_cast<const bf16*>(batch.kv_pool), batch.kv_indptr, batch.kv_indices,
                                  batch.kv_last_page_len, shape_.page_size, shape_.num_kv_heads, kHeadDim,
                                  shape_.kv_layout == KVLayout::HND);
    p.o = static_cast<bf16*>(batch.o);
    p.lse = batch.lse;
    p.num_qo_heads = shape_.num_qo_heads;
    p.group_size = shape_.group_size();
    p.sm_scale = shape_.resolved_sm_scale();
    exercise_decode<<<dim3(shape_.num_qo_heads, shape_.batch_size), 32, 0, stream>>>(p);
    kernels::check_launch("exercise_decode");
  }

 private:
  BatchShape shape_;
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "02_paged_exercise";
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
  // Pages are shuffled and spare pages hold NaN: a wrong walk cannot pass by luck.
  std::vector<CaseSpec> cases(4);
  cases[0].batch_size = 3, cases[0].kv_len = 17, cases[0].page_size = 16;
  cases[1].batch_size = 12, cases[1].kv_len = 97, cases[1].page_size = 1, cases[1].kv_layout = KVLayout::HND;
  cases[2].batch_size = 5, cases[2].kv_len = 54, cases[2].page_size = 8, cases[2].num_qo_heads = 28,
  cases[2].num_kv_heads = 4;
  cases[3].batch_size = 4, cases[3].kv_len = 33, cases[3].lengths = LengthPolicy::ragged_with_empty;
  const uint64_t seed = 20240602;
  return stages::harness::run_exercise(stage, cases, seed);
}
