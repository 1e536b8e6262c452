// Stage 05 exercise — a two-level cascade for decode.
//
// The program below is a deliberately small cascade (decode, bf16, head_dim 64, page 16
// NHD, one warp per (request, query head), no tensor cores, no tiles): plan() derives
// two levels from the page ids the requests share (the reference's
// derive_cascade_level_ends and build_cascade_levels); run() computes each query row's
// state over level 0 (the shared pages of its group) and over level 1 (its own pages),
// then merges the two. Two holes, marked TODO:
//   1. which pages a query row reads at a level: its group's slice of the level's CSR
//      page table (a row of request r belongs to the group g whose request range holds r);
//   2. the merge of two normalized states (o1, lse1) and (o2, lse2) into one, exactly.
// As shipped it FAILs every case; fill in the two holes until it prints PASS. Then read
// cascade.cu and merge_levels.cuh to see what the real stage does instead: all queries of
// a group as one tall tensor-core tile per level (stage 04's kernel), the shared level
// split to fill the chip, and a cost model that falls back to the flat stages.
//
//     cmake --build build --target flashstep_exercise_05_cascade
//     build/bin/flashstep_exercise_05_cascade
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/state.cuh"
#include "flashstep/reference/cascade.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;
using bf16 = __nv_bfloat16;

constexpr int kHeadDim = 64;
constexpr int kPageSize = 16;

/// One level's CSR view, on the device (FlashInfer's multi-level layout).
struct Level {
  const int32_t* request_indptr;  ///< (groups + 1) requests of each group
  const int32_t* kv_indptr;       ///< (groups + 1) pages of each group
  const int32_t* kv_indices;      ///< page ids
  const int32_t* last_page_len;   ///< (groups) tokens in the group's last page (0: no pages)
  int num_groups;
};

struct ExerciseParams {
  const bf16* q;     ///< (batch, Hq, 64)
  const bf16* pool;  ///< (pages, 2, 16, Hkv, 64) NHD
  Level level[2];
  bf16* o;     ///< (batch, Hq, 64)
  float* lse;  ///< (batch, Hq), natural log
  int num_qo_heads, num_kv_heads;
  float sm_scale;
};

/// TODO(exercise) 1 — the pages of request `r` at `level`: set `first` to the index in
/// level.kv_indices of its group's first page, `count` to the group's page count and
/// `last_len` to the group's last_page_len. Find the group g with
/// request_indptr[g] <= r < request_indptr[g + 1] (a linear scan is fine here).
__device__ void group_pages(const Level& level, int r, int& first, int& count, int& last_len) {
  first = 0;  // placeholder: every request reads no page at all
  count = 0;
  last_len = 0;
}

/// TODO(exercise) 2 — merge two normalized states: (o1, lse1) is attention over one key
/// set, (o2, lse2) over a disjoint one; return attention over their union in (o1, lse1).
/// lse = -inf is the empty state (no keys): merging it must change nothing. The reference's
/// merge_state (reference/src/merge.cpp) states the formula.
__device__ void merge_into(float* o1, float& lse1, const float* o2, float lse2, int lane) {
  // placeholder: keeps level 0's state and forgets level 1's
}

/// Attention of one query row over `count` pages (the last holding last_len tokens):
/// lane l owns dims 2 l, 2 l + 1; scores by a warp sum; online softmax in natural log.
__device__ void attend(const ExerciseParams& p, const Level& level, int first, int count, int last_len,
                       const float (&q)[2], int kv_head, float (&o)[2], float& lse) {
  const int lane = threadIdx.x;
  float m = -INFINITY, d = 0.f;
  o[0] = o[1] = 0.f;
  for (int pi = 0; pi < count; ++pi) {
    const int64_t page = level.kv_indices[first + pi];
    const int tokens = pi + 1 == count ? last_len : kPageSize;
    for (int t = 0; t < tokens; ++t) {
      const int64_t base = ((page * 2) * kPageSize + t) * p.num_kv_heads + kv_head;  // K row
      const bf16* k = p.pool + base * kHeadDim;
      const bf16* v = p.pool + (base + int64_t{kPageSize} * p.num_kv_heads) * kHeadDim;  // V row
      float s = q[0] * __bfloat162float(k[2 * lane]) + q[1] * __bfloat162float(k[2 * lane + 1]);
      for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
      s *= p.sm_scale;
      const float m_new = fmaxf(m, s), scale = expf(m - m_new), w = expf(s - m_new);
      d = d * scale + w;
      o[0] = o[0] * scale + w * __bfloat162float(v[2 * lane]);
      o[1] = o[1] * scale + w * __bfloat162float(v[2 * lane + 1]);
      m = m_new;
    }
  }
  if (d > 0.f) {
    o[0] /= d;
    o[1] /= d;
  }
  lse = d > 0.f ? m + logf(d) : -INFINITY;
}

/// grid (Hq, batch), one warp: the row's state at each level, then their merge.
__global__ void exercise_cascade(const ExerciseParams p) {
  const int head = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
  const int kv_head = head / (p.num_qo_heads / p.num_kv_heads);
  const bf16* qr = p.q + (int64_t{r} * p.num_qo_heads + head) * kHeadDim;
  const float q[2] = {__bfloat162float(qr[2 * lane]), __bfloat162float(qr[2 * lane + 1])};
  float o[2][2], lse[2];
  for (int l = 0; l < 2; ++l) {
    int first, count, last_len;
    group_pages(p.level[l], r, first, count, last_len);
    attend(p, p.level[l], first, count, last_len, q, kv_head, o[l], lse[l]);
  }
  merge_into(o[0], lse[0], o[1], lse[1], lane);
  bf16* out = p.o + (int64_t{r} * p.num_qo_heads + head) * kHeadDim;
  out[2 * lane] = __float2bfloat16(o[0][0]);
  out[2 * lane + 1] = __float2bfloat16(o[0][1]);
  if (lane == 0) p.lse[int64_t{r} * p.num_qo_heads + head] = lse[0];
}

class ExerciseRunner : public StageRunner {
 public:
  void plan(const BatchShape& s, void*, size_t, cudaStream_t) override {
    shape_ = s;
    // Two levels: the pages all (or runs of) requests share, then each request's own.
    const auto ends = ref::derive_cascade_level_ends(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_last_page_len,
                                                     s.page_size, 2, false);
    const ref::CascadeLevels levels = ref::build_cascade_levels(s.qo_indptr, s.kv_indptr, s.kv_indices,
                                                                s.kv_last_page_len, s.page_size, ends, false);
    for (int l = 0; l < 2; ++l) {
      const ref::CascadeLevel& lv = levels.levels[static_cast<size_t>(l)];
      buffers_[l][0] = harness::upload(lv.request_indptr);
      buffers_[l][1] = harness::upload(lv.kv_indptr);
      buffers_[l][2] = harness::upload(lv.kv_indices.empty() ? std::vector<int32_t>{0} : lv.kv_indices);
      buffers_[l][3] = harness::upload(lv.kv_last_page_len);
      level_[l] = {buffers_[l][0].as<int32_t>(), buffers_[l][1].as<int32_t>(), buffers_[l][2].as<int32_t>(),
                   buffers_[l][3].as<int32_t>(), static_cast<int>(lv.kv_last_page_len.size())};
    }
  }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    ExerciseParams p{static_cast<const bf16*>(batch.q),
                     static_cast<const bf16*>(batch.kv_pool),
                     {level_[0], level_[1]},
                     static_cast<bf16*>(batch.o),
                     batch.lse,
                     shape_.num_qo_heads,
                     shape_.num_kv_heads,
                     shape_.resolved_sm_scale()};
    exercise_cascade<<<dim3(shape_.num_qo_heads, shape_.batch_size), 32, 0, stream>>>(p);
    kernels::check_launch("exercise_cascade");
  }

 private:
  BatchShape shape_;
  harness::DeviceBuffer buffers_[2][4];
  Level level_[2] = {};
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "05_exercise";
  stage.summary = "the exercise's two-level decode cascade";
  stage.modes = {Mode::decode};
  stage.storage = KVStorage::paged;
  stage.dtypes = {DType::bf16};
  stage.head_dims = {kHeadDim};
  stage.kv_layouts = {KVLayout::NHD};
  stage.max_page_size = kPageSize;
  stage.max_group_size = 8;
  stage.needs_host_page_table = true;
  stage.make_runner = [] { return std::make_unique<ExerciseRunner>(); };

  std::vector<harness::CaseSpec> cases;
  for (int prefix : {0, 16, 40, 300})
    for (int batch : {1, 5}) {
      harness::CaseSpec c;
      c.mode = Mode::decode;
      c.dtype = DType::bf16;
      c.batch_size = batch;
      c.shared_prefix = prefix;
      c.kv_len = 37;
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = kHeadDim;
      c.page_size = kPageSize;
      cases.push_back(c);
    }
  return harness::run_exercise(stage, cases, 5);
}
