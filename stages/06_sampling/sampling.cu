// Stage 06 — the sorting-free rejection sampler on the GPU.
//
// What it does: one thread block per output draws one token from row indices[i] under a
// filter (none, top-k, top-p, min-p, top-k and top-p jointly), with the reference's
// Philox stream (output i, round j reads word offset + j of subsequence i) and its exact
// integer masses, so that every token equals ref::rejection_sample_row's.
// Why it is fast: no sort. A round is two streaming passes over the row (an inverse CDF
// by block scan that stops where the draw lands, then a count and mass above two pivots
// by block reduction); a rejection raises the floor `low` so later rounds draw from fewer
// candidates, and a handful of rounds is typical (the chapter has the counts). From
// logits (f32 or bf16) the same kernel fuses the softmax: the row's max and sum in one
// pass first, then every pass reads p_j = exp(x_j - max) * (1 / sum) computed on the fly,
// bit-identically.
// When outputs are few, each probability row is split over the blocks of a cluster
// (rejection_sampling_cluster_kernel), so batch 1 uses 16 SMs instead of one.
// The full passes stream their tiles through a cp.async ring, every other one last tile
// first, and the last rounds read a candidate list in shared memory (row_passes.cuh);
// where a GPU gives a block too little shared memory for the ring or the list, the
// launcher leaves them out (fit_shared_memory), which changes no token.
// What it still does badly: pass 0 (the row's exact total) is a full extra pass that a
// sampler trusting rows to sum to 1 would skip; masses are 128-bit integers (summed per
// thread in two 64-bit halves, MassAcc, and widened once per tile), so the passes still
// do more work than float sums.
// How to run it: build flashstep_sampling_tests and run it (tests/stages/), or
//     flashstep_exercise_06_sampling
// for the exercise; the chapter is README.md in this folder.
#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "06_sampling/launch.hpp"
#include "06_sampling/row_passes.cuh"
#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/philox.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::sampling {

namespace device {

/// The filter of one output, as the kernel reads it.
struct Filter {
  int64_t top_k;  ///< top_k, top_k_top_p
  float top_p;    ///< top_p, top_k_top_p
  float min_p;    ///< min_p
};

/// Everything one launch of the sampler reads and writes (raw pointers, FlashInfer style).
struct SamplerParams {
  const void* input;                ///< (rows, vocab) probabilities (f32), or logits (Source)
  int64_t rows, vocab;              ///< shape of probs
  const int32_t* indices;           ///< (batch) or null: output i reads row indices[i] (or i)
  const int32_t* prior_status;      ///< (rows) or null: a bad status of the input row is passed on
  int64_t top_k;                    ///< scalar, when top_k_per_output is null
  const int32_t* top_k_per_output;  ///< (batch) or null
  float top_p;                      ///< scalar, when top_p_per_output is null
  const float* top_p_per_output;    ///< (batch) or null
  float min_p;                      ///< scalar, when min_p_per_output is null
  const float* min_p_per_output;    ///< (batch) or null
  uint64_t seed, offset;            ///< Philox key and the stream word of round 0
  const uint64_t* seeds;            ///< (batch) or null: output i's key (then subsequence 0)
  const uint64_t* offsets;          ///< (batch) or null: output i's word of round 0
  int32_t* samples;                 ///< (batch) tokens
  int32_t* rounds;                  ///< (batch) or null
  int32_t* status;                  ///< (batch) or null
  float* probs_out;                 ///< (batch, vocab) or null: the fused softmax rows (logits only)
  bool stream;                      ///< full passes by stream_tiles (aligned rows; dynamic shared memory)
  bool compact;                     ///< rejection rounds over the candidate list once it fits
};

/// What a sampler kernel reads: probabilities, or logits whose softmax it fuses.
enum class Source { probs, f32_logits, bf16_logits };

__host__ __device__ constexpr bool uses_top_k(FilterKind k) {
  return k == FilterKind::top_k || k == FilterKind::top_k_top_p;
}
__host__ __device__ constexpr bool uses_top_p(FilterKind k) {
  return k == FilterKind::top_p || k == FilterKind::top_k_top_p;
}

/// Step 1: the row and filter of output `out`, or the Status that forbids drawing.
template <FilterKind KIND>
__device__ Status read_output(const SamplerParams& p, int64_t out, int64_t& row, Filter& f) {
  row = p.indices ? p.indices[out] : out;
  if (row < 0 || row >= p.rows) return Status::bad_index;
  // a status from the kernel that wrote this row comes first (it saw the input first)
  if (p.prior_status && p.prior_status[row] != static_cast<int32_t>(Status::ok))
    return static_cast<Status>(p.prior_status[row]);
  f.top_k = p.top_k_per_output ? p.top_k_per_output[out] : p.top_k;
  f.top_p = p.top_p_per_output ? p.top_p_per_output[out] : p.top_p;
  f.min_p = p.min_p_per_output ? p.min_p_per_output[out] : p.min_p;
  if (uses_top_k(KIND) && f.top_k < 1) return Status::bad_top_k;
  if (uses_top_p(KIND) && !(f.top_p > 0.f && f.top_p <= 1.f)) return Status::bad_top_p;
  if (KIND == FilterKind::min_p && !(f.min_p >= 0.f && f.min_p <= 1.f)) return Status::bad_min_p;
  return Status::ok;
}

/// Step 2's verdict on pass 0: the first bad-entry flag, or a row with no mass.
__device__ __forceinline__ Status row_status(const RowSummary& s) {
  if (s.flags & kFlagNotFinite) return Status::not_finite;
  if (s.flags & kFlagNegative) return Status::negative;
  if (s.flags & kFlagAboveOne) return Status::above_one;
  if (s.total == 0) return Status::zero_row;
  return Status::ok;
}

/// The u24 of (output, round): the same number ref::rejection_sample_row uses, with
/// (seed, subsequence out, offset), or, where the output has its own key, with
/// (seed_per_output[out], subsequence 0, its offset): a one-output call's stream.
__device__ __forceinline__ uint32_t uniform_bits(const SamplerParams& p, int64_t out, int32_t round) {
  const uint64_t key = p.seeds ? p.seeds[out] : p.seed;
  const uint64_t subsequence = p.seeds ? 0 : static_cast<uint64_t>(out);
  const uint64_t offset = p.offsets ? p.offsets[out] : p.offset;
  return kernels::philox_uniform_bits24(key, subsequence, offset + static_cast<uint64_t>(round));
}

/// Does a pivot with `count` entries and `mass` above it pass the filter (every entry at
/// or above a passing pivot is kept)?
template <FilterKind KIND>
__device__ __forceinline__ bool pivot_passes(const Filter& f, int32_t count, Mass mass, Mass top_p_bound) {
  if (uses_top_k(KIND) && !(count < f.top_k)) return false;
  if (uses_top_p(KIND) && !(mass < top_p_bound)) return false;
  return true;
}

struct Draw {
  int32_t token;
  int32_t rounds;
  Status status;
};

/// Step 3 for top_k / top_p / top_k_top_p: draw among p > low, test the two pivots,
/// raise low (ref::rejection_sample_row, line for line).
template <FilterKind KIND, int VEC, bool CLUSTER, typename Row>
__device__ Draw draw_by_rejection(const SamplerParams& p, int64_t out, const Row& row, const RowSummary& s,
                                  const Filter& f, SharedState& sh, RowSplit& sp) {
  const Mass top_p_bound = uses_top_p(KIND) ? mass_fraction_ceil(s.total, f.top_p) : 0;
  float low = 0.f, high = 1.f;
  Mass q = s.total;  // mass of the candidates p > low
  int tile_set = 0;  // where the last pass kept the candidates' per-tile masses
  // the candidate list (row_passes.cuh), one block per row only: once a round leaves at
  // most kListCapacity candidates, later rounds read the list, not the row
  const bool may_list = !CLUSTER && p.compact;
  CandidateList list = candidate_list();
  bool listed = false;
  for (int32_t round = 0;;) {
    const Mass threshold = scaled_threshold(uniform_bits(p, out, round++), q);
    int32_t token;
    float pivot_0;
    if (listed) {
      const int32_t at = list_inverse_cdf(list, low, threshold, sh);
      if (at < 0) return {kInvalidToken, round, Status::internal_error};
      token = list.index[at];
      pivot_0 = list.value[at];
    } else {
      token = inverse_cdf<VEC>(
          row, [low](float x) { return x > low; }, threshold, sh, tile_set, sp.phase);
      if (token < 0) return {kInvalidToken, round, Status::internal_error};
      pivot_0 = row.at(token);
    }
    // two pivots per pass: the drawn probability, and the midpoint towards `high`
    const float pivot_1 = __fmul_rn(__fadd_rn(pivot_0, high), 0.5f);
    const PivotStats above = listed ? list_count_mass_above(list, pivot_0, pivot_1, sh)
                                    : count_mass_above<VEC, CLUSTER>(row, pivot_0, pivot_1, sh, sp);
    if (pivot_passes<KIND>(f, above.count_0, above.mass_0, top_p_bound)) return {token, round, Status::ok};
    int32_t left;  // candidates of the next round
    if (pivot_passes<KIND>(f, above.count_1, above.mass_1, top_p_bound)) {
      low = pivot_0;  // the keep threshold lies in (pivot_0, pivot_1]
      high = pivot_1;
      q = above.mass_0;
      tile_set = 0;
      left = above.count_0;
    } else {
      low = pivot_1;  // the keep threshold lies above pivot_1
      q = above.mass_1;
      tile_set = 1;
      left = above.count_1;
    }
    // low rises every round and `high` always passes, so this ends; never loop on a surprise
    if (!(low < high)) return {kInvalidToken, round, Status::internal_error};
    if (may_list && !listed && left <= list.capacity) {
      gather_candidates<VEC>(row, low, list, sh);
      listed = true;
    }
  }
}

/// Step 3 for none and min_p: one draw, no rejection (the pivot is known upfront).
template <FilterKind KIND, int VEC, bool CLUSTER, typename Row>
__device__ Draw draw_once(const SamplerParams& p, int64_t out, const Row& row, const RowSummary& s, const Filter& f,
                          SharedState& sh, RowSplit& sp) {
  const uint32_t u24 = uniform_bits(p, out, 0);
  int32_t token;
  if (KIND == FilterKind::min_p) {
    const float pivot = __fmul_rn(s.max_p, f.min_p);
    auto kept = [pivot](float x) { return x >= pivot && x > 0.f; };
    const Mass q = sum_mass_where<VEC, true, CLUSTER>(row, kept, sh, sp);
    token = inverse_cdf<VEC>(row, kept, scaled_threshold(u24, q), sh, 0, sp.phase);
  } else {
    token = inverse_cdf<VEC>(
        row, [](float x) { return x > 0.f; }, scaled_threshold(u24, s.total), sh, 0, sp.phase);
  }
  return token < 0 ? Draw{kInvalidToken, 1, Status::internal_error} : Draw{token, 1, Status::ok};
}

/// Pass 0 and the draw, on a row of probabilities in memory or computed on the fly.
/// CLUSTER: the blocks of a cluster share the row (sp); every decision below is taken on
/// cluster-wide results, so all of them take the same path and meet at every barrier.
template <FilterKind KIND, int VEC, bool CLUSTER = false, typename Row>
__device__ Draw sample_row(const SamplerParams& p, int64_t out, const Row& row, const Filter& f, SharedState& sh,
                           RowSplit& sp) {
  const RowSummary s = summarize_row<VEC, true, CLUSTER>(row, sh, sp);  // with set 0: the candidates p > 0
  const Status status = row_status(s);
  if (status != Status::ok) return {kInvalidToken, 0, status};
  if (KIND == FilterKind::none || KIND == FilterKind::min_p)
    return draw_once<KIND, VEC, CLUSTER>(p, out, row, s, f, sh, sp);
  return draw_by_rejection<KIND, VEC, CLUSTER>(p, out, row, s, f, sh, sp);
}

/// One block per output: read its row and filter, (for logits: the softmax's max and
/// sum), pass 0, draw, write. VECTOR_LOADS: 16-byte loads (aligned rows).
template <FilterKind KIND, Source SOURCE, bool VECTOR_LOADS>
__global__ void __launch_bounds__(kBlock) rejection_sampling_kernel(SamplerParams p) {
  __shared__ SharedState sh;
  const int64_t out = blockIdx.x;
  RowSplit whole;
  whole.stream = p.stream && VECTOR_LOADS;
  int64_t row_index = 0;
  Filter f{};
  Draw d{kInvalidToken, 0, read_output<KIND>(p, out, row_index, f)};
  if constexpr (SOURCE == Source::probs) {
    if (d.status == Status::ok) {
      // 16 entries a thread per tile as four 16-byte loads (aligned rows); else 8 loads of 4 bytes
      constexpr int VEC = VECTOR_LOADS ? 16 : 8;
      const ProbRowT<VECTOR_LOADS> row{static_cast<const float*>(p.input) + row_index * p.vocab, p.vocab};
      d = sample_row<KIND, VEC>(p, out, row, f, sh, whole);
    }
  } else {
    // the fused softmax: always 16 entries a thread per tile, so the sum (a float sum,
    // order-dependent) is the same whatever the loads; softmax() uses the same passes
    using T = std::conditional_t<SOURCE == Source::f32_logits, float, Bf16Bits>;
    constexpr int VEC = 16;
    const LogitRowT<T, VECTOR_LOADS> logits{static_cast<const T*>(p.input) + row_index * p.vocab, p.vocab};
    SoftmaxScale scale{};
    uint32_t flags = 0;
    bool have_softmax = false;
    if (d.status == Status::ok) {
      have_softmax = softmax_scale<VEC>(logits, 1.0f, scale, flags, sh, whole);
      if (!have_softmax) d.status = flags ? Status::not_finite : Status::zero_row;
    }
    float* probs_row = p.probs_out ? p.probs_out + out * p.vocab : nullptr;
    if (have_softmax) {
      whole.passes = 1;  // the softmax read the row first to last: the next pass runs back
      const SoftmaxRowT<LogitRowT<T, VECTOR_LOADS>> row{logits, scale, p.vocab};
      if (probs_row) write_row<VEC>(row, probs_row);
      d = sample_row<KIND, VEC>(p, out, row, f, sh, whole);
    } else if (probs_row) {
      for (int64_t i = threadIdx.x; i < p.vocab; i += kBlock) probs_row[i] = NAN;
    }
  }
  if (threadIdx.x == 0) {
    const bool ok = d.status == Status::ok;
    p.samples[out] = ok ? d.token : kInvalidToken;
    if (p.rounds) p.rounds[out] = ok ? d.rounds : 0;
    if (p.status) p.status[out] = static_cast<int32_t>(d.status);
  }
}

/// The same sampler with one output's row split over the C blocks of a cluster (grid =
/// outputs x C, launched with a cluster dimension of C): probability rows with 16-byte
/// loads and per-tile masses (at most kMaxTiles tiles, at least C). Block r reads tiles
/// r, r + C, ... in the counting passes (row_passes.cuh: cluster_combine); every block
/// computes the same token, rank 0 writes it.
template <FilterKind KIND>
__global__ void __launch_bounds__(kBlock) rejection_sampling_cluster_kernel(SamplerParams p) {
#if FLASHSTEP_SAMPLING_HAS_CLUSTERS
  __shared__ SharedState sh;
  const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  RowSplit sp;
  sp.rank = static_cast<int>(cluster.block_rank());
  sp.size = static_cast<int>(cluster.num_blocks());
  sp.stream = p.stream;
  const int64_t out = blockIdx.x / sp.size;
  // no block writes into another's shared memory before every block of the cluster runs
  auto started = cluster.barrier_arrive();
  int64_t row_index = 0;
  Filter f{};
  Draw d{kInvalidToken, 0, read_output<KIND>(p, out, row_index, f)};  // the same in every block
  cluster.barrier_wait(std::move(started));
  if (d.status == Status::ok) {
    const ProbRowT<true> row{static_cast<const float*>(p.input) + row_index * p.vocab, p.vocab};
    d = sample_row<KIND, 16, true>(p, out, row, f, sh, sp);
  }
  // no remote access follows the last cluster barrier of sample_row, so blocks may leave
  if (sp.rank == 0 && threadIdx.x == 0) {
    const bool ok = d.status == Status::ok;
    p.samples[out] = ok ? d.token : kInvalidToken;
    if (p.rounds) p.rounds[out] = ok ? d.rounds : 0;
    if (p.status) p.status[out] = static_cast<int32_t>(d.status);
  }
#else
  __trap();  // compiled for a GPU without clusters, where the host never launches it
#endif
}

}  // namespace device

const char* to_string(Status status) {
  switch (status) {
    case Status::ok: return "ok";
    case Status::bad_index: return "bad_index";
    case Status::bad_top_k: return "bad_top_k";
    case Status::bad_top_p: return "bad_top_p";
    case Status::bad_min_p: return "bad_min_p";
    case Status::bad_temperature: return "bad_temperature";
    case Status::not_finite: return "not_finite";
    case Status::negative: return "negative";
    case Status::above_one: return "above_one";
    case Status::zero_row: return "zero_row";
    case Status::bad_draft_token: return "bad_draft_token";
    case Status::internal_error: return "internal_error";
  }
  return "?";
}

namespace detail {

namespace {
constexpr int64_t kMaxVocab = int64_t{1} << 30;  // a row's mass stays below 2^126

[[noreturn]] void fail(const char* fn, const std::string& message) {
  throw ref::InvalidArgument(std::string(fn) + ": " + message);
}

/// Dynamic shared memory of a sampler launch: stream_tiles' ring when p.stream (16 entries
/// a thread per tile, entries of `bytes_per_entry`), the candidate list when p.compact
/// (over the ring: no streamed pass runs while the list is in use).
size_t ring_bytes(const device::SamplerParams& p, int64_t bytes_per_entry) {
  const size_t ring = p.stream
                          ? size_t{device::kStreamStages} * device::kBlock * 16 * static_cast<size_t>(bytes_per_entry)
                          : 0;
  const size_t list = p.compact ? device::kListBytes : 0;
  return ring > list ? ring : list;
}

template <FilterKind KIND, device::Source SOURCE, bool VECTOR_LOADS>
void launch_kind(const device::SamplerParams& p, int64_t batch, cudaStream_t stream) {
  constexpr int64_t kEntry = SOURCE == device::Source::bf16_logits ? 2 : 4;
  const auto kernel = device::rejection_sampling_kernel<KIND, SOURCE, VECTOR_LOADS>;
  static const size_t allowed = allow_dynamic_smem(
      reinterpret_cast<const void*>(kernel),
      std::max(size_t{device::kStreamStages} * device::kBlock * 16 * kEntry, device::kListBytes));
  const auto ring_of = [](device::SamplerParams q) {
    q.stream = q.stream && VECTOR_LOADS;  // the ring only for aligned rows; the list for any
    return ring_bytes(q, kEntry);
  };
  const device::SamplerParams launched = fit_shared_memory(p, allowed, ring_of);
  kernel<<<static_cast<unsigned>(batch), device::kBlock, ring_of(launched), stream>>>(launched);
  kernels::check_launch("rejection_sampling_kernel");
}

/// How many clusters of c blocks of the cluster kernel fit on the GPU at once (c = 2, 4,
/// 8, 16; 0 where the GPU or the build cannot launch them), asked once per kernel from
/// the current device (16 needs the non-portable cluster size). The build cannot where
/// the code this GPU runs was compiled for an architecture below sm_90 (an A100, or an
/// sm_80 build JIT-compiled for an H100): there the kernel is a trap (row_passes.cuh).
template <FilterKind KIND>
int clusters_that_fit(int c) {
  static const std::array<int, 5> fit = [] {
    std::array<int, 5> n{};
    const auto kernel = device::rejection_sampling_cluster_kernel<KIND>;
    cudaFuncAttributes built{};  // of the image the current GPU runs
    if (cudaFuncGetAttributes(&built, kernel) != cudaSuccess) {
      cudaGetLastError();
      return n;
    }
    if ((built.ptxVersion > 0 ? built.ptxVersion : built.binaryVersion) < 90) return n;
    const size_t ring = size_t{device::kStreamStages} * device::kBlock * 16 * 4;  // the most a launch asks
    if (allow_dynamic_smem(reinterpret_cast<const void*>(kernel), ring) < ring) return n;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      cudaGetLastError();
      return n;
    }
    for (int k = 1; k < 5; ++k) {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(1u << k);
      cfg.blockDim = dim3(device::kBlock);
      cfg.dynamicSmemBytes = ring;
      cudaLaunchAttribute attr{};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = 1u << k;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError();
        clusters = 0;
      }
      n[static_cast<size_t>(k)] = clusters;
    }
    return n;
  }();
  int k = 0;
  while ((1 << k) < c) ++k;
  return fit[static_cast<size_t>(k)];
}

/// Blocks per output: the largest cluster (16, 8, 4 or 2) such that every output's
/// cluster is resident at once and each block has at least one tile of the row; 1 (one
/// block per row) when rows are many, short, longer than kMaxTiles tiles, or unaligned.
/// Depends on batch and vocab only, so a CUDA graph captures a fixed grid.
template <FilterKind KIND>
int cluster_size(const device::SamplerParams& p, int64_t batch) {
  const bool aligned = p.vocab % 4 == 0 && reinterpret_cast<uintptr_t>(p.input) % 16 == 0;
  const int64_t tile = int64_t{device::kBlock} * 16;
  const int64_t tiles = (p.vocab + tile - 1) / tile;
  if (!aligned || tiles > device::kMaxTiles) return 1;
  for (int c = device::kMaxCluster; c >= 2; c /= 2)
    if (c <= tiles && batch <= clusters_that_fit<KIND>(c)) return c;
  return 1;
}

template <FilterKind KIND>
void launch_cluster(const device::SamplerParams& p, int64_t batch, int c, cudaStream_t stream) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(batch * c));
  cfg.blockDim = dim3(device::kBlock);
  cfg.dynamicSmemBytes = ring_bytes(p, 4);
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(c);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  FLASHSTEP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, device::rejection_sampling_cluster_kernel<KIND>, p));
  kernels::check_launch("rejection_sampling_cluster_kernel");
}

template <FilterKind KIND, device::Source SOURCE>
void launch_vec(const device::SamplerParams& p, int64_t batch, int64_t bytes_per_entry, cudaStream_t stream) {
  if constexpr (SOURCE == device::Source::probs) {  // few rows: split each over a cluster
    const int c = cluster_size<KIND>(p, batch);
    if (c > 1) return launch_cluster<KIND>(p, batch, c, stream);
  }
  // 16-byte loads need every row start aligned: vocab * entry size % 16 == 0 and an aligned base
  const bool vec = p.vocab * bytes_per_entry % 16 == 0 && reinterpret_cast<uintptr_t>(p.input) % 16 == 0;
  if (vec) {
    launch_kind<KIND, SOURCE, true>(p, batch, stream);
  } else {
    launch_kind<KIND, SOURCE, false>(p, batch, stream);
  }
}

template <FilterKind KIND>
void launch_source(const device::SamplerParams& p, int64_t batch, bool logits, ElementType dtype, cudaStream_t stream) {
  if (!logits) return launch_vec<KIND, device::Source::probs>(p, batch, 4, stream);
  // the from-logits operators use none (sampling_from_logits), top_k_top_p (joint) and
  // top_p (top_k_first); the other kinds are not instantiated for logits
  if constexpr (KIND == FilterKind::none || KIND == FilterKind::top_p || KIND == FilterKind::top_k_top_p) {
    if (dtype == ElementType::bf16) return launch_vec<KIND, device::Source::bf16_logits>(p, batch, 2, stream);
    return launch_vec<KIND, device::Source::f32_logits>(p, batch, 4, stream);
  } else {
    fail("sampler", "no from-logits sampler for this filter");
  }
}
}  // namespace

size_t allow_dynamic_smem(const void* kernel, size_t bytes) {
  int device = 0, optin = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attr{};
  FLASHSTEP_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  // what a block may opt into, less the kernel's own static shared memory
  const size_t optin_bytes = static_cast<size_t>(optin);
  const size_t room = optin_bytes > attr.sharedSizeBytes ? optin_bytes - attr.sharedSizeBytes : 0;
  const size_t allowed = std::min(bytes, room);
  if (allowed > 48 * 1024)
    FLASHSTEP_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(allowed)));
  return allowed;
}

void check_rows(const char* fn, const char* name, DeviceRows rows, bool bf16_allowed) {
  if (rows.dtype != ElementType::f32 && !(bf16_allowed && rows.dtype == ElementType::bf16))
    fail(fn, std::string(name) + " must be " + (bf16_allowed ? "f32 or bf16" : "f32") + ", got element type " +
                 std::to_string(static_cast<int>(rows.dtype)));
  if (rows.rows < 0) fail(fn, std::string(name) + " must have rows >= 0, got " + std::to_string(rows.rows));
  if (rows.vocab < 1 || rows.vocab > kMaxVocab)
    fail(fn, std::string(name) + " vocab_size must be in [1, 2^30], got " + std::to_string(rows.vocab));
  if (rows.rows > 0 && rows.data == nullptr) fail(fn, std::string(name) + " is null");
}

void check_top_k(const char* fn, TopK top_k) {
  if (!top_k.per_output && top_k.scalar < 1)
    fail(fn, "top_k must be >= 1, but top_k = " + std::to_string(top_k.scalar));
}

void check_top_p(const char* fn, Fraction top_p) {
  const double p = top_p.scalar;
  if (!top_p.per_output && !(p > 0.0 && p <= 1.0 && static_cast<float>(p) > 0.0f))
    fail(fn, "top_p must be in (0, 1], but top_p = " + std::to_string(p));
}

void check_min_p(const char* fn, Fraction min_p) {
  const double m = min_p.scalar;
  if (!min_p.per_output && !(m >= 0.0 && m <= 1.0))
    fail(fn, "min_p must be in [0, 1], but min_p = " + std::to_string(m));
}

int64_t output_count(const char* fn, DeviceRows rows, const SamplingOptions& opt) {
  if (opt.batch < 0) {
    if (opt.indices) fail(fn, "batch must be given when indices is set");
    return rows.rows;
  }
  if (opt.batch > std::numeric_limits<int32_t>::max())
    fail(fn, "batch must be < 2^31, got " + std::to_string(opt.batch));
  return opt.batch;
}

void launch_sampler(FilterKind kind, DeviceRows probs, TopK top_k, Fraction top_p, Fraction min_p, SamplingOutputs out,
                    const SamplingOptions& opt, const int32_t* prior_status, cudaStream_t stream, bool logits) {
  const int64_t batch = output_count("sampler", probs, opt);
  if (batch == 0) return;
  device::SamplerParams p{};
  p.input = probs.data;
  p.rows = probs.rows;
  p.vocab = probs.vocab;
  p.indices = opt.indices;
  p.prior_status = prior_status;
  p.top_k = top_k.scalar;
  p.top_k_per_output = top_k.per_output;
  p.top_p = static_cast<float>(top_p.scalar);
  p.top_p_per_output = top_p.per_output;
  p.min_p = static_cast<float>(min_p.scalar);
  p.min_p_per_output = min_p.per_output;
  p.seed = opt.seed;
  p.offset = opt.offset;
  p.seeds = opt.seed_per_output;
  p.offsets = opt.offset_per_output;
  p.samples = out.samples;
  p.rounds = out.rounds;
  p.status = out.status;
  p.probs_out = logits ? out.probs : nullptr;
  // the ring for probability rows (launch_kind leaves the ring or the list out where they do
  // not fit); logit rows load directly (softmax() reads them the same way)
  p.stream = !logits;
  p.compact = true;
  const ElementType dtype = probs.dtype;
  switch (kind) {
    case FilterKind::none: return launch_source<FilterKind::none>(p, batch, logits, dtype, stream);
    case FilterKind::top_k: return launch_source<FilterKind::top_k>(p, batch, logits, dtype, stream);
    case FilterKind::top_p: return launch_source<FilterKind::top_p>(p, batch, logits, dtype, stream);
    case FilterKind::min_p: return launch_source<FilterKind::min_p>(p, batch, logits, dtype, stream);
    case FilterKind::top_k_top_p: return launch_source<FilterKind::top_k_top_p>(p, batch, logits, dtype, stream);
  }
}

}  // namespace detail

// ---- The operators --------------------------------------------------------------------------

namespace {

using detail::check_rows;

void check_outputs(const char* fn, const SamplingOutputs& out, int64_t batch, bool from_logits = false) {
  if (batch > 0 && out.samples == nullptr) throw ref::InvalidArgument(std::string(fn) + ": samples is null");
  if (!from_logits && out.probs != nullptr)
    throw ref::InvalidArgument(std::string(fn) +
                               ": probs (the fused softmax output) is written only by the "
                               "from-logits samplers; leave it null");
}

void check_workspace(const char* fn, Workspace ws, size_t needed) {
  if (ws.bytes < needed || (needed > 0 && ws.data == nullptr))
    throw ref::InvalidArgument(std::string(fn) + ": workspace must hold " + std::to_string(needed) + " bytes, got " +
                               std::to_string(ws.bytes));
}

// Workspace layout of the chained operators: float rows, then one status per row.
struct ChainBuffers {
  float* rows;
  int32_t* status;
};
size_t chain_bytes(int64_t rows, int64_t vocab) {
  const size_t floats = static_cast<size_t>(rows) * static_cast<size_t>(vocab) * sizeof(float);
  const size_t aligned = (floats + 255) / 256 * 256;
  return aligned + static_cast<size_t>(rows) * sizeof(int32_t);
}
ChainBuffers chain_buffers(Workspace ws, int64_t rows, int64_t vocab) {
  const size_t floats = static_cast<size_t>(rows) * static_cast<size_t>(vocab) * sizeof(float);
  auto* base = static_cast<uint8_t*>(ws.data);
  return {reinterpret_cast<float*>(base), reinterpret_cast<int32_t*>(base + (floats + 255) / 256 * 256)};
}

const TopK kNoTopK(1);
const Fraction kNoFraction(1.0);

}  // namespace

void sampling_from_probs(DeviceRows probs, SamplingOutputs out, const SamplingOptions& opt, cudaStream_t stream) {
  const char* fn = "sampling_from_probs";
  check_rows(fn, "probs", probs);
  check_outputs(fn, out, detail::output_count(fn, probs, opt));
  detail::launch_sampler(FilterKind::none, probs, kNoTopK, kNoFraction, Fraction(0.0), out, opt, nullptr, stream);
}

void top_k_sampling_from_probs(DeviceRows probs, TopK top_k, SamplingOutputs out, const SamplingOptions& opt,
                               cudaStream_t stream) {
  const char* fn = "top_k_sampling_from_probs";
  check_rows(fn, "probs", probs);
  detail::check_top_k(fn, top_k);
  check_outputs(fn, out, detail::output_count(fn, probs, opt));
  detail::launch_sampler(FilterKind::top_k, probs, top_k, kNoFraction, Fraction(0.0), out, opt, nullptr, stream);
}

void top_p_sampling_from_probs(DeviceRows probs, Fraction top_p, SamplingOutputs out, const SamplingOptions& opt,
                               cudaStream_t stream) {
  const char* fn = "top_p_sampling_from_probs";
  check_rows(fn, "probs", probs);
  detail::check_top_p(fn, top_p);
  check_outputs(fn, out, detail::output_count(fn, probs, opt));
  detail::launch_sampler(FilterKind::top_p, probs, kNoTopK, top_p, Fraction(0.0), out, opt, nullptr, stream);
}

void min_p_sampling_from_probs(DeviceRows probs, Fraction min_p, SamplingOutputs out, const SamplingOptions& opt,
                               cudaStream_t stream) {
  const char* fn = "min_p_sampling_from_probs";
  check_rows(fn, "probs", probs);
  detail::check_min_p(fn, min_p);
  check_outputs(fn, out, detail::output_count(fn, probs, opt));
  detail::launch_sampler(FilterKind::min_p, probs, kNoTopK, kNoFraction, min_p, out, opt, nullptr, stream);
}

void top_k_top_p_sampling_from_probs(DeviceRows probs, TopK top_k, Fraction top_p, FilterApplyOrder order,
                                     SamplingOutputs out, Workspace workspace, const SamplingOptions& opt,
                                     cudaStream_t stream) {
  const char* fn = "top_k_top_p_sampling_from_probs";
  check_rows(fn, "probs", probs);
  detail::check_top_k(fn, top_k);
  detail::check_top_p(fn, top_p);
  const int64_t batch = detail::output_count(fn, probs, opt);
  check_outputs(fn, out, batch);
  if (order == FilterApplyOrder::joint) {
    detail::launch_sampler(FilterKind::top_k_top_p, probs, top_k, top_p, Fraction(0.0), out, opt, nullptr, stream);
    return;
  }
  // top_k_first: output i's row renormalized to its top-k, then top-p on that row
  check_workspace(fn, workspace, chain_bytes(batch, probs.vocab));
  if (batch == 0) return;
  const ChainBuffers ws = chain_buffers(workspace, batch, probs.vocab);
  detail::launch_renorm(FilterKind::top_k, probs, top_k, kNoFraction, ws.rows,
                        detail::Gather{opt.indices, batch, nullptr, ws.status}, stream);
  SamplingOptions renormed = opt;
  renormed.indices = nullptr;
  renormed.batch = batch;
  detail::launch_sampler(FilterKind::top_p, DeviceRows{ws.rows, batch, probs.vocab}, kNoTopK, top_p, Fraction(0.0), out,
                         renormed, ws.status, stream);
}

void sampling_from_logits(DeviceRows logits, SamplingOutputs out, Workspace, const SamplingOptions& opt,
                          cudaStream_t stream) {
  const char* fn = "sampling_from_logits";
  check_rows(fn, "logits", logits, true);
  check_outputs(fn, out, detail::output_count(fn, logits, opt), true);
  // one kernel: each block's softmax is fused into its passes (no workspace)
  detail::launch_sampler(FilterKind::none, logits, kNoTopK, kNoFraction, Fraction(0.0), out, opt, nullptr, stream,
                         true);
}

void top_k_top_p_sampling_from_logits(DeviceRows logits, TopK top_k, Fraction top_p, FilterApplyOrder order,
                                      SamplingOutputs out, Workspace workspace, const SamplingOptions& opt,
                                      cudaStream_t stream) {
  const char* fn = "top_k_top_p_sampling_from_logits";
  check_rows(fn, "logits", logits, true);
  detail::check_top_k(fn, top_k);
  detail::check_top_p(fn, top_p);
  const int64_t batch = detail::output_count(fn, logits, opt);
  check_outputs(fn, out, batch, true);
  if (order == FilterApplyOrder::joint) {  // one kernel, softmax fused
    detail::launch_sampler(FilterKind::top_k_top_p, logits, top_k, top_p, Fraction(0.0), out, opt, nullptr, stream,
                           true);
    return;
  }
  // top_k_first: mask output i's logits to its top-k (f32, into the workspace), then top-p
  // with the softmax of the masked row fused
  check_workspace(fn, workspace, chain_bytes(batch, logits.vocab));
  if (batch == 0) return;
  const ChainBuffers ws = chain_buffers(workspace, batch, logits.vocab);
  detail::launch_mask_logits(logits, top_k, ws.rows, detail::Gather{opt.indices, batch, nullptr, ws.status}, stream);
  SamplingOptions masked = opt;
  masked.indices = nullptr;
  masked.batch = batch;
  detail::launch_sampler(FilterKind::top_p, DeviceRows{ws.rows, batch, logits.vocab}, kNoTopK, top_p, Fraction(0.0),
                         out, masked, ws.status, stream, true);
}

// ---- Registry ----------------------------------------------------------------------------------

const std::vector<OperatorInfo>& operators() {
  static const std::vector<OperatorInfo> list = {
      {"sampling_from_probs", "probs", "tokens", "one inverse-CDF pass (block scan), no rejection"},
      {"sampling_from_logits", "logits", "tokens",
       "one kernel: the row's max and sum, then the sampler on p computed on the fly"},
      {"top_k_sampling_from_probs", "probs", "tokens", "rejection: draw among p > low, count above two pivots"},
      {"top_p_sampling_from_probs", "probs", "tokens", "rejection: draw among p > low, exact mass above two pivots"},
      {"min_p_sampling_from_probs", "probs", "tokens", "pivot max_p * min_p known after pass 0: one draw"},
      {"top_k_top_p_sampling_from_probs", "probs", "tokens",
       "joint: one rejection loop testing both rules; top_k_first: top_k_renorm_probs, then top-p"},
      {"top_k_top_p_sampling_from_logits", "logits", "tokens",
       "joint: the joint loop, softmax fused; top_k_first: top_k_mask_logits, then top-p, softmax fused"},
      {"softmax", "logits", "probs", "max and sum in one pass, then the write, float (the samplers' fused softmax)"},
      {"top_k_renorm_probs", "probs", "probs", "the k-th largest by a 3-pass radix select on the value, exact masses"},
      {"top_p_renorm_probs", "probs", "probs", "the top-p cut by a 3-pass radix select on the value, exact masses"},
      {"top_k_mask_logits", "logits", "logits", "the k-th largest logit by a 3-pass radix select on the value"},
      {"chain_speculative_sampling", "draft/target probs", "tokens",
       "one block per request: acceptance tests, then one inverse CDF over relu(p - q)"},
  };
  return list;
}

size_t workspace_bytes(const std::string& name, int64_t rows, int64_t batch, int64_t vocab, FilterApplyOrder order) {
  static_cast<void>(rows);  // every workspace is per output now (the fused softmax keeps none per input row)
  for (const OperatorInfo& op : operators()) {
    if (op.name != name) continue;
    if (name == "top_k_top_p_sampling_from_logits")
      return order == FilterApplyOrder::joint ? 0 : chain_bytes(batch, vocab);
    if (name == "top_k_top_p_sampling_from_probs")
      return order == FilterApplyOrder::joint ? 0 : chain_bytes(batch, vocab);
    return 0;
  }
  throw ref::InvalidArgument("workspace_bytes: no sampling operator named \"" + name + "\"");
}

}  // namespace flashstep::stages::sampling
