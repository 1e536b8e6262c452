// Stage 03 — split-KV decode: the workspace layout, plan/run, the launches, and the
// registry entry.
//
// The control plane (plan, host, once per batch composition) and the data plane (run,
// device, once per layer) are kept apart the way FlashInfer keeps them (the FlashInfer
// paper, arXiv 2501.01005, and docs/concepts/09_plan_run.md):
//   plan()  reads the lengths on the host, asks ref::plan_split_kv — the reference
//           planner, the very function the CPU tests check — for the schedule, writes it
//           into pinned memory in the workspace's layout, and ships it with ONE copy.
//   run()   launches chunk_decode_kernel or mma_decode_kernel (and merge_states_kernel when
//           the plan split) with pointers into the workspace; it reads no length and makes
//           no choice.
//
// The chunk kernel is instantiated for fp32, fp16, bf16 x head_dim 64, 128, 256, and for
// fp16/bf16 queries over an FP8 cache (e4m3, e5m2), by kernels/dispatch.cuh, as stage 02's;
// the tensor-core kernel for fp16/bf16 q at head_dim 128, under the lesson's K/V format and
// fp8/'s two.
// How to run it: `ctest -L gpu` validates it (the decode grids through the registry, and
// tests/stages/test_split_kv.cpp for partial states, forced splits and CUDA graphs);
// `flashstep_bench --shapes=bench/shapes_split_kv.csv` times it.
#include "03_split_kv/split_kv.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "03_split_kv/chunk_decode.cuh"
#include "03_split_kv/merge_states.cuh"
#include "03_split_kv/mma_decode.cuh"
#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"
#include "fp8/fp8_kv.cuh"
#include "rope/rope_in_loads.cuh"
#include "sinks/sinks.cuh"
#include "soft_cap/soft_cap.cuh"

namespace flashstep::stages::split_kv {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

/// What a launch of the two kernels needs besides the batch's pointers.
struct LaunchArgs {
  const BatchShape* shape;
  const DeviceBatch* batch;
  const ref::SplitKVPlan* plan;
  const WorkspaceLayout* layout;
  uint8_t* workspace;
  int num_stages;
  size_t smem_bytes;
  bool programmatic_launch;
  bool fp32_states;
  kernels::PolicyInputs policy;  // what a policy's hooks read (RoPE's turns, the run's sinks)
};

/// One instantiation (dtype x head_dim x K/V dtype) of the chunk kernel and its merge.
using Entry = KernelEntry<LaunchArgs>;

template <typename T, int HEAD_DIM>
void launch_merge_of(const LaunchArgs& a, const float* partial_o, const float* partial_lse, T* o, float* lse,
                     const int32_t* o_indptr, cudaStream_t stream);

/// The chunk kernel's arguments that both kernels of this stage take (the chunk kernel and
/// the tensor-core kernel): the batch's pointers, the paged view, the schedule, the
/// destinations in the workspace, the pipeline depth and the scales.
template <typename T, int HEAD_DIM, typename KV, typename Policy>
void fill_chunk_params(const LaunchArgs& a, ChunkDecodeParams<T, KV, Policy>& p) {
  const BatchShape& s = *a.shape;
  const WorkspaceLayout& w = *a.layout;
  p.q = static_cast<const T*>(a.batch->q);
  p.kv = kernels::make_paged_kv(static_cast<const KV*>(a.batch->kv_pool), a.batch->kv_indptr, a.batch->kv_indices,
                                a.batch->kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM,
                                s.kv_layout == KVLayout::HND);
  p.request_indices = reinterpret_cast<const int32_t*>(a.workspace + w.request_indices);
  p.kv_page_begin = reinterpret_cast<const int32_t*>(a.workspace + w.kv_page_begin);
  p.kv_chunk_len = reinterpret_cast<const int32_t*>(a.workspace + w.kv_chunk_len);
  p.block_valid_mask = a.workspace + w.block_valid_mask;
  p.partition_kv = a.plan->split_kv;
  p.partial_o = reinterpret_cast<float*>(a.workspace + w.partial_o);
  p.partial_lse = reinterpret_cast<float*>(a.workspace + w.partial_lse);
  p.o = static_cast<T*>(a.batch->o);
  p.lse = a.batch->lse;
  p.num_qo_heads = s.num_qo_heads;
  p.group_size = s.group_size();
  p.num_stages = a.num_stages;
  // As stage 02: k_scale on q's scale, v_scale on each chunk's normalisation (the run's
  // scales when it gives them).
  p.sm_scale_log2 = s.resolved_sm_scale() * run_k_scale(s, *a.batch) * kernels::kLog2e;
  p.v_scale = run_v_scale(s, *a.batch);
}

/// The chunk kernel under `Policy`, and the merge when the plan split.
template <typename T, int HEAD_DIM, typename KV, typename Policy = kernels::IdentityPolicy>
void launch(const LaunchArgs& a, cudaStream_t stream) {
  const BatchShape& s = *a.shape;
  const WorkspaceLayout& w = *a.layout;
  const int32_t* o_indptr = reinterpret_cast<const int32_t*>(a.workspace + w.o_indptr);
  const dim3 grid(s.num_kv_heads, a.plan->padded_batch_size);
  constexpr int kThreads = paged::DecodeTraits<KV, HEAD_DIM>::kThreads;
  const paged::DecodeBlockShape bs = paged::DecodeTraits<KV, HEAD_DIM>::block_shape(s.group_size());
  ChunkDecodeParams<T, KV, Policy> p;
  fill_chunk_params<T, HEAD_DIM, KV>(a, p);
  p.bdy = bs.bdy;
  p.bdz = bs.bdz;
  p.policy = Policy::Params::from(a.policy);
  chunk_decode_kernel<T, HEAD_DIM, KV, Policy><<<grid, kThreads, a.smem_bytes, stream>>>(p);
  kernels::check_launch("chunk_decode_kernel");
  launch_merge_of<T, HEAD_DIM>(a, p.partial_o, p.partial_lse, p.o, p.lse, o_indptr, stream);
}

/// The merge of a split plan's partial rows (nothing when the plan did not split).
template <typename T, int HEAD_DIM>
void launch_merge_of(const LaunchArgs& a, const float* partial_o, const float* partial_lse, T* o, float* lse,
                     const int32_t* o_indptr, cudaStream_t stream) {
  const BatchShape& s = *a.shape;
  if (!a.plan->split_kv) return;
  if (a.fp32_states) {
    launch_merge<float, HEAD_DIM>(partial_o, partial_lse, o_indptr, static_cast<float*>(a.batch->o), lse,
                                  s.num_qo_heads, s.batch_size, a.programmatic_launch, stream);
  } else {
    launch_merge<T, HEAD_DIM>(partial_o, partial_lse, o_indptr, o, lse, s.num_qo_heads, s.batch_size,
                              a.programmatic_launch, stream);
  }
}

/// The tensor-core kernel (mma_decode.cuh) under K/V format `Format`: the chunk kernel's
/// arguments and schedule, its own kernel, the same merge. The plan's split decides
/// partial rows or direct outputs.
template <typename T, typename Format>
void launch_mma(const LaunchArgs& a, cudaStream_t stream) {
  constexpr int HEAD_DIM = 128;
  using KV = typename Format::Stored;
  const BatchShape& s = *a.shape;
  const WorkspaceLayout& w = *a.layout;
  ChunkDecodeParams<T, KV> p;
  fill_chunk_params<T, HEAD_DIM, KV>(a, p);
  const dim3 grid(s.num_kv_heads, a.plan->padded_batch_size);
  mma_decode_kernel<T, HEAD_DIM, Format>
      <<<grid, MmaDecodeTraits<HEAD_DIM, sizeof(KV)>::kThreads, a.smem_bytes, stream>>>(p);
  kernels::check_launch("mma_decode_kernel");
  launch_merge_of<T, HEAD_DIM>(a, p.partial_o, p.partial_lse, p.o, p.lse,
                               reinterpret_cast<const int32_t*>(a.workspace + w.o_indptr), stream);
}

template <typename T, int HEAD_DIM, typename KV>
Entry kernel_entry() {
  Entry e;
  e.smem_bytes = [](int num_stages, int group_size) {
    const paged::DecodeBlockShape bs = paged::DecodeTraits<KV, HEAD_DIM>::block_shape(group_size);
    return chunk_decode_smem_bytes<KV, HEAD_DIM>(num_stages, bs.bdy, bs.bdz);
  };
  e.set_smem_limit = [](size_t bytes) {
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(chunk_decode_kernel<T, HEAD_DIM, KV>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  e.blocks_per_sm = [](size_t bytes) {
    int blocks = 0;
    FLASHSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, chunk_decode_kernel<T, HEAD_DIM, KV>, paged::DecodeTraits<KV, HEAD_DIM>::kThreads, bytes));
    return blocks;
  };
  e.launch = launch<T, HEAD_DIM, KV>;
  return e;
}

Entry kernel_entry_for(DType dtype, DType kv_dtype, int head_dim) {
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, {
    FLASHSTEP_DISPATCH_HEAD_DIM(head_dim, HEAD_DIM, {
      FLASHSTEP_DISPATCH_KV_DTYPE(dtype, kv_dtype, T, KV, { return kernel_entry<T, HEAD_DIM, KV>(); });
    });
  });
}

/// The chunk kernel under a policy (kernels/attention_policy.cuh) for 16-bit q and K/V:
/// RoPE in the loads (rope/, head_dim 64 or 128: stage_info's rules refuse the rest), the
/// logits soft cap (soft_cap/) or attention sinks (sinks/).
template <typename T, int HEAD_DIM, typename Policy>
Entry policy_kernel_entry() {
  Entry e;
  e.smem_bytes = kernel_entry<T, HEAD_DIM, T>().smem_bytes;
  e.set_smem_limit = [](size_t bytes) {
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(chunk_decode_kernel<T, HEAD_DIM, T, Policy>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  e.blocks_per_sm = [](size_t bytes) {
    int blocks = 0;
    FLASHSTEP_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &blocks, chunk_decode_kernel<T, HEAD_DIM, T, Policy>, paged::DecodeTraits<T, HEAD_DIM>::kThreads, bytes));
    return blocks;
  };
  e.launch = launch<T, HEAD_DIM, T, Policy>;
  return e;
}

Entry rope_kernel_entry_for(DType dtype, int head_dim) {
  using rope::RopeInLoads;
  const bool f16 = dtype == DType::f16;
  if (head_dim == 64)
    return f16 ? policy_kernel_entry<__half, 64, RopeInLoads>() : policy_kernel_entry<__nv_bfloat16, 64, RopeInLoads>();
  return f16 ? policy_kernel_entry<__half, 128, RopeInLoads>() : policy_kernel_entry<__nv_bfloat16, 128, RopeInLoads>();
}

/// The instantiation under `Policy` for fp16/bf16 q and K/V at any head_dim of the stage.
template <typename Policy>
Entry policy_kernel_entry_for(DType dtype, int head_dim) {
  const bool f16 = dtype == DType::f16;
  switch (head_dim) {
    case 64: return f16 ? policy_kernel_entry<__half, 64, Policy>() : policy_kernel_entry<__nv_bfloat16, 64, Policy>();
    case 128:
      return f16 ? policy_kernel_entry<__half, 128, Policy>() : policy_kernel_entry<__nv_bfloat16, 128, Policy>();
    default:
      return f16 ? policy_kernel_entry<__half, 256, Policy>() : policy_kernel_entry<__nv_bfloat16, 256, Policy>();
  }
}

/// Empty when a run of `shape` may take sinks; otherwise why not.
std::string sinks_reason(const BatchShape& shape) {
  if (shape.dtype != DType::f16 && shape.dtype != DType::bf16)
    return "sinks need fp16 or bf16 q, got " + std::string(to_string(shape.dtype));
  if (shape.resolved_kv_dtype() != shape.dtype) return "sinks need K/V in q's dtype (not an FP8 cache)";
  if (shape.pos_encoding != PosEncoding::none) return "sinks and pos_encoding rope_llama do not combine";
  if (shape.logits_soft_cap > 0.f) return "sinks and logits_soft_cap do not combine";
  return {};
}

/// The instantiation a plan of `shape` runs: the lesson's (identity), or the one under the
/// policy the shape asks for (RoPE in the loads, the soft cap; stage_info's rules refuse
/// the shapes none is built for).
Entry entry_for(const BatchShape& shape) {
  if (shape.pos_encoding != PosEncoding::none) return rope_kernel_entry_for(shape.dtype, shape.head_dim);
  if (shape.logits_soft_cap > 0.f) return policy_kernel_entry_for<soft_cap::SoftCap>(shape.dtype, shape.head_dim);
  return kernel_entry_for(shape.dtype, shape.resolved_kv_dtype(), shape.head_dim);
}

template <typename T, typename Format>
Entry mma_entry() {
  using Tr = MmaDecodeTraits<128, sizeof(typename Format::Stored)>;
  Entry e;
  e.smem_bytes = [](int num_stages, int) { return Tr::smem_bytes(num_stages); };
  e.set_smem_limit = [](size_t bytes) {
    FLASHSTEP_CUDA_CHECK(cudaFuncSetAttribute(mma_decode_kernel<T, 128, Format>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  e.blocks_per_sm = [](size_t bytes) {
    int n = 0;
    FLASHSTEP_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mma_decode_kernel<T, 128, Format>, Tr::kThreads, bytes));
    return n;
  };
  e.launch = launch_mma<T, Format>;
  return e;
}

/// The tensor-core kernel's entry for q/o in `dtype` (f16 or bf16) over `kv_dtype`: the
/// lesson's format (K/V in q's dtype), or fp8/'s.
Entry mma_entry_for(DType dtype, DType kv_dtype) {
  using fp8::Fp8KV;
  const bool f16 = dtype == DType::f16;
  if (kv_dtype == DType::e4m3)
    return f16 ? mma_entry<__half, Fp8KV<__nv_fp8_e4m3>>() : mma_entry<__nv_bfloat16, Fp8KV<__nv_fp8_e4m3>>();
  if (kv_dtype == DType::e5m2)
    return f16 ? mma_entry<__half, Fp8KV<__nv_fp8_e5m2>>() : mma_entry<__nv_bfloat16, Fp8KV<__nv_fp8_e5m2>>();
  return f16 ? mma_entry<__half, SameAsQ<__half>>() : mma_entry<__nv_bfloat16, SameAsQ<__nv_bfloat16>>();
}

/// Whether `shape` runs mma_decode.cuh's kernel under `options`: tensor_cores on, the
/// path not forced unsplit, and a shape the kernel takes (tensor_core_decode_takes).
bool uses_mma(const SplitKVOptions& options, const BatchShape& shape) {
  return options.tensor_cores && options.path != PathChoice::unsplit && tensor_core_decode_takes(shape);
}

/// The launch choices that depend on the shape but never on the lengths.
struct Resolved {
  bool mma;     ///< mma_decode.cuh's kernel instead of the chunk kernel (uses_mma)
  Entry entry;  ///< the instantiation that runs (chunk kernel, its RoPE policy, or the tensor-core kernel)
  Entry sinks;  ///< the chunk kernel under the sinks policy, for a run given sinks (launch null: none)
  int num_stages;
  size_t smem_bytes;
  int num_sm;
  int ctas_per_sm;
  DeviceModel device;  ///< what the cost model prices: options.device or device_model(), on num_sm SMs
  bool programmatic_launch;
};

/// The chunk kernel's shared-memory limit set to `smem_bytes` and its blocks per SM at
/// that size, for the kernel `entry` names.
/// Both are driver calls of microseconds each and plan() runs at every engine step, so
/// the occupancy is asked once per (device, kernel, bytes) and the limit set only when
/// it is not the kernel's current one. Process-wide, under a mutex.
int kernel_setup(int device, size_t smem_bytes, const Entry& entry) {
  // A kernel is known by its entry's functions: one instantiation each (dtypes, head_dim,
  // the tensor-core kernel, the RoPE variants), so no variant can share another's limit.
  using Kernel = std::pair<int, void (*)(size_t)>;
  static std::mutex mutex;
  static std::map<Kernel, size_t> limit;                      // the limit last set on each kernel
  static std::map<std::pair<Kernel, size_t>, int> occupancy;  // blocks per SM at each size
  const Kernel kernel{device, entry.set_smem_limit};
  const std::lock_guard<std::mutex> lock(mutex);
  const auto set = limit.find(kernel);
  if (set == limit.end() || set->second != smem_bytes) {
    entry.set_smem_limit(smem_bytes);
    limit[kernel] = smem_bytes;
  }
  const auto known = occupancy.find({kernel, smem_bytes});
  if (known != occupancy.end()) return known->second;
  const int blocks = entry.blocks_per_sm(smem_bytes);
  occupancy.emplace(std::make_pair(kernel, smem_bytes), blocks);
  return blocks;
}

Resolved resolve(const SplitKVOptions& options, const BatchShape& shape, const char* fn) {
  const std::string reason = stage_info().unsupported_reason(shape);
  ref::require(reason.empty(), fn, reason);
  ref::require(shape.batch_size >= 1 && shape.batch_size <= 65535, fn,
               "batch_size must be 1..65535 (grid.y of the kernels), got " + str(shape.batch_size));
  ref::require(options.num_stages == 0 || (options.num_stages >= 2 && options.num_stages <= 8), fn,
               "options.num_stages must be 0 (auto) or 2..8, got " + str(options.num_stages));
  ref::require(options.num_sm >= 0 && options.ctas_per_sm >= 0 && options.min_kv_chunk_tokens >= 0, fn,
               "options.num_sm, ctas_per_sm and min_kv_chunk_tokens must be >= 0");
  int device = 0, major = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  Resolved r;
  r.device = options.device ? *options.device : device_model();
  ref::require(r.device.read_bytes_per_second > 0 && r.device.num_sm >= 1, fn,
               "options.device must have a positive read_bytes_per_second and num_sm >= 1");
  r.num_sm = options.num_sm > 0 ? options.num_sm : r.device.num_sm;
  r.device.num_sm = r.num_sm;
  // The chunk kernel's depth: stage 02's two 32 KB stages, one tile in flight while one is
  // computed; with two blocks on every SM (the wave the planner fills) 64 KB in flight per SM.
  // Measured on an H100 with bench/split_kv_tune.cpp: 3 and 4 stages were slower on every
  // shape, split or not (bench/split_kv_tune.cpp, docs/results/03_split_kv_tune_h100.json).
  r.mma = uses_mma(options, shape);
  // The tensor-core kernel: stages of 64 keys of K and V (16 KB FP8, 32 KB 16-bit), two, or
  // three over one wave (mma_num_stages).
  r.num_stages = options.num_stages > 0 ? options.num_stages : r.mma ? kMmaStages : 2;
  r.entry = r.mma ? mma_entry_for(shape.dtype, shape.resolved_kv_dtype()) : entry_for(shape);
  if (sinks_reason(shape).empty())  // a run may bring sinks: the chunk kernel under their policy
    r.sinks = policy_kernel_entry_for<sinks::Sinks>(shape.dtype, shape.head_dim);
  const auto smem_at = [&](int num_stages) {
    size_t bytes = r.entry.smem_bytes(num_stages, shape.group_size());
    if (r.sinks.launch) bytes = std::max(bytes, r.sinks.smem_bytes(num_stages, shape.group_size()));
    return bytes;
  };
  r.smem_bytes = smem_at(r.num_stages);
  int kernel_blocks = kernel_setup(device, r.smem_bytes, r.entry);  // plan() makes it, run() does not
  if (r.mma && options.num_stages == 0 &&
      int64_t{shape.batch_size} * shape.num_kv_heads > int64_t{r.num_sm} * kernel_blocks) {  // over one wave
    const int deeper_blocks = kernel_setup(device, smem_at(kMmaWaveStages), r.entry);
    r.num_stages = mma_num_stages(kernel_blocks, deeper_blocks, r.num_sm, shape.batch_size, shape.num_kv_heads);
    r.smem_bytes = smem_at(r.num_stages);
    kernel_blocks = kernel_setup(device, r.smem_bytes, r.entry);  // and the limit back, if it stays at two
  }
  int blocks = kernel_blocks;
  if (r.sinks.launch) blocks = std::min(blocks, kernel_setup(device, r.smem_bytes, r.sinks));  // the same grid must fit
  r.ctas_per_sm = options.ctas_per_sm > 0 ? options.ctas_per_sm
                  : r.mma
                      ? mma_planned_ctas_per_sm(blocks, kernel_blocks, r.num_sm, shape.batch_size, shape.num_kv_heads)
                      : blocks;
  ref::require(r.ctas_per_sm >= 1, fn,
               "the chunk kernel does not fit on a multiprocessor with " + str(int64_t(r.smem_bytes)) +
                   " bytes of shared memory (num_stages " + str(r.num_stages) + ")");
  r.programmatic_launch = options.programmatic_launch && major >= 9;
  return r;
}

/// The busiest SM's bytes when blocks of `sizes` bytes are handed out longest first, each
/// to the least loaded of `bins` SMs (LPT, the greedy schedule the model assumes).
double lpt_makespan(std::vector<double> sizes, int bins) {
  std::sort(sizes.begin(), sizes.end(), std::greater<double>());
  std::priority_queue<double, std::vector<double>, std::greater<double>> load;
  for (int i = 0; i < bins; ++i) load.push(0.0);
  double busiest = 0;
  for (double b : sizes) {
    const double l = load.top() + b;
    load.pop();
    load.push(l);
    busiest = std::max(busiest, l);
  }
  return busiest;
}

}  // namespace

// A thread of the tensor-core kernel copies PASSES consecutive keys, which must lie in at
// most two pages (mma_decode.cuh, "the copies").
static_assert(MmaDecodeTraits<128, 2>::PASSES <= kMmaMinPageSize && MmaDecodeTraits<128, 1>::PASSES <= kMmaMinPageSize,
              "kMmaMinPageSize must cover a copy thread's keys");

bool tensor_core_decode_takes(const BatchShape& shape) {
  const DType kv = shape.resolved_kv_dtype();
  const bool format = is_fp8(kv) ||
                      (kv == shape.dtype && shape.pos_encoding == PosEncoding::none && !(shape.logits_soft_cap > 0.f));
  return format && shape.page_size >= kMmaMinPageSize && (shape.dtype == DType::f16 || shape.dtype == DType::bf16) &&
         shape.head_dim == 128 && shape.group_size() <= MmaDecodeTraits<128, 2>::MAX_GROUP;
}

int mma_wave_chunks(int kernel_blocks, int num_sm, int batch_size, int num_kv_heads) {
  const int64_t slots = int64_t{num_sm} * kernel_blocks, grid = int64_t{batch_size} * num_kv_heads;
  if (grid <= slots) return 1;  // one wave or less: the planner's own split fills it
  // k chunks a request make k x grid blocks, waves / ceil(waves) of the slots' time busy:
  // the fewest chunks that keep 95% of it busy, else the best of kMaxWaveChunks
  int best_k = 1;
  double best = 0;
  for (int k = 1; k <= kMaxWaveChunks; ++k) {
    const int64_t blocks = k * grid, waves = (blocks + slots - 1) / slots;
    const double busy = static_cast<double>(blocks) / static_cast<double>(waves * slots);
    if (busy > best + 1e-9) best = busy, best_k = k;
    if (busy >= 0.95) break;
  }
  return best_k;
}

int mma_planned_ctas_per_sm(int planned_blocks, int kernel_blocks, int num_sm, int batch_size, int num_kv_heads) {
  const int k = mma_wave_chunks(kernel_blocks, num_sm, batch_size, num_kv_heads);
  const int64_t grid = int64_t{batch_size} * num_kv_heads;
  return k == 1 ? planned_blocks : static_cast<int>((k * grid + num_sm - 1) / num_sm);
}

int mma_num_stages(int kernel_blocks, int deeper_blocks, int num_sm, int batch_size, int num_kv_heads) {
  if (int64_t{batch_size} * num_kv_heads <= int64_t{num_sm} * kernel_blocks) return kMmaStages;  // one wave
  return mma_wave_chunks(deeper_blocks, num_sm, batch_size, num_kv_heads) <=
                 mma_wave_chunks(kernel_blocks, num_sm, batch_size, num_kv_heads)
             ? kMmaWaveStages
             : kMmaStages;
}

const char* to_string(DecodePath path) {
  switch (path) {
    case DecodePath::unsplit: return "unsplit";
    case DecodePath::split: return "split";
  }
  return "?";
}

PathEstimate estimate_paths(const std::vector<int64_t>& kv_lens, const ref::SplitKVPlan& plan, int page_size,
                            int num_kv_heads, int num_qo_heads, int head_dim, int elem_bytes, const DeviceModel& device,
                            const DecodeCostModel& model) {
  const char* fn = "estimate_paths";
  ref::require(kv_lens.size() + 1 == plan.o_indptr.size(), fn,
               "kv_lens has " + str(int64_t(kv_lens.size())) + " requests, the plan " +
                   str(int64_t(plan.o_indptr.size()) - 1));
  ref::require(page_size >= 1 && num_kv_heads >= 1 && num_qo_heads >= 1 && head_dim >= 1 && elem_bytes >= 1 &&
                   device.num_sm >= 1 && device.read_bytes_per_second > 0,
               fn,
               "page_size, heads, head_dim, elem_bytes, device.num_sm and device.read_bytes_per_second must be "
               "positive");
  const int num_sm = device.num_sm;
  const double per_token = 2.0 * head_dim * elem_bytes;  // one K row and one V row of one kv head
  const double sm_rate = device.read_bytes_per_second / num_sm;
  PathEstimate e;
  // Unsplit: one block per (request, kv head), each reading its request's keys.
  std::vector<double> blocks;
  for (int64_t len : kv_lens)
    for (int h = 0; h < num_kv_heads; ++h) blocks.push_back(double(len) * per_token);
  e.unsplit_seconds = lpt_makespan(blocks, num_sm) / sm_rate;
  if (!plan.split_kv) {  // nothing to split: the chunk kernel would be stage 02's loop, unsplit
    e.split_seconds = e.unsplit_seconds;
    return e;
  }
  // Split: one block per (work item, kv head); every partial row goes to memory and back.
  std::vector<double> items;
  const int64_t chunk_tokens = int64_t{plan.kv_chunk_size_in_pages} * page_size;
  for (int32_t k = 0; k < plan.num_work_items; ++k) {
    const int64_t len = kv_lens[size_t(plan.request_indices[size_t(k)])];
    const int64_t start = std::min(len, int64_t{plan.kv_tile_indices[size_t(k)]} * chunk_tokens);
    for (int h = 0; h < num_kv_heads; ++h) items.push_back(double(std::min(len - start, chunk_tokens)) * per_token);
  }
  const int64_t partial_rows = plan.o_indptr.back();
  const double partial_bytes = 2.0 * partial_rows * num_qo_heads * (head_dim + 1) * sizeof(float);
  e.split_seconds = lpt_makespan(items, num_sm) / sm_rate + partial_bytes / device.read_bytes_per_second +
                    model.merge_kernel_seconds;
  e.path = e.split_seconds < model.split_margin * e.unsplit_seconds ? DecodePath::split : DecodePath::unsplit;
  return e;
}

WorkspaceLayout make_workspace_layout(int batch_size, int num_qo_heads, int num_kv_heads, int head_dim,
                                      int max_grid_size, bool fp32_states) {
  const char* fn = "make_workspace_layout";
  ref::require(batch_size >= 1 && num_qo_heads >= 1 && num_kv_heads >= 1 && head_dim >= 1 && max_grid_size >= 1, fn,
               "batch_size, num_qo_heads, num_kv_heads, head_dim and max_grid_size must be >= 1");
  WorkspaceLayout w;
  w.batch_size = batch_size;
  const int32_t per_head = max_grid_size / num_kv_heads;  // G / H: the split grid, padded
  w.capacity = std::max(batch_size, per_head);
  // The planner splits only when batch_size * H < G; then it never makes more than G / H items.
  w.partial_rows = int64_t{batch_size} * num_kv_heads < max_grid_size ? per_head : 0;
  // fp32 states: every work item writes a row, split or not.
  if (fp32_states) w.partial_rows = w.capacity;
  size_t at = 0;
  w.header = at;
  at = align_up(at + sizeof(SplitKVHeader));
  w.request_indices = at;
  at = align_up(at + sizeof(int32_t) * w.capacity);
  w.kv_tile_indices = at;
  at = align_up(at + sizeof(int32_t) * w.capacity);
  w.o_indptr = at;
  at = align_up(at + sizeof(int32_t) * (size_t(batch_size) + 1));
  w.kv_page_begin = at;
  at = align_up(at + sizeof(int32_t) * w.capacity);
  w.kv_chunk_len = at;
  at = align_up(at + sizeof(int32_t) * w.capacity);
  w.block_valid_mask = at;
  at = align_up(at + w.capacity);
  w.schedule_bytes = at;
  w.partial_o = at;
  at = align_up(at + sizeof(float) * size_t(w.partial_rows) * num_qo_heads * head_dim);
  w.partial_lse = at;
  at = align_up(at + sizeof(float) * size_t(w.partial_rows) * num_qo_heads);
  w.bytes = at;
  return w;
}

SplitKVRunner::SplitKVRunner(SplitKVOptions options) : options_(options) {}

SplitKVRunner::~SplitKVRunner() = default;

size_t SplitKVRunner::workspace_bytes(const BatchShape& shape) const {
  const Resolved r = resolve(options_, shape, "SplitKVRunner::workspace_bytes");
  return make_workspace_layout(shape.batch_size, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                               r.num_sm * r.ctas_per_sm, options_.fp32_states)
      .bytes;
}

void SplitKVRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  const char* fn = "SplitKVRunner::plan";
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  ref::require(capture == cudaStreamCaptureStatusNone, fn,
               "the stream is being captured into a CUDA graph; plan() is host work that runs between "
               "replays (it reads the lengths and copies a new schedule), so call it before capturing or "
               "before each replay, never inside the capture");
  const Resolved r = resolve(options_, shape, fn);
  ref::require(shape.kv_indptr.size() == size_t(shape.batch_size) + 1, fn,
               "shape.kv_indptr must have batch_size + 1 = " + str(shape.batch_size + 1) + " entries, got " +
                   str(int64_t(shape.kv_indptr.size())));
  ref::require(shape.kv_last_page_len.size() == size_t(shape.batch_size), fn,
               "shape.kv_last_page_len must have batch_size = " + str(shape.batch_size) + " entries, got " +
                   str(int64_t(shape.kv_last_page_len.size())));

  // ---- the schedule: the reference planner, called as the CPU tests call it.
  ref::SplitKVConfig config;
  config.page_size = shape.page_size;
  config.num_kv_heads = shape.num_kv_heads;
  config.num_sm = r.num_sm;
  config.ctas_per_sm = r.ctas_per_sm;
  config.enable_cuda_graph = options_.enable_cuda_graph;
  config.min_kv_chunk_tokens = options_.min_kv_chunk_tokens;
  ref::SplitKVPlan plan = ref::plan_split_kv(ref::kv_page_counts_from_indptr(shape.kv_indptr), config);
  // fp32 states: one work item per request where the planner does not split, its state
  // written as a partial row, and the merge kernel (of one row) writes it in fp32. This
  // depends on the batch size only, as the planner's choice does, so graphs still replay.
  if (options_.fp32_states) plan.split_kv = true;
  ref::require(plan.padded_batch_size <= 65535, fn,
               "the plan's grid has " + str(plan.padded_batch_size) + " work items, more than grid.y allows (65535)");

  // ---- the workspace: every scratch array at a fixed offset of the caller's buffer.
  const WorkspaceLayout layout = make_workspace_layout(shape.batch_size, shape.num_qo_heads, shape.num_kv_heads,
                                                       shape.head_dim, plan.max_grid_size, options_.fp32_states);
  ref::require(workspace != nullptr, fn, "workspace is null; allocate workspace_bytes(shape) bytes of device memory");
  ref::require(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, fn, "workspace must be 16-byte aligned");
  ref::require(workspace_size >= layout.bytes, fn,
               "workspace_size is " + str(int64_t(workspace_size)) + " bytes; this shape needs " +
                   str(int64_t(layout.bytes)) + " (workspace_bytes(shape))");
  ref::require(plan.padded_batch_size <= layout.capacity &&
                   (!plan.split_kv || plan.padded_batch_size <= layout.partial_rows),
               fn, "internal: the plan does not fit the workspace layout");  // the planner's rule guarantees it

  // ---- the path: stage 02's kernel, or the chunks and their merge (DecodeCostModel).
  PathEstimate estimate;
  DecodePath path = DecodePath::unsplit;
  if (options_.fp32_states) {
    path = DecodePath::split;  // every item a partial row; the merge kernel writes fp32
  } else if (r.mma) {
    path = plan.split_kv ? DecodePath::split : DecodePath::unsplit;  // one kernel either way, no cost model
  } else if (options_.path == PathChoice::unsplit) {
    path = DecodePath::unsplit;
  } else if (options_.path == PathChoice::split) {
    path = DecodePath::split;
  } else if (plan.split_kv) {
    const int elem = static_cast<int>(dtype_bytes(shape.resolved_kv_dtype()));  // the K/V bytes are what it prices
    if (options_.enable_cuda_graph) {
      // A graph cannot change path with the lengths: price graph_kv_len keys per request,
      // so that the choice depends on the batch size alone.
      const int64_t len = std::max(1, options_.cost.graph_kv_len);
      const std::vector<int32_t> pages(size_t(shape.batch_size),
                                       int32_t((len + shape.page_size - 1) / shape.page_size));
      const ref::SplitKVPlan uniform = ref::plan_split_kv(pages, config);
      estimate = estimate_paths(std::vector<int64_t>(size_t(shape.batch_size), len), uniform, shape.page_size,
                                shape.num_kv_heads, shape.num_qo_heads, shape.head_dim, elem, r.device, options_.cost);
    } else {
      std::vector<int64_t> lens;
      for (int i = 0; i < shape.batch_size; ++i) lens.push_back(shape.kv_len(i));
      estimate = estimate_paths(lens, plan, shape.page_size, shape.num_kv_heads, shape.num_qo_heads, shape.head_dim,
                                elem, r.device, options_.cost);
    }
    path = estimate.path;
  }
  // Stage 02's runner has no policy: under ROPE_LLAMA or a soft cap the chunk kernel serves
  // every plan (writing o and lse directly when the plan does not split).
  if (shape.pos_encoding == PosEncoding::rope_llama || shape.logits_soft_cap > 0.f) path = DecodePath::split;
  if (path == DecodePath::unsplit && !r.mma) unsplit_.plan(shape, nullptr, 0, stream);

  // ---- a captured graph froze the launch shape: a new plan must keep it.
  if (captured_) {
    ref::require(
        shape.batch_size == captured_batch_size_ && path == captured_path_ &&
            (path == DecodePath::unsplit ||
             (plan.padded_batch_size == captured_padded_batch_size_ && plan.split_kv == captured_split_kv_)),
        fn,
        "run() was captured into a CUDA graph for batch_size " + str(captured_batch_size_) + " (path " +
            to_string(captured_path_) + ", grid of " + str(captured_padded_batch_size_) +
            " work items); this plan needs batch_size " + str(shape.batch_size) + " (path " + to_string(path) + ", " +
            str(plan.padded_batch_size) +
            " work items), which that graph cannot replay. Use one runner (and workspace) per captured batch size.");
  }

  // ---- stage the schedule in pinned memory, in the workspace's layout, and copy it once.
  uint8_t* staged = staging_.begin(layout.schedule_bytes);  // waits for the previous plan's copy
  const SplitKVHeader header{plan.kv_chunk_size_in_pages, plan.num_work_items, plan.split_kv ? 1 : 0,
                             plan.padded_batch_size, static_cast<int32_t>(path)};
  std::memcpy(staged + layout.header, &header, sizeof header);
  std::memcpy(staged + layout.request_indices, plan.request_indices.data(),
              sizeof(int32_t) * plan.request_indices.size());
  std::memcpy(staged + layout.kv_tile_indices, plan.kv_tile_indices.data(),
              sizeof(int32_t) * plan.kv_tile_indices.size());
  std::memcpy(staged + layout.o_indptr, plan.o_indptr.data(), sizeof(int32_t) * plan.o_indptr.size());
  std::memcpy(staged + layout.block_valid_mask, plan.block_valid_mask.data(), plan.block_valid_mask.size());
  // Each real work item's first page (an index into kv_indices) and its length in tokens,
  // from the host copy of the lengths: the kernel starts with the page ids.
  auto* page_begin = reinterpret_cast<int32_t*>(staged + layout.kv_page_begin);
  auto* chunk_len = reinterpret_cast<int32_t*>(staged + layout.kv_chunk_len);
  const int64_t chunk_tokens = int64_t{plan.kv_chunk_size_in_pages} * shape.page_size;
  for (int32_t k = 0; k < plan.num_work_items; ++k) {
    const int r = plan.request_indices[k];
    const int64_t t = plan.kv_tile_indices[k];
    const int64_t start = std::min(shape.kv_len(r), t * chunk_tokens);
    page_begin[k] = static_cast<int32_t>(shape.kv_indptr[r] + t * plan.kv_chunk_size_in_pages);
    chunk_len[k] = static_cast<int32_t>(std::min(shape.kv_len(r) - start, chunk_tokens));
  }
  staging_.upload(workspace, layout.schedule_bytes, stream);

  shape_ = shape;
  planner_config_ = config;
  plan_ = std::move(plan);
  layout_ = layout;
  workspace_ = static_cast<uint8_t*>(workspace);
  num_stages_ = r.num_stages;
  const double* rope_turns = rope_turns_.update(shape, stream);
  path_ = path;
  estimate_ = estimate;
  mma_ = r.mma;
  launch_ = [this, r, rope_turns](const DeviceBatch& batch, cudaStream_t s) {
    // A run given sinks takes the chunk kernel under the sinks policy, on the plan's
    // schedule: its chunks and merge when the plan split, o and lse directly when not.
    if (batch.sinks != nullptr)
      return r.sinks.launch(LaunchArgs{&shape_, &batch, &plan_, &layout_, workspace_, r.num_stages, r.smem_bytes,
                                       r.programmatic_launch, options_.fp32_states,
                                       kernels::PolicyInputs{nullptr, batch.sinks, 0.f}},
                            s);
    if (path_ == DecodePath::unsplit && !r.mma) return unsplit_.run(batch, s);
    r.entry.launch(LaunchArgs{&shape_, &batch, &plan_, &layout_, workspace_, r.num_stages, r.smem_bytes,
                              r.programmatic_launch, options_.fp32_states,
                              kernels::PolicyInputs{rope_turns, nullptr, shape_.logits_soft_cap}},
                   s);
  };
  planned_ = true;
}

void SplitKVRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  const char* fn = "SplitKVRunner::run";
  ref::require(planned_, fn, "call plan() before run()");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    // A graph replays this launch as captured: grid size, split or not. Without the graph
    // flag the grid is the number of work items of *these* lengths, and a replay after a
    // plan() for other lengths would silently skip or misread chunks.
    ref::require(options_.enable_cuda_graph, fn,
                 "the stream is being captured into a CUDA graph, but this runner plans without "
                 "SplitKVOptions::enable_cuda_graph: its grid (" +
                     str(plan_.padded_batch_size) +
                     " work items) follows the current lengths, so a replay after the next plan() "
                     "would compute on a stale schedule. Make the runner with enable_cuda_graph = true.");
    captured_ = true;
    captured_batch_size_ = shape_.batch_size;
    captured_padded_batch_size_ = plan_.padded_batch_size;
    captured_split_kv_ = plan_.split_kv;
    captured_path_ = path_;
  }
  ref::require(!options_.fp32_states || batch.lse != nullptr, fn,
               "batch.lse is null; a runner with SplitKVOptions::fp32_states writes (o, lse) states and needs both");
  if (batch.sinks != nullptr) {
    const std::string why = sinks_reason(shape_);
    ref::require(why.empty(), fn, "batch.sinks is given, but " + why + " (" + shape_.describe() + ")");
    ref::require(!options_.fp32_states, fn,
                 "batch.sinks is given to a runner with fp32_states, whose states another merge combines "
                 "(the sink would be counted once per shard)");
  }
  launch_(batch, stream);
}

const float* SplitKVRunner::partial_o() const {
  return planned_ ? reinterpret_cast<const float*>(workspace_ + layout_.partial_o) : nullptr;
}

const float* SplitKVRunner::partial_lse() const {
  return planned_ ? reinterpret_cast<const float*>(workspace_ + layout_.partial_lse) : nullptr;
}

StageInfo stage_info() {
  StageInfo s;
  s.name = "03_split_kv";
  s.summary =
      "split-KV decode: plan() prices chunks that fill every SM (then a merge) against stage 02's kernel and runs the cheaper; CUDA-graph safe";
  s.modes = {Mode::decode};
  s.storage = KVStorage::paged;
  s.dtypes = {DType::f32, DType::f16, DType::bf16};
  s.kv_dtypes = {DType::e4m3, DType::e5m2};
  s.head_dims = {64, 128, 256};
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = kMaxPageSize;
  s.max_group_size = kMaxGroupSize;
  s.causal = false;
  s.cuda_graph = true;
  s.sinks = true;            // fp16/bf16 with K/V in q's dtype, no RoPE: run() refuses the rest by name
  s.logits_soft_cap = true;  // soft_cap/'s policy: fp16/bf16 with K/V in q's dtype (the rules)
  // ROPE_LLAMA: the chunk kernel under rope/'s policy, each K tile rotated in shared
  // memory once it lands, q in registers, both rounded to the dtype.
  s.pos_encodings = {PosEncoding::none, PosEncoding::rope_llama};
  s.rope_rounds_to_dtype = true;
  s.rules = [](const BatchShape& shape) -> std::string {
    if (shape.pos_encoding == PosEncoding::rope_llama &&
        (shape.dtype == DType::f32 || (shape.head_dim != 64 && shape.head_dim != 128)))
      return "03_split_kv rotates (pos_encoding rope_llama) fp16/bf16 heads of head_dim 64 or 128 only";
    if (shape.logits_soft_cap > 0.f) {
      if (shape.pos_encoding != PosEncoding::none)
        return "03_split_kv does not combine logits_soft_cap with pos_encoding rope_llama";
      if ((shape.dtype != DType::f16 && shape.dtype != DType::bf16) || shape.resolved_kv_dtype() != shape.dtype)
        return "03_split_kv caps logits (logits_soft_cap) for fp16/bf16 q with K/V in q's dtype only";
    }
    return {};
  };
  // The registry's runner plans for CUDA graphs, as a serving engine's decode step does,
  // so that the benchmark replays a captured run() for this stage as it does for stage
  // 02 and the peers. (SplitKVOptions' own default is FlashInfer's: no graph.)
  s.make_runner = [] {
    SplitKVOptions options;
    options.enable_cuda_graph = true;
    return std::make_unique<SplitKVRunner>(options);
  };
  return s;
}

}  // namespace flashstep::stages::split_kv
