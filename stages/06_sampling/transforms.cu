// Stage 06 — row transforms: softmax, top_k_renorm_probs, top_p_renorm_probs,
// top_k_mask_logits. One block per output row, built from the passes of row_passes.cuh.
//
// The renorm and mask operators need the value where a row is cut (the k-th largest,
// or the smallest head reaching top_p). Without a sort, the block runs a radix select on
// the value: order keys (row_passes.cuh) turn floats into unsigned integers with the same
// order, and three levels of 11, 11 and 10 key bits, each one histogram pass (count or
// exact mass per digit, shared-memory atomics) and one block scan over the digits, find
// the cut exactly, ties included: the same key a bisection over the key range would find
// (the first level rides along with pass 0). Then the kept mass and the write.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "06_sampling/launch.hpp"
#include "06_sampling/row_passes.cuh"
#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::sampling {

namespace device {

enum class Transform { softmax, top_k_renorm, top_p_renorm, top_k_mask };

/// One launch of a row transform.
struct TransformParams {
  const void* in;                       ///< (rows, vocab): float, or bf16 logits (softmax, mask)
  int64_t rows, vocab;                  ///< shape of `in`
  const int32_t* indices;               ///< (outputs) or null: output o reads row indices[o] (or o)
  const int32_t* prior_status;          ///< (rows) or null
  int64_t top_k;                        ///< scalar top_k
  const int32_t* top_k_per_output;      ///< (outputs) or null
  float top_p;                          ///< scalar top_p
  const float* top_p_per_output;        ///< (outputs) or null
  float temperature;                    ///< scalar temperature
  const float* temperature_per_output;  ///< (outputs) or null
  float* out;                           ///< (outputs, vocab); may alias `in` when indices is null
  int32_t* status;                      ///< (outputs) or null
  bool stream;                          ///< full passes by stream_tiles (aligned rows; dynamic shared memory)
  bool compact;                         ///< count cuts: finish from a shared-memory list (radix_cut)
};

/// Step 1: the input row of output `o` and its parameters, or why there is none.
template <Transform T>
__device__ Status read_row(const TransformParams& p, int64_t o, int64_t& row, int64_t& top_k, float& top_p,
                           float& temperature) {
  row = p.indices ? p.indices[o] : o;
  if (row < 0 || row >= p.rows) return Status::bad_index;
  if (p.prior_status && p.prior_status[row] != static_cast<int32_t>(Status::ok))
    return static_cast<Status>(p.prior_status[row]);
  top_k = p.top_k_per_output ? p.top_k_per_output[o] : p.top_k;
  top_p = p.top_p_per_output ? p.top_p_per_output[o] : p.top_p;
  temperature = p.temperature_per_output ? p.temperature_per_output[o] : p.temperature;
  if ((T == Transform::top_k_renorm || T == Transform::top_k_mask) && top_k < 1) return Status::bad_top_k;
  if (T == Transform::top_p_renorm && !(top_p > 0.f && top_p <= 1.f)) return Status::bad_top_p;
  if (T == Transform::softmax && !(isfinite(temperature) && temperature > 0.f)) return Status::bad_temperature;
  return Status::ok;
}

/// Histogram of one radix-select level: 2^11 digits, a count or an exact mass each.
constexpr int kRadixBits = 11;
constexpr int kRadixDigits = 1 << kRadixBits;
/// Digits a thread owns in the suffix scan (2048 / 512).
constexpr int kDigitsPerThread = kRadixDigits / kBlock;
static_assert(kRadixDigits % kBlock == 0, "every thread owns the same number of digits");

/// What a radix level counts per digit: entries (top-k, mask) or exact masses (top-p).
enum class RadixStat { count, mass };

/// Shared memory of the radix select: one histogram (reused by the three levels) and
/// the digit a level settles on, with the count or mass above it. A bin is 64 bits kept
/// as two 32-bit words, because the GPU adds 32-bit words to shared memory in one
/// instruction, where a 64-bit add is a compare-and-swap loop that conflicting lanes
/// retry: `lo` holds the sum mod 2^32, `hi` counts the times an add carried out of `lo`.
struct RadixShared {
  uint32_t lo[kRadixDigits];  ///< count, or mass units (bucket_units) mod 2^32
  uint32_t hi[kRadixDigits];  ///< carries out of lo (mass units only; counts stay below 2^31)
  uint32_t digit;             ///< the digit the level settled on
  Mass above;                 ///< count or mass of the keys above that digit's bucket
  Mass at;                    ///< count or mass in that digit's bucket
  /// Bin d as one 64-bit number, once the level's adds are done (barrier).
  __device__ __forceinline__ unsigned long long bin(int d) const {
    return (static_cast<unsigned long long>(hi[d]) << 32) | lo[d];
  }
  /// Clears every bin (the caller's barrier follows).
  __device__ __forceinline__ void clear() {
    for (int d = threadIdx.x; d < kRadixDigits; d += kBlock) lo[d] = 0, hi[d] = 0;
  }
  /// Adds v to bin d: a 32-bit atomic, and one more for the carry when the sum wraps
  /// (old + v < old exactly when this add crossed a multiple of 2^32).
  template <RadixStat STAT>
  __device__ __forceinline__ void add(uint32_t d, uint32_t v) {
    if constexpr (STAT == RadixStat::count) {
      atomicAdd(&lo[d], v);
    } else {
      const uint32_t old = atomicAdd(&lo[d], v);
      if (old + v < old) atomicAdd(&hi[d], 1u);
    }
  }
};

/// An entry's contribution to its histogram bin in mass mode. Every key in one bin of a
/// level shares the float exponent e (a positive float's key is 1, 8 exponent bits, then
/// the significand, and every level resolves at least the top 11 bits), so a bin holds
/// the sum of significands where mass_of is an exact left shift (e >= 54) and the sum
/// of masses where it floors (e < 54); bin_mass turns either into the exact mass, so
/// one 64-bit shared atomic per entry adds a 128-bit mass. Sums stay below 2^54.
__device__ __forceinline__ unsigned long long bucket_units(float x) {
  const uint32_t bits = __float_as_uint(x);
  const int e = static_cast<int>((bits >> 23) & 0xFFu);
  const unsigned long long significand = (bits & 0x7FFFFFu) | 0x800000u;
  if (e == 0) return 0;  // denormals have no mass (mass_of)
  return e >= 54 ? significand : significand >> (54 - e);
}
/// The exact mass of a bin of exponent e holding `units` (bucket_units).
__device__ __forceinline__ Mass bin_mass(unsigned long long units, int e) {
  return e >= 54 ? static_cast<Mass>(units) << (e - 54) : static_cast<Mass>(units);
}

/// No bin: an entry the level does not count.
constexpr uint32_t kNoBin = 0xFFFFFFFFu;

/// The bin of an entry at one radix level: digit (key >> shift) if the key's settled
/// bits (at and above prefix_shift) equal the prefix's; the first level (prefix_shift 32)
/// takes every key.
__device__ __forceinline__ uint32_t radix_bin(uint32_t key, uint32_t prefix, int shift, int prefix_shift,
                                              uint32_t digit_mask) {
  if (prefix_shift < 32 && (key >> prefix_shift) != (prefix >> prefix_shift)) return kNoBin;
  return (key >> shift) & digit_mask;
}

/// Adds one entry to its bin d (kNoBin: none): one shared atomic per entry. After a
/// softmax most entries of a row fall into a few bins, so lanes of a warp that hit one
/// address wait on each other; adding a constant 1 (counts) compiles to ATOMS.POPC.INC,
/// which the hardware aggregates over the lanes that share an address.
template <RadixStat STAT>
__device__ __forceinline__ void radix_add(RadixShared& rs, uint32_t d, float x) {
  if (d != kNoBin) rs.add<STAT>(d, STAT == RadixStat::count ? 1u : static_cast<uint32_t>(bucket_units(x)));
}

/// After a level's histogram: the digit d* whose bucket holds the cut, i.e. the one d
/// with passes(above + bins above d) and (d == 0 or not passes(above + bins from d up)),
/// found by a block scan over the digits (thread t owns digits t * 4 .. t * 4 + 3).
/// Returns with rs.digit, rs.above (the stat above d*'s bucket) and rs.at set.
template <RadixStat STAT, typename Passes>
__device__ void radix_settle(RadixShared& rs, uint32_t prefix, int shift, int digits, Mass above, Passes passes,
                             SharedState& sh) {
  const int per = digits / kBlock;  // 4, or 2 on the last level
  const int first = static_cast<int>(threadIdx.x) * per;
  Mass bin[kDigitsPerThread];
  Mass mine = 0;
#pragma unroll
  for (int j = 0; j < kDigitsPerThread; ++j) {
    bin[j] = 0;
    if (j < per) {
      const unsigned long long v = rs.bin(first + j);
      if constexpr (STAT == RadixStat::count) {
        bin[j] = v;
      } else {
        const uint32_t key = prefix | (static_cast<uint32_t>(first + j) << shift);
        bin[j] = bin_mass(v, static_cast<int>((key >> 23) & 0xFFu));
      }
      mine += bin[j];
    }
  }
  Mass inclusive, total;
  cub::BlockScan<Mass, kBlock>(sh.temp.scan).InclusiveSum(mine, inclusive, total);
  Mass s = above + (total - inclusive);  // the stat of the digits above my last one
#pragma unroll
  for (int j = kDigitsPerThread - 1; j >= 0; --j) {
    if (j >= per) continue;
    const int d = first + j;
    if (passes(s) && (d == 0 || !passes(s + bin[j]))) {  // exactly one digit of the block
      rs.digit = static_cast<uint32_t>(d);
      rs.above = s;
      rs.at = bin[j];
    }
    s += bin[j];
  }
  __syncthreads();
}

/// The smallest order key K with passes(stat of the kept entries whose key is above K),
/// clamped to [lo, hi]: exactly what a bisection on K over [lo, hi] finds (`passes`
/// monotone, true at hi), in three passes over the row instead of ~30. Each level fixes
/// the next 11 (then 10) key bits: a histogram of the keys that share the bits fixed so
/// far, then the digit where `passes` turns true counting from the top. The first
/// level's histogram may be filled by the caller's pass 0 (first_level_done).
/// `above_cut` and `at_cut` get the stat of the keys above and equal to the unclamped K.
/// The gather (count levels only, when `list` is set): if the first level leaves at most
/// kListCapacity kept entries with a key at or above its digit's bucket (the count above
/// plus the count in it), the second level's pass over the row also copies those entries
/// (value and index, in no particular order) into `list`, the third level's histogram is
/// built from the list instead of a third pass, and the caller may finish from the list
/// (*listed). The histograms, and so the cut, are the same either way.
template <RadixStat STAT, int VEC, typename Row, typename Keep, typename Passes>
__device__ uint32_t radix_cut(const Row& row, uint32_t lo, uint32_t hi, Keep keep, Passes passes, bool first_level_done,
                              RadixShared& rs, SharedState& sh, Mass& above_cut, Mass& at_cut, bool& clamped,
                              RowSplit& sp, CandidateList* list = nullptr, bool* listed = nullptr) {
  uint32_t prefix = 0;
  Mass above = 0;
  bool gathered = false;
  constexpr int kShift[3] = {32 - kRadixBits, 32 - 2 * kRadixBits, 0};
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level];
    const int prefix_shift = level == 0 ? 32 : kShift[level - 1];
    const int digits = 1 << (prefix_shift - shift);
    if (threadIdx.x == 0)
      rs.digit = static_cast<uint32_t>(digits - 1), rs.above = above,
      rs.at = 0;  // never kept: one digit always qualifies
    if (level > 0 || !first_level_done) rs.clear();
    __syncthreads();
    if (gathered && level == 2) {
      // the third level from the list: it holds every kept entry with the prefix's top bits
      for (int a = static_cast<int>(threadIdx.x); a < list->n; a += kBlock) {
        const float x = list->value[a];
        radix_add<STAT>(rs, radix_bin(order_key(x), prefix, shift, prefix_shift, static_cast<uint32_t>(digits - 1)), x);
      }
      __syncthreads();
    } else if (level > 0 || !first_level_done) {
      const bool gather = STAT == RadixStat::count && list != nullptr && level == 1 &&
                          above + at_cut <= static_cast<Mass>(list->capacity);
      if (gather && threadIdx.x == 0) sh.token = 0;  // the list's fill counter
      if (gather) __syncthreads();
      for_each_tile<VEC>(row, sp, next_pass_reversed(sp), [&](int64_t, const float(&v)[VEC], auto index) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const bool counted = index(j) < row.vocab && keep(v[j]);
          const uint32_t key = order_key(v[j]);
          const uint32_t d = counted ? radix_bin(key, prefix, shift, prefix_shift, static_cast<uint32_t>(digits - 1))
                                     : kNoBin;
          radix_add<STAT>(rs, d, v[j]);
          if (gather && counted && key >= prefix) {  // rare: at most list->capacity in the row
            const int at = atomicAdd(&sh.token, 1);
            if (at < list->capacity) list->value[at] = v[j], list->index[at] = static_cast<int32_t>(index(j));
          }
        }
      });
      __syncthreads();
      if (gather) {
        list->n = sh.token < list->capacity ? sh.token : list->capacity;
        gathered = true;
      }
    }
    radix_settle<STAT>(rs, prefix, shift, digits, above, passes, sh);
    prefix |= rs.digit << shift;
    above = rs.above;
    at_cut = rs.at;
    __syncthreads();  // rs is read by every thread before the next level clears it
  }
  above_cut = above;
  clamped = prefix < lo || prefix > hi;  // radix_cut's last barrier: in-place writes may follow
  if (listed) *listed = gathered;
  return prefix < lo ? lo : (prefix > hi ? hi : prefix);
}

/// Entries the transforms' candidate list holds: the list lies past stream_tiles' ring
/// (the gather runs during a streamed pass), and both fit the shared memory beside
/// RadixShared and SharedState.
constexpr int kTransformListCapacity = 4096;
constexpr size_t kTransformListBytes = size_t{kTransformListCapacity} * (sizeof(float) + sizeof(int32_t));

/// The transforms' list: past the ring when this block streams its passes.
template <typename Row, int VEC>
__device__ __forceinline__ CandidateList transform_list(const RowSplit& sp) {
  size_t offset = 0;
  if constexpr (Streamable<Row>::value) {
    if (sp.stream) offset = stream_bytes<VEC, typename Row::Elem>();
  }
  return candidate_list(offset, kTransformListCapacity);
}

__device__ void fill_row(float* out, int64_t vocab, float value) {
  for (int64_t i = threadIdx.x; i < vocab; i += kBlock) out[i] = value;
}

/// fill_row with 16-byte stores where `out` is 16-byte aligned (the head and tail alone).
__device__ void fill_row_vec(float* out, int64_t vocab, float value) {
  const int64_t head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(out) % 16) % 16 / 4);
  if (reinterpret_cast<uintptr_t>(out) % 4 != 0 || head >= vocab) return fill_row(out, vocab, value);
  for (int64_t i = threadIdx.x; i < head; i += kBlock) out[i] = value;
  const int64_t quads = (vocab - head) / 4;
  float4* q = reinterpret_cast<float4*>(out + head);
  const float4 v4 = make_float4(value, value, value, value);
  for (int64_t i = threadIdx.x; i < quads; i += kBlock) q[i] = v4;
  for (int64_t i = head + quads * 4 + threadIdx.x; i < vocab; i += kBlock) out[i] = value;
}

/// softmax(x / temperature): max, sum of exp, divide (in place allowed: each thread
/// writes only the entries it has just read, after the sum's barrier). The very passes
/// of the fused from-logits samplers (row_passes.cuh: softmax_scale, SoftmaxRowT, VEC 16),
/// so at temperature 1 this writes the probabilities they draw from, bit for bit.
template <typename Row>
__device__ Status softmax_row(const Row& row, float temperature, float* out, SharedState& sh, const RowSplit& mode) {
  SoftmaxScale scale{};
  uint32_t flags = 0;
  if (!softmax_scale<16>(row, temperature, scale, flags, sh, mode))
    return flags ? Status::not_finite : Status::zero_row;
  write_row<16>(SoftmaxRowT<Row>{row, scale, row.vocab}, out);
  return Status::ok;
}

/// Pass 0 of a renorm or mask row, fused with the first radix level's histogram of the
/// entries `keep` accepts: the summary (probabilities: total, max, flags; logits: max,
/// flags) and the bins of the top 11 key bits. A bad row's bins are never read.
template <RadixStat STAT, bool LOGITS, int VEC, typename Row, typename Keep>
__device__ RowSummary summarize_with_histogram(const Row& row, Keep keep, RadixShared& rs, SharedState& sh,
                                               RowSplit& sp) {
  rs.clear();
  __syncthreads();
  constexpr int kShift = 32 - kRadixBits;
  RowSummary s{0, LOGITS ? -INFINITY : 0.f, 0u};
  for_each_tile<VEC>(row, sp, next_pass_reversed(sp), [&](int64_t, const float(&v)[VEC], auto index) {
    MassAcc acc;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const bool real = index(j) < row.vocab;
      if (real) {
        if constexpr (LOGITS) {
          if (isnan(v[j]) || v[j] == INFINITY) s.flags |= kFlagNotFinite;
          else s.max_p = fmaxf(s.max_p, v[j]);
        } else {  // as summarize_row's pass 0: no branch for a valid entry
          const bool valid = v[j] >= 0.f && v[j] <= 1.f;
          acc.add_unit(valid ? v[j] : 0.f);
          s.max_p = fmaxf(s.max_p, valid ? v[j] : 0.f);
          if (!valid) {
            MassAcc ignored;
            add_entry(s, ignored, v[j]);  // flags only
          }
        }
      }
      radix_add<STAT>(rs, real && keep(v[j]) ? order_key(v[j]) >> kShift : kNoBin, v[j]);
    }
    s.total += acc.value();
  });
  const RowSummary r =
      cub::BlockReduce<RowSummary, kBlock>(sh.temp.summary).Reduce(s, [](const RowSummary& a, const RowSummary& b) {
        return RowSummary{a.total + b.total, fmaxf(a.max_p, b.max_p), a.flags | b.flags};
      });
  return broadcast(r, sh.summary);  // its barriers also end the histogram
}

/// top_k_renorm_probs / top_p_renorm_probs of one row: pass 0 with the first radix
/// level, two more radix levels (the cut), for top-k the kept mass (top-p has it from
/// the last level), then the write.
template <Transform T, int VEC, typename Row>
__device__ Status renorm_row(const Row& row, int64_t top_k, float top_p, float* out, RadixShared& rs, SharedState& sh,
                             RowSplit& sp, bool gather) {
  constexpr RadixStat kStat = T == Transform::top_k_renorm ? RadixStat::count : RadixStat::mass;
  auto positive = [](float x) { return x > 0.f; };
  const RowSummary s = summarize_with_histogram<kStat, false, VEC>(row, positive, rs, sh, sp);
  if (s.flags & kFlagNotFinite) return Status::not_finite;
  if (s.flags & kFlagNegative) return Status::negative;
  if (s.flags & kFlagAboveOne) return Status::above_one;
  if (s.total == 0) return Status::zero_row;
  const Mass top_p_bound = mass_fraction_ceil(s.total, top_p);  // unused by top-k
  // keep p iff fewer than k entries are larger (top-k), or their mass is below the bound (top-p)
  Mass above_cut = 0, at_cut = 0;
  bool clamped = false, listed = false;
  CandidateList list = transform_list<Row, VEC>(sp);
  const uint32_t lo = order_key(0.f);
  const uint32_t cut = radix_cut<kStat, VEC>(
      row, lo, order_key(s.max_p), positive,
      [&](Mass stat) {
        if constexpr (T == Transform::top_k_renorm) return stat < static_cast<Mass>(top_k);
        else return stat < top_p_bound;
      },
      true, rs, sh, above_cut, at_cut, clamped, sp, gather ? &list : nullptr, &listed);
  auto kept = [cut](float x) { return x > 0.f && order_key(x) >= cut; };
  if (listed && !clamped) {  // every kept entry is in the list: no more passes over the row
    MassAcc acc;
    for (int a = static_cast<int>(threadIdx.x); a < list.n; a += kBlock)
      acc.add(kept(list.value[a]) ? list.value[a] : 0.f);
    const Mass kept_mass = broadcast(cub::BlockReduce<Mass, kBlock>(sh.temp.mass).Sum(acc.value()), sh.mass);
    const double kept_units = mass_units(kept_mass);
    fill_row_vec(out, row.vocab, 0.f);
    __syncthreads();  // the fill is done before the kept entries land on it
    for (int a = static_cast<int>(threadIdx.x); a < list.n; a += kBlock) {
      const float x = list.value[a];
      if (kept(x)) out[list.index[a]] = static_cast<float>(mass_units(mass_of(x)) / kept_units);
    }
    return Status::ok;
  }
  // top-p: the kept entries are those above the cut plus those at it, both summed by
  // the last level, unless the cut was clamped to [lo, hi] (which top-p never needs)
  const Mass kept_mass = kStat == RadixStat::mass && !clamped ? above_cut + at_cut
                                                              : sum_mass_where<VEC, false, false>(row, kept, sh, sp);
  const double kept_units = mass_units(kept_mass);
  for (int64_t i = threadIdx.x; i < row.vocab; i += kBlock) {
    const float x = row.at(i);
    out[i] = kept(x) ? static_cast<float>(mass_units(mass_of(x)) / kept_units) : 0.f;
  }
  return Status::ok;
}

/// top_k_mask_logits of one row (in place allowed: every entry is read before it is written).
template <int VEC, typename Row>
__device__ Status mask_row(const Row& row, int64_t top_k, float* out, RadixShared& rs, SharedState& sh, RowSplit& sp,
                           bool gather) {
  auto all = [](float) { return true; };
  const RowSummary s = summarize_with_histogram<RadixStat::count, true, VEC>(row, all, rs, sh, sp);
  if (s.flags & kFlagNotFinite) return Status::not_finite;
  if (s.max_p == -INFINITY) return Status::zero_row;
  Mass above_cut = 0, at_cut = 0;
  bool clamped = false, listed = false;
  CandidateList list = transform_list<Row, VEC>(sp);
  const uint32_t cut = radix_cut<RadixStat::count, VEC>(
      row, order_key(-INFINITY), order_key(s.max_p), all, [&](Mass count) { return count < static_cast<Mass>(top_k); },
      true, rs, sh, above_cut, at_cut, clamped, sp, gather ? &list : nullptr, &listed);
  if (listed && !clamped) {  // every kept entry is in the list: fill, then put them back
    fill_row_vec(out, row.vocab, -INFINITY);
    __syncthreads();
    for (int a = static_cast<int>(threadIdx.x); a < list.n; a += kBlock)
      if (order_key(list.value[a]) >= cut) out[list.index[a]] = list.value[a];
    return Status::ok;
  }
  for (int64_t i = threadIdx.x; i < row.vocab; i += kBlock) {
    const float x = row.at(i);
    out[i] = order_key(x) >= cut ? x : -INFINITY;
  }
  return Status::ok;
}

/// One block per output row: read the row and parameters, transform, or write NaN + status.
/// In: float or Bf16Bits (softmax and mask only); VECTOR_LOADS: 16-byte loads (aligned rows).
template <Transform T, typename In, bool VECTOR_LOADS>
__global__ void __launch_bounds__(kBlock) transform_kernel(TransformParams p) {
  __shared__ SharedState sh;
  constexpr int VEC = VECTOR_LOADS ? 16 : 8;  // renorm and mask: entries a thread per tile
  const int64_t o = blockIdx.x;
  int64_t row = 0, top_k = 0;
  float top_p = 0.f, temperature = 0.f;
  Status status = read_row<T>(p, o, row, top_k, top_p, temperature);
  float* out = p.out + o * p.vocab;
  RowSplit whole;
  whole.stream = p.stream && VECTOR_LOADS;
  if (status == Status::ok) {
    const In* in = static_cast<const In*>(p.in) + row * p.vocab;
    if constexpr (T == Transform::softmax)
      status = softmax_row(LogitRowT<In, VECTOR_LOADS>{in, p.vocab}, temperature, out, sh, whole);
    if constexpr (T == Transform::top_k_mask) {
      __shared__ RadixShared rs;
      status = mask_row<VEC>(LogitRowT<In, VECTOR_LOADS>{in, p.vocab}, top_k, out, rs, sh, whole, p.compact);
    }
    if constexpr (T == Transform::top_k_renorm || T == Transform::top_p_renorm) {
      __shared__ RadixShared rs;
      status = renorm_row<T, VEC>(ProbRowT<VECTOR_LOADS>{in, p.vocab}, top_k, top_p, out, rs, sh, whole, p.compact);
    }
  }
  if (status != Status::ok) {
    __syncthreads();  // an in-place row is fully read before NaN overwrites it
    fill_row(out, p.vocab, NAN);
  }
  if (threadIdx.x == 0 && p.status) p.status[o] = static_cast<int32_t>(status);
}

}  // namespace device

namespace detail {

namespace {

/// Launches one transform kernel with stream_tiles' ring when p.stream (rows of In, VEC 16).
template <device::Transform T, typename In, bool VECTOR_LOADS = false>
void launch_transform(const device::TransformParams& p, int64_t outputs, cudaStream_t stream) {
  if (outputs == 0) return;
  const auto kernel = device::transform_kernel<T, In, VECTOR_LOADS>;
  // the ring (streamed passes), then the candidate list (count cuts)
  constexpr size_t kRing = device::stream_bytes<16, In>() + device::kTransformListBytes;
  static const size_t allowed = allow_dynamic_smem(reinterpret_cast<const void*>(kernel), kRing);
  const auto ring_of = [](const device::TransformParams& q) {
    return (VECTOR_LOADS && q.stream ? device::stream_bytes<16, In>() : size_t{0}) +
           (q.compact && T != device::Transform::softmax ? device::kTransformListBytes : size_t{0});
  };
  const device::TransformParams launched = fit_shared_memory(p, allowed, ring_of);
  kernel<<<static_cast<unsigned>(outputs), device::kBlock, ring_of(launched), stream>>>(launched);
  kernels::check_launch("transform_kernel");
}

// 16-byte loads when every row start is aligned (as the fused samplers decide)
template <device::Transform T, typename In>
void launch_transform_vec(const device::TransformParams& p, int64_t outputs, cudaStream_t stream) {
  const bool vec = p.vocab * static_cast<int64_t>(sizeof(In)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.in) % 16 == 0;
  if (vec) {
    launch_transform<T, In, true>(p, outputs, stream);
  } else {
    launch_transform<T, In, false>(p, outputs, stream);
  }
}

device::TransformParams transform_params(DeviceRows in, float* out, const Gather& g) {
  device::TransformParams p{};
  p.in = in.data;
  p.rows = in.rows;
  p.vocab = in.vocab;
  p.indices = g.indices;
  p.prior_status = g.prior_status;
  p.top_k = 1;
  p.top_p = 1.f;
  p.temperature = 1.f;
  p.out = out;
  p.status = g.status;
  p.stream = true;  // launch_transform leaves the ring or the list out where they do not fit
  p.compact = true;
  return p;
}

}  // namespace

void launch_softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, Gather gather,
                    cudaStream_t stream) {
  device::TransformParams p = transform_params(logits, probs_out, gather);
  p.temperature = static_cast<float>(temperature.scalar);
  p.temperature_per_output = temperature.per_output;
  p.stream = false;  // logit rows load directly, as the fused samplers read them
  if (logits.dtype == ElementType::bf16) {
    launch_transform_vec<device::Transform::softmax, device::Bf16Bits>(p, gather.outputs, stream);
  } else {
    launch_transform_vec<device::Transform::softmax, float>(p, gather.outputs, stream);
  }
}

void launch_renorm(FilterKind kind, DeviceRows probs, TopK top_k, Fraction top_p, float* probs_out, Gather gather,
                   cudaStream_t stream) {
  device::TransformParams p = transform_params(probs, probs_out, gather);
  p.top_k = top_k.scalar;
  p.top_k_per_output = top_k.per_output;
  p.top_p = static_cast<float>(top_p.scalar);
  p.top_p_per_output = top_p.per_output;
  if (kind == FilterKind::top_k) {
    launch_transform_vec<device::Transform::top_k_renorm, float>(p, gather.outputs, stream);
  } else {
    launch_transform_vec<device::Transform::top_p_renorm, float>(p, gather.outputs, stream);
  }
}

void launch_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, Gather gather, cudaStream_t stream) {
  device::TransformParams p = transform_params(logits, logits_out, gather);
  p.top_k = top_k.scalar;
  p.top_k_per_output = top_k.per_output;
  if (logits.dtype == ElementType::bf16) {
    launch_transform_vec<device::Transform::top_k_mask, device::Bf16Bits>(p, gather.outputs, stream);
  } else {
    launch_transform_vec<device::Transform::top_k_mask, float>(p, gather.outputs, stream);
  }
}

}  // namespace detail

namespace {
void check_out(const char* fn, const char* name, const void* out, int64_t rows) {
  if (rows > 0 && out == nullptr) throw ref::InvalidArgument(std::string(fn) + ": " + name + " is null");
}
}  // namespace

void softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, int32_t* status,
             cudaStream_t stream) {
  const char* fn = "softmax";
  detail::check_rows(fn, "logits", logits, true);
  check_out(fn, "probs_out", probs_out, logits.rows);
  const double t = temperature.scalar;
  if (!temperature.per_output && !(std::isfinite(t) && t > 0.0 && std::isfinite(static_cast<float>(1.0 / t))))
    throw ref::InvalidArgument(std::string(fn) + ": temperature must be finite and > 0, but temperature = " +
                               std::to_string(t) + " (temperature 0 means greedy decoding: take the argmax)");
  detail::launch_softmax(logits, temperature, probs_out, detail::Gather{nullptr, logits.rows, nullptr, status}, stream);
}

void top_k_renorm_probs(DeviceRows probs, TopK top_k, float* probs_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_k_renorm_probs";
  detail::check_rows(fn, "probs", probs);
  detail::check_top_k(fn, top_k);
  check_out(fn, "probs_out", probs_out, probs.rows);
  detail::launch_renorm(FilterKind::top_k, probs, top_k, Fraction(1.0), probs_out,
                        detail::Gather{nullptr, probs.rows, nullptr, status}, stream);
}

void top_p_renorm_probs(DeviceRows probs, Fraction top_p, float* probs_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_p_renorm_probs";
  detail::check_rows(fn, "probs", probs);
  detail::check_top_p(fn, top_p);
  check_out(fn, "probs_out", probs_out, probs.rows);
  detail::launch_renorm(FilterKind::top_p, probs, TopK(1), top_p, probs_out,
                        detail::Gather{nullptr, probs.rows, nullptr, status}, stream);
}

void top_k_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, int32_t* status, cudaStream_t stream) {
  const char* fn = "top_k_mask_logits";
  detail::check_rows(fn, "logits", logits, true);
  detail::check_top_k(fn, top_k);
  check_out(fn, "logits_out", logits_out, logits.rows);
  detail::launch_mask_logits(logits, top_k, logits_out, detail::Gather{nullptr, logits.rows, nullptr, status}, stream);
}

}  // namespace flashstep::stages::sampling
