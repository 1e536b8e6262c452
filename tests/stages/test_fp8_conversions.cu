// FP8 conversions: the reference's decoder and encoder (reference/fp8.hpp) against the
// CUDA toolkit's, bit for bit. Suite "host" runs cuda_fp8.hpp's host code (no GPU
// needed); the GPU cases run the device conversions (the cvt instructions of sm_89 and
// later behind __nv_fp8_e4m3 / __nv_fp8_e5m2) and the stages' own widening and
// narrowing of 16-element vectors (kernels/vec.cuh). Every one of the 256 patterns is
// decoded; a sweep of doubles and floats (every FP8 value, every tie between two of them
// and one ulp either side, subnormals, values past the largest, infinities, NaNs of
// either sign and several payloads, random magnitudes and random bit patterns) is encoded.
#include <doctest/doctest.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/vec.cuh"
#include "flashstep/reference/fp8.hpp"
#include "harness/device.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::FP8Format;
using ref::FP8Overflow;
using stages::harness::DeviceBuffer;
using stages::harness::download;
using stages::harness::upload;

namespace {

__nv_fp8_interpretation_t toolkit_format(FP8Format f) { return f == FP8Format::e4m3 ? __NV_E4M3 : __NV_E5M2; }

double from_bits(uint64_t bits) {
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

float from_bits32(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

/// The doubles every encoder is checked on (file comment), for `format`.
std::vector<double> double_sweep(FP8Format format, std::mt19937_64& rng) {
  std::vector<double> values;  // the positive finite FP8 values, then the grid's next point past max
  for (int b = 0; b < 0x80; ++b) {
    const double v = ref::fp8_to_double(static_cast<uint8_t>(b), format);
    if (std::isfinite(v)) values.push_back(v);
  }
  const ref::FP8Spec& s = ref::fp8_spec(format);
  values.push_back(s.max_finite + std::ldexp(1.0, std::ilogb(s.max_finite) - s.fraction_bits));
  std::vector<double> xs;
  for (size_t i = 0; i < values.size(); ++i) {
    xs.push_back(values[i]);
    if (i + 1 == values.size()) break;
    const double mid = (values[i] + values[i + 1]) / 2;  // a tie
    for (double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300)}) xs.push_back(x);
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (double x : {inf, 1e300, std::numeric_limits<double>::max(), std::numeric_limits<double>::denorm_min(), 1e-300,
                   2 * s.max_finite, s.min_subnormal / 4})
    xs.push_back(x);
  std::uniform_real_distribution<double> log2_mag(std::log2(s.min_subnormal) - 4, std::log2(s.max_finite) + 2);
  for (int i = 0; i < 20000; ++i) xs.push_back(std::exp2(log2_mag(rng)));
  for (int i = 0; i < 20000; ++i) xs.push_back(from_bits(rng()));  // any double, NaNs included
  const size_t n = xs.size();
  for (size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  for (uint64_t nan : {0x7ff8000000000000ull, 0x7ffc000000000000ull, 0x7ff4000000000000ull, 0x7ff0000000000001ull,
                       0xfff8000000000000ull, 0xfffc000000000000ull, 0xfff0000000000001ull})
    xs.push_back(from_bits(nan));
  return xs;
}

/// The floats: every double of the sweep that a float holds exactly, the rest rounded to
/// float (a float conversion never sees the double), and random float bit patterns.
std::vector<float> float_sweep(FP8Format format, std::mt19937_64& rng) {
  std::vector<float> xs;
  for (double x : double_sweep(format, rng)) xs.push_back(static_cast<float>(x));
  for (int i = 0; i < 20000; ++i) xs.push_back(from_bits32(static_cast<uint32_t>(rng())));
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x00000001u, 0x80000001u})
    xs.push_back(from_bits32(nan));
  return xs;
}

/// Counts the mismatches of one comparison and keeps the first five as text.
struct Mismatches {
  int64_t count = 0;
  std::string first;
  void add(const std::string& line) {
    if (count++ < 5) first += "\n  " + line;
  }
};

std::string hex(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", x);
  return buf;
}

std::string byte_text(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

/// A decoded value agrees with the reference's: the same float bits (an FP8 value is a
/// float value, signed zeros included), or both NaN (the reference says NaN; which NaN
/// pattern a conversion writes is not part of a cache's contract).
bool same_value(float got, double expected) {
  if (std::isnan(expected)) return std::isnan(got);
  return bits_of(got) == bits_of(static_cast<float>(expected)) && static_cast<double>(got) == expected;
}

// ---- device kernels

/// Thread i decodes pattern i through the toolkit's operator float (fp8 -> f16 -> f32),
/// and threads 0..15 decode patterns 16t..16t+15 through the stages' Vec16 widening.
template <typename FP8>
__global__ void decode_kernel(float* through_operator, float* through_vec16) {
  const int i = threadIdx.x;
  FP8 x;
  x.__x = static_cast<__nv_fp8_storage_t>(i);
  through_operator[i] = static_cast<float>(x);
  if (i < 16) {
    kernels::Vec16<FP8> v;
    uint32_t w[4];  // element e is byte e: patterns 16i + e, little-endian
    for (int k = 0; k < 4; ++k) {
      const uint32_t first = 16 * i + 4 * k;
      w[k] = first | (first + 1) << 8 | (first + 2) << 16 | (first + 3) << 24;
    }
    v.raw = make_uint4(w[0], w[1], w[2], w[3]);
    v.to_float(through_vec16 + 16 * i);
  }
}

/// Element i through the toolkit's constructor (round to nearest, __NV_SATFINITE: the
/// cvt.rn.satfinite instruction) and without saturation (__NV_NOSAT); vector k of 16
/// floats through the stages' Vec16 narrowing.
template <typename FP8, __nv_fp8_interpretation_t FORMAT>
__global__ void encode_float_kernel(const float* in, int n, uint8_t* saturated, uint8_t* unsaturated,
                                    uint8_t* through_vec16) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    saturated[i] = FP8(in[i]).__x;
    unsaturated[i] = __nv_cvt_float_to_fp8(in[i], __NV_NOSAT, FORMAT);
  }
  if (16 * i + 15 < n) {
    kernels::Vec16<FP8> v;
    v.from_float(in + 16 * i);
    *reinterpret_cast<uint4*>(through_vec16 + 16 * i) = v.raw;  // 16-byte aligned: a cudaMalloc'd base
  }
}

template <typename FP8, __nv_fp8_interpretation_t FORMAT>
__global__ void encode_double_kernel(const double* in, int n, uint8_t* saturated, uint8_t* unsaturated) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  saturated[i] = FP8(in[i]).__x;
  unsaturated[i] = __nv_cvt_double_to_fp8(in[i], __NV_NOSAT, FORMAT);
}

template <typename FP8, __nv_fp8_interpretation_t FORMAT>
void check_device(FP8Format format) {
  auto rng = test::case_rng(std::string("fp8 device ") + ref::to_string(format));
  CAPTURE(test::run_seed());
  CAPTURE(std::string(ref::to_string(format)));

  // ---- decode: all 256 patterns, both ways.
  {
    DeviceBuffer op(256 * sizeof(float)), vec(256 * sizeof(float));
    decode_kernel<FP8><<<1, 256>>>(op.as<float>(), vec.as<float>());
    FLASHSTEP_CUDA_CHECK(cudaGetLastError());
    const std::vector<float> got_op = download<float>(op), got_vec = download<float>(vec);
    Mismatches m;
    for (int b = 0; b < 256; ++b) {
      const double expected = ref::fp8_to_double(static_cast<uint8_t>(b), format);
      if (!same_value(got_op[b], expected))
        m.add("operator float of " + byte_text(b) + ": " + hex(got_op[b]) + ", reference " + hex(expected));
      if (!same_value(got_vec[b], expected))
        m.add("Vec16::to_float of " + byte_text(b) + ": " + hex(got_vec[b]) + ", reference " + hex(expected));
    }
    CHECK_MESSAGE(m.count == 0, m.count << " decode mismatches:" << m.first);
  }

  // ---- encode floats: saturated (hardware cvt), unsaturated, and 16 at a time.
  {
    std::vector<float> xs = float_sweep(format, rng);
    while (xs.size() % 16) xs.push_back(0.f);
    const int n = static_cast<int>(xs.size());
    const DeviceBuffer in = upload(xs);
    DeviceBuffer sat(xs.size()), unsat(xs.size()), vec(xs.size());
    encode_float_kernel<FP8, FORMAT>
        <<<(n + 255) / 256, 256>>>(in.as<float>(), n, sat.as<uint8_t>(), unsat.as<uint8_t>(), vec.as<uint8_t>());
    FLASHSTEP_CUDA_CHECK(cudaGetLastError());
    const std::vector<uint8_t> got_sat = download<uint8_t>(sat), got_unsat = download<uint8_t>(unsat),
                               got_vec = download<uint8_t>(vec);
    Mismatches m;
    for (int i = 0; i < n; ++i) {
      const uint8_t expected_sat = ref::fp8_from_float(xs[i], format, FP8Overflow::saturate);
      const uint8_t expected_unsat = ref::fp8_from_float(xs[i], format, FP8Overflow::no_saturate);
      if (got_sat[i] != expected_sat)
        m.add("float " + hex(xs[i]) + " saturated: " + byte_text(got_sat[i]) + ", reference " +
              byte_text(expected_sat));
      if (got_unsat[i] != expected_unsat)
        m.add("float " + hex(xs[i]) + " unsaturated: " + byte_text(got_unsat[i]) + ", reference " +
              byte_text(expected_unsat));
      if (got_vec[i] != expected_sat)
        m.add("float " + hex(xs[i]) + " Vec16::from_float: " + byte_text(got_vec[i]) + ", reference " +
              byte_text(expected_sat));
    }
    CHECK_MESSAGE(m.count == 0, m.count << " float encode mismatches of " << 3 * n << ":" << m.first);
  }

  // ---- encode doubles.
  {
    const std::vector<double> xs = double_sweep(format, rng);
    const int n = static_cast<int>(xs.size());
    const DeviceBuffer in = upload(xs);
    DeviceBuffer sat(xs.size()), unsat(xs.size());
    encode_double_kernel<FP8, FORMAT>
        <<<(n + 255) / 256, 256>>>(in.as<double>(), n, sat.as<uint8_t>(), unsat.as<uint8_t>());
    FLASHSTEP_CUDA_CHECK(cudaGetLastError());
    const std::vector<uint8_t> got_sat = download<uint8_t>(sat), got_unsat = download<uint8_t>(unsat);
    Mismatches m;
    for (int i = 0; i < n; ++i) {
      const uint8_t expected_sat = ref::fp8_from_double(xs[i], format, FP8Overflow::saturate);
      const uint8_t expected_unsat = ref::fp8_from_double(xs[i], format, FP8Overflow::no_saturate);
      if (got_sat[i] != expected_sat)
        m.add("double " + hex(xs[i]) + " saturated: " + byte_text(got_sat[i]) + ", reference " +
              byte_text(expected_sat));
      if (got_unsat[i] != expected_unsat)
        m.add("double " + hex(xs[i]) + " unsaturated: " + byte_text(got_unsat[i]) + ", reference " +
              byte_text(expected_unsat));
    }
    CHECK_MESSAGE(m.count == 0, m.count << " double encode mismatches of " << 2 * n << ":" << m.first);
  }
}

}  // namespace

TEST_SUITE("host") {
TEST_CASE("fp8 conversions: the reference against cuda_fp8.hpp's host code, bit for bit") {
  for (FP8Format format : {FP8Format::e4m3, FP8Format::e5m2}) {
    auto rng = test::case_rng(std::string("fp8 host ") + ref::to_string(format));
    CAPTURE(test::run_seed());
    CAPTURE(std::string(ref::to_string(format)));
    const __nv_fp8_interpretation_t tk = toolkit_format(format);
    Mismatches m;
    int64_t checked = 0;
    for (int b = 0; b < 256; ++b) {
      const double expected = ref::fp8_to_double(static_cast<uint8_t>(b), format);
      const float got = __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), tk)));
      ++checked;
      if (!same_value(got, expected))
        m.add("decode " + byte_text(b) + ": " + hex(got) + ", reference " + hex(expected));
    }
    for (FP8Overflow o : {FP8Overflow::saturate, FP8Overflow::no_saturate}) {
      const __nv_saturation_t sat = o == FP8Overflow::saturate ? __NV_SATFINITE : __NV_NOSAT;
      for (double x : double_sweep(format, rng)) {
        ++checked;
        const uint8_t got = __nv_cvt_double_to_fp8(x, sat, tk), expected = ref::fp8_from_double(x, format, o);
        if (got != expected) m.add("double " + hex(x) + ": " + byte_text(got) + ", reference " + byte_text(expected));
      }
      for (float x : float_sweep(format, rng)) {
        ++checked;
        const uint8_t got = __nv_cvt_float_to_fp8(x, sat, tk), expected = ref::fp8_from_float(x, format, o);
        if (got != expected) m.add("float " + hex(x) + ": " + byte_text(got) + ", reference " + byte_text(expected));
      }
    }
    CHECK_MESSAGE(m.count == 0, m.count << " mismatches of " << checked << ":" << m.first);
  }
}
}  // TEST_SUITE("host")

TEST_CASE("fp8 conversions: the reference against the device's e4m3 conversions, bit for bit") {
  check_device<__nv_fp8_e4m3, __NV_E4M3>(FP8Format::e4m3);
}

TEST_CASE("fp8 conversions: the reference against the device's e5m2 conversions, bit for bit") {
  check_device<__nv_fp8_e5m2, __NV_E5M2>(FP8Format::e5m2);
}
