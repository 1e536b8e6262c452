// Stage 07 — Hopper prefill: the planner, the tensor maps, the launcher and the registry entry.
//
// The kernel (hopper_attention.cuh) is instantiated for fp16 and bf16 x head_dim 64 and
// 128; causal is a run-time flag. The tensor maps are encoded in run(), where the device
// pointers are known (a few microseconds of host work, captured by value in a CUDA graph).
//
// How to run it: `ctest -L gpu` validates it on the prefill grids of the registry;
// `flashstep_bench --shapes=bench/shapes_prefill.csv` times it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>

#include "04_tensor_core/tensor_core.hpp"  // kMaxPageSize
#include "07_hopper/hopper.hpp"
#include "07_hopper/hopper_attention.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::hopper {

namespace {

constexpr int kBr = 128;  // HopperTraits::Br

/// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found == cudaDriverEntryPointSuccess) encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  ref::require(encode != nullptr, "HopperRunner::run", "the driver has no cuTensorMapEncodeTiled");
  return encode;
}

/// A (tokens, heads, head_dim) tensor as a 3-D tensor map read in boxes of
/// (64 columns, box_heads heads, box_tokens tokens), written to shared memory with the
/// 128-byte swizzle that wgmma's descriptors expect.
CUtensorMap make_map(const void* base, DType dtype, int64_t tokens, int heads, int head_dim, int box_heads,
                     int box_tokens) {
  CUtensorMap map;
  const size_t elem = 2;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(std::max<int64_t>(tokens, 1))};
  const cuuint64_t strides[2] = {cuuint64_t(head_dim) * elem, cuuint64_t(heads) * head_dim * elem};  // bytes, dims 1, 2
  const cuuint32_t box[3] = {64, cuuint32_t(box_heads), cuuint32_t(box_tokens)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
      const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ref::require(r == CUDA_SUCCESS, "HopperRunner::run",
               "cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) +
                   "): q, k and v must be 16-byte aligned");
  return map;
}

/// What a captured graph freezes of run(): the grid, and the tensor maps, whose sizes are
/// the batch's nnz_qo and nnz_kv (a map describes the whole of q, k or v).
std::string launch_of(const Schedule& s, const BatchShape& shape) {
  return "stage 07: " + std::to_string(s.num_items()) + " work items x " + std::to_string(shape.num_kv_heads) +
         " kv heads, nnz_qo " + std::to_string(shape.nnz_qo()) + ", nnz_kv " +
         std::to_string(shape.kv_indptr.empty() ? 0 : shape.kv_indptr.back());
}

template <typename T, int HEAD_DIM, bool PAGED>
void launch(const BatchShape& s, const Schedule& sched, const uint8_t* ws, const DeviceBatch& batch,
            cudaStream_t stream) {
  using Tr = HopperTraits<T, HEAD_DIM, PAGED>;
  const int group = s.group_size();
  HopperParams p;
  p.q_map = make_map(batch.q, s.dtype, s.nnz_qo(), s.num_qo_heads, HEAD_DIM, group, Tr::Br / group);
  if constexpr (PAGED) {
    p.kv = kernels::make_paged_kv(static_cast<const uint16_t*>(batch.kv_pool), batch.kv_indptr, batch.kv_indices,
                                  batch.kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM,
                                  s.kv_layout == KVLayout::HND);
  } else {
    p.k_map = make_map(batch.k, s.dtype, s.kv_indptr.back(), s.num_kv_heads, HEAD_DIM, 1, Tr::Bc);
    p.v_map = make_map(batch.v, s.dtype, s.kv_indptr.back(), s.num_kv_heads, HEAD_DIM, 1, Tr::Bc);
    p.kv_indptr = batch.kv_indptr;
  }
  p.qo_indptr = batch.qo_indptr;
  p.request_indices = reinterpret_cast<const int32_t*>(ws);
  p.qo_tile_indices = reinterpret_cast<const int32_t*>(ws + align_up(sched.num_items() * sizeof(int32_t)));
  p.o = batch.o;
  p.lse = batch.lse;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.group_size = group;
  p.causal = s.mode == Mode::prefill && s.causal;
  p.score_scale = s.resolved_sm_scale() * kernels::kLog2e;
  hopper_attention_kernel<T, HEAD_DIM, PAGED>
      <<<static_cast<unsigned>(sched.num_items() * s.num_kv_heads), Tr::kThreads, Tr::smem_bytes(), stream>>>(p);
  kernels::check_launch("hopper_attention_kernel");
}

/// The kernel's dynamic shared-memory limit raised to what it uses (a host call: plan()
/// makes it, run() does not).
template <typename T, int HEAD_DIM, bool PAGED>
void set_smem_limit() {
  FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(hopper_attention_kernel<T, HEAD_DIM, PAGED>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(HopperTraits<T, HEAD_DIM, PAGED>::smem_bytes())));
}

/// Calls f(T{}, head_dim, paged) for the batch's element type, head_dim and storage, the
/// last two as std::integral_constant (the kernel's template arguments).
template <typename F>
void dispatch(const BatchShape& s, F&& f) {
  auto by_dim = [&](auto t) {
    // over pages head_dim 128 only (stage_info() says why)
    if (s.head_dim == 64 && s.storage == KVStorage::ragged)
      return f(t, std::integral_constant<int, 64>{}, std::false_type{});
    if (s.head_dim == 128 && s.storage == KVStorage::ragged)
      return f(t, std::integral_constant<int, 128>{}, std::false_type{});
    if (s.head_dim == 128) return f(t, std::integral_constant<int, 128>{}, std::true_type{});
    ref::require(false, "HopperRunner", "no kernel for " + s.describe());
  };
  if (s.dtype == DType::bf16) return by_dim(__nv_bfloat16{});
  if (s.dtype == DType::f16) return by_dim(__half{});
  ref::require(false, "HopperRunner", "no kernel for " + s.describe());
}

}  // namespace

std::string hopper_unavailable_reason() {
#ifndef FLASHSTEP_HAS_SM90A
  return "stage 07 needs sm_90a code (wgmma, setmaxnreg): build with CMAKE_CUDA_ARCHITECTURES containing 90a";
#else
  static const std::string reason = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      cudaGetLastError();
      return std::string("stage 07 needs a Hopper GPU (sm_90a); no CUDA device could be queried");
    }
    if (major != 9 || minor != 0)
      return "stage 07 needs a Hopper GPU (sm_90a: H100, H200); this one is sm_" + std::to_string(major) +
             std::to_string(minor);
    return std::string();
  }();
  return reason;
#endif
}

Schedule HopperRunner::make_schedule(const BatchShape& s) {
  const char* fn = "HopperRunner::plan";
  const std::string reason =
      (s.storage == KVStorage::paged ? stage_info() : ragged_stage_info()).unsupported_reason(s);
  ref::require(reason.empty(), fn, reason);
  ref::require(static_cast<int>(s.qo_indptr.size()) == s.batch_size + 1 &&
                   static_cast<int>(s.kv_indptr.size()) == s.batch_size + 1,
               fn, "qo_indptr and kv_indptr must have batch_size + 1 entries");
  Schedule sched;
  sched.Br = kBr;
  const int64_t group = s.group_size();
  struct Item {
    int32_t request, tile;
    int64_t keys;
  };
  std::vector<Item> items;
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b], kv_len = s.kv_len(b);
    const int64_t tiles = (qo_len * group + kBr - 1) / kBr;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      int64_t keys = kv_len;
      if (s.causal) {
        const int64_t last_token = std::min((tile + 1) * kBr, qo_len * group) / group - 1;
        keys = std::clamp<int64_t>(last_token + kv_len - qo_len + 1, 0, kv_len);
      }
      items.push_back({b, static_cast<int32_t>(tile), keys});
    }
  }
  // Longest first: the last wave is made of short blocks, so the chip empties evenly.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.keys > b.keys; });
  ref::require(static_cast<int64_t>(items.size()) * s.num_kv_heads < (int64_t{1} << 31), fn,
               "too many work items for one grid");
  for (const Item& it : items) {
    sched.request_indices.push_back(it.request);
    sched.qo_tile_indices.push_back(it.tile);
  }
  return sched;
}

size_t HopperRunner::workspace_bytes(const BatchShape& shape) const {
  const int64_t items = make_schedule(shape).num_items();
  return 2 * align_up(static_cast<size_t>(items) * sizeof(int32_t));
}

void HopperRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  const char* fn = "HopperRunner::plan";
  Schedule sched = make_schedule(shape);
  captured_.check_plan(fn, launch_of(sched, shape));
  const size_t half = align_up(static_cast<size_t>(sched.num_items()) * sizeof(int32_t));
  ref::require(workspace_size >= 2 * half && (workspace != nullptr || half == 0), fn,
               "workspace holds " + std::to_string(workspace_size) + " bytes, the plan needs " +
                   std::to_string(2 * half));
  schedule_ = std::move(sched);
  shape_ = shape;
  workspace_ = static_cast<uint8_t*>(workspace);
  dispatch(shape, [](auto t, auto d, auto paged) { set_smem_limit<decltype(t), d(), paged()>(); });
  if (half == 0) return;
  // The schedule, staged in one host buffer and copied once.
  std::vector<uint8_t> staged(2 * half, 0);
  std::memcpy(staged.data(), schedule_.request_indices.data(), schedule_.request_indices.size() * sizeof(int32_t));
  std::memcpy(staged.data() + half, schedule_.qo_tile_indices.data(), schedule_.qo_tile_indices.size() * sizeof(int32_t));
  FLASHSTEP_CUDA_CHECK(cudaMemcpyAsync(workspace_, staged.data(), staged.size(), cudaMemcpyHostToDevice, stream));
  // Pageable source: wait so that `staged` may go when this returns.
  FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void HopperRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  captured_.on_run(stream, [&] { return launch_of(schedule_, shape_); });
  if (schedule_.num_items() == 0) return;
  dispatch(shape_, [&](auto t, auto d, auto paged) {
    launch<decltype(t), d(), paged()>(shape_, schedule_, workspace_, batch, stream);
  });
}

namespace {
/// What both registry entries share.
StageInfo common_info(const std::string& name) {
  StageInfo s;
  s.name = name;
  s.modes = {Mode::prefill};
  s.dtypes = {DType::f16, DType::bf16};
  s.head_dims = {64, 128};
  s.max_group_size = 32;
  s.causal = true;
  // Not CUDA-graph safe: the grid follows the lengths (one block per work item), and the
  // tensor maps a graph captures hold the batch's nnz_qo (and, ragged, nnz_kv).
  s.cuda_graph = false;
  s.rules = [name](const BatchShape& shape) -> std::string {
    // the query box is (64, group, 128 / group): a token's group rows never straddle a tile
    if (kBr % shape.group_size() != 0) return name + " needs a GQA group that divides 128";
    return hopper_unavailable_reason();
  };
  return s;
}
}  // namespace

StageInfo stage_info() {
  StageInfo s = common_info("07_hopper");
  s.summary = "prefill on Hopper over paged K/V: the producer warp group gathers pages with cp.async, "
              "wgmma, two consumer warp groups";
  s.storage = KVStorage::paged;
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = tensor_core::kMaxPageSize;
  // head_dim 64 over pages ran at 0.88x stage 04 on an H100 (the chapter's table): a 128-byte
  // row costs the gather as much as a 256-byte one, for half the math. Stage 04 keeps it.
  s.head_dims = {128};
  s.make_runner = [] { return std::make_unique<HopperRunner>(); };
  return s;
}

StageInfo ragged_stage_info() {
  StageInfo s = common_info("07_hopper_ragged");
  s.summary = "prefill on Hopper: TMA into 128-byte swizzled tiles, wgmma, a producer and two consumer warp groups";
  s.storage = KVStorage::ragged;
  s.kv_layouts = {KVLayout::NHD};
  s.make_runner = [] { return std::make_unique<HopperRunner>(); };
  return s;
}

}  // namespace flashstep::stages::hopper
