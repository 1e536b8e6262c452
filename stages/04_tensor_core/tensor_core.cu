// Stage 04 — tensor-core prefill: the planner, the launcher and the two registry entries.
//
// The kernel (prefill_attention.cuh) is instantiated for fp16 and bf16 x head_dim 64, 128
// and 256, each with 8 warps of one m16 tile (Br = 128), here; its instantiations under
// fp8/'s format, for an FP8 cache (e4m3, e5m2 K/V), are in tensor_core_fp8.cu. Causal, window, soft cap, storage
// and layout are run-time flags: uniform branches, no extra instantiations.
//
// How to run it: `ctest -L gpu` validates it on the prefill and decode grids;
// `flashstep_bench --shapes=bench/shapes_prefill.csv` times it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <type_traits>

#include "03_split_kv/merge_states.cuh"
#include "04_tensor_core/prefill_attention.cuh"
#include "04_tensor_core/prefill_launch.cuh"
#include "04_tensor_core/tensor_core.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::tensor_core {

// The FP8 instantiations are tensor_core_fp8.cu's, those under the features' policies (RoPE
// in the loads, sinks) tensor_core_policies.cu's, compiled beside this file.
FLASHSTEP_PREFILL_FP8_INSTANTIATIONS(extern template)
FLASHSTEP_PREFILL_POLICY_INSTANTIATIONS(extern template)

namespace {

constexpr int kBc = 64;

/// What a launch needs besides the kernel.
struct LaunchArgs {
  const BatchShape* shape;
  const Schedule* schedule;
  const WorkspaceLayout* layout;
  uint8_t* workspace;
  const DeviceBatch* batch;
  kernels::PolicyInputs policy;  // what a policy's hooks read (RoPE's turns, the run's sinks)
};

/// One instantiation (dtype x head_dim x K/V format x policy); its shared memory is
/// fixed by the instantiation, and prepare_prefill_attention both raises the limit and
/// asks the occupancy calculator.
using Entry = KernelEntry<LaunchArgs>;

template <typename T, int HEAD_DIM, typename Format, typename Policy = kernels::IdentityPolicy>
Entry kernel_entry() {
  using KV = typename Format::Stored;
  Entry e;
  e.smem_bytes = [](int, int) { return PrefillTraits<T, HEAD_DIM, Format>::smem_bytes(); };
  e.set_smem_limit = [](size_t) { prepare_prefill_attention<T, Format, Policy>(HEAD_DIM); };
  e.blocks_per_sm = [](size_t) { return prepare_prefill_attention<T, Format, Policy>(HEAD_DIM); };
  e.launch = [](const LaunchArgs& a, cudaStream_t stream) {
    const BatchShape& s = *a.shape;
    const DeviceBatch& batch = *a.batch;
    const WorkspaceLayout& w = *a.layout;
    uint8_t* ws = a.workspace;
    PrefillParams<T, KV> p;
    p.q = static_cast<const T*>(batch.q);
    p.qo_indptr = batch.qo_indptr;
    p.paged_kv = s.storage == KVStorage::paged;
    if (p.paged_kv) {
      p.paged = kernels::make_paged_kv(static_cast<const KV*>(batch.kv_pool), batch.kv_indptr, batch.kv_indices,
                                       batch.kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM,
                                       s.kv_layout == KVLayout::HND);
    } else {
      p.k = static_cast<const KV*>(batch.k);
      p.v = static_cast<const KV*>(batch.v);
      p.kv_indptr = batch.kv_indptr;
    }
    p.o = static_cast<T*>(batch.o);
    p.lse = batch.lse;
    p.request_indices = reinterpret_cast<const int32_t*>(ws + w.request_indices);
    p.qo_tile_indices = reinterpret_cast<const int32_t*>(ws + w.qo_tile_indices);
    p.kv_chunk_indices = reinterpret_cast<const int32_t*>(ws + w.kv_chunk_indices);
    p.kv_chunk_size = a.schedule->kv_chunk_size;
    p.partial_indptr = reinterpret_cast<const int32_t*>(ws + w.partial_indptr);
    p.partial_o = reinterpret_cast<float*>(ws + w.partial_o);
    p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse);
    p.num_qo_heads = s.num_qo_heads;
    p.num_kv_heads = s.num_kv_heads;
    p.group_size = s.group_size();
    p.causal = s.mode == Mode::prefill && s.causal;
    p.window_left = s.window_left;
    // An FP8 cache's k_scale joins sm_scale (one factor of the scores), its v_scale the
    // output's 1 / l (so a split's partial rows carry it, and the linear merge keeps it);
    // the run's scales when it gives them.
    p.set_score_transform(s.resolved_sm_scale() * run_k_scale(s, batch), s.logits_soft_cap);
    p.v_scale = run_v_scale(s, batch);
    launch_prefill_attention<T, Format, Policy>(p, HEAD_DIM, a.schedule->num_items(), stream,
                                                Policy::Params::from(a.policy));
    if (a.schedule->kv_chunk_size == 0) return;
    // stage 03's merge, one block per (query head, query token): a token's chunks by their lse
    split_kv::launch_merge<T, HEAD_DIM>(p.partial_o, p.partial_lse, p.partial_indptr, p.o, p.lse, s.num_qo_heads,
                                        static_cast<int>(s.nnz_qo()), false, stream);
  };
  return e;
}

/// The entry for q's element type T: fp16 and bf16 only (the mma.sync kernel has no fp32
/// instantiation, and none is compiled for it).
template <typename T>
Entry kernel_entry_of(DType dtype, DType kv_dtype, int head_dim) {
  if constexpr (sizeof(T) != 2) {
    throw ref::InvalidArgument("TensorCoreRunner::plan: dtype must be f16 or bf16 (got " +
                               std::string(to_string(dtype)) + ")");
  } else {
    FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
      FLASHSTEP_DISPATCH_KV_DTYPE(dtype, kv_dtype, T, KV, {
        if constexpr (std::is_same_v<KV, T>) return kernel_entry<T, HEAD_DIM, SameAsQ<T>>();
        else return kernel_entry<T, HEAD_DIM, fp8::Fp8Staged<T, KV>>();  // an FP8 pool: fp8/'s format
      });
    });
    return {};
  }
}

Entry kernel_entry_for(DType dtype, DType kv_dtype, int head_dim) {
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, { return kernel_entry_of<T>(dtype, kv_dtype, head_dim); });
}

/// The instantiation under `Policy` for fp16/bf16 q and K/V, the default ring.
template <typename Policy>
Entry policy_entry_for(const BatchShape& s) {
  FLASHSTEP_DISPATCH_HEAD_DIM(s.head_dim, HEAD_DIM, {
    if (s.dtype == DType::f16) return kernel_entry<__half, HEAD_DIM, SameAsQ<__half>, Policy>();
    return kernel_entry<__nv_bfloat16, HEAD_DIM, SameAsQ<__nv_bfloat16>, Policy>();
  });
  return {};
}

/// The entry for a shape: under ROPE_LLAMA the instantiation that rotates the Q and K
/// tiles (rope/'s policy: fp16/bf16 K/V, the default ring; the registry's rules refuse
/// the rest).
Entry entry_for(const BatchShape& s) {
  if (s.pos_encoding == PosEncoding::none) return kernel_entry_for(s.dtype, s.resolved_kv_dtype(), s.head_dim);
  return policy_entry_for<rope::RopeInLoads>(s);
}

/// Empty when a run of `s` may take sinks (sinks/'s policy); otherwise why not.
std::string sinks_reason(const BatchShape& s) {
  if (s.resolved_kv_dtype() != s.dtype) return "sinks need K/V in q's dtype (not an FP8 cache)";
  if (s.pos_encoding != PosEncoding::none) return "sinks and pos_encoding rope_llama do not combine";
  return {};
}

/// Work items of a CUDA-graph plan: enough for any lengths of batch_size requests and
/// nnz_qo queries, so the grid does not change between plans.
int64_t graph_capacity(const BatchShape& s, int br) {
  return (s.nnz_qo() * s.group_size() + br - 1) / br + std::max(0, s.batch_size - 1);
}

/// What a captured graph freezes of run(): the grid, the split and the workspace offsets.
std::string launch_of(const Schedule& s, const WorkspaceLayout& w, int num_kv_heads) {
  return "stage 04: " + std::to_string(s.num_items()) + " work items x " + std::to_string(num_kv_heads) +
         " kv heads, kv_chunk_size " + std::to_string(s.kv_chunk_size) + ", workspace " + std::to_string(w.bytes) +
         " bytes";
}

}  // namespace

template int prepare_prefill_attention<__half>(int);
template int prepare_prefill_attention<__nv_bfloat16>(int);
template void launch_prefill_attention<__half>(const PrefillParams<__half>&, int, int64_t, cudaStream_t,
                                               const kernels::IdentityPolicy::Params&);
template void launch_prefill_attention<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, int, int64_t, cudaStream_t,
                                                      const kernels::IdentityPolicy::Params&);

WorkspaceLayout layout_of(const Schedule& s, int num_qo_heads, int head_dim) {
  WorkspaceLayout w;
  const size_t items = static_cast<size_t>(s.num_items()) * sizeof(int32_t);
  w.request_indices = 0;
  w.qo_tile_indices = align_up(items);
  w.kv_chunk_indices = w.qo_tile_indices + align_up(items);
  w.partial_indptr = w.kv_chunk_indices + align_up(items);
  w.schedule_bytes = w.partial_indptr + s.partial_indptr.size() * sizeof(int32_t);
  const size_t rows = static_cast<size_t>(s.partial_rows()) * static_cast<size_t>(num_qo_heads);
  w.partial_o = align_up(w.schedule_bytes);
  w.partial_lse = w.partial_o + align_up(rows * static_cast<size_t>(head_dim) * sizeof(float));
  w.bytes = w.partial_lse + align_up(rows * sizeof(float));
  return w;
}

void upload_schedule(const Schedule& s, const WorkspaceLayout& w, ScheduleStaging& staging, void* workspace,
                     cudaStream_t stream) {
  if (w.schedule_bytes == 0) return;
  uint8_t* staged = staging.begin(w.schedule_bytes);
  auto put = [&](size_t offset, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(staged + offset, v.data(), v.size() * sizeof(int32_t));
  };
  put(w.request_indices, s.request_indices);
  put(w.qo_tile_indices, s.qo_tile_indices);
  put(w.kv_chunk_indices, s.kv_chunk_indices);
  put(w.partial_indptr, s.partial_indptr);
  staging.upload(workspace, w.schedule_bytes, stream);
}

void upload_schedule(const Schedule& s, const WorkspaceLayout& w, void* workspace, cudaStream_t stream) {
  ScheduleStaging staging;  // its destructor waits for the copy
  upload_schedule(s, w, staging, workspace, stream);
}

TensorCoreRunner::TensorCoreRunner(KVStorage storage, TensorCoreOptions options)
    : storage_(storage), options_(options) {}

std::string shared_memory_rule(const std::string& name, const BatchShape& shape) {
  const size_t available = device_smem_optin();
  if (available == 0) return {};
  const Entry e = entry_for(shape);
  const size_t needed = e.smem_bytes(0, 0);
  if (needed <= available) return {};
  const bool fp8 = shape.resolved_kv_dtype() != shape.dtype;
  return name + " needs " + std::to_string(needed) + " bytes of shared memory a block at head_dim " +
         std::to_string(shape.head_dim) + " (" + to_string(shape.dtype) +
         (fp8 ? std::string(" with an ") + to_string(shape.resolved_kv_dtype()) + " cache" : "") + "), more than the " +
         std::to_string(available) + " this GPU allows";
}

Schedule TensorCoreRunner::make_schedule(const BatchShape& s) const {
  const char* fn = "TensorCoreRunner::plan";
  const StageInfo info = storage_ == KVStorage::paged ? stage_info() : ragged_stage_info();
  const std::string reason = info.unsupported_reason(s);
  ref::require(reason.empty(), fn, reason);
  ref::require(options_.kv_chunk_size >= 0 && options_.kv_chunk_size % kBc == 0, fn,
               "kv_chunk_size must be 0 (auto) or a positive multiple of 64 (got " +
                   std::to_string(options_.kv_chunk_size) + ")");
  ref::require(static_cast<int>(s.qo_indptr.size()) == s.batch_size + 1, fn,
               "qo_indptr must have batch_size + 1 entries");
  ref::require(static_cast<int>(s.kv_indptr.size()) == s.batch_size + 1, fn,
               "kv_indptr must have batch_size + 1 entries");

  Schedule sched;
  sched.Br = 128;  // PrefillTraits::Br: 8 warps of one m16 tile
  const int64_t group = s.group_size();
  std::vector<int64_t> tiles(static_cast<size_t>(s.batch_size));
  int64_t base_items = 0, max_kv = 0;
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
    tiles[b] = (qo_len * group + sched.Br - 1) / sched.Br;
    base_items += tiles[b];
    max_kv = std::max(max_kv, s.kv_len(b));
  }
  // Too few blocks to fill the chip: cut every request's KV into chunks (stage 03's
  // split), as many as it takes for the longest request to bring the grid to target.
  // Not under a CUDA graph: the chunk count follows the lengths, and the graph keeps the
  // grid of the plan it was captured after.
  int64_t chunk = s.cuda_graph ? 0 : options_.kv_chunk_size;
  if (chunk == 0 && base_items > 0 && !s.cuda_graph) {
    int64_t target = options_.target_blocks;
    if (target == 0) {
      const Entry e = entry_for(s);
      target = int64_t{device_sm_count()} * std::max(1, e.blocks_per_sm(e.smem_bytes(0, 0)));
    }
    const int64_t blocks = base_items * s.num_kv_heads;
    if (blocks < target && s.nnz_qo() <= 65535) {
      const int64_t splits = (target + blocks - 1) / blocks;
      chunk = std::max<int64_t>(kMinChunkKeys, ((max_kv + splits - 1) / splits + kBc - 1) / kBc * kBc);
      if (chunk >= max_kv) chunk = 0;
    }
  }
  sched.kv_chunk_size = static_cast<int>(chunk);

  struct Item {
    int32_t request, tile, chunk;
    int64_t keys;
  };
  std::vector<Item> items;
  if (chunk > 0) sched.partial_indptr.assign(1, 0);
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b], kv_len = s.kv_len(b);
    const int64_t chunks = chunk > 0 ? std::max<int64_t>(1, (kv_len + chunk - 1) / chunk) : 1;
    for (int64_t tile = 0; tile < tiles[b]; ++tile) {
      const int64_t row_begin = tile * sched.Br, rows = std::min<int64_t>(sched.Br, qo_len * group - row_begin);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t lo = chunk > 0 ? c * chunk : 0, hi = chunk > 0 ? std::min(kv_len, lo + chunk) : kv_len;
        items.push_back({b, static_cast<int32_t>(tile), static_cast<int32_t>(c),
                         visible_keys(s, qo_len, kv_len, row_begin, rows, lo, hi)});
      }
    }
    if (chunk > 0)
      for (int64_t i = 0; i < qo_len; ++i)
        sched.partial_indptr.push_back(sched.partial_indptr.back() + static_cast<int32_t>(chunks));
  }
  // Longest first: the last wave of blocks is made of short ones, so the chip empties evenly.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.keys > b.keys; });
  ref::require((s.cuda_graph ? graph_capacity(s, sched.Br) : static_cast<int64_t>(items.size())) * s.num_kv_heads <
                   (int64_t{1} << 31),
               fn, "too many work items for one grid");
  for (const Item& it : items) {
    sched.request_indices.push_back(it.request);
    sched.qo_tile_indices.push_back(it.tile);
    sched.kv_chunk_indices.push_back(it.chunk);
  }
  if (s.cuda_graph) {
    // The most tiles any batch of batch_size requests and nnz_qo queries can need
    // (sum of ceil(qo_len * group / Br) <= ceil(nnz_qo * group / Br) + batch_size - 1);
    // the rest of the grid is padding (request -1) that the kernel skips.
    const int64_t capacity = graph_capacity(s, sched.Br);
    sched.request_indices.resize(static_cast<size_t>(capacity), -1);
    sched.qo_tile_indices.resize(static_cast<size_t>(capacity), 0);
    sched.kv_chunk_indices.resize(static_cast<size_t>(capacity), 0);
  }
  return sched;
}

size_t TensorCoreRunner::workspace_bytes(const BatchShape& shape) const {
  return layout_of(make_schedule(shape), shape.num_qo_heads, shape.head_dim).bytes;
}

void TensorCoreRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  const char* fn = "TensorCoreRunner::plan";
  Schedule schedule = make_schedule(shape);
  const WorkspaceLayout w = layout_of(schedule, shape.num_qo_heads, shape.head_dim);
  captured_.check_plan(fn, launch_of(schedule, w, shape.num_kv_heads));
  ref::require(workspace_size >= w.bytes && (workspace != nullptr || w.bytes == 0), fn,
               "workspace holds " + std::to_string(workspace_size) + " bytes, the plan needs " +
                   std::to_string(w.bytes));
  schedule_ = std::move(schedule);
  shape_ = shape;
  workspace_ = static_cast<uint8_t*>(workspace);
  const Entry e = entry_for(shape);
  e.set_smem_limit(e.smem_bytes(0, 0));  // run() launches with PrefillTraits::smem_bytes() of dynamic shared memory
  if (sinks_reason(shape).empty()) {     // a run may bring sinks: their instantiation gets its limit too
    const Entry with_sinks = policy_entry_for<sinks::Sinks>(shape);
    with_sinks.set_smem_limit(with_sinks.smem_bytes(0, 0));
  }
  upload_schedule(schedule_, w, staging_, workspace_, stream);
  rope_turns_ptr_ = rope_turns_.update(shape, stream);
}

void TensorCoreRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  if (batch.sinks != nullptr) {
    const std::string why = sinks_reason(shape_);
    ref::require(why.empty(), "TensorCoreRunner::run",
                 "batch.sinks is given, but " + why + " (" + shape_.describe() + ")");
  }
  const WorkspaceLayout w = layout_of(schedule_, shape_.num_qo_heads, shape_.head_dim);
  captured_.on_run(stream, [&] { return launch_of(schedule_, w, shape_.num_kv_heads); });
  if (schedule_.num_items() == 0) return;
  // A run given sinks takes the kernel under sinks/'s policy, on the same schedule.
  const Entry e = batch.sinks != nullptr ? policy_entry_for<sinks::Sinks>(shape_) : entry_for(shape_);
  e.launch(LaunchArgs{&shape_, &schedule_, &w, workspace_, &batch, kernels::PolicyInputs{rope_turns_ptr_, batch.sinks}},
           stream);
}

namespace {

StageInfo common_info() {
  StageInfo s;
  s.modes = {Mode::decode, Mode::prefill};
  s.dtypes = {DType::f16, DType::bf16};
  s.head_dims = {64, 128, 256};
  s.max_group_size = kMaxGroupSize;
  s.causal = true;
  s.window_left = true;
  s.logits_soft_cap = true;
  s.cuda_graph = true;
  s.sinks = true;  // K/V in q's dtype, no RoPE: run() refuses the rest by name
  // ROPE_LLAMA (rope/'s policy): the Q tile and each K tile rotated in shared memory, where
  // the MMAs read them, so rounded back to the dtype.
  s.pos_encodings = {PosEncoding::none, PosEncoding::rope_llama};
  s.rope_rounds_to_dtype = true;
  return s;
}

}  // namespace

StageInfo stage_info() {
  StageInfo s = common_info();
  s.name = "04_tensor_core";
  s.summary = "prefill/append and large-group decode on mma.sync tensor cores, paged K/V";
  s.storage = KVStorage::paged;
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = kMaxPageSize;
  s.kv_dtypes = {DType::e4m3, DType::e5m2};  // FP8 pools: tiles widened to q's dtype in shared memory
  s.rules = [](const BatchShape& shape) { return shared_memory_rule("04_tensor_core", shape); };
  s.make_runner = [] { return std::make_unique<TensorCoreRunner>(KVStorage::paged); };
  return s;
}

StageInfo ragged_stage_info() {
  StageInfo s = common_info();
  s.name = "04_tensor_core_ragged";
  s.summary = "stage 04 over ragged (contiguous) K/V";
  s.storage = KVStorage::ragged;
  s.kv_layouts = {KVLayout::NHD};
  s.rules = [](const BatchShape& shape) { return shared_memory_rule("04_tensor_core_ragged", shape); };
  s.make_runner = [] { return std::make_unique<TensorCoreRunner>(KVStorage::ragged); };
  return s;
}

}  // namespace flashstep::stages::tensor_core
