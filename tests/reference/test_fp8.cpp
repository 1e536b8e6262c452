// The FP8 formats and attention on FP8 K/V. The encoder is checked against a brute-force
// search for the nearest of the 256 decoded values (an oracle that shares no code with
// it), the decoder against values written out by hand from the bit layout, and the
// attention against the unquantized reference with the scales applied another way
// (k_scale folded into sm_scale, v_scale applied to the output).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <flashstep/reference.hpp>
#include <limits>
#include <vector>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::FP8Format;
using ref::FP8Overflow;
using ref::Tensor;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

/// The patterns of `format` that are finite numbers.
std::vector<uint8_t> finite_patterns(FP8Format format) {
  std::vector<uint8_t> out;
  for (int b = 0; b < 256; ++b)
    if (std::isfinite(ref::fp8_to_double(static_cast<uint8_t>(b), format))) out.push_back(static_cast<uint8_t>(b));
  return out;
}

/// The oracle: the pattern nearest to finite x among all finite patterns; on a tie the
/// one whose fraction is even (last bit 0); zero takes x's sign. Values beyond the
/// largest finite one follow the grid's next point (max + one spacing), which is not a
/// pattern: a value nearer to it than to max (or tied with it, when max's fraction is
/// odd) overflows, returned as -1.
int nearest_pattern(double x, FP8Format format) {
  const ref::FP8Spec& f = ref::fp8_spec(format);
  const double top_spacing = std::ldexp(1.0, std::ilogb(f.max_finite) - f.fraction_bits);
  const double beyond = f.max_finite + top_spacing;  // 480 (e4m3) or 65536 (e5m2)
  const double a = std::fabs(x);
  const bool max_is_odd = format == FP8Format::e5m2;  // 0 11110 11 vs 0 1111 110
  if (a >= beyond) return -1;
  if (a > f.max_finite) {
    const double to_max = a - f.max_finite, to_beyond = std::fabs(beyond - a);
    if (to_beyond < to_max || (to_beyond == to_max && max_is_odd)) return -1;
  }
  int best = -1;
  double best_dist = kInf;
  for (uint8_t b : finite_patterns(format)) {
    const double v = ref::fp8_to_double(b, format);
    if ((std::signbit(v) != std::signbit(x)) && v != 0) continue;  // the nearest has x's sign (or is zero)
    const double dist = std::fabs(v - x);
    if (dist < best_dist || (dist == best_dist && (b & 1) == 0 && (best & 1) == 1)) {
      best = b;
      best_dist = dist;
    }
  }
  if (ref::fp8_to_double(static_cast<uint8_t>(best), format) == 0) best = std::signbit(x) ? 0x80 : 0x00;
  return best;
}

uint8_t saturated_max(FP8Format format, bool negative) {
  return static_cast<uint8_t>((format == FP8Format::e4m3 ? 0x7e : 0x7b) | (negative ? 0x80 : 0));
}

double with_payload(uint64_t bits) {
  double x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

}  // namespace

TEST_CASE("fp8: known values of each format, from the bit layout") {
  struct Known {
    uint8_t bits;
    double value;
  };
  // e4m3: s eeee mmm, bias 7. 0 0111 000 = 1; 0 0000 001 = 2^-9 (smallest subnormal);
  // 0 0001 000 = 2^-6 (smallest normal); 0 1111 110 = 1.75 * 2^8 = 448 (largest).
  const Known e4m3[] = {{0x00, 0.0},   {0x01, 0x1p-9}, {0x07, 7 * 0x1p-9}, {0x08, 0x1p-6}, {0x38, 1.0},
                        {0x39, 1.125}, {0x3c, 1.5},    {0x40, 2.0},        {0x77, 240.0},  {0x7e, 448.0},
                        {0xb8, -1.0},  {0xfe, -448.0}, {0x81, -0x1p-9},    {0x30, 0.5},    {0x4e, 7.0}};
  // e5m2: s eeeee mm, bias 15. 0 01111 00 = 1; 0 00000 01 = 2^-16; 0 00001 00 = 2^-14;
  // 0 11110 11 = 1.75 * 2^15 = 57344 (largest).
  const Known e5m2[] = {{0x00, 0.0},      {0x01, 0x1p-16}, {0x03, 3 * 0x1p-16}, {0x04, 0x1p-14}, {0x3c, 1.0},
                        {0x3d, 1.25},     {0x3e, 1.5},     {0x40, 2.0},         {0x7b, 57344.0}, {0xbc, -1.0},
                        {0xfb, -57344.0}, {0x7c, kInf},    {0xfc, -kInf}};
  for (const Known& k : e4m3) {
    CAPTURE(int(k.bits));
    CHECK(ref::fp8_to_double(k.bits, FP8Format::e4m3) == k.value);
  }
  for (const Known& k : e5m2) {
    CAPTURE(int(k.bits));
    CHECK(ref::fp8_to_double(k.bits, FP8Format::e5m2) == k.value);
  }
  CHECK(std::signbit(ref::fp8_to_double(0x80, FP8Format::e4m3)));
  CHECK(std::signbit(ref::fp8_to_double(0x80, FP8Format::e5m2)));
  for (uint8_t nan : {0x7f, 0xff}) CHECK(std::isnan(ref::fp8_to_double(nan, FP8Format::e4m3)));
  for (uint8_t nan : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) CHECK(std::isnan(ref::fp8_to_double(nan, FP8Format::e5m2)));
  // The spec table agrees with the patterns.
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2}) {
    const ref::FP8Spec& s = ref::fp8_spec(f);
    CHECK(ref::fp8_to_double(saturated_max(f, false), f) == s.max_finite);
    CHECK(ref::fp8_to_double(0x01, f) == s.min_subnormal);
    CHECK(ref::fp8_to_double(static_cast<uint8_t>(1 << s.fraction_bits), f) == s.min_normal);
    CHECK(s.exponent_bits + s.fraction_bits == 7);
  }
}

TEST_CASE("fp8: every pattern decodes to its class, positives increase, the sign bit negates") {
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2}) {
    CAPTURE(std::string(ref::to_string(f)));
    int nans = 0, infs = 0;
    double previous = -1;
    for (int b = 0; b < 256; ++b) {
      const double v = ref::fp8_to_double(static_cast<uint8_t>(b), f);
      nans += std::isnan(v);
      infs += std::isinf(v);
      if (b < 0x80 && std::isfinite(v)) {
        CHECK(v > previous);
        previous = v;
      }
      if (b < 0x80 && !std::isnan(v)) {
        const double negated = ref::fp8_to_double(static_cast<uint8_t>(b | 0x80), f);
        CHECK(negated == -v);
        CHECK(std::signbit(negated));
      }
    }
    CHECK(nans == (f == FP8Format::e4m3 ? 2 : 6));
    CHECK(infs == (f == FP8Format::e4m3 ? 0 : 2));
    CHECK(static_cast<int>(finite_patterns(f).size()) == 256 - nans - infs);
  }
}

TEST_CASE("fp8: all 256 patterns round-trip decode -> encode, from double and from float") {
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2}) {
    for (int b = 0; b < 256; ++b) {
      const uint8_t bits = static_cast<uint8_t>(b);
      const double v = ref::fp8_to_double(bits, f);
      CAPTURE(std::string(ref::to_string(f)));
      CAPTURE(b);
      if (std::isnan(v)) continue;  // NaNs: their own case below
      if (std::isinf(v)) {
        // e5m2's infinities: kept without saturation, the largest finite value with it.
        CHECK(ref::fp8_from_double(v, f, FP8Overflow::no_saturate) == bits);
        CHECK(ref::fp8_from_double(v, f, FP8Overflow::saturate) == saturated_max(f, v < 0));
        continue;
      }
      for (FP8Overflow o : {FP8Overflow::saturate, FP8Overflow::no_saturate}) {
        CHECK(ref::fp8_from_double(v, f, o) == bits);
        CHECK(ref::fp8_from_float(static_cast<float>(v), f, o) == bits);
      }
      CHECK(ref::fp8_round(v, f) == v);
    }
  }
}

TEST_CASE("fp8: encoding is the nearest pattern, ties to even, over a sweep of doubles") {
  auto rng = test::case_rng("fp8-nearest");
  CAPTURE(test::run_seed());
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2}) {
    CAPTURE(std::string(ref::to_string(f)));
    std::vector<double> xs;
    // Every finite value, the midpoint of every neighbouring pair (a tie), and a double's
    // ulp either side of each midpoint; the same beyond the largest value.
    std::vector<double> values;
    for (uint8_t b : finite_patterns(f))
      if (b < 0x80) values.push_back(ref::fp8_to_double(b, f));
    const ref::FP8Spec& s = ref::fp8_spec(f);
    values.push_back(s.max_finite + std::ldexp(1.0, std::ilogb(s.max_finite) - s.fraction_bits));
    values.push_back(2 * values.back());
    for (size_t i = 0; i < values.size(); ++i) {
      xs.push_back(values[i]);
      if (i + 1 == values.size()) break;
      const double mid = (values[i] + values[i + 1]) / 2;
      xs.push_back(mid);
      xs.push_back(std::nextafter(mid, 0.0));
      xs.push_back(std::nextafter(mid, kInf));
    }
    // Random doubles over the whole range, log-uniform, and tiny ones far below it.
    std::uniform_real_distribution<double> log2_mag(std::log2(s.min_subnormal) - 4, std::log2(s.max_finite) + 2);
    for (int i = 0; i < 4000; ++i) xs.push_back(std::exp2(log2_mag(rng)));
    xs.push_back(1e-300);
    xs.push_back(std::numeric_limits<double>::denorm_min());
    xs.push_back(std::numeric_limits<double>::max());
    for (double x : xs)
      for (double signed_x : {x, -x}) {
        CAPTURE(signed_x);
        const int expected = nearest_pattern(signed_x, f);
        const bool negative = std::signbit(signed_x);
        if (expected < 0) {
          CHECK(ref::fp8_from_double(signed_x, f, FP8Overflow::saturate) == saturated_max(f, negative));
          const uint8_t unsaturated = ref::fp8_from_double(signed_x, f, FP8Overflow::no_saturate);
          if (f == FP8Format::e4m3) CHECK(unsaturated == (negative ? 0xff : 0x7f));  // NaN: no infinity in e4m3
          else CHECK(unsaturated == (negative ? 0xfc : 0x7c));                       // +-inf
        } else {
          CHECK(ref::fp8_from_double(signed_x, f) == expected);
          CHECK(ref::fp8_from_double(signed_x, f, FP8Overflow::no_saturate) == expected);
        }
        // A float of the same value converts the same (when the float is that value).
        if (static_cast<double>(static_cast<float>(signed_x)) == signed_x)
          CHECK(ref::fp8_from_float(static_cast<float>(signed_x), f) == ref::fp8_from_double(signed_x, f));
      }
  }
}

TEST_CASE("fp8: ties, subnormals and overflow, case by case") {
  const FP8Format e4m3 = FP8Format::e4m3, e5m2 = FP8Format::e5m2;
  // Ties between normals go to the even fraction.
  CHECK(ref::fp8_from_double(1.0625, e4m3) == 0x38);                       // between 1 (000) and 1.125 (001): 1
  CHECK(ref::fp8_from_double(1.1875, e4m3) == 0x3a);                       // between 1.125 (001) and 1.25 (010): 1.25
  CHECK(ref::fp8_from_double(1.125, e5m2) == 0x3c);                        // between 1 (00) and 1.25 (01): 1
  CHECK(ref::fp8_from_double(1.375, e5m2) == 0x3e);                        // between 1.25 (01) and 1.5 (10): 1.5
  CHECK(ref::fp8_from_double(std::nextafter(1.0625, 2.0), e4m3) == 0x39);  // just past the tie: up
  // A tie that carries into the next binade: 1.9375 is halfway between 1.875 (111) and 2.
  CHECK(ref::fp8_from_double(1.9375, e4m3) == 0x40);
  // Subnormals: half the smallest rounds to zero (0 is even), 1.5 of it to 2 of it.
  CHECK(ref::fp8_from_double(0x1p-10, e4m3) == 0x00);
  CHECK(ref::fp8_from_double(-0x1p-10, e4m3) == 0x80);
  CHECK(ref::fp8_from_double(std::nextafter(0x1p-10, 1.0), e4m3) == 0x01);
  CHECK(ref::fp8_from_double(3 * 0x1p-10, e4m3) == 0x02);
  CHECK(ref::fp8_from_double(5 * 0x1p-10, e4m3) == 0x02);
  CHECK(ref::fp8_from_double(0x1p-17, e5m2) == 0x00);
  CHECK(ref::fp8_from_double(3 * 0x1p-17, e5m2) == 0x02);
  // The largest subnormal rounding up into the smallest normal.
  CHECK(ref::fp8_from_double(7.5 * 0x1p-9, e4m3) == 0x08);
  CHECK(ref::fp8_from_double(3.5 * 0x1p-16, e5m2) == 0x04);
  // Overflow: e4m3's max 448 has an even fraction, so the tie at 464 stays; past it
  // saturates (or NaN without saturation). e5m2's max 57344 is odd: its tie 61440 overflows.
  CHECK(ref::fp8_from_double(464.0, e4m3) == 0x7e);
  CHECK(ref::fp8_from_double(464.0, e4m3, FP8Overflow::no_saturate) == 0x7e);
  CHECK(ref::fp8_from_double(std::nextafter(464.0, 1e9), e4m3) == 0x7e);
  CHECK(ref::fp8_from_double(std::nextafter(464.0, 1e9), e4m3, FP8Overflow::no_saturate) == 0x7f);
  CHECK(ref::fp8_from_double(-1e9, e4m3) == 0xfe);
  CHECK(ref::fp8_from_double(std::nextafter(61440.0, 0.0), e5m2) == 0x7b);
  CHECK(ref::fp8_from_double(61440.0, e5m2) == 0x7b);
  CHECK(ref::fp8_from_double(61440.0, e5m2, FP8Overflow::no_saturate) == 0x7c);
  CHECK(ref::fp8_from_double(-61440.0, e5m2, FP8Overflow::no_saturate) == 0xfc);
  // Infinity saturates too (the toolkit's __NV_SATFINITE), in both formats.
  CHECK(ref::fp8_from_double(kInf, e4m3) == 0x7e);
  CHECK(ref::fp8_from_double(-kInf, e4m3) == 0xfe);
  CHECK(ref::fp8_from_double(-kInf, e4m3, FP8Overflow::no_saturate) == 0xff);
  CHECK(ref::fp8_from_double(kInf, e5m2) == 0x7b);
  CHECK(ref::fp8_from_float(-std::numeric_limits<float>::infinity(), e5m2, FP8Overflow::no_saturate) == 0xfc);
  // Zero keeps its sign.
  CHECK(ref::fp8_from_double(0.0, e4m3) == 0x00);
  CHECK(ref::fp8_from_double(-0.0, e5m2) == 0x80);
}

TEST_CASE("fp8: NaN, from double (sign kept) and from float (canonical +NaN)") {
  const FP8Format e4m3 = FP8Format::e4m3, e5m2 = FP8Format::e5m2;
  const double qnan = with_payload(0x7ff8000000000000ull);      // quiet, second fraction bit 0
  const double qnan_11 = with_payload(0x7ffc000000000000ull);   // quiet, second fraction bit 1
  const double snan_01 = with_payload(0x7ff4000000000000ull);   // signalling, second bit 1
  const double snan_low = with_payload(0x7ff0000000000001ull);  // signalling, only the last bit
  const double neg_qnan = with_payload(0xfff8000000000000ull);
  for (FP8Overflow o : {FP8Overflow::saturate, FP8Overflow::no_saturate}) {
    CHECK(ref::fp8_from_double(qnan, e4m3, o) == 0x7f);
    CHECK(ref::fp8_from_double(neg_qnan, e4m3, o) == 0xff);
    CHECK(ref::fp8_from_double(snan_low, e4m3, o) == 0x7f);
    CHECK(ref::fp8_from_double(qnan, e5m2, o) == 0x7e);
    CHECK(ref::fp8_from_double(qnan_11, e5m2, o) == 0x7f);
    CHECK(ref::fp8_from_double(snan_01, e5m2, o) == 0x7f);
    CHECK(ref::fp8_from_double(snan_low, e5m2, o) == 0x7e);
    CHECK(ref::fp8_from_double(neg_qnan, e5m2, o) == 0xfe);
    for (float nan : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::signaling_NaN()}) {
      CHECK(ref::fp8_from_float(nan, e4m3, o) == 0x7f);
      CHECK(ref::fp8_from_float(nan, e5m2, o) == 0x7f);
    }
  }
}

TEST_CASE("fp8: quantize divides by the scale and rounds once, dequantize multiplies back") {
  auto rng = test::case_rng("fp8-quantize");
  CAPTURE(test::run_seed());
  const Tensor x = test::random_tensor(rng, {3, 4, 16}, -1, 1);
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2})
    for (double scale : {1.0, 1.0 / 64, 0.0123, 3.0}) {
      CAPTURE(scale);
      const ref::FP8Tensor q = ref::quantize(x, f, scale);
      CHECK(q.format == f);
      CHECK(q.shape == x.shape);
      const Tensor back = ref::dequantize(q, scale);
      for (size_t i = 0; i < x.data.size(); ++i) {
        CHECK(q.data[i] == ref::fp8_from_double(x.data[i] / scale, f));
        CHECK(back.data[i] == ref::fp8_to_double(q.data[i], f) * scale);
        // Within half a spacing of the format, relative (above its subnormals).
        if (std::fabs(x.data[i] / scale) >= ref::fp8_spec(f).min_normal)
          CHECK(std::fabs(back.data[i] - x.data[i]) <=
                std::ldexp(std::fabs(x.data[i]), -ref::fp8_spec(f).fraction_bits - 1));
      }
    }
  // Saturation: 1000 / 1 in e4m3 is 448.
  CHECK(ref::dequantize(ref::quantize(Tensor({1}, {1000.0}), FP8Format::e4m3)).data[0] == 448.0);
}

namespace {

/// A small paged cache of FP8 patterns, with NaN patterns in the slots nobody owns.
ref::FP8PagedKVCache random_fp8_cache(std::mt19937_64& rng, FP8Format format, ref::KVLayout layout) {
  ref::FP8PagedKVCache c;
  const int64_t pages = 7, P = 4, H = 2, D = 8;
  c.layout = layout;
  c.pages.format = format;
  c.pages.shape = layout == ref::KVLayout::NHD ? std::vector<int64_t>{pages, 2, P, H, D}
                                               : std::vector<int64_t>{pages, 2, H, P, D};
  const Tensor values = test::random_tensor(rng, c.pages.shape, -2, 2);
  c.pages.data = ref::quantize(values, format).data;
  c.kv_indptr = {0, 2, 2, 5};
  c.kv_indices = {4, 0, 6, 2, 5};
  c.kv_last_page_len = {3, 0, 4};
  // Pages 1 and 3 belong to nobody: the NaN patterns there must never be read.
  for (int64_t page : {1, 3})
    for (int64_t i = 0; i < 2 * P * H * D; ++i) c.pages.data[static_cast<size_t>(page * 2 * P * H * D + i)] = 0x7f;
  return c;
}

}  // namespace

TEST_CASE("fp8 attention: scores use k * k_scale, the output v * v_scale (FlashInfer's semantics)") {
  auto rng = test::case_rng("fp8-attention");
  CAPTURE(test::run_seed());
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2})
    for (ref::KVLayout layout : {ref::KVLayout::NHD, ref::KVLayout::HND}) {
      const ref::FP8PagedKVCache cache = random_fp8_cache(rng, f, layout);
      const Tensor q = test::random_tensor(rng, {3, 6, 8}, -3, 3);  // GQA group 3
      const ref::KVScales scales{0.37, 2.5};
      ref::AttentionOptions opt;
      opt.sm_scale = 0.3;
      const auto got = ref::batch_decode_with_paged_kv_cache(q, cache, scales, opt);

      // The same attention written the other way round: the unscaled FP8 values, k_scale
      // folded into sm_scale (a stage's way), v_scale applied to the finished output.
      ref::AttentionOptions folded = opt;
      folded.sm_scale = 0.3 * 0.37;
      auto expected = ref::batch_decode_with_paged_kv_cache(q, ref::dequantize(cache, ref::KVScales{}), folded);
      for (double& o : expected.o.data) o *= 2.5;
      CAPTURE(std::string(ref::to_string(f)));
      CHECK(ref::max_abs_diff(got.o, expected.o) < 1e-12);
      CHECK(ref::max_abs_diff(got.lse, expected.lse) < 1e-12);
      CHECK(got.lse({1, 0}) == -kInf);  // request 1 has no pages: the empty state

      // dequantize scales the K half and the V half of each page by their own scale.
      const ref::PagedKVCache d = ref::dequantize(cache, scales);
      const ref::PagedKVCache raw = ref::dequantize(cache, ref::KVScales{});
      CHECK(d.at(4, 0, 1, 1, 3) == raw.at(4, 0, 1, 1, 3) * 0.37);
      CHECK(d.at(4, 1, 1, 1, 3) == raw.at(4, 1, 1, 1, 3) * 2.5);
      CHECK(d.kv_indices == cache.kv_indices);

      // Prefill through the pool agrees with decode for one query per request.
      const auto prefill = ref::batch_prefill_with_paged_kv_cache(q, {0, 1, 2, 3}, cache, scales, opt);
      CHECK(ref::max_abs_diff(prefill.o, got.o) == 0);
    }
}

TEST_CASE("fp8 attention: ragged K/V agree with the same rows in a pool") {
  auto rng = test::case_rng("fp8-ragged");
  CAPTURE(test::run_seed());
  const Tensor q = test::random_tensor(rng, {5, 4, 8}, -3, 3);
  const Tensor k = test::random_tensor(rng, {9, 2, 8}, -1, 1), v = test::random_tensor(rng, {9, 2, 8}, -1, 1);
  const std::vector<int32_t> qo_indptr{0, 2, 5}, kv_indptr{0, 4, 9};
  const ref::KVScales scales{1.0 / 16, 0.5};
  for (FP8Format f : {FP8Format::e4m3, FP8Format::e5m2}) {
    const ref::FP8Tensor k8 = ref::quantize(k, f, scales.k_scale), v8 = ref::quantize(v, f, scales.v_scale);
    ref::AttentionOptions opt;
    opt.causal = true;
    const auto got = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k8, v8, kv_indptr, scales, opt);
    const auto expected = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, ref::dequantize(k8, scales.k_scale),
                                                                  ref::dequantize(v8, scales.v_scale), kv_indptr, opt);
    CHECK(ref::max_abs_diff(got.o, expected.o) == 0);
    // Quantized to FP8 and scaled back, the keys are close to the originals: the answer is
    // near the unquantized one (a sanity bound on the format, not a tolerance of a stage).
    const auto exact = ref::batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, opt);
    CHECK(ref::max_abs_diff(got.o, exact.o) < (f == FP8Format::e4m3 ? 0.1 : 0.2));
  }
}

TEST_CASE("fp8: bad arguments name the argument") {
  test::expect_error([] { ref::parse_fp8_format("e3m4"); }, {"parse_fp8_format", "e4m3", "e3m4"});
  CHECK(ref::parse_fp8_format("float8_e4m3fn") == FP8Format::e4m3);
  CHECK(ref::parse_fp8_format("e5m2") == FP8Format::e5m2);
  const Tensor x({2}, {1.0, 2.0});
  test::expect_error([&] { ref::quantize(x, FP8Format::e4m3, 0.0); }, {"quantize", "scale", "positive"});
  test::expect_error([&] { ref::quantize(x, FP8Format::e4m3, kNaN); }, {"quantize", "scale"});
  test::expect_error([&] { ref::dequantize(ref::quantize(x, FP8Format::e4m3), -1.0); }, {"dequantize", "scale"});
  auto rng = test::case_rng("fp8-errors");
  const ref::FP8PagedKVCache cache = random_fp8_cache(rng, FP8Format::e4m3, ref::KVLayout::NHD);
  const Tensor q = test::random_tensor(rng, {3, 2, 8});
  test::expect_error(
      [&] {
        ref::batch_decode_with_paged_kv_cache(q, cache, ref::KVScales{1.0, 0.0});
      },
      {"v_scale", "positive"});
  test::expect_error(
      [&] {
        ref::batch_decode_with_paged_kv_cache(q, cache, ref::KVScales{kInf, 1.0});
      },
      {"k_scale", "positive"});
  // A NaN pattern in a slot a request reads is caught by the cache check.
  ref::FP8PagedKVCache poisoned = cache;
  poisoned.pages.data[static_cast<size_t>(4 * 2 * 4 * 2 * 8)] = 0x7f;  // page 4, K, slot 0, head 0, dim 0
  test::expect_error([&] { ref::batch_decode_with_paged_kv_cache(q, poisoned, ref::KVScales{}); },
                     {"finite", "request 0", "token 0"});
  const ref::FP8Tensor k8 = ref::quantize(Tensor({2, 2, 8}), FP8Format::e4m3);
  const ref::FP8Tensor v8 = ref::quantize(Tensor({2, 2, 8}), FP8Format::e5m2);
  test::expect_error(
      [&] {
        ref::batch_prefill_with_ragged_kv_cache(q, {0, 1, 2, 3}, k8, v8, {0, 1, 1, 2}, ref::KVScales{});
      },
      {"same FP8 format", "e4m3", "e5m2"});
}
