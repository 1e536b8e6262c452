// The FP8 formats: decode a pattern to its exact value, encode a value by rounding on the
// format's grid, and attention over K/V stored in FP8 (decode, scale, then the reference
// attention unchanged). Written from the formats' definitions (fp8.hpp); the tests check
// the encoder against a brute-force nearest-value search and, on a GPU machine, against
// the CUDA toolkit's conversions bit for bit.
#include "flashstep/reference/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

constexpr FP8Spec kE4M3{4, 3, 7, 448.0, 0x1p-6, 0x1p-9, false};
constexpr FP8Spec kE5M2{5, 2, 15, 57344.0, 0x1p-14, 0x1p-16, true};

uint8_t sign_bit(double x) { return std::signbit(x) ? 0x80 : 0x00; }

/// The second fraction bit of a double (the one after the quiet bit), for an e5m2 NaN.
uint8_t second_fraction_bit(double x) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint8_t>((bits >> 50) & 1u);
}

/// Round half to even of a non-negative double.
double round_half_even(double n) {
  const double f = std::floor(n);
  const double rest = n - f;  // exact: n and f are within one binade of each other or f = 0
  if (rest > 0.5) return f + 1;
  if (rest < 0.5) return f;
  return std::fmod(f, 2.0) == 0.0 ? f : f + 1;
}

}  // namespace

const char* to_string(FP8Format format) { return format == FP8Format::e4m3 ? "e4m3" : "e5m2"; }

FP8Format parse_fp8_format(const std::string& name) {
  if (name == "e4m3" || name == "e4m3fn" || name == "float8_e4m3fn") return FP8Format::e4m3;
  if (name == "e5m2" || name == "float8_e5m2") return FP8Format::e5m2;
  throw InvalidArgument("parse_fp8_format: format must be e4m3 (float8_e4m3fn) or e5m2 (float8_e5m2), got \"" + name +
                        "\"");
}

const FP8Spec& fp8_spec(FP8Format format) { return format == FP8Format::e4m3 ? kE4M3 : kE5M2; }

double fp8_to_double(uint8_t bits, FP8Format format) {
  const FP8Spec& f = fp8_spec(format);
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  const int exponent_field = (bits & 0x7f) >> f.fraction_bits;
  const int fraction = bits & ((1 << f.fraction_bits) - 1);
  const int exponent_max = (1 << f.exponent_bits) - 1;
  if (format == FP8Format::e4m3 && exponent_field == exponent_max && fraction == (1 << f.fraction_bits) - 1)
    return std::numeric_limits<double>::quiet_NaN();  // s 1111 111: e4m3's only NaN
  if (format == FP8Format::e5m2 && exponent_field == exponent_max)
    return fraction == 0 ? sign * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (exponent_field == 0)  // subnormal (or zero): 0.m * 2^(1 - bias)
    return sign * std::ldexp(static_cast<double>(fraction), 1 - f.bias - f.fraction_bits);
  // normal: 1.m * 2^(e - bias)
  return sign *
         std::ldexp(static_cast<double>((1 << f.fraction_bits) | fraction), exponent_field - f.bias - f.fraction_bits);
}

uint8_t fp8_from_double(double x, FP8Format format, FP8Overflow overflow) {
  const FP8Spec& f = fp8_spec(format);
  const uint8_t sign = sign_bit(x);
  if (std::isnan(x)) return format == FP8Format::e4m3 ? (sign | 0x7f) : (sign | 0x7e | second_fraction_bit(x));
  const uint8_t max_finite = format == FP8Format::e4m3 ? 0x7e : 0x7b;  // s 1111 110, s 11110 11
  const uint8_t overflowed = overflow == FP8Overflow::saturate ? (sign | max_finite)
                             : format == FP8Format::e4m3       ? (sign | 0x7f)  // NaN: e4m3 has no infinity
                                                               : (sign | 0x7c);       // inf: s 11111 00
  const double a = std::fabs(x);
  if (std::isinf(a)) return overflowed;
  if (a == 0) return sign;

  // The grid around a: spacing 2^(e - fraction_bits), where e is a's binary exponent, but
  // never below the smallest normal's (the subnormals share its spacing).
  const int min_exponent = 1 - f.bias;
  const int e = std::max(std::ilogb(a), min_exponent);
  const double spacing = std::ldexp(1.0, e - f.fraction_bits);
  const double steps = round_half_even(a / spacing);  // a / spacing is exact: a power-of-two scaling
  const double rounded = steps * spacing;
  if (rounded > f.max_finite) return overflowed;
  if (rounded == 0) return sign;  // at most half the smallest subnormal: rounds to zero

  // Pack: steps is in [2^fraction_bits, 2^(fraction_bits + 1)] for a normal (the top when
  // rounding carried into the next binade), below 2^fraction_bits for a subnormal.
  const int significand = static_cast<int>(steps);
  const int one = 1 << f.fraction_bits;
  if (significand < one) return sign | static_cast<uint8_t>(significand);  // exponent field 0
  const int carry = significand == 2 * one ? 1 : 0;
  const int exponent_field = e + carry + f.bias;
  const int fraction = carry ? 0 : significand - one;
  return sign | static_cast<uint8_t>((exponent_field << f.fraction_bits) | fraction);
}

uint8_t fp8_from_float(float x, FP8Format format, FP8Overflow overflow) {
  // The toolkit first replaces a float NaN by 0x7fffffff, a positive NaN with every
  // fraction bit set: 0 1111 111 in e4m3, 0 11111 11 in e5m2.
  if (std::isnan(x)) return 0x7f;
  return fp8_from_double(static_cast<double>(x), format, overflow);
}

double fp8_round(double x, FP8Format format) { return fp8_to_double(fp8_from_double(x, format), format); }

namespace {

void check_scale(const char* fn, const char* name, double scale) {
  require(std::isfinite(scale) && scale > 0, fn,
          std::string(name) + " must be positive and finite (got " + std::to_string(scale) + ")");
}

}  // namespace

FP8Tensor quantize(const Tensor& x, FP8Format format, double scale) {
  check_scale("quantize", "scale", scale);
  check_storage("quantize", "x", x);
  FP8Tensor out;
  out.format = format;
  out.shape = x.shape;
  out.data.resize(x.data.size());
  for (size_t i = 0; i < x.data.size(); ++i) out.data[i] = fp8_from_double(x.data[i] / scale, format);
  return out;
}

Tensor dequantize(const FP8Tensor& x, double scale) {
  check_scale("dequantize", "scale", scale);
  require(static_cast<int64_t>(x.data.size()) == x.numel(), "dequantize",
          "x holds " + std::to_string(x.data.size()) + " elements, its shape " + shape_string(x.shape) + " needs " +
              std::to_string(x.numel()));
  Tensor out(x.shape);
  for (size_t i = 0; i < x.data.size(); ++i) out.data[i] = fp8_to_double(x.data[i], x.format) * scale;
  return out;
}

void check_kv_scales(const char* fn, const KVScales& scales) {
  check_scale(fn, "k_scale", scales.k_scale);
  check_scale(fn, "v_scale", scales.v_scale);
}

PagedKVCache dequantize(const FP8PagedKVCache& cache, const KVScales& scales) {
  const char* fn = "dequantize";
  check_kv_scales(fn, scales);
  require(cache.pages.rank() == 5 && cache.pages.dim(1) == 2, fn,
          "an FP8 paged cache's pages must have shape (num_pages, 2, ...) of rank 5, got " +
              shape_string(cache.pages.shape));
  PagedKVCache out;
  out.pages = dequantize(cache.pages, 1.0);
  // [:, 0] is K, [:, 1] is V: each half of a page times its own scale.
  const int64_t half = cache.pages.numel() / (cache.pages.dim(0) * 2);
  for (int64_t page = 0; page < cache.pages.dim(0); ++page)
    for (int kv = 0; kv < 2; ++kv) {
      const double scale = kv == 0 ? scales.k_scale : scales.v_scale;
      double* first = out.pages.data.data() + (page * 2 + kv) * half;
      for (int64_t i = 0; i < half; ++i) first[i] *= scale;
    }
  out.layout = cache.layout;
  out.kv_indptr = cache.kv_indptr;
  out.kv_indices = cache.kv_indices;
  out.kv_last_page_len = cache.kv_last_page_len;
  return out;
}

AttentionResult batch_decode_with_paged_kv_cache(const Tensor& q, const FP8PagedKVCache& cache, const KVScales& scales,
                                                 const AttentionOptions& opt) {
  return batch_decode_with_paged_kv_cache(q, dequantize(cache, scales), opt);
}

AttentionResult batch_prefill_with_paged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                  const FP8PagedKVCache& cache, const KVScales& scales,
                                                  const AttentionOptions& opt) {
  return batch_prefill_with_paged_kv_cache(q, qo_indptr, dequantize(cache, scales), opt);
}

AttentionResult batch_prefill_with_ragged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                   const FP8Tensor& k, const FP8Tensor& v,
                                                   const std::vector<int32_t>& kv_indptr, const KVScales& scales,
                                                   const AttentionOptions& opt) {
  const char* fn = "batch_prefill_with_ragged_kv_cache";
  check_kv_scales(fn, scales);
  require(k.format == v.format, fn,
          std::string("k and v must be in the same FP8 format, got k ") + to_string(k.format) + " and v " +
              to_string(v.format));
  return batch_prefill_with_ragged_kv_cache(q, qo_indptr, dequantize(k, scales.k_scale), dequantize(v, scales.v_scale),
                                            kv_indptr, opt);
}

}  // namespace flashstep::ref
