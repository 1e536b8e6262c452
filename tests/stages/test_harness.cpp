// Host-only checks of the machinery itself (suite "host": these run even where no GPU
// is present): the comparison must fail what it should, the tolerance table must cover
// every dtype, cases must be built as specified, the registry must answer by name, and
// runners must refuse shapes they cannot run with a clear InvalidArgument.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>

#include "01_naive/naive.hpp"
#include "02_paged/paged.hpp"
#include "flashstep/kernels/paged_kv.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/fp8.hpp"
#include "harness/case.hpp"
#include "harness/compare.hpp"
#include "harness/dtype_convert.hpp"
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::harness;

namespace {
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
const Tolerance kTol{1e-3, 1e-2, 1e-3};
ElementLabel flat_label() {
  return [](int64_t i) { return "(element " + std::to_string(i) + ")"; };
}
}  // namespace

TEST_SUITE("host") {

TEST_CASE("compare: a NaN never passes, and the mismatch is named") {
  const std::vector<double> ref{0.5, -0.25, 1.0};
  const std::vector<double> out{0.5, kNaN, 1.0};
  const Comparison c = compare("o", out, ref, kTol, output_label({0, 1}, 1, 3));
  CHECK_FALSE(c.passed);
  CHECK(c.mismatches == 1);
  REQUIRE(c.first_mismatches.size() == 1);
  CHECK(c.first_mismatches[0].find("(request 0, head 0, token 0, dim 1)") != std::string::npos);
  CHECK(c.summary().find("FAIL") != std::string::npos);
}

TEST_CASE("compare: -inf matches only -inf and stays out of the norms") {
  const std::vector<double> ref{-kInf, 2.0};
  CHECK(compare("lse", {-kInf, 2.0}, ref, kTol, flat_label()).passed);
  CHECK_FALSE(compare("lse", {0.0, 2.0}, ref, kTol, flat_label()).passed);
  CHECK_FALSE(compare("lse", {-kInf, -kInf}, ref, kTol, flat_label()).passed);
}

TEST_CASE("compare: element-wise and norm-wise tests each catch what the other allows") {
  std::vector<double> ref(1000, 1.0);
  // A small bias on every element: each within atol + rtol, the norm is not.
  std::vector<double> biased(ref);
  for (double& x : biased) x += 0.009;
  const Comparison bias = compare("o", biased, ref, kTol, flat_label());
  CHECK(bias.mismatches == 0);
  CHECK_FALSE(bias.passed);
  // One wrong element: the norm barely moves, the element-wise bound catches it.
  std::vector<double> outlier(ref);
  outlier[123] = 1.02;
  const Comparison one = compare("o", outlier, ref, {1e-3, 1e-2, 1e-2}, flat_label());
  CHECK(one.norm_ratio <= 1e-2);
  CHECK(one.mismatches == 1);
  CHECK_FALSE(one.passed);
  // At most five mismatches are listed, however many there are.
  std::vector<double> all_wrong(ref.size(), 5.0);
  CHECK(compare("o", all_wrong, ref, kTol, flat_label()).first_mismatches.size() == 5);
}

TEST_CASE("compare: mismatch labels name request, head, token and dim through qo_indptr") {
  // Two requests with 2 and 1 query rows, 3 heads, head_dim 4: flat index of
  // (row 2, head 1, dim 3) is (2 * 3 + 1) * 4 + 3 = 31, and row 2 is request 1's token 0.
  CHECK(output_label({0, 2, 3}, 3, 4)(31) == "(request 1, head 1, token 0, dim 3)");
  CHECK(lse_label({0, 2, 3}, 3)(4) == "(request 0, head 1, token 1, dim -)");
}

TEST_CASE("tolerance table: one row per dtype, looser for narrower types") {
  CHECK(tolerance_table().size() == 7);  // f32, f16, bf16; f16 and bf16 over e4m3 and e5m2 K/V
  CHECK(tolerance_for(DType::f32).o.rtol < tolerance_for(DType::f16).o.rtol);
  CHECK(tolerance_for(DType::f16).o.rtol < tolerance_for(DType::bf16).o.rtol);
  CHECK(tolerance_for(DType::bf16).o.norm < 0.01);  // never a "1% of elements" rule
}

TEST_CASE("tolerance table: an FP8 cache's rows are its q dtype's plus fp16 weights, derived, not chosen") {
  // The q dtype's row, and on o the bound of weights rounded to fp16 (2^-11 relative)
  // times the largest |v| the harness stores (1 + 2^-3): 1.125 / 2048 absolute, 2^-11 in
  // the norm. lse is untouched.
  for (DType q : {DType::f16, DType::bf16})
    for (DType kv : {DType::e4m3, DType::e5m2}) {
      const DTypeTolerance& row = tolerance_for(q, kv);
      const DTypeTolerance& base = tolerance_for(q);
      CHECK(row.kv_dtype == kv);
      CHECK(row.o.atol == doctest::Approx(base.o.atol + 1.125 / 2048).epsilon(1e-12));
      CHECK(row.o.rtol == base.o.rtol);
      CHECK(row.o.norm == doctest::Approx(base.o.norm + 1.0 / 2048).epsilon(1e-12));
      CHECK(row.lse.atol == base.lse.atol);
      CHECK(row.lse.rtol == base.lse.rtol);
      CHECK(row.lse.norm == base.lse.norm);
    }
  CHECK_THROWS_AS(tolerance_for(DType::f32, DType::e4m3), ref::InvalidArgument);  // FP8 K/V needs 16-bit q
  CHECK_THROWS_AS(tolerance_for(DType::bf16, DType::f16), ref::InvalidArgument);
}

TEST_CASE("dtype conversion: rounding is exact and encode/decode round-trips") {
  auto rng = test::case_rng("dtype conversion");
  std::vector<double> x = test::random_tensor(rng, {257}, -3.0, 3.0).data;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    CAPTURE(to_string(dtype));
    std::vector<double> rounded(x);
    round_all(dtype, rounded);
    CHECK(decode(dtype, encode(dtype, rounded), rounded.size()) == rounded);
    for (size_t i = 0; i < x.size(); ++i) CHECK(round_to(dtype, rounded[i]) == rounded[i]);
  }
  CHECK(round_to(DType::bf16, 1.0 + 1.0 / 256) == 1.0);  // 8 significant bits: ties to even
  CHECK(std::isnan(decode(DType::bf16, encode(DType::bf16, {kNaN}), 1)[0]));
  // FP8: one byte a value, the reference's rounding, NaN kept.
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    CAPTURE(to_string(dtype));
    std::vector<double> rounded(x);
    round_all(dtype, rounded);
    const std::vector<uint8_t> bytes = encode(dtype, rounded);
    CHECK(bytes.size() == rounded.size());
    CHECK(decode(dtype, bytes, rounded.size()) == rounded);
    CHECK(std::isnan(decode(dtype, encode(dtype, {kNaN}), 1)[0]));
  }
  CHECK(round_to(DType::e4m3, 1.0625) == 1.0);  // 4 significant bits: ties to even
  CHECK(round_to(DType::e5m2, 1.375) == 1.5);
  CHECK(encode(DType::e4m3, {448.0, -1.0}) == std::vector<uint8_t>{0x7e, 0xb8});
}

TEST_CASE("build_case: an FP8 cache holds FP8 values, and the reference reads them scaled") {
  CaseSpec spec;
  spec.batch_size = 3;
  spec.kv_len = 40;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.kv_dtype = DType::e4m3;
  spec.k_scale = 1.0 / 128;
  spec.v_scale = 0.03;
  const uint64_t seed = case_seed(test::run_seed(), "build_case fp8");
  CAPTURE(seed);
  const HostCase c = build_case(spec, KVStorage::paged, seed);
  CHECK(c.layout.shape.resolved_kv_dtype() == DType::e4m3);
  CHECK(c.layout.shape.k_scale == static_cast<float>(1.0 / 128));
  // Stored values are e4m3 values of k / k_scale: K up to 128 (|k| <= 1), V up to 33.
  double k_max = 0, v_max = 0;
  const int64_t P = spec.page_size, H = 2, D = 64, per_half = P * H * D;
  for (int64_t i = 0; i < c.paged.pages.numel(); ++i) {
    const double x = c.paged.pages.data[static_cast<size_t>(i)];
    if (!std::isfinite(x)) continue;
    CHECK(round_to(DType::e4m3, x) == x);
    ((i / per_half) % 2 == 0 ? k_max : v_max) = std::max((i / per_half) % 2 == 0 ? k_max : v_max, std::abs(x));
  }
  CHECK(k_max > 64);
  CHECK(k_max <= 128);
  CHECK(v_max > 16);
  CHECK(v_max <= 34);
  // The answer is the reference's FP8 attention of exactly these values and scales.
  ref::FP8PagedKVCache p8;
  p8.pages = ref::quantize(c.paged.pages, ref::FP8Format::e4m3);
  p8.layout = c.paged.layout;
  p8.kv_indptr = c.paged.kv_indptr;
  p8.kv_indices = c.paged.kv_indices;
  p8.kv_last_page_len = c.paged.kv_last_page_len;
  // The scales the stage gets: the shape's floats (read from there, not cast again here).
  const ref::KVScales scales{c.layout.shape.k_scale, c.layout.shape.v_scale};
  const auto r = ref::batch_decode_with_paged_kv_cache(c.q, p8, scales);
  CHECK(ref::max_abs_diff(r.o, c.expected.o) < 1e-12);
  CHECK(c.layout.shape.describe().find("kv=e4m3") != std::string::npos);
}

TEST_CASE("build_case: lengths, page table and NaN pool follow the spec") {
  CaseSpec spec;
  spec.batch_size = 6;
  spec.kv_len = 37;
  spec.page_size = 8;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.lengths = LengthPolicy::ragged_with_empty;
  const uint64_t seed = case_seed(test::run_seed(), "build_case");
  CAPTURE(seed);
  const HostCase c = build_case(spec, KVStorage::paged, seed);
  const BatchShape& s = c.layout.shape;
  CHECK(s.kv_len(0) == 37);
  CHECK(s.kv_len(1) == 0);
  CHECK(s.kv_last_page_len[0] == 37 - 4 * 8);
  CHECK(s.kv_last_page_len[1] == 0);
  // Distinct pages, all inside the pool, with spare pages left over.
  const std::set<int32_t> pages(c.layout.kv_indices.begin(), c.layout.kv_indices.end());
  CHECK(pages.size() == c.layout.kv_indices.size());
  CHECK(*pages.rbegin() < s.num_pages);
  CHECK(s.num_pages > static_cast<int64_t>(pages.size()));
  // Owned slots are finite, everything else in the pool is NaN.
  int64_t finite = 0;
  for (double x : c.paged.pages.data) finite += std::isfinite(x);
  CHECK(finite == 2 * s.total_kv_len() * s.num_kv_heads * s.head_dim);
  // Inputs are representable in the dtype, and the reference answered every row.
  for (double x : c.q.data) CHECK(round_to(spec.dtype, x) == x);
  CHECK(c.expected.o.numel() == s.nnz_qo() * 8 * 64);
  CHECK(c.expected.lse({1, 0}) == -kInf);  // the empty request's state is (0, -inf)
  // The same seed rebuilds the same case.
  CHECK(build_case(spec, KVStorage::paged, seed).q.data == c.q.data);
}

TEST_CASE("build_case: V of its own width keeps a pool of its own, shared pages and both layouts") {
  // MLA's prefill over pages: K's pool (num_pages, 1, ...) of head_dim 12, V's of 8; a
  // shared prefix makes requests hold the same pages, whose rows must be one set in both
  // pools; build_case itself holds the reference's paged answer from these pools to its
  // ragged one on cases this small, so a scatter to the wrong plane or width throws
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    CaseSpec spec;
    spec.mode = Mode::prefill;
    spec.kv_layout = layout;
    spec.batch_size = 3;
    spec.kv_len = 21;
    spec.qo_len = 5;
    spec.page_size = 4;
    spec.num_qo_heads = 4;
    spec.num_kv_heads = 2;
    spec.head_dim = 12;
    spec.head_dim_vo = 8;
    spec.shared_prefix = 9;  // two whole pages shared, the third each request's own copy
    spec.causal = true;
    const uint64_t seed = case_seed(test::run_seed(), "build_case own v " + spec.describe());
    CAPTURE(seed);
    const HostCase c = build_case(spec, KVStorage::paged, seed);
    const BatchShape& s = c.layout.shape;
    CHECK(c.paged.pages.shape ==
          std::vector<int64_t>{s.num_pages, 1, layout == KVLayout::NHD ? 4 : 2, layout == KVLayout::NHD ? 2 : 4, 12});
    REQUIRE(c.paged.v_pages.rank() == 5);
    CHECK(c.paged.v_pages.dim(4) == 8);
    CHECK(c.paged.head_dim_vo() == 8);
    CHECK(c.expected.o.shape == std::vector<int64_t>{s.nnz_qo(), 4, 8});
    // every page a request holds is filled in both pools (shared pages once), the rest NaN
    const std::set<int32_t> held(c.layout.kv_indices.begin(), c.layout.kv_indices.end());
    int64_t slots = 0;  // distinct (page, slot) pairs holding a token
    for (int b = 0; b < s.batch_size; ++b)
      for (int64_t t = 0; t < s.kv_len(b); ++t)
        if (t >= 8 || b == 0) ++slots;  // the shared pages' slots count once
    int64_t k_finite = 0, v_finite = 0;
    for (double x : c.paged.pages.data) k_finite += std::isfinite(x);
    for (double x : c.paged.v_pages.data) v_finite += std::isfinite(x);
    CHECK(k_finite == slots * 2 * 12);
    CHECK(v_finite == slots * 2 * 8);
    CHECK(held.size() < c.layout.kv_indices.size());  // the prefix's pages are shared
  }
  CaseSpec fp8;
  fp8.head_dim = 192;
  fp8.head_dim_vo = 128;
  fp8.kv_dtype = DType::e4m3;
  CHECK_THROWS_WITH_AS(build_case(fp8, KVStorage::paged, 1), doctest::Contains("K/V in q's dtype, unscaled"),
                       ref::InvalidArgument);
}

TEST_CASE("build_case: bad specs are refused by name") {
  CaseSpec spec;
  spec.num_qo_heads = 12;
  spec.num_kv_heads = 8;
  CHECK_THROWS_AS(build_case(spec, KVStorage::paged, 1), ref::InvalidArgument);
  CaseSpec hnd;
  hnd.kv_layout = KVLayout::HND;
  CHECK_THROWS_WITH_AS(build_case(hnd, KVStorage::ragged, 1), doctest::Contains("build_case: ragged KV is stored NHD"),
                       ref::InvalidArgument);
}

TEST_CASE("registry: stages in teaching order, found by name or number") {
  REQUIRE(registry().size() >= 2);
  CHECK(registry()[0].name == "01_naive");
  CHECK(registry()[1].name == "02_paged");
  for (size_t i = 1; i < registry().size(); ++i) CHECK(registry()[i - 1].name < registry()[i].name);
  CHECK(find_stage("02").name == "02_paged");
  CHECK(find_stage("01_naive").name == "01_naive");
  CHECK_THROWS_WITH_AS(find_stage("99_missing"), doctest::Contains("known: 01_naive, 02_paged"), ref::InvalidArgument);
  for (const StageInfo& s : registry()) {
    CAPTURE(s.name);
    CHECK(static_cast<bool>(s.make_runner));
    CHECK_FALSE(s.capabilities().empty());
  }
}

TEST_CASE("registry: unsupported shapes are explained, and runners refuse them") {
  BatchShape shape;
  shape.mode = Mode::decode;
  shape.storage = KVStorage::paged;
  shape.dtype = DType::bf16;
  shape.batch_size = 1;
  shape.num_qo_heads = 32;
  shape.num_kv_heads = 8;
  shape.head_dim = 96;
  shape.page_size = 16;
  const StageInfo& paged_stage = find_stage("02_paged");
  CHECK(paged_stage.unsupported_reason(shape).find("head_dim 96") != std::string::npos);
  paged::PagedRunner runner;
  CHECK_THROWS_WITH_AS(runner.plan(shape, nullptr, 0, nullptr),
                       doctest::Contains("PagedRunner::plan: 02_paged is not built for head_dim 96"),
                       ref::InvalidArgument);
  shape.head_dim = 128;
  shape.num_qo_heads = 72;  // group 9
  CHECK(paged_stage.unsupported_reason(shape).find("GQA groups up to 8") != std::string::npos);
  shape.num_qo_heads = 32;
  shape.mode = Mode::prefill;
  CHECK(paged_stage.unsupported_reason(shape).find("does not do prefill") != std::string::npos);
  const StageInfo& naive_stage = find_stage("01");
  CHECK(naive_stage.unsupported_reason(shape).find("reads ragged KV") != std::string::npos);
  shape.storage = KVStorage::ragged;
  CHECK(naive_stage.unsupported_reason(shape).find("dtype bf16") != std::string::npos);
  shape.dtype = DType::f32;
  CHECK(naive_stage.unsupported_reason(shape).empty());
}

TEST_CASE("registry: FP8 caches are read by the stages that declare them, the others say why") {
  BatchShape shape;
  shape.mode = Mode::decode;
  shape.storage = KVStorage::paged;
  shape.dtype = DType::bf16;
  shape.kv_dtype = DType::e4m3;
  shape.batch_size = 1;
  shape.num_qo_heads = 32;
  shape.num_kv_heads = 8;
  shape.head_dim = 128;
  shape.page_size = 16;
  shape.k_scale = 0.5f;
  shape.v_scale = 2.f;
  for (const StageInfo& stage : registry()) {
    CAPTURE(stage.name);
    const bool declares = std::find(stage.kv_dtypes.begin(), stage.kv_dtypes.end(), DType::e4m3) !=
                          stage.kv_dtypes.end();
    BatchShape s = shape;
    s.storage = stage.storage;
    s.kv_layout = stage.kv_layouts.front();
    if (!stage.supports(s.dtype)) continue;  // refused for its dtype before its K/V
    if (!stage.supports(s.mode)) s.mode = stage.modes.front();
    const std::string reason = stage.unsupported_reason(s);
    if (declares) CHECK(reason.empty());
    else CHECK(reason.find("not e4m3") != std::string::npos);
  }
  const StageInfo& paged_stage = find_stage("02_paged");
  CHECK(paged_stage.kv_dtypes == std::vector<DType>{DType::e4m3, DType::e5m2});
  CHECK(find_stage("03_split_kv").kv_dtypes == paged_stage.kv_dtypes);
  CHECK(paged_stage.capabilities().find("FP8 K/V e4m3 e5m2") != std::string::npos);
  shape.dtype = DType::f32;
  CHECK(paged_stage.unsupported_reason(shape).find("fp16 or bf16 queries") != std::string::npos);
  shape.dtype = DType::bf16;
  shape.kv_dtype = DType::f16;
  CHECK(paged_stage.unsupported_reason(shape).find("q's dtype (bf16) or an FP8 format") != std::string::npos);
  shape.kv_dtype.reset();
  shape.v_scale = 0.f;
  CHECK(paged_stage.unsupported_reason(shape).find("positive finite") != std::string::npos);
  shape.v_scale = 1.f;
  CHECK(paged_stage.unsupported_reason(shape).empty());  // k_scale 0.5 on a bf16 cache: applied too
  CHECK(find_stage("04_tensor_core").kv_dtypes == paged_stage.kv_dtypes);
  const StageInfo& cascade = find_stage("05_cascade");  // no kv_dtypes: no scales either
  CHECK(cascade.unsupported_reason(shape).find("does not apply k_scale or v_scale") != std::string::npos);
  CHECK(parse_dtype("float8_e4m3fn") == DType::e4m3);
  CHECK(parse_dtype("e5m2") == DType::e5m2);
  CHECK(dtype_bytes(DType::e5m2) == 1);
}

TEST_CASE("FastDivmod: equals / and % for every divisor 1..130 and many numerators") {
  auto rng = test::case_rng("FastDivmod host");
  for (uint32_t d = 1; d <= 130; ++d) {
    const kernels::FastDivmod fd(d);
    for (uint32_t n : {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 4095u, 65536u, 2147483647u, 4294967295u}) {
      uint32_t q, r;
      fd.divmod(n, q, r);
      CHECK(q == n / d);
      CHECK(r == n % d);
    }
    for (int i = 0; i < 200; ++i) {
      const uint32_t n = static_cast<uint32_t>(rng());
      uint32_t q, r;
      fd.divmod(n, q, r);
      REQUIRE(q == n / d);
      REQUIRE(r == n % d);
    }
  }
}

}  // TEST_SUITE("host")
