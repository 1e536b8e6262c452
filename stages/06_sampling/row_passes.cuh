/// \file row_passes.cuh
/// \brief The block-wide passes over one row that every stage 06 kernel is made of.
///
/// One thread block (kBlock threads) owns one output row. A *pass* streams the row once,
/// VEC consecutive entries per thread per tile (tile = kBlock * VEC entries), and ends in
/// one CUB block reduction or, for the inverse CDF, one block scan per tile. All sums are
/// exact 128-bit masses (mass.cuh), so the order CUB adds them in does not matter and the
/// answers equal the reference's loops.
///
///     summarize_row       total mass, max p, bad-entry flags          (pass 0)
///     inverse_cdf         first candidate whose cumulative mass > t   (one tile, scan)
///     count_mass_above    count and mass of p > pivot_0 and > pivot_1 (pass 2)
///
/// Per-tile masses: pass 0 and the counting pass also keep each tile's candidate mass in
/// shared memory, so the inverse CDF that follows walks those to the tile its threshold
/// falls in and scans that tile alone (1/16 of a 128k row instead of half on average).
///     sum_mass_where      mass of the entries a predicate keeps
///     softmax_scale       max and sum of a logit row (the fused softmax's one pass)
///
/// A row split over a cluster (RowSplit, CLUSTER): when outputs are fewer than the SMs,
/// the C blocks of a thread-block cluster share one row, block r taking tiles r, r + C,
/// r + 2C, ... of every counting pass. Each block reduces its tiles as before, then
/// writes its result and its tiles' masses into every block of the cluster (distributed
/// shared memory), and after one cluster barrier each block combines the C results
/// itself. Masses are integers and the max, flags and counts do not depend on order, so
/// every block holds exactly what the single block would; the inverse CDF, one tile, is
/// scanned by every block (no second barrier), so every block finds the same token.
#pragma once

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <type_traits>

#include "06_sampling/mass.cuh"

namespace flashstep::stages::sampling::device {

/// Threads per block, one block per output row. 512, not FlashInfer's 1024: the 128-bit
/// masses need ~120 registers a thread, and 1024 threads get at most 64 (ptxas then
/// spilled ~3 KB a thread to local memory and every pass ran several times slower).
constexpr int kBlock = 512;

/// Whether a row type can be read by stream_tiles (has Elem, elems(), unpack() and says so).
template <typename Row, typename = void>
struct Streamable {
  static constexpr bool value = false;
};
template <typename Row>
struct Streamable<Row, std::void_t<typename Row::Elem>> {
  static constexpr bool value = Row::kStreamable;
};

/// Bad-entry flags of a probability row (RowSummary::flags).
enum : uint32_t { kFlagNotFinite = 1u, kFlagNegative = 2u, kFlagAboveOne = 4u };

/// The bits of 1.0f: a float x is in [+0, 1] exactly when its bits are at most these.
constexpr uint32_t kOneBits = 0x3F800000u;
/// The bits of +inf.
constexpr uint32_t kInfBits = 0x7F800000u;

/// Asks the L2 for `bytes` bytes at p (16-byte aligned, a multiple of 16) in one bulk
/// prefetch (Hopper's cp.async.bulk.prefetch): no registers, no wait, no effect on values.
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

/// One probability row in device memory. load() reads VEC consecutive entries starting
/// at i and gives 0 past the end: 0 is never a candidate, has no mass and never beats a
/// maximum. With VECTOR_LOADS (needs vocab % 4 == 0 and a 16-byte aligned row) the entries
/// come in VEC / 4 16-byte loads, all issued before any is used: at one block per row the
/// passes are bound by memory latency, and several loads in flight per thread hide it.
template <bool VECTOR_LOADS>
struct ProbRowT {
  const float* p;  ///< (vocab) the row
  int64_t vocab;   ///< entries
  /// Entries i .. i + n - 1 (clamped to the row) into the L2 (16-byte loads only).
  __device__ __forceinline__ void prefetch_entries(int64_t i, int64_t n) const {
    if constexpr (VECTOR_LOADS) {  // vocab % 4 == 0 and i % 4 == 0: 16-byte multiples
      if (i < vocab) prefetch_l2(p + i, static_cast<uint32_t>((n < vocab - i ? n : vocab - i) * 4));
    }
  }
  /// Entries i .. i + VEC - 1 into v.
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&v)[VEC]) const {
    if constexpr (VECTOR_LOADS) {
      static_assert(VEC % 4 == 0, "16-byte loads take 4 entries at a time");
#pragma unroll
      for (int j = 0; j < VEC; j += 4) {
        const float4 x = i + j < vocab ? *reinterpret_cast<const float4*>(p + i + j) : make_float4(0.f, 0.f, 0.f, 0.f);
        v[j] = x.x, v[j + 1] = x.y, v[j + 2] = x.z, v[j + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = i + j < vocab ? p[i + j] : 0.f;
    }
  }
  /// Entry i (i < vocab).
  __device__ __forceinline__ float at(int64_t i) const { return p[i]; }
  // For stream_tiles (aligned rows only): the elements, and a 16-byte chunk of 4 entries
  // starting at `first` as floats (chunks past the end arrive zero-filled: zeros, as load()).
  using Elem = float;
  static constexpr bool kStreamable = VECTOR_LOADS;
  __device__ __forceinline__ const float* elems() const { return p; }
  __device__ __forceinline__ void unpack(const uint4& w, int64_t, float* v) const {
    v[0] = __uint_as_float(w.x), v[1] = __uint_as_float(w.y), v[2] = __uint_as_float(w.z), v[3] = __uint_as_float(w.w);
  }
};
/// A row read entry by entry (any vocab, any alignment).
using ProbRow = ProbRowT<false>;

/// A bf16 value as its 16 bits (the upper half of a float32): no cuda_bf16.h needed.
using Bf16Bits = uint16_t;

/// An input entry as float: exact for both element types.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(Bf16Bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

/// One logit row of element type T (float, or Bf16Bits) read as float; -inf past the end
/// (never a maximum, never kept, probability 0). With VECTOR_LOADS (vocab a multiple of
/// 16 / sizeof(T) and a 16-byte aligned row) the entries come in 16-byte loads; the
/// entries a thread reads, and so every sum, are the same either way.
template <typename T, bool VECTOR_LOADS>
struct LogitRowT {
  const T* p;     ///< (vocab) the row
  int64_t vocab;  ///< entries
  /// As ProbRowT (vocab a multiple of 16 / sizeof(T), i too: 16-byte multiples).
  __device__ __forceinline__ void prefetch_entries(int64_t i, int64_t n) const {
    if constexpr (VECTOR_LOADS) {
      if (i < vocab)
        prefetch_l2(p + i, static_cast<uint32_t>((n < vocab - i ? n : vocab - i) * static_cast<int64_t>(sizeof(T))));
    }
  }
  /// Entries i .. i + VEC - 1 into v.
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&v)[VEC]) const {
    constexpr int kPerLoad = 16 / static_cast<int>(sizeof(T));  // entries per 16-byte load
    if constexpr (VECTOR_LOADS) {
      static_assert(VEC % kPerLoad == 0, "16-byte loads take whole groups");
      uint4 w[VEC / kPerLoad];
#pragma unroll
      for (int j = 0; j < VEC / kPerLoad; ++j)
        w[j] = i + j * kPerLoad < vocab ? *reinterpret_cast<const uint4*>(p + i + j * kPerLoad)
                                        : make_uint4(0xFF800000u, 0xFF800000u, 0xFF800000u, 0xFF800000u);
#pragma unroll
      for (int j = 0; j < VEC / kPerLoad; ++j) {
        const uint32_t words[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if constexpr (sizeof(T) == 4) {
            v[j * 4 + k] = __uint_as_float(words[k]);
          } else {  // two bf16 per word, the lower address in the low half; -inf pads as 0xFF80
            const bool pad = !(i + j * kPerLoad < vocab);
            v[j * 8 + 2 * k] = pad ? -INFINITY : __uint_as_float(words[k] << 16);
            v[j * 8 + 2 * k + 1] = pad ? -INFINITY : __uint_as_float(words[k] & 0xFFFF0000u);
          }
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = i + j < vocab ? to_float(p[i + j]) : -INFINITY;
    }
  }
  /// Entry i (i < vocab).
  __device__ __forceinline__ float at(int64_t i) const { return to_float(p[i]); }
  // For stream_tiles, as ProbRowT: one 16-byte chunk (16 / sizeof(T) entries from `first`),
  // -inf past the end.
  using Elem = T;
  static constexpr bool kStreamable = VECTOR_LOADS;
  __device__ __forceinline__ const T* elems() const { return p; }
  __device__ __forceinline__ void unpack(const uint4& w, int64_t first, float* v) const {
    const bool pad = !(first < vocab);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (sizeof(T) == 4) {
        v[k] = pad ? -INFINITY : __uint_as_float(words[k]);
      } else {
        v[2 * k] = pad ? -INFINITY : __uint_as_float(words[k] << 16);
        v[2 * k + 1] = pad ? -INFINITY : __uint_as_float(words[k] & 0xFFFF0000u);
      }
    }
  }
};

/// What the fused softmax needs of a logit row: p_j = 2^(x_j * scale - m) * (1 / sum), with
/// scale = log2(e) / temperature (a logit in powers of two) and m = max logit * scale.
struct SoftmaxScale {
  float scale;      ///< log2(e) / temperature
  float m;          ///< max logit * scale
  float sum;        ///< sum over the row of the numerators, >= 1
  float rcp = 0.f;  ///< 1 / sum, rounded: p = numerator * rcp (two roundings, no division an entry)
};

/// 2^x in one instruction (ex2.approx.ftz: about 2 ulp; denormal results flush to 0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// The softmax numerator of logit x: 2^(x * scale - m). Every operation is spelled out
/// (no FMA contraction, one hardware exp2), so every pass, every kernel and every call
/// computes the same bits. With m = max * scale rounded the same way, the max's exponent
/// is exactly 0 and, rounding being monotonic, no other exponent is above it: every
/// numerator is at most 1.
__device__ __forceinline__ float softmax_numerator(float x, float scale, float m) {
  return exp2_approx(__fsub_rn(__fmul_rn(x, scale), m));
}

/// A softmax row computed on the fly from its logits: what the fused from-logits sampler
/// reads in every pass instead of a probability row in memory. load() and at() apply
/// the same function to the same logit, so a pivot equals the entry it came from.
template <typename LogitRow>
struct SoftmaxRowT {
  LogitRow logits;     ///< the logit row
  SoftmaxScale scale;  ///< from softmax_scale
  int64_t vocab;       ///< entries (logits.vocab)
  __device__ __forceinline__ float prob(float x) const {
    return __fmul_rn(softmax_numerator(x, scale.scale, scale.m), scale.rcp);
  }
  /// Entries i .. i + VEC - 1 into v (0 past the end).
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&v)[VEC]) const {
    logits.template load<VEC>(i, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = prob(v[j]);
  }
  /// Entry i (i < vocab).
  __device__ __forceinline__ float at(int64_t i) const { return prob(logits.at(i)); }
  __device__ __forceinline__ void prefetch_entries(int64_t i, int64_t n) const { logits.prefetch_entries(i, n); }
  using Elem = typename LogitRow::Elem;
  static constexpr bool kStreamable = LogitRow::kStreamable;
  __device__ __forceinline__ const Elem* elems() const { return logits.elems(); }
  __device__ __forceinline__ void unpack(const uint4& w, int64_t first, float* v) const {
    constexpr int kPer = 16 / static_cast<int>(sizeof(Elem));
    logits.unpack(w, first, v);
#pragma unroll
    for (int k = 0; k < kPer; ++k) v[k] = prob(v[k]);
  }
};

/// At the top of a tile loop: thread 0 asks the L2 for the tile this thread block reads
/// next (`next`, VEC entries a thread), so its loads wait on the L2, not on DRAM, while
/// this tile is computed (rows without 16-byte loads: nothing).
template <int VEC, typename Row>
__device__ __forceinline__ void prefetch_tile(const Row& row, int64_t next) {
  if (threadIdx.x == 0) row.prefetch_entries(next, int64_t{kBlock} * VEC);
}

/// What pass 0 learns about a row.
struct RowSummary {
  Mass total;      ///< exact mass of the valid entries
  float max_p;     ///< largest valid entry
  uint32_t flags;  ///< kFlag* of the bad entries seen
};

/// Count and mass strictly above two pivots (pass 2).
struct PivotStats {
  Mass mass_0;      ///< mass of p > pivot_0
  Mass mass_1;      ///< mass of p > pivot_1
  int32_t count_0;  ///< count of p > pivot_0
  int32_t count_1;  ///< count of p > pivot_1
};

/// Tiles (kBlock * VEC entries) whose masses the passes keep in shared memory: 64 tiles
/// of 8192 entries cover 524288 tokens; longer rows fall back to the full scan.
constexpr int kMaxTiles = 64;

/// Most blocks that share one row (a cluster of 16 is H100's non-portable maximum).
constexpr int kMaxCluster = 16;

// Thread-block clusters and distributed shared memory exist from sm_90 on. Where this
// file is compiled for an older GPU (sm_80, sm_86, sm_89) the cluster code below is a
// trap, and the host never launches it there (sampling.cu: clusters_that_fit finds no
// cluster kernel built for sm_90), so rows go one block each. The host pass sees it all.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define FLASHSTEP_SAMPLING_HAS_CLUSTERS 1
#else
#define FLASHSTEP_SAMPLING_HAS_CLUSTERS 0
#endif

/// Which tiles of the row this block reads in the counting passes, and the parity of the
/// exchange buffers the last pass wrote (CLUSTER only; see cluster_combine).
struct RowSplit {
  int rank = 0;   ///< this block's place in the cluster
  int size = 1;   ///< blocks sharing the row (1: the block reads the whole row)
  int phase = 0;  ///< exchange buffers of the latest counting pass (0 or 1)
  /// stream_tiles: cp.async into a shared-memory ring (streamable rows, where the ring fits;
  /// the same in every block of a cluster)
  bool stream = false;
  int passes = 0;  ///< full passes so far (the serpentine order's parity)
};

/// The direction of the next full pass (every thread of every block calls it alike), in
/// serpentine order: odd passes run from the last tile back, so they start on the tiles
/// the pass before read last, which are the ones still in the L2.
__device__ __forceinline__ bool next_pass_reversed(RowSplit& sp) {
  const bool reverse = (sp.passes & 1) != 0;
  ++sp.passes;
  return reverse;
}

/// Shared memory of one block: CUB's scratch (one pass at a time) and broadcast slots.
struct SharedState {
  /// CUB's scratch of the pass in progress (passes are separated by barriers).
  union {
    typename cub::BlockReduce<RowSummary, kBlock>::TempStorage summary;
    typename cub::BlockReduce<PivotStats, kBlock>::TempStorage pivots;
    typename cub::BlockReduce<Mass, kBlock>::TempStorage mass;
    typename cub::BlockReduce<float, kBlock>::TempStorage value;
    typename cub::BlockScan<Mass, kBlock>::TempStorage scan;
    typename cub::BlockScan<int, kBlock>::TempStorage count_scan;
  } temp;
  RowSummary summary;  ///< broadcast slot of summarize_row
  PivotStats pivots;   ///< broadcast slot of the counting passes
  Mass mass;           ///< broadcast slot of sum_mass_where
  float value;         ///< broadcast slot of a float reduction (softmax's sum)
  int32_t token;       ///< the token inverse_cdf found (written by the crossing thread)
  /// Per-tile masses a pass keeps for the next inverse CDF (two candidate sets: the
  /// counting pass's p > pivot_0 and p > pivot_1): the sums of the threads' MassAcc
  /// halves, below 2^62 for a tile of 512 threads x 16 entries. [parity][set][tile]:
  /// a row split over a cluster alternates two copies (RowSplit::phase); one block
  /// uses parity 0 only.
  unsigned long long tile_hi[2][2][kMaxTiles];
  unsigned long long tile_lo[2][2][kMaxTiles];
  /// A cluster's per-block results of the counting passes, [parity][rank].
  RowSummary summary_parts[2][kMaxCluster];
  PivotStats pivot_parts[2][kMaxCluster];
  Mass mass_parts[2][kMaxCluster];
};

/// Starts a counting pass: on a cluster, the next parity (sp.phase); then clears this
/// block's own tiles of `sets` sets there (after a barrier: the previous pass may still
/// read them), then a barrier before any pass adds to them. The other blocks' tiles are
/// left alone: they arrive by cluster_combine, possibly before this block clears.
template <bool CLUSTER>
__device__ __forceinline__ void begin_pass(SharedState& sh, int sets, RowSplit& sp) {
  if constexpr (CLUSTER) sp.phase ^= 1;
  __syncthreads();
  for (int k = threadIdx.x; k < sets * kMaxTiles; k += kBlock) {
    const int set = k / kMaxTiles, t = k % kMaxTiles;
    if (t % sp.size == sp.rank) sh.tile_hi[sp.phase][set][t] = 0, sh.tile_lo[sp.phase][set][t] = 0;
  }
  __syncthreads();
}

/// Ring slots per thread of stream_tiles, and the tiles in flight ahead of the one being
/// computed. A slot is refilled two tiles after it was read (kStreamStages - kStreamAhead
/// = 2), so the shared-memory reads of a tile are long done when its slot is written again.
constexpr int kStreamStages = 5;
constexpr int kStreamAhead = 3;

/// Dynamic shared memory stream_tiles needs for rows of `Elem` read VEC entries a thread.
template <int VEC, typename Elem>
__host__ __device__ constexpr size_t stream_bytes() {
  return size_t{kStreamStages} * kBlock * VEC * sizeof(Elem);
}

/// 16 bytes global -> shared, asynchronously (cp.async, L2 only); src_bytes 0 fills zeros.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, uint32_t src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// The ring of stream_tiles (dynamic shared memory, sized by the launcher: stream_bytes).
extern __shared__ uint4 flashstep_stream_ring[];

/// The candidate list: once a rejection round leaves at most kListCapacity candidates
/// (p > low), one pass copies them, in vocabulary order, into shared memory (the dynamic
/// shared memory of stream_tiles' ring, free between passes), and every later round
/// draws and counts over the list instead of the row. The list holds values and indices;
/// later rounds only raise `low`, so the list keeps every later candidate and the rounds
/// test x > low on it as the row passes do: the same tokens, masses and counts.
constexpr int kListCapacity = 8192;
constexpr size_t kListBytes = size_t{kListCapacity} * (sizeof(float) + sizeof(int32_t));

struct CandidateList {
  float* value;  ///< (capacity) in shared memory
  int32_t* index;
  int capacity = kListCapacity;
  int n = 0;  ///< entries
};
/// The list `offset` bytes into the dynamic shared memory (0: over the ring, for callers
/// that run no streamed pass while the list is in use; else past the ring).
__device__ __forceinline__ CandidateList candidate_list(size_t offset = 0, int capacity = kListCapacity) {
  CandidateList l;
  l.value = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(flashstep_stream_ring) + offset);
  l.index = reinterpret_cast<int32_t*>(l.value + capacity);
  l.capacity = capacity;
  return l;
}

/// One full pass over this block's tiles (tiles rank, rank + size, ...; last to first if
/// `reverse`) with the loads of the next kStreamAhead tiles in flight while a tile is
/// computed: each thread copies its own 16-byte chunks into its own ring slots
/// (cp.async) and reads back only those, so no barrier is needed. The chunk layout is
/// coalesced (chunk c of a tile, c = j * kBlock + thread, holds entries c * (16 / entry
/// size) ...): a thread's VEC entries are not consecutive, which a pass whose result does
/// not depend on which thread holds which entry (integer sums, max, counts) allows.
/// body(tile, v, index) gets the tile's index, the thread's entries and index(j), the
/// vocabulary index of v[j]; entries past the end are the row's padding.
template <int VEC, typename Row, typename Body>
__device__ __forceinline__ void stream_tiles(const Row& row, const RowSplit& sp, bool reverse, Body body) {
  using Elem = typename Row::Elem;
  constexpr int kPer = 16 / static_cast<int>(sizeof(Elem));  // entries per chunk
  constexpr int kChunks = VEC / kPer;                        // chunks per thread per tile
  static_assert(VEC % kPer == 0, "whole chunks");
  constexpr int64_t kTile = int64_t{kBlock} * VEC;
  const int64_t tiles = (row.vocab + kTile - 1) / kTile;
  const int64_t mine = tiles > sp.rank ? (tiles - 1 - sp.rank) / sp.size + 1 : 0;
  const Elem* base = row.elems();
  const int tid = static_cast<int>(threadIdx.x);
  auto tile_of = [&](int64_t k) { return sp.rank + (reverse ? mine - 1 - k : k) * sp.size; };
  auto issue = [&](int64_t k) {  // k < 2^17 (a row holds at most 2^30 entries): int slot arithmetic
    if (k < mine) {
      uint4* slot = flashstep_stream_ring + static_cast<int>(k) % kStreamStages * kChunks * kBlock;
      const int64_t start = tile_of(k) * kTile;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int64_t first = start + int64_t{j * kBlock + tid} * kPer;
        const bool in = first < row.vocab;  // rows are whole chunks (streamable rows only)
        cp_async_16(slot + j * kBlock + tid, in ? base + first : base, in ? 16u : 0u);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the count of groups uniform
  };
#pragma unroll
  for (int k = 0; k < kStreamAhead; ++k) issue(k);
  for (int64_t k = 0; k < mine; ++k) {
    issue(k + kStreamAhead);
    cp_async_wait<kStreamAhead>();  // groups 0 .. k are complete: tile k is in its slot
    const uint4* slot = flashstep_stream_ring + static_cast<int>(k) % kStreamStages * kChunks * kBlock;
    const int64_t start = tile_of(k) * kTile;
    float v[VEC];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const uint4 w = slot[j * kBlock + tid];
      row.unpack(w, start + int64_t{j * kBlock + tid} * kPer, v + j * kPer);
    }
    body(tile_of(k), v, [start, tid](int j) { return start + int64_t{(j / kPer) * kBlock + tid} * kPer + j % kPer; });
  }
  cp_async_wait<0>();
}

/// One full pass over this block's tiles: stream_tiles when sp.stream is set and the row
/// allows it, else each thread loads its VEC consecutive entries of a tile (16-byte loads
/// for aligned rows) with the L2 prefetch of the next tile. body as stream_tiles.
template <int VEC, typename Row, typename Body>
__device__ __forceinline__ void for_each_tile(const Row& row, const RowSplit& sp, bool reverse, Body body) {
  if constexpr (Streamable<Row>::value) {
    if (sp.stream) return stream_tiles<VEC>(row, sp, reverse, body);
  }
  constexpr int64_t kTile = int64_t{kBlock} * VEC;
  const int64_t tiles = (row.vocab + kTile - 1) / kTile;
  const int64_t mine = tiles > sp.rank ? (tiles - 1 - sp.rank) / sp.size + 1 : 0;
  for (int64_t k = 0; k < mine; ++k) {
    const int64_t t = sp.rank + (reverse ? mine - 1 - k : k) * sp.size;
    const int64_t next = sp.rank + (reverse ? mine - 2 - k : k + 1) * sp.size;  // may be off the row
    if (next >= 0) prefetch_tile<VEC>(row, next * kTile);
    const int64_t i = t * kTile + int64_t{threadIdx.x} * VEC;
    float v[VEC];
    row.template load<VEC>(i, v);  // past the end: the row's padding
    body(t, v, [i](int j) { return i + j; });
  }
}

/// Adds the whole block's MassAcc of one tile to (set, tile): a warp reduction of the two
/// 64-bit halves, then one shared atomic per half and warp (integer sums: any order).
/// Every thread of the block calls it for every tile (the shuffles need whole warps).
__device__ __forceinline__ void add_tile_mass(SharedState& sh, int set, int64_t tile, const MassAcc& acc, int phase) {
  unsigned long long hi = acc.hi, lo = acc.lo;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    hi += __shfl_down_sync(0xFFFFFFFFu, hi, o);
    lo += __shfl_down_sync(0xFFFFFFFFu, lo, o);
  }
  if ((threadIdx.x & 31u) == 0) {
    atomicAdd(&sh.tile_hi[phase][set][tile], hi);
    atomicAdd(&sh.tile_lo[phase][set][tile], lo);
  }
}

/// The exact mass of (set, tile), once the pass that kept it has ended (barrier).
__device__ __forceinline__ Mass tile_mass(const SharedState& sh, int set, int64_t tile, int phase) {
  return (static_cast<Mass>(sh.tile_hi[phase][set][tile]) << 48) + sh.tile_lo[phase][set][tile];
}

/// Whether a row's tiles of VEC entries a thread fit the per-tile masses.
template <int VEC>
__device__ __forceinline__ bool keeps_tiles(int64_t vocab) {
  return vocab <= int64_t{kMaxTiles} * kBlock * VEC;
}

/// Thread 0's `value` to every thread (all threads call it; the slot is free again after).
template <typename T>
__device__ __forceinline__ T broadcast(T value, T& slot) {
  if (threadIdx.x == 0) slot = value;
  __syncthreads();
  const T result = slot;
  __syncthreads();
  return result;
}

/// The end of a counting pass on a row split over a cluster. `mine` is this block's
/// result (valid in thread 0, as CUB leaves it); its tiles' masses of `sets` sets are in
/// shared memory at parity sp.phase. Both are written into every other block of the
/// cluster (its parts[phase][rank] and its copy of those tiles); one cluster barrier
/// (release / acquire) makes them visible; then each block folds the C results with
/// `op` in rank order and every thread gets the row's result.
/// Why the buffers are never overwritten while read: what pass k writes is read before
/// the reader arrives at pass k + 1's barrier, and pass k + 2, the next to write the same
/// parity, writes only after leaving that barrier.
template <typename T, typename Op>
__device__ T cluster_combine(const T& mine, T (&parts)[2][kMaxCluster], int sets, int64_t tiles, Op op, T& slot,
                             SharedState& sh, const RowSplit& sp) {
#if FLASHSTEP_SAMPLING_HAS_CLUSTERS
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int ph = sp.phase;
  if (threadIdx.x == 0) parts[ph][sp.rank] = mine;
  __syncthreads();  // this block's tile atomics and its part are in shared memory
  const int per_rank = sets * static_cast<int>(tiles);
  for (int k = threadIdx.x; k < sp.size * per_rank; k += kBlock) {
    const int r = k / per_rank, set = (k % per_rank) / static_cast<int>(tiles), t = k % static_cast<int>(tiles);
    if (r == sp.rank || t % sp.size != sp.rank) continue;  // another block's copy of one of my tiles
    *cluster.map_shared_rank(&sh.tile_hi[ph][set][t], r) = sh.tile_hi[ph][set][t];
    *cluster.map_shared_rank(&sh.tile_lo[ph][set][t], r) = sh.tile_lo[ph][set][t];
  }
  if (static_cast<int>(threadIdx.x) < sp.size && static_cast<int>(threadIdx.x) != sp.rank)
    *cluster.map_shared_rank(&parts[ph][sp.rank], static_cast<int>(threadIdx.x)) = parts[ph][sp.rank];
  cluster.sync();
  if (threadIdx.x == 0) {
    T all = parts[ph][0];
    for (int r = 1; r < sp.size; ++r) all = op(all, parts[ph][r]);
    slot = all;
  }
  __syncthreads();
  const T result = slot;
  __syncthreads();
  return result;
#else
  __trap();  // no clusters before sm_90 (see FLASHSTEP_SAMPLING_HAS_CLUSTERS)
  return mine;
#endif
}

/// The tiles of a row of `vocab` entries, VEC a thread.
template <int VEC>
__device__ __forceinline__ int64_t tile_count(int64_t vocab) {
  return (vocab + int64_t{kBlock} * VEC - 1) / (int64_t{kBlock} * VEC);
}

/// Adds one entry to a thread's summary (its mass to `acc`, which the caller widens into
/// s.total once per tile): bad entries only raise a flag.
__device__ __forceinline__ void add_entry(RowSummary& s, MassAcc& acc, float x) {
  if (!isfinite(x)) {
    s.flags |= kFlagNotFinite;
  } else if (x < 0.f) {
    s.flags |= kFlagNegative;
  } else if (x > 1.f) {
    s.flags |= kFlagAboveOne;
  } else {
    acc.add(x);
    s.max_p = fmaxf(s.max_p, x);
  }
}

/// Pass 0: exact total, max and bad-entry flags of the row (every thread gets them).
/// TILES: also keeps each tile's mass of the valid entries (set 0), which is the mass
/// of the candidates p > 0 of the first inverse CDF.
template <int VEC, bool TILES = false, bool CLUSTER = false, typename Row>
__device__ RowSummary summarize_row(const Row& row, SharedState& sh, RowSplit& sp) {
  const bool tiles = (TILES || CLUSTER) && keeps_tiles<VEC>(row.vocab);
  if (tiles) begin_pass<CLUSTER>(sh, 1, sp);
  RowSummary s{0, 0.f, 0u};
  for_each_tile<VEC>(row, sp, next_pass_reversed(sp), [&](int64_t tile, const float(&v)[VEC], auto) {
    MassAcc acc;  // past the end: zeros, valid and massless
    // one unsigned max an entry finds both the tile's verdict and its max: a valid entry
    // (+0 <= x <= 1) has bits <= kOneBits, ordered as the floats are; a negative entry
    // (-0 too), NaN or entry above 1 has larger bits and sends this thread's tile down
    // the flagged path (rare), which tests each entry as the reference does
    uint32_t top_bits = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) top_bits = max(top_bits, float_bits(v[j]));
    const bool ok = top_bits <= kOneBits;
    if (ok) {
      s.max_p = fmaxf(s.max_p, __uint_as_float(top_bits));
    } else {
      // flags and the max of the valid entries; their mass goes in below, with the valid tiles'
      // (adding it here and skipping those flagged tiles below gives the same sums, but it
      // took top_p at batch 1 from 21.3 to 22.2 us on an H200: commit b2a045a)
      MassAcc ignored;
#pragma unroll
      for (int j = 0; j < VEC; ++j) add_entry(s, ignored, v[j]);
    }
    // a warp whose entries are all 0 (most of a renormalized top-k row) adds nothing
    if (__any_sync(0xFFFFFFFFu, !ok || top_bits != 0)) {
      if (ok) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc.add_unit(v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc.add_unit(v[j] >= 0.f && v[j] <= 1.f ? v[j] : 0.f);
      }
    }
    s.total += acc.value();
    if (tiles) add_tile_mass(sh, 0, tile, acc, sp.phase);
  });
  auto fold = [](const RowSummary& a, const RowSummary& b) {
    return RowSummary{a.total + b.total, fmaxf(a.max_p, b.max_p), a.flags | b.flags};
  };
  const RowSummary r = cub::BlockReduce<RowSummary, kBlock>(sh.temp.summary).Reduce(s, fold);
  if constexpr (CLUSTER)
    return cluster_combine(r, sh.summary_parts, 1, tile_count<VEC>(row.vocab), fold, sh.summary, sh, sp);
  return broadcast(r, sh.summary);
}

/// One block reading the whole row (the callers that never split a row).
template <int VEC, bool TILES = false, typename Row>
__device__ RowSummary summarize_row(const Row& row, SharedState& sh) {
  RowSplit whole;
  return summarize_row<VEC, TILES, false>(row, sh, whole);
}

/// The softmax's max and sum over a logit row in one pass (VEC entries a thread per tile;
/// the whole row, first tile to last, whatever sp's split and order: the float sum depends
/// on the order, and softmax() must get the bits the fused samplers get). Each thread
/// keeps its running max (and kFlagNotFinite for NaN or +inf) and its sum of numerators
/// scaled to it, rescaled when the max rises; the block takes the max and adds the
/// threads' sums scaled to it (one CUB reduction), and the probabilities are numerator *
/// (1 / sum). Returns false, leaving `flags` / an all -inf max for the caller's status,
/// when there is no softmax.
template <int VEC, typename Row>
__device__ bool softmax_scale(const Row& row, float temperature, SoftmaxScale& out, uint32_t& flags, SharedState& sh,
                              const RowSplit& mode = RowSplit{}) {
  RowSplit whole;  // one block, forward, the read mode of `mode`
  whole.stream = mode.stream;
  constexpr float kLog2e = 1.4426950408889634f;
  out.scale = __fdiv_rn(kLog2e, temperature);
  const float scale = out.scale;
  RowSummary s{0, -INFINITY, 0u};
  float sum = 0.f;  // this thread's sum of numerators scaled to its running max s.max_p
  for_each_tile<VEC>(row, whole, false, [&](int64_t, const float(&v)[VEC], auto) {
    // a NaN (either sign) or +inf entry fails the row, whose sums are then never used;
    // -inf (a masked logit) is an entry of numerator 0. Two integer maxima find them: as
    // signed ints, +inf and the positive NaNs are the bits >= those of +inf; as unsigned
    // ints, the negative NaNs are the bits above those of -inf
    int32_t top_signed = INT32_MIN;
    uint32_t top_unsigned = 0;
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const uint32_t bits = float_bits(v[j]);
      top_signed = max(top_signed, static_cast<int32_t>(bits));
      top_unsigned = max(top_unsigned, bits);
      tile_max = fmaxf(tile_max, v[j]);
    }
    if (top_signed >= static_cast<int32_t>(kInfBits) || top_unsigned > (kInfBits | 0x80000000u)) {
      s.flags |= kFlagNotFinite;
      return;
    }
    if (tile_max > s.max_p) {  // rescale the sum so far to the new max (a sum of 0 stays 0)
      const float m_new = __fmul_rn(tile_max, scale);
      if (s.max_p != -INFINITY) sum = __fmul_rn(sum, softmax_numerator(s.max_p, scale, m_new));
      s.max_p = tile_max;
    }
    if (s.max_p != -INFINITY) {
      const float m = __fmul_rn(s.max_p, scale);
#pragma unroll
      for (int j = 0; j < VEC; ++j) sum = __fadd_rn(sum, softmax_numerator(v[j], scale, m));
    }
  });
  const RowSummary r =
      cub::BlockReduce<RowSummary, kBlock>(sh.temp.summary).Reduce(s, [](const RowSummary& a, const RowSummary& b) {
        return RowSummary{0, fmaxf(a.max_p, b.max_p), a.flags | b.flags};
      });
  const RowSummary all = broadcast(r, sh.summary);
  flags = all.flags;
  if (all.flags != 0 || all.max_p == -INFINITY) return false;
  out.m = __fmul_rn(all.max_p, scale);  // the largest numerator is 2^0 = 1: no overflow
  // this thread's sum scaled from its max to the row's (the thread holding the row's max adds >= 1)
  sum = s.max_p == -INFINITY ? 0.f : __fmul_rn(sum, softmax_numerator(s.max_p, scale, out.m));
  sum = cub::BlockReduce<float, kBlock>(sh.temp.value).Sum(sum);
  out.sum = broadcast(sum, sh.value);
  out.rcp = __frcp_rn(out.sum);
  return true;
}

/// Writes row entries 0 .. vocab - 1 to `out` with the pass layout (VEC per thread per
/// tile): the same values the other passes read.
template <int VEC, typename Row>
__device__ void write_row(const Row& row, float* out) {
  for (int64_t i = int64_t{threadIdx.x} * VEC; i < row.vocab; i += int64_t{kBlock} * VEC) {
    float v[VEC];
    row.template load<VEC>(i, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      if (i + j < row.vocab) out[i + j] = v[j];
  }
}

/// Exact mass of the entries `keep(p)` accepts (every thread gets it). TILES: also
/// keeps each tile's (set 0) for the inverse CDF over the same entries.
template <int VEC, bool TILES = false, bool CLUSTER = false, typename Row, typename Keep>
__device__ Mass sum_mass_where(const Row& row, Keep keep, SharedState& sh, RowSplit& sp) {
  const bool tiles = (TILES || CLUSTER) && keeps_tiles<VEC>(row.vocab);
  if (tiles) begin_pass<CLUSTER>(sh, 1, sp);
  Mass m = 0;
  for_each_tile<VEC>(row, sp, next_pass_reversed(sp), [&](int64_t tile, const float(&v)[VEC], auto) {
    MassAcc acc;
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc.add(keep(v[j]) ? v[j] : 0.f);
    m += acc.value();
    if (tiles) add_tile_mass(sh, 0, tile, acc, sp.phase);
  });
  const Mass r = cub::BlockReduce<Mass, kBlock>(sh.temp.mass).Sum(m);
  if constexpr (CLUSTER)
    return cluster_combine(
        r, sh.mass_parts, 1, tile_count<VEC>(row.vocab), [](Mass a, Mass b) { return a + b; }, sh.mass, sh, sp);
  return broadcast(r, sh.mass);
}

/// One block reading the whole row.
template <int VEC, bool TILES = false, typename Row, typename Keep>
__device__ Mass sum_mass_where(const Row& row, Keep keep, SharedState& sh) {
  RowSplit whole;
  return sum_mass_where<VEC, TILES, false>(row, keep, sh, whole);
}

/// Pass 1, the inverse CDF: the first entry, in vocabulary order, among the candidates
/// (`is_candidate(p)`), whose cumulative mass exceeds `threshold`; -1 if none does.
/// Tile by tile, a block scan gives each thread the mass before its VEC entries; the one
/// thread whose entries straddle the threshold finds the token; the scan's aggregate
/// tells every thread whether to stop, so on average half the row is read.
/// With tile_set >= 0, the pass before kept every tile's candidate mass (same
/// candidates) in that set: every thread walks those masses to the crossing tile and the
/// scan reads that tile alone.
template <int VEC, typename Row, typename Candidate>
__device__ int32_t inverse_cdf(const Row& row, Candidate is_candidate, Mass threshold, SharedState& sh,
                               int tile_set = -1, int phase = 0) {
  if (threadIdx.x == 0) sh.token = -1;
  Mass before = 0;  // candidate mass of the earlier tiles, the same in every thread
  int64_t start = 0;
  if (tile_set >= 0 && keeps_tiles<VEC>(row.vocab)) {
    const int64_t tiles = (row.vocab + int64_t{kBlock} * VEC - 1) / (int64_t{kBlock} * VEC);
    int64_t t = 0;
    for (; t < tiles; ++t) {
      const Mass m = tile_mass(sh, tile_set, t, phase);
      if (before + m > threshold) break;
      before += m;
    }
    start = t * int64_t{kBlock} * VEC;  // t == tiles: no tile crosses, no token (-1)
  }
  for (int64_t tile = start; tile < row.vocab; tile += int64_t{kBlock} * VEC) {
    const int64_t i = tile + int64_t{threadIdx.x} * VEC;
    float v[VEC];
    row.template load<VEC>(i, v);
    MassAcc acc;
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc.add(is_candidate(v[j]) ? v[j] : 0.f);
    const Mass mine = acc.value();
    Mass prefix, tile_mass;
    __syncthreads();  // the previous tile's scan storage and sh.token reads are done
    cub::BlockScan<Mass, kBlock>(sh.temp.scan).ExclusiveSum(mine, prefix, tile_mass);
    Mass cdf = before + prefix;
    if (cdf <= threshold && cdf + mine > threshold) {  // exactly one thread, or none
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (!is_candidate(v[j])) continue;
        cdf += mass_of(v[j]);
        if (cdf > threshold) {
          sh.token = static_cast<int32_t>(i + j);
          break;
        }
      }
    }
    before += tile_mass;
    if (before > threshold) break;  // the same decision in every thread
  }
  __syncthreads();
  const int32_t token = sh.token;
  __syncthreads();
  return token;
}

/// Pass 2: count and exact mass of the entries strictly above pivot_0 and pivot_1, and
/// each tile's two masses (sets 0 and 1): the next round's candidates are one of the two.
template <int VEC, bool CLUSTER = false, typename Row>
__device__ PivotStats count_mass_above(const Row& row, float pivot_0, float pivot_1, SharedState& sh, RowSplit& sp) {
  const bool tiles = keeps_tiles<VEC>(row.vocab);
  if (tiles) begin_pass<CLUSTER>(sh, 2, sp);
  PivotStats s{0, 0, 0, 0};
  for_each_tile<VEC>(row, sp, next_pass_reversed(sp), [&](int64_t tile, const float(&v)[VEC], auto) {
    // a warp converts only for a set some of its entries are in; entries are valid (pass
    // 0). The set above pivot_1 (the midpoint towards `high`, usually empty) lies inside
    // the set above pivot_0, so a warp with no entry above pivot_0 skips both sets' sums
    // and tile masses (zero already)
    float top = v[0];
#pragma unroll
    for (int j = 1; j < VEC; ++j) top = fmaxf(top, v[j]);
    auto add_set = [&](int set, float pivot, int32_t& count, Mass& mass) {
      MassAcc acc;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const bool above = v[j] > pivot;
        count += above ? 1 : 0;
        acc.add_unit(above ? v[j] : 0.f);
      }
      mass += acc.value();
      if (tiles) add_tile_mass(sh, set, tile, acc, sp.phase);
    };
    if (!__any_sync(0xFFFFFFFFu, top > pivot_0)) return;
    add_set(0, pivot_0, s.count_0, s.mass_0);
    if (!__any_sync(0xFFFFFFFFu, top > pivot_1)) return;
    add_set(1, pivot_1, s.count_1, s.mass_1);
  });
  auto fold = [](const PivotStats& a, const PivotStats& b) {
    return PivotStats{a.mass_0 + b.mass_0, a.mass_1 + b.mass_1, a.count_0 + b.count_0, a.count_1 + b.count_1};
  };
  const PivotStats r = cub::BlockReduce<PivotStats, kBlock>(sh.temp.pivots).Reduce(s, fold);
  if constexpr (CLUSTER)
    return cluster_combine(r, sh.pivot_parts, 2, tile_count<VEC>(row.vocab), fold, sh.pivots, sh, sp);
  return broadcast(r, sh.pivots);
}

/// One pass over the row (each thread its VEC consecutive entries of a tile, one block
/// scan of the counts per tile): the entries p > low into `list`, in vocabulary order.
/// The caller knows their count is at most kListCapacity (the counting pass counted them).
template <int VEC, typename Row>
__device__ void gather_candidates(const Row& row, float low, CandidateList& list, SharedState& sh) {
  int base = 0;  // the same in every thread
  for (int64_t tile = 0; tile < row.vocab; tile += int64_t{kBlock} * VEC) {
    prefetch_tile<VEC>(row, tile + int64_t{kBlock} * VEC);
    const int64_t i = tile + int64_t{threadIdx.x} * VEC;
    float v[VEC];
    row.template load<VEC>(i, v);
    int mine = 0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) mine += v[j] > low ? 1 : 0;
    int at = 0, tile_total = 0;
    __syncthreads();  // the previous tile's scan storage is free
    cub::BlockScan<int, kBlock>(sh.temp.count_scan).ExclusiveSum(mine, at, tile_total);
    at += base;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (v[j] > low && at < list.capacity) {
        list.value[at] = v[j];
        list.index[at] = static_cast<int32_t>(i + j);
        ++at;
      }
    }
    base += tile_total;
  }
  list.n = base < list.capacity ? base : list.capacity;
  __syncthreads();  // the list is complete
}

/// The inverse CDF over the list (candidates x > low): as inverse_cdf, with thread t
/// owning the list's entries t * per .. (t + 1) * per - 1, so a block scan gives each
/// thread the candidate mass before its entries. Returns the list position, or -1.
__device__ __forceinline__ int32_t list_inverse_cdf(const CandidateList& list, float low, Mass threshold,
                                                    SharedState& sh) {
  const int per = (list.n + kBlock - 1) / kBlock;
  const int first = static_cast<int>(threadIdx.x) * per;
  const int last = first + per < list.n ? first + per : list.n;
  if (threadIdx.x == 0) sh.token = -1;
  MassAcc acc;
  for (int a = first; a < last; ++a) {
    const float x = list.value[a];
    acc.add(x > low ? x : 0.f);
  }
  const Mass mine = acc.value();
  Mass prefix, total;
  __syncthreads();  // sh.token is set, the scan storage is free
  cub::BlockScan<Mass, kBlock>(sh.temp.scan).ExclusiveSum(mine, prefix, total);
  Mass cdf = prefix;
  if (cdf <= threshold && cdf + mine > threshold) {  // exactly one thread, or none
    for (int a = first; a < last; ++a) {
      const float x = list.value[a];
      if (!(x > low)) continue;
      cdf += mass_of(x);
      if (cdf > threshold) {
        sh.token = a;
        break;
      }
    }
  }
  __syncthreads();
  const int32_t at = sh.token;
  __syncthreads();
  return at;
}

/// count_mass_above over the list (every entry above a pivot > low is in it).
__device__ __forceinline__ PivotStats list_count_mass_above(const CandidateList& list, float pivot_0, float pivot_1,
                                                            SharedState& sh) {
  PivotStats s{0, 0, 0, 0};
  MassAcc acc_0, acc_1;
  for (int a = static_cast<int>(threadIdx.x); a < list.n; a += kBlock) {
    const float x = list.value[a];
    const MassAcc::Parts m = MassAcc::parts(x);
    const bool above_0 = x > pivot_0, above_1 = x > pivot_1;
    s.count_0 += above_0 ? 1 : 0;
    s.count_1 += above_1 ? 1 : 0;
    acc_0.add_if(above_0, m);
    acc_1.add_if(above_1, m);
  }
  s.mass_0 = acc_0.value();
  s.mass_1 = acc_1.value();
  auto fold = [](const PivotStats& a, const PivotStats& b) {
    return PivotStats{a.mass_0 + b.mass_0, a.mass_1 + b.mass_1, a.count_0 + b.count_0, a.count_1 + b.count_1};
  };
  const PivotStats r = cub::BlockReduce<PivotStats, kBlock>(sh.temp.pivots).Reduce(s, fold);
  return broadcast(r, sh.pivots);
}

/// Order key of a float: unsigned comparison of keys is float comparison (-0 and +0
/// share +0's key; NaN never reaches here). The renorm and mask operators' radix select
/// (transforms.cu) runs on these keys.
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t bits = __float_as_uint(x == 0.f ? 0.f : x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

}  // namespace flashstep::stages::sampling::device
