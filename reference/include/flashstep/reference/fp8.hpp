/// \file fp8.hpp
/// \brief The two 8-bit float formats of an FP8 KV cache, as data, and attention on K/V
/// stored in them.
///
/// Both formats are one sign bit, an exponent and a fraction (OCP 8-bit floating point
/// specification; Micikevicius et al., *FP8 Formats for Deep Learning*, arXiv 2209.05433):
///
///     e4m3 (PyTorch float8_e4m3fn)   s eeee mmm   bias 7    max 448     no infinities;
///                                                            NaN = s 1111 111 only
///     e5m2 (PyTorch float8_e5m2)     s eeeee mm   bias 15   max 57344   IEEE-like: 1 11111 00
///                                                            = inf, 1 11111 {01,10,11} = NaN
///
/// A pattern with exponent field 0 is subnormal: (-1)^s * 0.m * 2^(1 - bias); any other
/// (that is not inf/NaN) is normal: (-1)^s * 1.m * 2^(e - bias). Decoding is exact in
/// double. Encoding follows the CUDA toolkit's `__nv_cvt_double_to_fp8` and
/// `__nv_cvt_float_to_fp8` (cuda_fp8.hpp), which the `__nv_fp8_e4m3` / `__nv_fp8_e5m2`
/// constructors call with `__NV_SATFINITE`:
///
/// - round to nearest, ties to even, on the format's grid (subnormals included: the
///   grid spacing stops shrinking below the smallest normal);
/// - a rounded magnitude above the largest finite value (this includes +-inf) becomes
///   +-max with FP8Overflow::saturate (`__NV_SATFINITE`), or NaN (e4m3, which has no
///   infinity) / +-inf (e5m2) with FP8Overflow::no_saturate (`__NV_NOSAT`);
/// - a NaN from a double keeps its sign; e4m3 writes s 1111 111, e5m2 writes s 11111 1x
///   where x is the double's second fraction bit (the first, the quiet bit, is forced);
///   a NaN from a float becomes +NaN 0 1111 111 / 0 11111 11 whatever its sign (the
///   toolkit canonicalises a float NaN to 0x7fffffff first).
///
/// **Scales.** An FP8 cache stores K and V divided by a per-tensor scale, so that their
/// range fits the format; attention reads them back multiplied by it. The semantics are
/// FlashInfer's (`k_scale` and `v_scale` of its wrappers' run()): the scores are those of
/// `k * k_scale`, the output that of `v * v_scale`. The functions below state exactly that:
/// they decode every element, multiply by its scale (in double) and run the reference
/// attention on the result, so an FP8 stage must match them up to its own accumulation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// The two FP8 formats.
enum class FP8Format {
  e4m3,  ///< 1 sign, 4 exponent, 3 fraction bits, bias 7; finite or NaN (PyTorch float8_e4m3fn)
  e5m2,  ///< 1 sign, 5 exponent, 2 fraction bits, bias 15; infinities and NaNs (PyTorch float8_e5m2)
};

/// "e4m3" or "e5m2".
const char* to_string(FP8Format format);
/// Parses "e4m3" / "e4m3fn" / "float8_e4m3fn" and "e5m2" / "float8_e5m2"; throws
/// InvalidArgument naming `format` otherwise.
FP8Format parse_fp8_format(const std::string& name);

/// What a magnitude above the largest finite value becomes (the toolkit's __nv_saturation_t).
enum class FP8Overflow {
  saturate,     ///< +-max finite (__NV_SATFINITE, what the __nv_fp8_* constructors use)
  no_saturate,  ///< NaN in e4m3, +-inf in e5m2 (__NV_NOSAT)
};

/// The numbers that define a format.
struct FP8Spec {
  int exponent_bits;     ///< 4 or 5
  int fraction_bits;     ///< 3 or 2
  int bias;              ///< 7 or 15
  double max_finite;     ///< 448 or 57344
  double min_normal;     ///< 2^-6 or 2^-14
  double min_subnormal;  ///< 2^-9 or 2^-16
  bool has_infinity;     ///< false (e4m3) or true (e5m2)
};
/// The spec of `format`.
const FP8Spec& fp8_spec(FP8Format format);

/// The exact value of an FP8 bit pattern: a finite double, +-inf (e5m2 only) or NaN.
/// \param bits the pattern, sign in bit 7
/// \param format how to read it
double fp8_to_double(uint8_t bits, FP8Format format);

/// The FP8 pattern nearest to `x` (ties to even), with the toolkit's overflow and NaN
/// rules (file comment); what `__nv_cvt_double_to_fp8(x, saturation, format)` returns.
uint8_t fp8_from_double(double x, FP8Format format, FP8Overflow overflow = FP8Overflow::saturate);

/// The same from a float, as `__nv_cvt_float_to_fp8` does: a float NaN becomes the
/// positive NaN pattern (0x7f in both formats); any other float converts as its double.
uint8_t fp8_from_float(float x, FP8Format format, FP8Overflow overflow = FP8Overflow::saturate);

/// `x` rounded to `format` and read back: fp8_to_double(fp8_from_double(x, format)).
double fp8_round(double x, FP8Format format);

/// A tensor of FP8 bit patterns: the storage of an FP8 KV cache. Row-major, like Tensor.
struct FP8Tensor {
  FP8Format format = FP8Format::e4m3;  ///< how every element is read
  std::vector<int64_t> shape;          ///< extent of each dimension, outermost first
  std::vector<uint8_t> data;           ///< numel() bit patterns, row-major

  /// Number of elements.
  int64_t numel() const { return Tensor::count(shape); }
  /// Number of dimensions.
  int rank() const { return static_cast<int>(shape.size()); }
  /// Extent of dimension `i` (negative counts from the end).
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
};

/// Stores `x` in FP8 under a per-tensor scale: element i becomes
/// fp8_from_double(x_i / scale, format) (the quotient in double, then rounded once, with
/// saturation), so that dequantize(result, scale) is x to the format's precision.
/// \param x any tensor; NaN stays NaN, a magnitude above max * scale saturates
/// \param format e4m3 or e5m2
/// \param scale positive and finite (InvalidArgument otherwise)
FP8Tensor quantize(const Tensor& x, FP8Format format, double scale = 1.0);

/// The values an FP8 tensor holds, times `scale`: fp8_to_double(x_i) * scale in double.
/// \param x FP8 bit patterns
/// \param scale positive and finite (InvalidArgument otherwise)
Tensor dequantize(const FP8Tensor& x, double scale = 1.0);

/// FlashInfer's per-tensor scales of an FP8 (or any) KV cache: attention reads
/// k * k_scale and v * v_scale.
struct KVScales {
  double k_scale = 1.0;  ///< multiplies every key (so every score); positive, finite
  double v_scale = 1.0;  ///< multiplies every value (so the output); positive, finite
};

/// Throws InvalidArgument from `fn` unless both scales are positive and finite.
void check_kv_scales(const char* fn, const KVScales& scales);

/// A paged KV cache whose pool holds FP8 patterns: PagedKVCache with 1-byte elements.
struct FP8PagedKVCache {
  /// Pool of shape (num_pages, 2, page_size, num_kv_heads, head_dim) for NHD or
  /// (num_pages, 2, num_kv_heads, page_size, head_dim) for HND; [:,0] is K, [:,1] is V.
  FP8Tensor pages;
  KVLayout layout = KVLayout::NHD;        ///< layout of each page
  std::vector<int32_t> kv_indptr;         ///< (batch + 1): request i owns kv_indices[kv_indptr[i]:kv_indptr[i+1]]
  std::vector<int32_t> kv_indices;        ///< (kv_indptr[batch]): page ids in [0, num_pages)
  std::vector<int32_t> kv_last_page_len;  ///< (batch): tokens in each request's last page, 1..page_size
};

/// The cache attention reads: every K element decoded and times k_scale, every V element
/// decoded and times v_scale (a NaN pattern stays NaN: unused slots may hold anything,
/// and check_paged_kv_cache rejects only the slots a request reads).
/// \param cache the FP8 pool and its page table (copied unchanged)
/// \param scales k_scale and v_scale, positive and finite
PagedKVCache dequantize(const FP8PagedKVCache& cache, const KVScales& scales);

/// batch_decode_with_paged_kv_cache on an FP8 pool: the attention of
/// dequantize(cache, scales). Scores are sm_scale * q . (k * k_scale); the output is
/// sum_j p_j (v_j * v_scale); lse is that of those scores.
/// \param q (batch_size, num_qo_heads, head_dim)
/// \param cache FP8 pool with `batch_size` requests; every slot a request reads must be finite
/// \param scales k_scale and v_scale
/// \param opt as for the unquantized call
AttentionResult batch_decode_with_paged_kv_cache(const Tensor& q, const FP8PagedKVCache& cache, const KVScales& scales,
                                                 const AttentionOptions& opt = {});

/// batch_prefill_with_paged_kv_cache on an FP8 pool (same semantics as the decode above).
/// \param q (nnz_qo, num_qo_heads, head_dim) \param qo_indptr (batch_size + 1)
/// \param cache FP8 pool \param scales k_scale and v_scale \param opt mask, scale, window, soft cap
AttentionResult batch_prefill_with_paged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                  const FP8PagedKVCache& cache, const KVScales& scales,
                                                  const AttentionOptions& opt = {});

/// batch_prefill_with_ragged_kv_cache on FP8 K and V (same semantics as the decode above).
/// \param q (nnz_qo, num_qo_heads, head_dim) \param qo_indptr (batch_size + 1)
/// \param k FP8 keys, (nnz_kv, num_kv_heads, head_dim) NHD or (num_kv_heads, nnz_kv, head_dim) HND
/// \param v FP8 values, same shape and format as k
/// \param kv_indptr (batch_size + 1) \param scales k_scale and v_scale \param opt as for the unquantized call
AttentionResult batch_prefill_with_ragged_kv_cache(const Tensor& q, const std::vector<int32_t>& qo_indptr,
                                                   const FP8Tensor& k, const FP8Tensor& v,
                                                   const std::vector<int32_t>& kv_indptr, const KVScales& scales,
                                                   const AttentionOptions& opt = {});

}  // namespace flashstep::ref
