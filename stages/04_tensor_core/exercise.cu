// Stage 04 exercise — attention on tensor cores.
//
// The program below is a deliberately small tensor-core prefill (one warp per 16 query
// rows of one head, bf16, head_dim 64, ragged K/V, no mask but the end of the keys, no
// pipelining) with two holes marked TODO:
//   1. the swizzle: where chunk c of row r of a shared-memory tile is stored;
//   2. the fragment layout: which row and column of the 16 x 8 accumulator tile
//      element e of lane l holds (the softmax and the store both depend on it).
// As shipped it FAILs every case; fill in the two holes until it prints PASS. Then read
// prefill_attention.cuh to see what the real stage adds (4 warps sharing K/V tiles, the
// cp.async pipeline, GQA rows, causal tile skipping, the page table).
//
//     cmake --build build --target flashstep_exercise_04_tensor_core
//     build/bin/flashstep_exercise_04_tensor_core
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/mma.cuh"
#include "flashstep/kernels/state.cuh"
#include "harness/validate.hpp"
#include "stage.hpp"

namespace {

using namespace flashstep;
using namespace flashstep::stages;
using bf16 = __nv_bfloat16;

constexpr int kHeadDim = 64;
constexpr int kRows = 16;  // query rows of the warp = keys per tile

struct ExerciseParams {
  const bf16 *q, *k, *v;  ///< q (nnz_qo, Hq, 64); k, v (nnz_kv, Hkv, 64)
  const int32_t *qo_indptr, *kv_indptr;
  bf16* o;     ///< (nnz_qo, Hq, 64)
  float* lse;  ///< (nnz_qo, Hq)
  int num_qo_heads, num_kv_heads, group_size;
  float sm_scale_log2;
};

/// TODO(exercise) 1 — the swizzle. Return the element offset of 16-byte chunk `chunk`
/// (0..7) of row `row` in a 64-element-wide tile, with the chunk index XOR-ed with the
/// row's low 3 bits so that 8 consecutive rows' chunk c land in 8 different bank groups
/// (kernels/mma.cuh explains why).
__device__ uint32_t swizzle(uint32_t row, uint32_t chunk) {
  return row * kHeadDim;  // placeholder: every chunk of a row lands on chunk 0
}

/// TODO(exercise) 2 — the accumulator fragment of mma.m16n8k16: lane `lane` holds 4
/// floats c[0..3] of a 16 x 8 tile. Return the row (0..15) and column (0..7) of c[e].
/// (Lane l is in group g = l / 4 at place t = l % 4; see kernels/mma.cuh.)
__device__ int fragment_row(int lane, int e) { return 0; }
__device__ int fragment_col(int lane, int e) { return 0; }

/// One 16 x 64 tile from global rows (zero past `valid_rows`) into swizzled smem.
__device__ void load_tile(bf16* smem, const bf16* src, int64_t row_stride, int valid_rows) {
  const int lane = threadIdx.x;
  for (int i = lane; i < kRows * 8; i += 32) {
    const int row = i / 8, chunk = i % 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row < valid_rows) x = *reinterpret_cast<const uint4*>(src + row * row_stride + chunk * 8);
    *reinterpret_cast<uint4*>(smem + swizzle(row, chunk)) = x;
  }
}

__global__ void exercise_prefill(ExerciseParams p) {
  __shared__ __align__(128) bf16 q_s[kRows * kHeadDim], k_s[kRows * kHeadDim], v_s[kRows * kHeadDim];
  const int tile = blockIdx.x, head = blockIdx.y, b = blockIdx.z, lane = threadIdx.x;
  const int qo_begin = p.qo_indptr[b], qo_len = p.qo_indptr[b + 1] - qo_begin;
  const int kv_begin = p.kv_indptr[b], kv_len = p.kv_indptr[b + 1] - kv_begin;
  if (tile * kRows >= qo_len) return;
  const int kv_head = head / p.group_size;
  const int64_t q_stride = int64_t{p.num_qo_heads} * kHeadDim, kv_stride = int64_t{p.num_kv_heads} * kHeadDim;
  load_tile(q_s, p.q + (qo_begin + tile * kRows) * q_stride + head * kHeadDim, q_stride, qo_len - tile * kRows);

  float o[kHeadDim / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows g and g + 8
  for (int kv0 = 0; kv0 < kv_len; kv0 += kRows) {
    __syncwarp();
    load_tile(k_s, p.k + (kv_begin + kv0) * kv_stride + kv_head * kHeadDim, kv_stride, kv_len - kv0);
    load_tile(v_s, p.v + (kv_begin + kv0) * kv_stride + kv_head * kHeadDim, kv_stride, kv_len - kv0);
    __syncwarp();
    // S = Q K^T: 16 rows x 16 keys = two n-tiles.
    float s[2][4] = {};
    for (int kd = 0; kd < kHeadDim / 16; ++kd) {
      uint32_t a[4], b[4];
      kernels::ldmatrix_x4(a, kernels::smem_u32(q_s + swizzle(lane % 16, kd * 2 + lane / 16)));
      kernels::ldmatrix_x4(b, kernels::smem_u32(k_s + swizzle((lane / 16) * 8 + lane % 8, kd * 2 + (lane / 8) % 2)));
      kernels::mma_m16n8k16<bf16>(s[0], a, b[0], b[1]);
      kernels::mma_m16n8k16<bf16>(s[1], a, b[2], b[3]);
    }
    // Online softmax, base 2; row slot 0 is row g, slot 1 row g + 8.
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < 2; ++n)
      for (int e = 0; e < 4; ++e) {
        const int key = kv0 + n * 8 + fragment_col(lane, e);
        s[n][e] = key < kv_len ? s[n][e] * p.sm_scale_log2 : -INFINITY;
        const int slot = fragment_row(lane, e) / 8;
        tile_max[slot] = fmaxf(tile_max[slot], s[n][e]);
      }
    float scale[2];
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
      const float m_new = fmaxf(m[h], tile_max[h]);
      scale[h] = exp2f(m[h] - m_new);  // every tile has key kv0, so m_new is finite
      m[h] = m_new;
      l[h] *= scale[h];
    }
    for (int n = 0; n < 2; ++n)
      for (int e = 0; e < 4; ++e) {
        const int slot = fragment_row(lane, e) / 8;
        s[n][e] = exp2f(s[n][e] - m[slot]);
        l[slot] += s[n][e];
      }
    for (int n = 0; n < kHeadDim / 8; ++n)
      for (int e = 0; e < 4; ++e) o[n][e] *= scale[fragment_row(lane, e) / 8];
    // O += P V, P from registers as the A operand.
    const uint32_t a[4] = {kernels::pack2<bf16>(s[0][0], s[0][1]), kernels::pack2<bf16>(s[0][2], s[0][3]),
                           kernels::pack2<bf16>(s[1][0], s[1][1]), kernels::pack2<bf16>(s[1][2], s[1][3])};
    for (int d2 = 0; d2 < kHeadDim / 16; ++d2) {
      uint32_t b[4];
      kernels::ldmatrix_x4_trans(b,
                                 kernels::smem_u32(v_s + swizzle((lane / 8) % 2 * 8 + lane % 8, d2 * 2 + lane / 16)));
      kernels::mma_m16n8k16<bf16>(o[2 * d2], a, b[0], b[1]);
      kernels::mma_m16n8k16<bf16>(o[2 * d2 + 1], a, b[2], b[3]);
    }
  }
  // l over the row's 4 lanes, then o / l and lse.
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  for (int n = 0; n < kHeadDim / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = fragment_row(lane, e), slot = row / 8, token = tile * kRows + row;
      if (token >= qo_len) continue;
      const int64_t out = (qo_begin + token) * q_stride + head * kHeadDim + n * 8 + fragment_col(lane, e);
      p.o[out] = __float2bfloat16(l[slot] > 0.f ? o[n][e] / l[slot] : 0.f);
      if (n == 0 && fragment_col(lane, e) == 0)
        p.lse[(qo_begin + token) * int64_t{p.num_qo_heads} + head] = l[slot] > 0.f
                                                                         ? (m[slot] + log2f(l[slot])) * kernels::kLn2
                                                                         : -INFINITY;
    }
}

class ExerciseRunner : public StageRunner {
 public:
  void plan(const BatchShape& shape, void*, size_t, cudaStream_t) override { shape_ = shape; }
  void run(const DeviceBatch& batch, cudaStream_t stream) override {
    int max_qo = 0;
    for (int b = 0; b < shape_.batch_size; ++b)
      max_qo = std::max(max_qo, shape_.qo_indptr[b + 1] - shape_.qo_indptr[b]);
    if (max_qo == 0) return;
    ExerciseParams p{static_cast<const bf16*>(batch.q),
                     static_cast<const bf16*>(batch.k),
                     static_cast<const bf16*>(batch.v),
                     batch.qo_indptr,
                     batch.kv_indptr,
                     static_cast<bf16*>(batch.o),
                     batch.lse,
                     shape_.num_qo_heads,
                     shape_.num_kv_heads,
                     shape_.group_size(),
                     shape_.resolved_sm_scale() * kernels::kLog2e};
    const dim3 grid((max_qo + kRows - 1) / kRows, shape_.num_qo_heads, shape_.batch_size);
    exercise_prefill<<<grid, 32, 0, stream>>>(p);
    kernels::check_launch("exercise_prefill");
  }

 private:
  BatchShape shape_;
};

}  // namespace

int main() {
  StageInfo stage;
  stage.name = "04_exercise";
  stage.summary = "the exercise's tensor-core prefill";
  stage.modes = {Mode::prefill};
  stage.storage = KVStorage::ragged;
  stage.dtypes = {DType::bf16};
  stage.head_dims = {kHeadDim};
  stage.kv_layouts = {KVLayout::NHD};
  stage.max_group_size = 8;
  stage.make_runner = [] { return std::make_unique<ExerciseRunner>(); };

  std::vector<harness::CaseSpec> cases;
  for (int qo_len : {1, 16, 40})
    for (int kv_len : {5, 16, 100}) {
      harness::CaseSpec c;
      c.mode = Mode::prefill;
      c.dtype = DType::bf16;
      c.batch_size = 3;
      c.qo_len = qo_len;
      c.kv_len = kv_len;
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim = kHeadDim;
      cases.push_back(c);
    }
  return harness::run_exercise(stage, cases, 4);
}
