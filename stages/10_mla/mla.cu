// MLA's plan() and run() (mla.hpp), over the kernel of mla_decode.cuh.
//   plan()  on the host: the tile (64 rows where the device's shared memory and the batch's
//           rows allow it, else 16), the KV split (chunks when the tiles do not fill the
//           GPU), the work items longest first, and the merge's row offsets; copied into
//           the workspace once.
//   run()   launches only: mla_decode_kernel, then stage 03's merge_states_kernel when the
//           plan split the keys.
#include "10_mla/mla.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "03_split_kv/merge_states.cuh"
#include "07_hopper/hopper.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "10_mla/mla_decode.cuh"
#include "10_mla/mla_hopper.cuh"

namespace flashstep::stages::mla {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

/// The first rule `shape` breaks on `f`, "" when none (the text unsupported_reason returns).
std::string shape_reason(const MlaShape& s, const MlaDevice& f) {
  if (f.major < 8)
    return "MLA needs sm_80 or later (mma.sync on bf16, cp.async); this GPU is sm_" + std::to_string(f.major) +
           std::to_string(f.minor);
  if (f.smem_optin < MlaNarrowTile::smem_bytes())
    return "MLA needs " + std::to_string(MlaNarrowTile::smem_bytes()) +
           " bytes of shared memory a block; this GPU allows " + std::to_string(f.smem_optin);
  if (s.dtype != DType::f16 && s.dtype != DType::bf16)
    return std::string("dtype must be f16 or bf16 (got ") + to_string(s.dtype) + ")";
  if (s.head_dim_ckv != kLatentDim)
    return "head_dim_ckv must be " + std::to_string(kLatentDim) + ", the latent width the kernel is built for (got " +
           std::to_string(s.head_dim_ckv) + ")";
  if (s.head_dim_kpe != kRopeDim)
    return "head_dim_kpe must be " + std::to_string(kRopeDim) + ", the rotary width the kernel is built for (got " +
           std::to_string(s.head_dim_kpe) + ")";
  if (s.num_heads < 1 || s.num_heads > kMaxHeads)
    return "num_heads must be in 1.." + std::to_string(kMaxHeads) + " (got " + std::to_string(s.num_heads) + ")";
  if (s.page_size < 1) return "page_size must be >= 1 (got " + std::to_string(s.page_size) + ")";
  if (s.num_pages < 1) return "num_pages must be >= 1 (got " + std::to_string(s.num_pages) + ")";
  if (!(s.sm_scale > 0.f) || !std::isfinite(s.sm_scale))
    return "sm_scale must be positive and finite, 1/sqrt(head_dim_nope + rope_dim) for a model (got " +
           std::to_string(s.sm_scale) + ")";
  if (s.forced_chunk_keys < 0 || s.forced_chunk_keys % kTileKeys != 0)
    return "forced_chunk_keys must be 0 or a positive multiple of " + std::to_string(kTileKeys) + " (got " +
           std::to_string(s.forced_chunk_keys) + ")";
  if (s.batch_size < 1) return "batch_size must be >= 1 (got " + std::to_string(s.batch_size) + ")";
  const size_t b = static_cast<size_t>(s.batch_size);
  if (s.qo_indptr.size() != b + 1)
    return "qo_indptr must have batch_size + 1 = " + std::to_string(b + 1) + " entries (got " +
           std::to_string(s.qo_indptr.size()) + ")";
  if (s.kv_indptr.size() != b + 1)
    return "kv_indptr must have batch_size + 1 = " + std::to_string(b + 1) + " entries (got " +
           std::to_string(s.kv_indptr.size()) + ")";
  if (s.kv_len.size() != b)
    return "kv_len must have batch_size = " + std::to_string(b) + " entries (got " + std::to_string(s.kv_len.size()) +
           ")";
  if (s.qo_indptr[0] != 0) return "qo_indptr[0] must be 0 (got " + std::to_string(s.qo_indptr[0]) + ")";
  if (s.kv_indptr[0] != 0) return "kv_indptr[0] must be 0 (got " + std::to_string(s.kv_indptr[0]) + ")";
  for (size_t i = 0; i < b; ++i) {
    const int64_t qo = int64_t(s.qo_indptr[i + 1]) - s.qo_indptr[i];
    const int64_t pages = int64_t(s.kv_indptr[i + 1]) - s.kv_indptr[i];
    const std::string at = "[" + std::to_string(i) + "]";
    if (qo < 0) return "qo_indptr must not decrease (qo_indptr" + at + " > the next)";
    if (pages < 0) return "kv_indptr must not decrease (kv_indptr" + at + " > the next)";
    if (s.kv_len[i] < 0) return "kv_len" + at + " must be >= 0 (got " + std::to_string(s.kv_len[i]) + ")";
    if (s.kv_len[i] > pages * s.page_size)
      return "kv_len" + at + " = " + std::to_string(s.kv_len[i]) + " does not fit its " + std::to_string(pages) +
             " pages of " + std::to_string(s.page_size);
    if (pages > 0 && s.kv_len[i] <= (pages - 1) * s.page_size)
      return "kv_len" + at + " = " + std::to_string(s.kv_len[i]) + " leaves its last page empty (" +
             std::to_string(pages) + " pages of " + std::to_string(s.page_size) + ")";
    if (qo * s.num_heads > (int64_t{1} << 30)) return "qo_indptr: request " + std::to_string(i) + " has too many rows";
  }
  return "";
}

/// Offsets of the workspace, recomputed in run() from the plan's sizes.
struct Layout {
  size_t items = 0, o_indptr = 0, partial_o = 0, partial_lse = 0;
};

Layout layout_of(const MlaShape& s, const MlaPlanInfo& info) {
  Layout l;
  l.o_indptr = align_up(size_t(info.work_items) * sizeof(MlaWorkItem));
  const size_t o_indptr_entries = info.partial_rows > 0 ? size_t(s.nnz_qo()) + 1 : 0;
  l.partial_o = l.o_indptr + align_up(o_indptr_entries * sizeof(int32_t));
  l.partial_lse = l.partial_o + align_up(size_t(info.partial_rows) * s.num_heads * kLatentDim * sizeof(float));
  return l;
}

MlaSchedule plan_of(const MlaShape& s, const MlaDevice& f) {
  MlaSchedule plan;
  const int b = s.batch_size;
  int max_rows = 0;
  for (int i = 0; i < b; ++i) max_rows = std::max(max_rows, (s.qo_indptr[i + 1] - s.qo_indptr[i]) * s.num_heads);
  // On Hopper the wgmma kernel's 64-row tile (mla_hopper.cuh), however few the rows: with 16
  // heads its two 64-key buffers keep more of the cache in flight than two 16-row mma.sync
  // blocks an SM (296 against 319 us at batch 128 x 8192, the chapter's v12), though 48 of
  // its 64 rows are padding. Elsewhere mma.sync: 64 rows when a request has more than 16 and
  // the GPU has the shared memory, else 16.
  const bool wgmma = !s.portable_only && f.major == 9 && f.minor == 0 && f.hopper_build &&
                     f.smem_optin >= MlaHopperTile::smem_bytes();
  const bool wide = wgmma || (max_rows > 16 && f.smem_optin >= MlaWideTile::smem_bytes());
  const int rows = wide ? MlaWideTile::kRows : MlaNarrowTile::kRows;
  plan.info.rows_per_tile = rows;
  plan.info.kernel = wgmma ? "wgmma" : "mma_sync";
  plan.info.programmatic_merge = f.major >= 9;

  std::vector<int> tiles(b);
  int64_t units = 0;
  int max_kv = 0;
  for (int i = 0; i < b; ++i) {
    const int qo_rows = (s.qo_indptr[i + 1] - s.qo_indptr[i]) * s.num_heads;
    tiles[i] = (qo_rows + rows - 1) / rows;
    units += tiles[i];
    if (tiles[i] > 0) max_kv = std::max(max_kv, s.kv_len[i]);
  }
  // The split: a block per tile is one wave or more (the 16-row tile fits twice on an SM)
  // -> none; else each request's keys in about (slots / units) chunks, whole 32-key tiles,
  // at least 128 keys a chunk (a chunk also pays its Q tile's copy and a merge row).
  const size_t block_smem = wgmma  ? MlaHopperTile::smem_bytes()
                            : wide ? MlaWideTile::smem_bytes()
                                   : MlaNarrowTile::smem_bytes();
  // blocks an SM holds by shared memory (1 KB of it is the system's, per block)
  const int64_t slots = int64_t(f.num_sm) * std::max<int64_t>(1, int64_t(f.smem_per_sm / (block_smem + 1024)));
  int chunk = s.forced_chunk_keys;
  if (chunk == 0 && units > 0 && units < slots && max_kv > 0) {
    const int64_t per = slots / units;
    if (per >= 2) {
      chunk = static_cast<int>((max_kv + per - 1) / per);
      chunk = std::max(128, (chunk + kTileKeys - 1) / kTileKeys * kTileKeys);
      if (chunk >= max_kv) chunk = 0;
    }
  }
  const bool split = chunk > 0;
  plan.info.chunk_keys = chunk;

  // Partial slots: request i's token t, chunk c -> slot_base[i] + t * chunks[i] + c.
  std::vector<int> chunks(b, 1), slot_base(b, -1);
  int64_t slots_used = 0;
  if (split) {
    plan.o_indptr.assign(s.nnz_qo() + 1, 0);
    for (int i = 0; i < b; ++i) {
      chunks[i] = std::max(1, (s.kv_len[i] + chunk - 1) / chunk);
      slot_base[i] = static_cast<int>(slots_used);
      for (int t = s.qo_indptr[i]; t < s.qo_indptr[i + 1]; ++t) {
        plan.o_indptr[t] = static_cast<int32_t>(slots_used);
        slots_used += chunks[i];
      }
    }
    plan.o_indptr[s.nnz_qo()] = static_cast<int32_t>(slots_used);
    ref::require(slots_used < (int64_t{1} << 31) / std::max(1, s.num_heads), "MlaRunner::plan",
                 "the split needs too many partial rows");
  }
  plan.info.partial_rows = split ? slots_used : 0;

  // Work items, longest request first; a request's row tiles of one chunk side by side,
  // so the blocks that read the same latents run together and share them through L2.
  std::vector<int> order(b);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return s.kv_len[x] > s.kv_len[y]; });
  for (int i : order) {
    const int qo_len = s.qo_indptr[i + 1] - s.qo_indptr[i];
    for (int c = 0; c < chunks[i]; ++c) {
      const int begin = split ? c * chunk : 0;
      const int end = split ? std::min(s.kv_len[i], begin + chunk) : s.kv_len[i];
      for (int t = 0; t < tiles[i]; ++t)
        plan.items.push_back(MlaWorkItem{s.qo_indptr[i], qo_len, t * rows, s.kv_len[i], begin, end, s.kv_indptr[i],
                                         slot_base[i], c, chunks[i]});
    }
  }
  plan.info.work_items = static_cast<int64_t>(plan.items.size());

  const Layout l = layout_of(s, plan.info);
  plan.workspace_bytes = std::max<size_t>(kAlign,
                                          l.partial_lse + align_up(size_t(slots_used) * s.num_heads * sizeof(float)));
  return plan;
}

/// Launches the attention kernel of the plan (Tile: the mma.sync configuration, or
/// MlaHopperTile), then the merge when the plan split the keys.
template <typename T, typename Tile>
void launch_kernels(const MlaShape& s, const MlaBatch& b, const MlaPlanInfo& info, unsigned char* ws,
                    cudaStream_t stream) {
  const Layout l = layout_of(s, info);
  MlaParams<T> p;
  p.q_nope = static_cast<const T*>(b.q_nope);
  p.q_pe = static_cast<const T*>(b.q_pe);
  p.ckv = static_cast<const T*>(b.ckv_pages);
  p.kpe = static_cast<const T*>(b.kpe_pages);
  p.kv_indices = b.kv_indices;
  p.o = static_cast<T*>(b.o);
  p.lse = b.lse;
  p.items = reinterpret_cast<const MlaWorkItem*>(ws + l.items);
  const bool split = info.partial_rows > 0;
  if (split) {
    p.partial_o = reinterpret_cast<float*>(ws + l.partial_o);
    p.partial_lse = reinterpret_cast<float*>(ws + l.partial_lse);
  }
  p.num_heads = s.num_heads;
  p.page_size = s.page_size;
  p.causal = s.causal;
  p.scale_log2 = s.sm_scale * 1.4426950408889634f;
  if (info.work_items > 0) {
    if constexpr (std::is_same_v<Tile, MlaHopperTile>) {
      mla_hopper_kernel<T><<<static_cast<unsigned>(info.work_items), Tile::kThreads, Tile::smem_bytes(), stream>>>(p);
      kernels::check_launch("mla_hopper_kernel");
    } else {
      mla_decode_kernel<T, Tile::kRowGroupsOf, Tile::kColSplitOf>
          <<<static_cast<unsigned>(info.work_items), Tile::kThreads, Tile::smem_bytes(), stream>>>(p);
      kernels::check_launch("mla_decode_kernel");
    }
  }
  if (split && s.nnz_qo() > 0)  // stage 03's merge, at 512 columns, a programmatic launch on sm_90
    split_kv::launch_merge<T, kLatentDim>(p.partial_o, p.partial_lse, reinterpret_cast<const int32_t*>(ws + l.o_indptr),
                                          p.o, b.lse, s.num_heads, static_cast<int>(s.nnz_qo()),
                                          info.programmatic_merge, stream, "merge_states_kernel (MLA)");
}

template <typename T>
void allow_smem(bool wgmma) {
  if (wgmma)
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(mla_hopper_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(MlaHopperTile::smem_bytes())));
  FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel<T, 4, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(MlaWideTile::smem_bytes())));
  FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(mla_decode_kernel<T, 1, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(MlaNarrowTile::smem_bytes())));
}

}  // namespace

MlaDevice query_device(int device) {
  MlaDevice f;
  if (device < 0) FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  int optin = 0, per_sm = 0;
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&f.major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&f.minor, cudaDevAttrComputeCapabilityMinor, device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&f.num_sm, cudaDevAttrMultiProcessorCount, device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  f.smem_optin = static_cast<size_t>(optin);
  f.smem_per_sm = static_cast<size_t>(per_sm);
  f.hopper_build = hopper::hopper_unavailable_reason().empty();
  return f;
}

std::string unsupported_reason(const MlaShape& shape, const MlaDevice& device) { return shape_reason(shape, device); }

std::string unsupported_reason(const MlaShape& shape, int device) { return shape_reason(shape, query_device(device)); }

MlaSchedule make_schedule(const MlaShape& shape, const MlaDevice& device, const char* fn) {
  const std::string why = shape_reason(shape, device);
  ref::require(why.empty(), fn, why);
  return plan_of(shape, device);
}

size_t MlaRunner::workspace_bytes(const MlaShape& shape) const {
  return make_schedule(shape, query_device(), "MlaRunner::workspace_bytes").workspace_bytes;
}

void MlaRunner::plan(const MlaShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  constexpr const char* fn = "MlaRunner::plan";
  const MlaSchedule plan = make_schedule(shape, query_device(), fn);
  ref::require(workspace != nullptr || plan.workspace_bytes == 0, fn, "workspace must not be null");
  ref::require(workspace_size >= plan.workspace_bytes, fn,
               "workspace_size = " + std::to_string(workspace_size) +
                   " is below workspace_bytes() = " + std::to_string(plan.workspace_bytes));
  const bool wgmma = std::string(plan.info.kernel) == "wgmma";
  if (shape.dtype == DType::bf16) allow_smem<__nv_bfloat16>(wgmma);
  else allow_smem<__half>(wgmma);
  // The work items and the merge's row offsets sit at the start of the workspace, one after
  // the other: laid out in pinned memory as there, and copied with one cudaMemcpyAsync that
  // plan() does not wait for (the staging waits for its previous copy before it is reused).
  const Layout l = layout_of(shape, plan.info);
  const size_t items_bytes = plan.items.size() * sizeof(MlaWorkItem);
  const size_t indptr_bytes = plan.o_indptr.size() * sizeof(int32_t);
  const size_t bytes = indptr_bytes > 0 ? l.o_indptr + indptr_bytes : items_bytes;
  uint8_t* staged = staging_.begin(bytes);
  if (items_bytes) std::memcpy(staged + l.items, plan.items.data(), items_bytes);
  if (indptr_bytes) std::memcpy(staged + l.o_indptr, plan.o_indptr.data(), indptr_bytes);
  staging_.upload(workspace, bytes, stream);
  shape_ = shape;
  info_ = plan.info;
  wgmma_ = wgmma;  // once here, not on every run()
  workspace_ = workspace;
  planned_ = true;
}

void MlaRunner::run(const MlaBatch& b, cudaStream_t stream) const {
  constexpr const char* fn = "MlaRunner::run";
  ref::require(planned_, fn, "plan() must come first");
  ref::require(b.q_nope != nullptr, fn, "q_nope must not be null");
  ref::require(b.q_pe != nullptr, fn, "q_pe must not be null");
  ref::require(b.ckv_pages != nullptr, fn, "ckv_pages must not be null");
  ref::require(b.kpe_pages != nullptr, fn, "kpe_pages must not be null");
  ref::require(b.kv_indices != nullptr || shape_.kv_indptr.back() == 0, fn, "kv_indices must not be null");
  ref::require(b.o != nullptr || shape_.nnz_qo() == 0, fn, "o must not be null");
  auto* ws = static_cast<unsigned char*>(workspace_);
  const bool wide = info_.rows_per_tile == MlaWideTile::kRows;
  if (wgmma_) {
    if (shape_.dtype == DType::bf16) launch_kernels<__nv_bfloat16, MlaHopperTile>(shape_, b, info_, ws, stream);
    else launch_kernels<__half, MlaHopperTile>(shape_, b, info_, ws, stream);
  } else if (shape_.dtype == DType::bf16) {
    if (wide) launch_kernels<__nv_bfloat16, MlaWideTile>(shape_, b, info_, ws, stream);
    else launch_kernels<__nv_bfloat16, MlaNarrowTile>(shape_, b, info_, ws, stream);
  } else {
    if (wide) launch_kernels<__half, MlaWideTile>(shape_, b, info_, ws, stream);
    else launch_kernels<__half, MlaNarrowTile>(shape_, b, info_, ws, stream);
  }
}

}  // namespace flashstep::stages::mla
