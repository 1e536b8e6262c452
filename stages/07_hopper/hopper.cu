// Stage 07 — Hopper prefill, append and large-group decode: the planner, the tensor maps,
// the launcher and the registry entries.
//
// The kernel (hopper_attention.cuh) is instantiated for fp16 and bf16 x head_dim 64, 128
// and 256 (ragged) and 128 and 256 (paged), each with and without the window, and with
// the window under soft_cap/'s and sinks/'s policies; and, ragged, for MLA's prefill (q
// and k 192 wide, v and o 128) without them. Causal and the KV split are run-time flags.
// The tensor maps are encoded in run(), where the device pointers are known (a few
// microseconds of host work, captured by value in a CUDA graph; the last few encoded on a
// thread are reused for the same buffers).
//
// How to run it: `ctest -L gpu` validates it on the prefill grids of the registry;
// `flashstep_bench --shapes=bench/shapes_prefill.csv` times it.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "04_tensor_core/tensor_core.hpp"  // kMaxPageSize
#include "03_split_kv/merge_states.cuh"
#include "07_hopper/hopper.hpp"
#include "07_hopper/hopper_attention.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/reference/errors.hpp"
#include "sinks/sinks.cuh"
#include "soft_cap/soft_cap.cuh"

namespace flashstep::stages::hopper {

namespace {

/// HopperTraits::Br, the packed query rows of a block: 64 per consumer warp group, 192 at
/// head_dim 64, else 128. (The element type and the storage do not change it.)
int query_rows(const BatchShape& shape) { return 64 * consumer_groups(shape.head_dim, shape.resolved_head_dim_vo()); }

/// The query box is (64, group, Br / group): a token's group rows never straddle a tile.
std::string tile_rule(const std::string& name, const BatchShape& shape) {
  const int rows = query_rows(shape);
  if (rows % shape.group_size() != 0)
    return name + " needs a GQA group that divides " + std::to_string(rows) + " at head_dim " +
           std::to_string(shape.head_dim);
  if (shape.resolved_head_dim_vo() != shape.head_dim && (shape.window_left >= 0 || shape.logits_soft_cap > 0.f))
    return name + " runs head_dim_vo != head_dim (MLA's prefill) without window_left and logits_soft_cap";
  return std::string();
}

/// The driver's tensor-map encoder, through the runtime (no link against libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    FLASHSTEP_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found == cudaDriverEntryPointSuccess) encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  ref::require(encode != nullptr, "HopperRunner::run", "the driver has no cuTensorMapEncodeTiled");
  return encode;
}

/// A (tokens, heads, head_dim) tensor as a 3-D tensor map read in boxes of
/// (64 columns, box_heads heads, box_tokens tokens), written to shared memory with the
/// 128-byte swizzle that wgmma's descriptors expect.
CUtensorMap encode_map(const void* base, DType dtype, int64_t tokens, int heads, int head_dim, int box_heads,
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

/// The page pool as a 5-D tensor map for one TMA copy per page: all `rows` tokens of a page
/// for one head, every 64-column block, in the order the paged kernel's tiles lie (atom by
/// atom: HopperTraits::kAtomsOuter). Innermost first, the dims are (64 columns, 8 rows,
/// column blocks, 8-row groups, pages), the box (64, 8, width / 64, rows / 8, 1), so the
/// copy engine writes rows 0-7 of every column block, then rows 8-15, ... Strides need not
/// grow from one dim to the next: the column blocks (128 bytes apart) come after the rows.
/// NHD (page, K/V, slot, head, column) has its heads' column blocks side by side, so the
/// head is a column-block coordinate (H x width / 64 of them) and the pages dim counts
/// (page, K/V) planes; HND (page, K/V, head, slot, column) has each head's rows apart, so
/// the head joins the pages dim ((page x planes + plane) x H + head). `planes` is 2 (K and
/// V) or 1 (a pool of K alone, or V's own pool, `width` wide: MLA's prefill). `num_pages` 0
/// (a pool whose size plan() was not told): the pages dim is left at its largest, 2^32,
/// which a pool that fits in a GPU's memory never passes (page ids come from the table).
CUtensorMap make_pool_map(const void* pool, const BatchShape& s, int rows, int width, int planes) {
  CUtensorMap map;
  const cuuint64_t elem = 2, D = cuuint64_t(width), H = cuuint64_t(s.num_kv_heads), P = cuuint64_t(s.page_size);
  const bool hnd = s.kv_layout == KVLayout::HND;
  const cuuint64_t blocks = D / 64, plane_pages = cuuint64_t(planes) * (s.num_pages > 0 ? s.num_pages : INT32_MAX);
  const cuuint64_t pages_dim = std::min<cuuint64_t>(hnd ? plane_pages * H : plane_pages, cuuint64_t{1} << 32);
  const cuuint64_t row = (hnd ? D : H * D) * elem;  // bytes from one token of a head's page to the next
  const cuuint64_t dims[5] = {64, 8, hnd ? blocks : H * blocks, P / 8, pages_dim};
  // bytes to the next index of dims 1..4: a row, a column block, 8 rows, a (page, plane[, head])
  const cuuint64_t strides[4] = {row, 128, 8 * row, hnd ? P * D * elem : P * H * D * elem};
  const cuuint32_t box[5] = {64, 8, cuuint32_t(blocks), cuuint32_t(rows / 8), 1};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, s.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 5,
      const_cast<void*>(pool), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  ref::require(r == CUDA_SUCCESS, "HopperRunner::run",
               "cuTensorMapEncodeTiled failed for a page pool (error " + std::to_string(int(r)) +
                   "): kv_pool and v_pool must be 16-byte aligned");
  return map;
}

/// encode_map(), remembered: a map is a pure function of these arguments, and run()
/// (once per layer) often sees the same q, k and v buffers again (an engine's activations
/// come back at the same addresses layer after layer), so the last few maps this thread
/// encoded are kept and an equal request is answered without the driver's encoder.
CUtensorMap make_map(const void* base, DType dtype, int64_t tokens, int heads, int head_dim, int box_heads,
                     int box_tokens) {
  struct Entry {
    CUtensorMap map;
    const void* base = nullptr;
    int64_t tokens = -1;
    DType dtype = DType::f32;
    int heads = 0, head_dim = 0, box_heads = 0, box_tokens = 0;
  };
  constexpr int kEntries = 8;
  thread_local Entry memo[kEntries];
  thread_local int next = 0;
  for (const Entry& e : memo)
    if (e.base == base && e.tokens == tokens && e.dtype == dtype && e.heads == heads && e.head_dim == head_dim &&
        e.box_heads == box_heads && e.box_tokens == box_tokens)
      return e.map;
  Entry& e = memo[next];
  next = (next + 1) % kEntries;
  e.map = encode_map(base, dtype, tokens, heads, head_dim, box_heads, box_tokens);  // (throws before it is kept)
  e.base = base;
  e.tokens = tokens;
  e.dtype = dtype;
  e.heads = heads;
  e.head_dim = head_dim;
  e.box_heads = box_heads;
  e.box_tokens = box_tokens;
  return e.map;
}

/// What a captured graph freezes of run(): the grid, the split, and the tensor maps, whose
/// sizes are the batch's nnz_qo and nnz_kv (a map describes the whole of q, k or v).
std::string launch_of(const Schedule& s, const BatchShape& shape) {
  return "stage 07: " + std::to_string(s.num_items()) + " work items x " + std::to_string(shape.num_kv_heads) +
         " kv heads, kv_chunk_size " + std::to_string(s.kv_chunk_size) + ", nnz_qo " + std::to_string(shape.nnz_qo()) +
         ", nnz_kv " + std::to_string(shape.kv_indptr.empty() ? 0 : shape.kv_indptr.back());
}

template <typename T, int HEAD_DIM, bool PAGED, bool WINDOW, typename Policy, int HEAD_DIM_VO>
void launch(const BatchShape& s, const HopperLaunch& l, cudaStream_t stream) {
  using Tr = HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>;
  const int group = s.group_size();
  HopperParams p;
  p.q_map = make_map(l.q, s.dtype, s.nnz_qo(), s.num_qo_heads, HEAD_DIM, group, Tr::Br / group);
  if constexpr (PAGED) {
    // V of its own width (MLA's prefill) comes from its own pool, and K's holds K alone
    constexpr bool kOwnV = HEAD_DIM_VO != HEAD_DIM;
    const bool hnd = s.kv_layout == KVLayout::HND;
    p.kv = kernels::make_paged_kv(static_cast<const uint16_t*>(l.kv_pool), l.kv_indptr, l.kv_indices,
                                  l.kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM, hnd);
    if constexpr (kOwnV) {
      p.kv.stride_page = p.kv.stride_kv;  // one plane a page
      p.v_kv = kernels::make_paged_kv(static_cast<const uint16_t*>(l.v_pool), l.kv_indptr, l.kv_indices,
                                      l.kv_last_page_len, s.page_size, s.num_kv_heads, HEAD_DIM_VO, hnd);
      p.v_kv.stride_page = p.v_kv.stride_kv;
    }
    p.hnd = hnd;
    // one TMA copy per page where a page is a whole number of 8-row swizzle atoms and the
    // key tile a whole number of pages (8, 16, 32, 64 tokens)
    if (s.page_size % 8 == 0 && Tr::Bc % s.page_size == 0) {
      p.tma_rows = s.page_size;
      p.kv_map = make_pool_map(l.kv_pool, s, p.tma_rows, HEAD_DIM, kOwnV ? 1 : 2);
      if constexpr (kOwnV) p.v_pool_map = make_pool_map(l.v_pool, s, p.tma_rows, HEAD_DIM_VO, 1);
    }
  } else {
    p.k_map = make_map(l.k, s.dtype, s.kv_indptr.back(), s.num_kv_heads, HEAD_DIM, 1, Tr::Bc);
    p.v_map = make_map(l.v, s.dtype, s.kv_indptr.back(), s.num_kv_heads, HEAD_DIM_VO, 1, Tr::Bc);
    p.kv_indptr = l.kv_indptr;
  }
  p.qo_indptr = l.qo_indptr;
  p.request_indices = l.request_indices;
  p.qo_tile_indices = l.qo_tile_indices;
  p.kv_chunk_indices = l.kv_chunk_indices;
  p.kv_chunk_size = l.kv_chunk_size;
  p.partial_indptr = l.partial_indptr;
  p.partial_o = l.partial_o;
  p.partial_lse = l.partial_lse;
  p.o = l.o;
  p.lse = l.lse;
  // the output by TMA stores (HopperTraits::kStoreByTma), where a consumer's 64 rows are a
  // box of o: whole tokens of the group, 16-byte aligned rows; a split writes fp32 partials
  if constexpr (Tr::kStoreByTma) {
    if (64 % group == 0 && l.kv_chunk_size == 0 && l.o != nullptr && reinterpret_cast<uintptr_t>(l.o) % 16 == 0) {
      p.o_map = make_map(l.o, s.dtype, s.nnz_qo(), s.num_qo_heads, HEAD_DIM_VO, group, 64 / group);
      p.o_by_tma = true;
    }
  }
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.group_size = group;
  p.causal = s.mode == Mode::prefill && s.causal;
  p.window_left = s.window_left;
  p.score_scale = s.resolved_sm_scale() * kernels::kLog2e;
  // The blocks' order (make_schedule checked the grid's limits). A prefill's query tiles of
  // one request read the same K/V: with the work items fastest, the blocks resident at one
  // time are tiles of one kv head, and L2 serves most of their reads. A decode batch's items
  // share no keys: there the kv heads go fastest, and the resident blocks read neighbouring
  // heads of the same tokens (on an H200, b1 x 131072 ran at 0.89-0.90 and b128 x 8192 at
  // page 1 at 0.94 of this order with the items fastest; the README has the table).
  p.heads_fastest = s.mode == Mode::decode;
  p.num_items = static_cast<int>(l.num_items);
  // Persistent, given a claim counter: one block per multiprocessor (a block's shared
  // memory leaves room for no second), each claiming its next unit of the longest-first
  // list as it starts one. Without one, a block per unit.
  const int64_t units = int64_t{l.num_items} * s.num_kv_heads;
  p.unit_counter = l.unit_counter;
  const int64_t blocks = l.unit_counter == nullptr ? units : l.max_blocks > 0 ? l.max_blocks : device_sm_count();
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(units, blocks)));
  hopper_attention_kernel<T, HEAD_DIM, PAGED, WINDOW, Policy, HEAD_DIM_VO>
      <<<grid, Tr::kThreads, Tr::smem_bytes(), stream>>>(
          p, Policy::Params::from(kernels::PolicyInputs{nullptr, l.sinks, s.logits_soft_cap}));
  kernels::check_launch("hopper_attention_kernel");
}

/// The kernel's dynamic shared-memory limit raised to what it uses (a host call: plan()
/// makes it, run() does not).
template <typename T, int HEAD_DIM, bool PAGED, bool WINDOW, typename Policy, int HEAD_DIM_VO>
void set_smem_limit() {
  FLASHSTEP_CUDA_CHECK(
      cudaFuncSetAttribute(hopper_attention_kernel<T, HEAD_DIM, PAGED, WINDOW, Policy, HEAD_DIM_VO>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(HopperTraits<T, HEAD_DIM, PAGED, HEAD_DIM_VO>::smem_bytes())));
}

/// Calls f(T{}, head_dim, paged, window, policy, head_dim_vo) for the batch's element
/// type, head_dim, storage, whether it has a window, the policy its run takes and v's
/// width: all but T and the policy as std::integral_constant, the policy as a value of its
/// type (the kernel's template arguments). A run with sinks takes the kernel under
/// sinks/'s policy, a capped one under soft_cap/'s, each always the instantiation with the
/// window (gpt-oss's layers slide a window beside their sinks, Gemma 2's beside the cap),
/// so that a policy costs one instantiation per element type and head_dim, not two. Sinks
/// and the cap do not combine. MLA's prefill (head_dim 192, head_dim_vo 128, ragged or
/// paged) is built plain only: the entries' rules refuse a window or a cap with it, run()
/// sinks.
template <typename F>
void dispatch(const BatchShape& s, bool with_sinks, F&& f) {
  auto by_mods = [&](auto t, auto d, auto paged) {
    if (with_sinks) return f(t, d, paged, std::true_type{}, sinks::Sinks{}, d);
    if (s.logits_soft_cap > 0.f) return f(t, d, paged, std::true_type{}, soft_cap::SoftCap{}, d);
    if (s.window_left >= 0) return f(t, d, paged, std::true_type{}, kernels::IdentityPolicy{}, d);
    return f(t, d, paged, std::false_type{}, kernels::IdentityPolicy{}, d);
  };
  auto by_dim = [&](auto t) {
    // over pages head_dim 128 and 256 (stage_info() says why not 64)
    const bool ragged = s.storage == KVStorage::ragged;
    if (s.head_dim == 192 && s.resolved_head_dim_vo() == 128) {
      if (ragged)
        return f(t, std::integral_constant<int, 192>{}, std::false_type{}, std::false_type{}, kernels::IdentityPolicy{},
                 std::integral_constant<int, 128>{});
      return f(t, std::integral_constant<int, 192>{}, std::true_type{}, std::false_type{}, kernels::IdentityPolicy{},
               std::integral_constant<int, 128>{});
    }
    ref::require(s.resolved_head_dim_vo() == s.head_dim, "HopperRunner", "no kernel for " + s.describe());
    if (s.head_dim == 64 && ragged) return by_mods(t, std::integral_constant<int, 64>{}, std::false_type{});
    if (s.head_dim == 128 && ragged) return by_mods(t, std::integral_constant<int, 128>{}, std::false_type{});
    if (s.head_dim == 256 && ragged) return by_mods(t, std::integral_constant<int, 256>{}, std::false_type{});
    if (s.head_dim == 128) return by_mods(t, std::integral_constant<int, 128>{}, std::true_type{});
    if (s.head_dim == 256) return by_mods(t, std::integral_constant<int, 256>{}, std::true_type{});
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

void launch_hopper_attention(const BatchShape& shape, const HopperLaunch& l, cudaStream_t stream) {
  if (l.num_items == 0) return;
  // checks on every run: their messages are built only when one fails (require_lazy)
  ref::require_lazy(l.sinks == nullptr || shape.logits_soft_cap <= 0.f, "HopperRunner::run", [&] {
    return "batch.sinks is given, but sinks and logits_soft_cap do not combine in stage 07 (" + shape.describe() + ")";
  });
  ref::require_lazy(l.sinks == nullptr || shape.resolved_head_dim_vo() == shape.head_dim, "HopperRunner::run", [&] {
    return "batch.sinks is given, but stage 07 runs head_dim_vo != head_dim without sinks (" + shape.describe() + ")";
  });
  if (shape.storage == KVStorage::paged) {
    const bool own_v = shape.resolved_head_dim_vo() != shape.head_dim;
    ref::require_lazy(own_v == (l.v_pool != nullptr), "HopperRunner::run", [&] {
      return own_v ? "batch.v_pool is null, but head_dim_vo != head_dim keeps V in a pool of its own (" +
                         shape.describe() + ")"
                   : "batch.v_pool is given, but head_dim_vo == head_dim keeps V in kv_pool (" + shape.describe() + ")";
    });
  }
  dispatch(shape, l.sinks != nullptr, [&](auto t, auto d, auto paged, auto window, auto policy, auto vo) {
    launch<decltype(t), d(), paged(), window(), decltype(policy), vo()>(shape, l, stream);
  });
}

void prepare_hopper_attention(const BatchShape& shape) {
  // both instantiations a run of this plan may take: with sinks and without
  for (bool with_sinks : {false, true})
    dispatch(shape, with_sinks, [](auto t, auto d, auto paged, auto window, auto policy, auto vo) {
      set_smem_limit<decltype(t), d(), paged(), window(), decltype(policy), vo()>();
    });
}

HopperRunner::HopperRunner(HopperOptions options) : options_(options) {}

Schedule HopperRunner::make_schedule(const BatchShape& s) const {
  const char* fn = "HopperRunner::plan";
  // the entry's rules less the GPU's (a schedule is host work; plan() checks the GPU)
  StageInfo info = s.storage == KVStorage::paged ? stage_info() : ragged_stage_info();
  info.rules = [name = info.name](const BatchShape& shape) { return tile_rule(name, shape); };
  const std::string reason = info.unsupported_reason(s);
  ref::require(reason.empty(), fn, reason);
  ref::require(options_.max_blocks >= 0, fn,
               "max_blocks must be 0 (one per multiprocessor) or positive (got " + std::to_string(options_.max_blocks) +
                   ")");
  ref::require(options_.kv_chunk_size >= 0 && options_.kv_chunk_size % kKeyTile == 0, fn,
               "kv_chunk_size must be 0 (auto) or a positive multiple of 128 (got " +
                   std::to_string(options_.kv_chunk_size) + ")");
  ref::require(static_cast<int>(s.qo_indptr.size()) == s.batch_size + 1 &&
                   static_cast<int>(s.kv_indptr.size()) == s.batch_size + 1,
               fn, "qo_indptr and kv_indptr must have batch_size + 1 entries");
  Schedule sched;
  const int64_t br = query_rows(s);
  sched.Br = static_cast<int>(br);
  const int64_t group = s.group_size();
  std::vector<int64_t> tiles(static_cast<size_t>(s.batch_size));
  int64_t base_items = 0, max_kv = 0;
  for (int b = 0; b < s.batch_size; ++b) {
    const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
    tiles[b] = (qo_len * group + br - 1) / br;
    base_items += tiles[b];
    max_kv = std::max(max_kv, s.kv_len(b));
  }
  // Too few blocks to fill the chip (decode batches, a few long requests, a cascade's
  // shared level): cut every request's KV into chunks of whole key tiles, stage 03's
  // split, merged by its kernel.
  int64_t chunk = options_.kv_chunk_size;
  if (chunk == 0 && base_items > 0) {
    const int64_t target = options_.target_blocks > 0 ? options_.target_blocks : int64_t{device_sm_count()};
    const int64_t blocks = base_items * s.num_kv_heads;
    if (blocks < target && s.nnz_qo() <= 65535) {  // 65535: the merge grid's y dimension
      // as many chunks as it takes for the longest request to bring the grid to the
      // target: stage 04's rule. (Tried and measured slower on an H100: keeping 128 MQA
      // decode requests whole, one wave of 128 blocks on 132 multiprocessors, took 311 us
      // against 226 us split in two, two waves of halves, though with the idle consumer 1
      // computing in the split run; a block alone on its multiprocessor waits on its ring.)
      const int64_t splits = (target + blocks - 1) / blocks;
      chunk = ((max_kv + splits - 1) / splits + kKeyTile - 1) / kKeyTile * kKeyTile;
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
      const int64_t row_begin = tile * br, rows = std::min<int64_t>(br, qo_len * group - row_begin);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t lo = chunk > 0 ? c * chunk : 0, hi = chunk > 0 ? std::min(kv_len, lo + chunk) : kv_len;
        items.push_back({b, static_cast<int32_t>(tile), static_cast<int32_t>(c),
                         tensor_core::visible_keys(s, qo_len, kv_len, row_begin, rows, lo, hi)});
      }
    }
    if (chunk > 0)
      for (int64_t i = 0; i < qo_len; ++i)
        sched.partial_indptr.push_back(sched.partial_indptr.back() + static_cast<int32_t>(chunks));
  }
  // Longest first: the last wave is made of short blocks, so the chip empties evenly.
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.keys > b.keys; });
  // (the kernel's unit index steps a grid's width past the last unit: room to spare in 32 bits)
  ref::require(static_cast<int64_t>(items.size()) * s.num_kv_heads < (int64_t{1} << 30), fn,
               "too many work items for one grid");
  // a prefill's grid is (work items, kv heads), whose y is at most 65535; a decode batch's is
  // one dimension (launch()), held to the same limit so one rule covers both
  ref::require(s.num_kv_heads <= 65535, fn, "num_kv_heads must be <= 65535 (" + s.describe() + ")");
  for (const Item& it : items) {
    sched.request_indices.push_back(it.request);
    sched.qo_tile_indices.push_back(it.tile);
    sched.kv_chunk_indices.push_back(it.chunk);
  }
  return sched;
}

namespace {
/// The persistent grid's claim counter: an int in a workspace section of its own past
/// stage 04's layout (schedule, partial rows).
size_t counter_offset(const tensor_core::WorkspaceLayout& w) { return align_up(w.bytes); }
size_t total_bytes(const tensor_core::WorkspaceLayout& w) { return counter_offset(w) + align_up(sizeof(int)); }
}  // namespace

size_t HopperRunner::workspace_bytes(const BatchShape& shape) const {
  return total_bytes(tensor_core::layout_of(make_schedule(shape), shape.num_qo_heads, shape.resolved_head_dim_vo()));
}

void HopperRunner::plan(const BatchShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream) {
  const char* fn = "HopperRunner::plan";
  const std::string gpu = hopper_unavailable_reason();
  ref::require(gpu.empty(), fn, gpu);
  Schedule sched = make_schedule(shape);
  const tensor_core::WorkspaceLayout w = tensor_core::layout_of(sched, shape.num_qo_heads,
                                                                shape.resolved_head_dim_vo());
  captured_.check_plan(fn, launch_of(sched, shape));
  ref::require(workspace_size >= total_bytes(w) && workspace != nullptr, fn,
               "workspace holds " + std::to_string(workspace_size) + " bytes, the plan needs " +
                   std::to_string(total_bytes(w)));
  schedule_ = std::move(sched);
  shape_ = shape;
  workspace_ = static_cast<uint8_t*>(workspace);
  prepare_hopper_attention(shape);
  tensor_core::upload_schedule(schedule_, w, staging_, workspace_, stream);
  // zero once: each launch leaves it zero (claim_unit)
  FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(workspace_ + counter_offset(w), 0, sizeof(int), stream));
}

void HopperRunner::run(const DeviceBatch& batch, cudaStream_t stream) {
  captured_.on_run(stream, [&] { return launch_of(schedule_, shape_); });
  if (schedule_.num_items() == 0) return;
  const tensor_core::WorkspaceLayout w = tensor_core::layout_of(schedule_, shape_.num_qo_heads,
                                                                shape_.resolved_head_dim_vo());
  HopperLaunch l;
  l.q = batch.q;
  l.k = batch.k;
  l.v = batch.v;
  l.kv_pool = batch.kv_pool;
  l.v_pool = batch.v_pool;
  l.qo_indptr = batch.qo_indptr;
  l.kv_indptr = batch.kv_indptr;
  l.kv_indices = batch.kv_indices;
  l.kv_last_page_len = batch.kv_last_page_len;
  l.o = batch.o;
  l.lse = batch.lse;
  l.sinks = batch.sinks;
  // A prefill's units claim their way over a persistent grid; a decode batch keeps a block
  // per unit (the persistent grid's first form, units b, b + grid, ... of a static
  // stripe, ran decode over pages at 0.75-0.95 of it on an H200; the chapter's table).
  if (shape_.mode == Mode::prefill) l.unit_counter = reinterpret_cast<int*>(workspace_ + counter_offset(w));
  l.max_blocks = options_.max_blocks;
  l.num_items = schedule_.num_items();
  l.request_indices = reinterpret_cast<const int32_t*>(workspace_ + w.request_indices);
  l.qo_tile_indices = reinterpret_cast<const int32_t*>(workspace_ + w.qo_tile_indices);
  l.kv_chunk_indices = reinterpret_cast<const int32_t*>(workspace_ + w.kv_chunk_indices);
  l.kv_chunk_size = schedule_.kv_chunk_size;
  l.partial_indptr = reinterpret_cast<const int32_t*>(workspace_ + w.partial_indptr);
  l.partial_o = reinterpret_cast<float*>(workspace_ + w.partial_o);
  l.partial_lse = reinterpret_cast<float*>(workspace_ + w.partial_lse);
  launch_hopper_attention(shape_, l, stream);
  if (schedule_.kv_chunk_size == 0 || shape_.nnz_qo() == 0) return;
  // stage 03's merge: each query row's chunks folded by their lse
  dispatch(shape_, false, [&](auto t, auto, auto, auto, auto, auto vo) {
    using T = decltype(t);
    split_kv::launch_merge<T, vo()>(l.partial_o, l.partial_lse, l.partial_indptr, static_cast<T*>(batch.o), batch.lse,
                                    shape_.num_qo_heads, static_cast<int>(shape_.nnz_qo()), false, stream);
  });
}

namespace {
/// What both registry entries share.
StageInfo common_info(const std::string& name) {
  StageInfo s;
  s.name = name;
  s.modes = {Mode::prefill, Mode::decode};  // decode: large GQA groups, the group's rows in one tile
  s.dtypes = {DType::f16, DType::bf16};
  s.head_dims = {64, 128, 256};
  s.max_group_size = 32;
  s.causal = true;
  s.window_left = true;
  s.logits_soft_cap = true;
  s.sinks = true;  // sinks/'s policy, through the epilogue's on_state
  // Not CUDA-graph safe: the grid follows the lengths (one block per work item), and the
  // tensor maps a graph captures hold the batch's nnz_qo (and, ragged, nnz_kv).
  s.cuda_graph = false;
  s.rules = [name](const BatchShape& shape) -> std::string {
    const std::string tile = tile_rule(name, shape);
    return tile.empty() ? hopper_unavailable_reason() : tile;
  };
  return s;
}
}  // namespace

StageInfo stage_info() {
  StageInfo s = common_info("07_hopper");
  s.summary =
      "prefill on Hopper over paged K/V: the producer warp group gathers pages with cp.async, "
      "wgmma, two consumer warp groups";
  s.storage = KVStorage::paged;
  s.kv_layouts = {KVLayout::NHD, KVLayout::HND};
  s.max_page_size = tensor_core::kMaxPageSize;
  // head_dim 64 over pages ran at 0.88x stage 04 on an H100 (the chapter's table): a 128-byte
  // row costs the gather as much as a 256-byte one, for half the math. Stage 04 keeps it.
  s.head_dims = {128, 256};
  // MLA's prefill over pages: K's pool and V's own (DeviceBatch::v_pool), as in the ragged entry
  s.head_dim_pairs = {{192, 128}};
  s.make_runner = [] { return std::make_unique<HopperRunner>(); };
  return s;
}

LevelKernel level_kernel() {
  LevelKernel k;
  k.stage = "07_hopper";
  k.key_tile = kKeyTile;
  k.make_schedule = [](const BatchShape& level, int kv_chunk_size) {
    HopperOptions options;
    options.kv_chunk_size = kv_chunk_size;
    return HopperRunner(options).make_schedule(level);
  };
  k.prepare = &prepare_hopper_attention;
  k.launch = &launch_hopper_attention;
  return k;
}

StageInfo ragged_stage_info() {
  StageInfo s = common_info("07_hopper_ragged");
  s.summary =
      "prefill on Hopper: TMA into 128-byte swizzled tiles, wgmma, a producer and two consumer warp groups "
      "(three at head_dim 64)";
  s.storage = KVStorage::ragged;
  // MLA's prefill, the naive form: q and k of head_dim_nope + rope_dim = 192, v and o of
  // head_dim_vo = 128 (DeepSeek-V2/V3); K and V tiles of their own widths in the ring
  s.head_dim_pairs = {{192, 128}};
  s.kv_layouts = {KVLayout::NHD};
  s.make_runner = [] { return std::make_unique<HopperRunner>(); };
  return s;
}

}  // namespace flashstep::stages::hopper
