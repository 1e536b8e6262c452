// The append of K/V rows into the paged pool (kernels/append_paged.cuh) on the device:
// FP8 quantize on write against the reference's encoder (ref::quantize) bit for bit, for
// every 16-bit pattern of fp16 and bf16 rows (zeros, subnormals, values past the FP8
// maximum, infinities, NaNs), e4m3 and e5m2, scales 1, a power of two and two that are
// not, NHD and HND, pages of 1 and 16 tokens, rows in shuffled order over shuffled pages;
// rows that fall outside the page table write nothing and get status 1; every other slot
// of the pool keeps its bytes. FP8 rows into a cache of their own format are copied.
#include <doctest/doctest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashstep/kernels/append_paged.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/fp8.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::FP8Format;
using stages::DType;
using stages::harness::DeviceBuffer;
using stages::harness::download;
using stages::harness::upload;

namespace {

constexpr int kHeads = 2;
constexpr int kDim = 64;
constexpr int kRowElems = kHeads * kDim;
constexpr uint8_t kSentinel = 0x5a;  // what the pool holds before the append

/// A batch of three requests appended from empty: lengths 200, 1 and 311 (512 rows, each
/// row kRowElems elements), pages shuffled in a pool with spare pages, rows shuffled,
/// then three rows that fall outside the table (request out of range, position past the
/// request's pages, negative position).
struct Table {
  int page_size = 0;
  int num_pages = 0;
  std::vector<int32_t> kv_indptr, kv_indices, batch_indices, positions;
  std::vector<bool> valid;  ///< per row: inside the table

  Table(int page_size_, std::mt19937_64& rng) : page_size(page_size_) {
    const std::vector<int> lengths = {200, 1, 311};
    kv_indptr.push_back(0);
    for (int len : lengths) kv_indptr.push_back(kv_indptr.back() + (len + page_size - 1) / page_size);
    num_pages = kv_indptr.back() + 5;
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    kv_indices.assign(ids.begin(), ids.begin() + kv_indptr.back());
    for (int b = 0; b < 3; ++b)
      for (int p = 0; p < lengths[static_cast<size_t>(b)]; ++p) {
        batch_indices.push_back(b);
        positions.push_back(p);
      }
    std::vector<size_t> order(batch_indices.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> bi, pos;
    for (size_t i : order) bi.push_back(batch_indices[i]), pos.push_back(positions[i]);
    batch_indices = bi, positions = pos;
    valid.assign(batch_indices.size(), true);
    // out of range: request 3 of 3; position 311 rounded up to a page past request 2's;
    // position -1
    const int past = (kv_indptr[3] - kv_indptr[2]) * page_size;
    for (auto [b, p] : {std::pair{3, 0}, std::pair{2, past}, std::pair{0, -1}}) {
      batch_indices.push_back(b);
      positions.push_back(p);
      valid.push_back(false);
    }
  }
  int64_t nnz() const { return static_cast<int64_t>(batch_indices.size()); }
};

/// Byte offset in the pool of element (h, d) of row r's K (kv 0) or V (kv 1), one byte
/// per element (an FP8 pool).
int64_t pool_offset(const Table& t, bool hnd, int64_t r, int kv, int h, int d) {
  const int b = t.batch_indices[static_cast<size_t>(r)], pos = t.positions[static_cast<size_t>(r)];
  const int64_t page = t.kv_indices[static_cast<size_t>(t.kv_indptr[static_cast<size_t>(b)] + pos / t.page_size)];
  const int slot = pos % t.page_size;
  const int64_t half = int64_t{t.page_size} * kRowElems;
  const int64_t in_page = hnd ? (int64_t{h} * t.page_size + slot) * kDim + d : (int64_t{slot} * kHeads + h) * kDim + d;
  return (page * 2 + kv) * half + in_page;
}

/// Launches the header's append of `rows_k` / `rows_v` (raw element bytes of type T) into
/// a sentinel-filled FP8 pool of type KV; returns the pool and fills `status`.
template <typename T, typename KV>
std::vector<uint8_t> run_append(const Table& t, bool hnd, const std::vector<uint8_t>& rows_k,
                                const std::vector<uint8_t>& rows_v, double k_scale, double v_scale,
                                std::vector<int32_t>& status) {
  const int64_t half = int64_t{t.page_size} * kRowElems;
  std::vector<uint8_t> pool_host(static_cast<size_t>(t.num_pages * 2 * half), kSentinel);
  DeviceBuffer pool = upload(pool_host), k = upload(rows_k), v = upload(rows_v), indptr = upload(t.kv_indptr),
               indices = upload(t.kv_indices), bi = upload(t.batch_indices), pos = upload(t.positions),
               st(static_cast<size_t>(t.nnz()) * sizeof(int32_t));
  kernels::AppendPagedKVParams p;
  p.append_key = k.get();
  p.append_value = v.get();
  p.key_row_stride = kRowElems;
  p.value_row_stride = kRowElems;
  p.nnz = t.nnz();
  p.batch_indices = bi.as<int32_t>();
  p.positions = pos.as<int32_t>();
  p.k_cache = pool.get();
  p.v_cache = pool.as<uint8_t>() + half;
  p.page_stride = 2 * half;
  p.hnd = hnd;
  p.num_kv_heads = kHeads;
  p.head_dim = kDim;
  p.page_size = t.page_size;
  p.num_pages = t.num_pages;
  p.kv_indices = indices.as<int32_t>();
  p.kv_indptr = indptr.as<int32_t>();
  p.batch_size = 3;
  p.status = st.as<int32_t>();
  p.k_scale = k_scale;
  p.v_scale = v_scale;
  kernels::launch_append_paged_kv_cache<T, KV>(p, nullptr);
  FLASHSTEP_CUDA_CHECK(cudaGetLastError());
  FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());
  status = download<int32_t>(st);
  return download<uint8_t>(pool);
}

std::string byte_text(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

/// Compares the pool with what the reference says: for row r inside the table, element i
/// of K is ref::quantize's pattern of expected_k[r * kRowElems + i] (a NaN may be any NaN
/// pattern: which one is not part of a cache's contract); rows outside the table have
/// status 1; every byte no valid row owns is still the sentinel.
void check_pool(const Table& t, bool hnd, FP8Format format, const std::vector<uint8_t>& pool,
                const std::vector<int32_t>& status, const ref::FP8Tensor& expected_k,
                const ref::FP8Tensor& expected_v) {
  std::vector<bool> owned(pool.size(), false);
  int64_t mismatches = 0;
  std::string first;
  for (int64_t r = 0; r < t.nnz(); ++r) {
    const bool valid = t.valid[static_cast<size_t>(r)];
    if (status[static_cast<size_t>(r)] != (valid ? 0 : 1)) {
      if (mismatches++ < 5) first += "\n  row " + std::to_string(r) + ": status " + std::to_string(status[r]);
    }
    if (!valid) continue;
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kDim; ++d) {
          const int64_t at = pool_offset(t, hnd, r, kv, h, d);
          owned[static_cast<size_t>(at)] = true;
          const uint8_t want = (kv ? expected_v : expected_k).data[static_cast<size_t>(r * kRowElems + h * kDim + d)];
          const uint8_t got = pool[static_cast<size_t>(at)];
          const bool ok = std::isnan(ref::fp8_to_double(want, format)) ? std::isnan(ref::fp8_to_double(got, format))
                                                                       : got == want;
          if (!ok && mismatches++ < 5)
            first += "\n  row " + std::to_string(r) + (kv ? " V" : " K") + " head " + std::to_string(h) + " dim " +
                     std::to_string(d) + ": " + byte_text(got) + ", reference " + byte_text(want);
        }
  }
  int64_t touched = 0;
  for (size_t i = 0; i < pool.size(); ++i) touched += !owned[i] && pool[i] != kSentinel;
  CHECK_MESSAGE(mismatches == 0, mismatches << " mismatches:" << first);
  CHECK_MESSAGE(touched == 0, touched << " bytes outside the appended slots changed");
}

/// Rows holding every 16-bit pattern of `dtype` once in K and once in V (V in another
/// order), the three rows outside the table random: 2 x 65536 elements.
void pattern_rows(const Table& t, std::mt19937_64& rng, std::vector<uint8_t>& k, std::vector<uint8_t>& v) {
  const size_t n = static_cast<size_t>(t.nnz()) * kRowElems;
  REQUIRE(n >= 65536);
  std::vector<uint16_t> pk(n), pv(n);
  for (size_t i = 0; i < n; ++i) pk[i] = static_cast<uint16_t>(i < 65536 ? i : rng());
  pv = pk;
  std::shuffle(pv.begin(), pv.begin() + 65536, rng);
  std::shuffle(pk.begin(), pk.begin() + 65536, rng);
  k.resize(2 * n), v.resize(2 * n);
  std::memcpy(k.data(), pk.data(), 2 * n);
  std::memcpy(v.data(), pv.data(), 2 * n);
}

template <typename T, typename KV>
void check_quantize(DType row_dtype, FP8Format format) {
  auto rng = test::case_rng(std::string("append quantize ") + stages::to_string(row_dtype) + " " +
                            ref::to_string(format));
  CAPTURE(test::run_seed());
  // 1: FP8 ties land exactly on 16-bit values; 0.25: the same, shifted; the others are no
  // power of two, so the quotient rounds (in double) before it is encoded.
  for (const std::pair<double, double>& scales :
       {std::pair{1.0, 1.0}, std::pair{0.25, 4.0}, std::pair{1.0 / 200, 0.0123}, std::pair{3.7, 1.0 / 3}})
    for (int page_size : {1, 16})
      for (bool hnd : {false, true}) {
        const double k_scale = scales.first, v_scale = scales.second;
        CAPTURE(k_scale);
        CAPTURE(v_scale);
        CAPTURE(page_size);
        CAPTURE(hnd);
        const Table t(page_size, rng);
        std::vector<uint8_t> rows_k, rows_v;
        pattern_rows(t, rng, rows_k, rows_v);
        const size_t n = static_cast<size_t>(t.nnz()) * kRowElems;
        // the rows' values, decoded on the host: what the reference quantizes
        const ref::Tensor xk({t.nnz(), kHeads, kDim}, stages::harness::decode(row_dtype, rows_k, n));
        const ref::Tensor xv({t.nnz(), kHeads, kDim}, stages::harness::decode(row_dtype, rows_v, n));
        std::vector<int32_t> status;
        const std::vector<uint8_t> pool = run_append<T, KV>(t, hnd, rows_k, rows_v, k_scale, v_scale, status);
        check_pool(t, hnd, format, pool, status, ref::quantize(xk, format, k_scale),
                   ref::quantize(xv, format, v_scale));
      }
}

}  // namespace

TEST_CASE("append: fp16 rows quantized into an e4m3 cache equal the reference's encoder, bit for bit") {
  check_quantize<__half, __nv_fp8_e4m3>(DType::f16, FP8Format::e4m3);
}
TEST_CASE("append: fp16 rows quantized into an e5m2 cache equal the reference's encoder, bit for bit") {
  check_quantize<__half, __nv_fp8_e5m2>(DType::f16, FP8Format::e5m2);
}
TEST_CASE("append: bf16 rows quantized into an e4m3 cache equal the reference's encoder, bit for bit") {
  check_quantize<__nv_bfloat16, __nv_fp8_e4m3>(DType::bf16, FP8Format::e4m3);
}
TEST_CASE("append: bf16 rows quantized into an e5m2 cache equal the reference's encoder, bit for bit") {
  check_quantize<__nv_bfloat16, __nv_fp8_e5m2>(DType::bf16, FP8Format::e5m2);
}

TEST_CASE("append: e4m3 rows into an e4m3 cache are copied byte for byte") {
  auto rng = test::case_rng("append copy e4m3");
  CAPTURE(test::run_seed());
  for (bool hnd : {false, true}) {
    const Table t(16, rng);
    const size_t n = static_cast<size_t>(t.nnz()) * kRowElems;
    std::vector<uint8_t> rows_k(n), rows_v(n);
    for (size_t i = 0; i < n; ++i) rows_k[i] = static_cast<uint8_t>(i), rows_v[i] = static_cast<uint8_t>(rng());
    ref::FP8Tensor ek, ev;
    ek.format = ev.format = FP8Format::e4m3;
    ek.shape = ev.shape = {t.nnz(), kHeads, kDim};
    ek.data = rows_k, ev.data = rows_v;
    std::vector<int32_t> status;
    const std::vector<uint8_t> pool = run_append<__nv_fp8_e4m3, __nv_fp8_e4m3>(t, hnd, rows_k, rows_v, 1, 1, status);
    check_pool(t, hnd, FP8Format::e4m3, pool, status, ek, ev);
  }
}
