/// \file mass.cuh
/// \brief Exact probability masses on the GPU: the reference's fixed-point arithmetic
/// (reference/sampling.hpp, "Arithmetic"), written once for host and device.
///
/// A probability p in [0, 1] becomes floor(p * 2^96), an integer held in 128 bits.
/// Integer sums do not depend on the order of addition, so a block reduction over 1024
/// threads, a CUB scan and the CPU's left-to-right loop all reach the same total, and
/// every accept/reject comparison of the sampler is decided the same way on both sides.
/// The functions compile for host and device, so the host test suite checks them
/// against the reference's own (tests/stages/test_sampling.cpp, suite "host").
#pragma once

#include <cstdint>
#include <cstring>

#include "flashstep/kernels/philox.cuh"  // FLASHSTEP_HOST_DEVICE

namespace flashstep::stages::sampling {

/// An exact mass: an integer number of 2^-96 units (ref::Mass).
__extension__ typedef unsigned __int128 Mass;

/// The bits of a float (host: memcpy, device: a register move).
FLASHSTEP_HOST_DEVICE uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

/// floor(p * 2^96) for a probability p: ref::mass_of. Zero for p <= 0, NaN and
/// denormals; entries >= 2 (rejected by the operators before any sum) also give zero,
/// so a bad row can never shift a 128-bit integer out of range.
FLASHSTEP_HOST_DEVICE Mass mass_of(float p) {
  if (!(p > 0.0f)) return 0;
  const uint32_t bits = float_bits(p);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  if (exponent == 0 || exponent > 127) return 0;
  const Mass significand = static_cast<Mass>((bits & 0x7FFFFFu) | 0x800000u);
  const int shift = exponent - 54;  // p * 2^96 = significand * 2^(exponent - 54)
  if (shift >= 0) return significand << shift;
  if (shift <= -24) return 0;
  return significand >> (-shift);
}

/// A thread's running sum of exact masses, cheap per entry. floor(p * 2^96) splits at
/// 2^48 into hi = floor(p * 2^48) and lo = floor(p * 2^96) mod 2^48, both read off p's
/// bits with integer shifts (parts), and each half sums in a 64-bit register without
/// carries: an entry adds < 2^49 to `hi` and < 2^48 to `lo`, so up to 2^14 entries fit
/// (the passes widen once per tile of 16). value() equals the sum of mass_of over the
/// same entries, in any order; the host suite checks it against the reference's mass_of,
/// on the same code the device runs.
struct MassAcc {
  uint64_t hi = 0;  ///< sum of floor(p * 2^48)
  uint64_t lo = 0;  ///< sum of floor(p * 2^96) mod 2^48
  /// The two halves add(p) adds.
  struct Parts {
    uint64_t hi, lo;
  };
  /// floor(p * 2^48) and floor(p * 2^96) mod 2^48. A normal p in (0, 2) is s * 2^(e - 150)
  /// with its 24-bit significand s and biased exponent e, so the halves are s shifted by
  /// e - 102 and by e - 54 (keeping the low 48 bits). Both are zero where mass_of is: p <= 0
  /// (the sign bit makes e > 255), NaN, p >= 2 (e > 127) and denormals (e == 0, whose mass
  /// is below 2^-30). Integer shifts rather than a float-to-uint64 conversion, which Hopper
  /// issues at a quarter of its integer rate.
  FLASHSTEP_HOST_DEVICE static Parts parts(float p) {
    const uint32_t bits = float_bits(p);
    const int e = static_cast<int>(bits >> 23);
    if (e == 0 || e > 127) return {0, 0};
    const uint64_t s = (bits & 0x7FFFFFu) | 0x800000u;
    const uint64_t lo = e - 54 >= 48 ? 0 : shifted(s, e - 54) & ((uint64_t{1} << 48) - 1);
    return {shifted(s, e - 102), lo};
  }
  /// Adds mass_of(p).
  FLASHSTEP_HOST_DEVICE void add(float p) { add_if(true, parts(p)); }
  /// Adds an entry's parts(p) if `keep`: one pass that sums one entry into several sets
  /// (the counting pass's p > pivot_0 and p > pivot_1) converts it once.
  FLASHSTEP_HOST_DEVICE void add_if(bool keep, const Parts& m) {
    hi += keep ? m.hi : 0;
    lo += keep ? m.lo : 0;
  }
  /// The exact sum, as a Mass.
  FLASHSTEP_HOST_DEVICE Mass value() const { return (static_cast<Mass>(hi) << 48) + lo; }

 private:
  /// floor(s * 2^n) for s < 2^24 and n < 64 (n >= 0: the low 64 bits).
  FLASHSTEP_HOST_DEVICE static uint64_t shifted(uint64_t s, int n) {
    return n >= 0 ? s << n : (n > -24 ? s >> -n : 0);
  }
};

/// floor(u24 * q / 2^24): the inverse-CDF threshold of the uniform u24 / 2^24 over the
/// mass q (ref::scaled_threshold). \param u24 a 24-bit uniform \param q a mass < 2^127
FLASHSTEP_HOST_DEVICE Mass scaled_threshold(uint32_t u24, Mass q) {
  const Mass ql = static_cast<uint64_t>(q);
  const Mass qh = q >> 64;
  return ((static_cast<Mass>(u24) * qh) << 40) + ((static_cast<Mass>(u24) * ql) >> 24);
}

/// ceil(fraction * total), exact for a float fraction in [0, 1] (ref::mass_fraction_ceil):
/// the top-p bound. \param total a row's mass \param fraction top_p
FLASHSTEP_HOST_DEVICE Mass mass_fraction_ceil(Mass total, float fraction) {
  if (!(fraction > 0.0f)) return 0;
  const uint32_t bits = float_bits(fraction);
  const int exponent = static_cast<int>((bits >> 23) & 0xFFu);
  // fraction = M * 2^-s with an integer M < 2^24
  const uint64_t M = exponent == 0 ? (bits & 0x7FFFFFu) : ((bits & 0x7FFFFFu) | 0x800000u);
  const int s = exponent == 0 ? 149 : 150 - exponent;
  // M * total as three 64-bit limbs w2:w1:w0
  const Mass lo = static_cast<Mass>(M) * static_cast<uint64_t>(total);
  const Mass hi = static_cast<Mass>(M) * static_cast<uint64_t>(total >> 64);
  const Mass mid = (lo >> 64) + static_cast<uint64_t>(hi);
  uint64_t w0 = static_cast<uint64_t>(lo), w1 = static_cast<uint64_t>(mid);
  uint64_t w2 = static_cast<uint64_t>((hi >> 64) + (mid >> 64));
  // shift right by s, remembering whether any bit fell off (then round up)
  bool remainder = false;
  int shift = s;
  while (shift >= 64) {
    remainder = remainder || w0 != 0;
    w0 = w1;
    w1 = w2;
    w2 = 0;
    shift -= 64;
  }
  if (shift > 0) {
    remainder = remainder || (w0 & ((uint64_t{1} << shift) - 1)) != 0;
    w0 = (w0 >> shift) | (w1 << (64 - shift));
    w1 = (w1 >> shift) | (w2 << (64 - shift));
  }
  return ((static_cast<Mass>(w1) << 64) | w0) + (remainder ? 1 : 0);
}

/// A mass as a double number of 2^-96 units (nearest after two roundings): the ratio of
/// two of them is a renormalized probability.
FLASHSTEP_HOST_DEVICE double mass_units(Mass m) {
  const double hi = static_cast<double>(static_cast<uint64_t>(m >> 64));
  const double lo = static_cast<double>(static_cast<uint64_t>(m));
  return hi * 18446744073709551616.0 + lo;  // hi * 2^64 + lo
}

}  // namespace flashstep::stages::sampling
