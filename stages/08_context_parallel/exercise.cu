// Stage 08 exercise — shard a batch over "GPUs" by sequence position, then merge the
// gathered states.
//
// The program plays three ranks on one GPU, so it needs neither NCCL nor a second GPU:
// each "rank" runs stage 03 (fp32 states) on its shard of every request and writes its
// state where an NCCL all-gather would have put it, rank j's request r at row j B + r
// of one buffer; then a merge kernel folds the three states of every (request, head).
// It has two holes marked TODO:
//   1. the shard's last_page_len: which length does a rank's slice of a request get?
//   2. the merge of the gathered states: find rank j's row and fold it in.
// As shipped it FAILs every case; fill in the two holes until it prints PASS. Then read
// sharding.cpp (shard_page_table), context_parallel.cpp (the exchange) and
// merge_gathered.cuh (stage 03's merge block doing hole 2 for real).
//
//     cmake --build build --target flashstep_exercise_08_context_parallel
//     build/bin/flashstep_exercise_08_context_parallel
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "08_context_parallel/sharding.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::context_parallel;
using bf16 = __nv_bfloat16;

constexpr int kHeadDim = 128;
constexpr int kRanks = 3;
constexpr int kPerLane = kHeadDim / 32;  // each lane of the warp owns 4 consecutive dims

/// TODO(exercise) 1 — a rank's slice [begin, end) of a request of `pages` pages whose last
/// page holds last_page_len tokens. Every page but the request's last is full; an empty
/// slice gets 0 (stage 03 reads a request with no pages as having no keys).
int32_t slice_last_page_len(int32_t begin, int32_t end, int32_t pages, int32_t last_page_len, int32_t page_size) {
  return page_size;  // placeholder: every slice ends on a full page
}

/// Rank k's page table: for each request, its pages [r's split k, split k+1), three even thirds.
PageTable rank_table(const BatchShape& s, int k) {
  PageTable t;
  t.kv_indptr.push_back(0);
  for (int r = 0; r < s.batch_size; ++r) {
    const int32_t pages = s.kv_indptr[r + 1] - s.kv_indptr[r];
    const int32_t begin = pages * k / kRanks, end = pages * (k + 1) / kRanks;
    for (int32_t p = begin; p < end; ++p) t.kv_indices.push_back(s.kv_indices[size_t(s.kv_indptr[r] + p)]);
    t.kv_indptr.push_back(t.kv_indptr.back() + (end - begin));
    t.kv_last_page_len.push_back(slice_last_page_len(begin, end, pages, s.kv_last_page_len[size_t(r)], s.page_size));
  }
  return t;
}

struct MergeParams {
  const float* states_o;    ///< (kRanks * batch_size, num_qo_heads, 128): rank j's request r at row j B + r
  const float* states_lse;  ///< (kRanks * batch_size, num_qo_heads), natural log; -inf: no keys on that rank
  bf16* o;                  ///< (batch_size, num_qo_heads, 128)
  float* lse;               ///< (batch_size, num_qo_heads)
  int batch_size, num_qo_heads;
};

/// TODO(exercise) 2 — one warp per (head, request): fold the kRanks states of this
/// request and head. Rank j's state is row (j * batch_size + r) * num_qo_heads + h of
/// states_lse (times head_dim for states_o). Keep a running max m of the lse's, the sum
/// d of exp(lse_j - m) and the weighted sum of o_j (rescale both when m grows); the result
/// is o = sum / d and lse = m + log(d). Every rank may be empty (lse -inf): then o = 0 and
/// lse = -inf, and no (-inf) - (-inf) may be formed.
__global__ void merge_kernel(MergeParams p) {
  const int h = blockIdx.x, r = blockIdx.y, lane = threadIdx.x;
  float o[kPerLane] = {}, lse = -INFINITY;  // placeholder: the empty state, whatever the ranks hold
  const int64_t row = int64_t{r} * p.num_qo_heads + h;
  for (int e = 0; e < kPerLane; ++e) p.o[row * kHeadDim + lane * kPerLane + e] = __float2bfloat16_rn(o[e]);
  if (lane == 0) p.lse[row] = lse;
}

/// Three ranks' stage 03 on one GPU, then the merge.
class ExerciseRunner : public StageRunner {
 public:
  size_t workspace_bytes(const BatchShape& s) const override {
    size_t bytes = states_bytes(s);
    for (int k = 0; k < kRanks; ++k) bytes += runner_bytes(s);
    return bytes;
  }
  void plan(const BatchShape& s, void* workspace, size_t, cudaStream_t stream) override {
    shape_ = s;
    auto* at = static_cast<uint8_t*>(workspace);
    states_ = reinterpret_cast<float*>(at);
    at += states_bytes(s);
    for (int k = 0; k < kRanks; ++k) {
      split_kv::SplitKVOptions options;
      options.fp32_states = true;
      runners_[k] = std::make_unique<split_kv::SplitKVRunner>(options);
      const PageTable t = rank_table(s, k);
      indptr_[k] = stages::harness::upload(t.kv_indptr);
      indices_[k] = stages::harness::upload(t.kv_indices);
      last_[k] = stages::harness::upload(t.kv_last_page_len);
      runners_[k]->plan(shard_shape(s, t), at, runner_bytes(s), stream);
      at += runner_bytes(s);
    }
  }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    const size_t rows = size_t(shape_.batch_size) * shape_.num_qo_heads;
    float* states_lse = states_ + kRanks * rows * kHeadDim;
    for (int k = 0; k < kRanks; ++k) {
      DeviceBatch b = batch;  // rank k: its page table, its state where the all-gather puts it
      b.kv_indptr = indptr_[k].as<int32_t>();
      b.kv_indices = indices_[k].as<int32_t>();
      b.kv_last_page_len = last_[k].as<int32_t>();
      b.o = states_ + k * rows * kHeadDim;
      b.lse = states_lse + k * rows;
      runners_[k]->run(b, stream);
    }
    const MergeParams m{states_,   states_lse,        static_cast<bf16*>(batch.o),
                        batch.lse, shape_.batch_size, shape_.num_qo_heads};
    merge_kernel<<<dim3(shape_.num_qo_heads, shape_.batch_size), 32, 0, stream>>>(m);
    kernels::check_launch("merge_kernel");
  }

 private:
  static size_t states_bytes(const BatchShape& s) {
    return (size_t(kRanks) * s.batch_size * s.num_qo_heads * (kHeadDim + 1) * sizeof(float) + 255) / 256 * 256;
  }
  static size_t runner_bytes(const BatchShape& s) {
    split_kv::SplitKVOptions options;
    options.fp32_states = true;
    return (split_kv::SplitKVRunner(options).workspace_bytes(s) + 255) / 256 * 256;
  }
  BatchShape shape_;
  float* states_ = nullptr;
  std::unique_ptr<split_kv::SplitKVRunner> runners_[kRanks];
  stages::harness::DeviceBuffer indptr_[kRanks], indices_[kRanks], last_[kRanks];
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "08_context_parallel_exercise";
  stage.modes = {Mode::decode};
  stage.storage = KVStorage::paged;
  stage.dtypes = {DType::bf16};
  stage.head_dims = {kHeadDim};
  stage.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  stage.max_page_size = 64;
  stage.max_group_size = 8;
  stage.needs_host_page_table = true;
  stage.make_runner = [] { return std::make_unique<ExerciseRunner>(); };

  using stages::harness::CaseSpec;
  using stages::harness::LengthPolicy;
  // Partial last pages, requests shorter than three pages (empty slices), an empty request.
  std::vector<CaseSpec> cases(4);
  cases[0].batch_size = 2, cases[0].kv_len = 1000, cases[0].page_size = 16;
  cases[1].batch_size = 3, cases[1].kv_len = 97, cases[1].page_size = 1, cases[1].kv_layout = KVLayout::HND;
  cases[2].batch_size = 4, cases[2].kv_len = 40, cases[2].page_size = 16, cases[2].num_qo_heads = 28,
  cases[2].num_kv_heads = 4;
  cases[3].batch_size = 4, cases[3].kv_len = 300, cases[3].lengths = LengthPolicy::ragged_with_empty;
  const uint64_t seed = 20240608;
  return stages::harness::run_exercise(stage, cases, seed);
}
