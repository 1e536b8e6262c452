// MLA on the GPU (stages/10_mla/): the absorbed form over a paged latent cache against the
// reference's batch_mla_paged_attention (flashstep/reference/mla.hpp), computed in double
// on the same rounded inputs, under the harness's tolerance for the dtype. Decode and
// causal append; pages of 1, 16 and 64 in a shuffled pool; empty requests; 1 to 128
// heads (both tiles: 16 and 64 rows); splits forced and chosen by plan(); bad shapes
// refused by name. On a Hopper GPU every case runs twice: the wgmma kernel, then the
// mma.sync kernels every sm_80+ GPU runs (MlaShape::portable_only).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/mla.hpp"
#include "harness/compare.hpp"
#include "harness/device.hpp"
#include "harness/dtype_convert.hpp"
#include "10_mla/mla.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using mla::kLatentDim;
using mla::kRopeDim;

namespace {

/// One MLA batch to check.
struct MlaCase {
  DType dtype = DType::bf16;
  int num_heads = 16;
  int page_size = 16;
  std::vector<int> qo_lens;  ///< per request
  std::vector<int> kv_lens;  ///< per request
  bool causal = false;
  int forced_chunk_keys = 0;

  std::string describe() const {
    std::string s = std::string(to_string(dtype)) + " heads " + std::to_string(num_heads) + " page " +
                    std::to_string(page_size) + (causal ? " causal" : "") + " chunk " +
                    std::to_string(forced_chunk_keys) + " (qo, kv):";
    for (size_t i = 0; i < qo_lens.size(); ++i)
      s += " (" + std::to_string(qo_lens[i]) + ", " + std::to_string(kv_lens[i]) + ")";
    return s;
  }
};

/// Uniform values in [-1, 1) rounded to `dtype`: the inputs both sides see.
ref::Tensor rounded(std::mt19937_64& rng, std::vector<int64_t> shape, DType dtype) {
  ref::Tensor t = test::random_tensor(rng, std::move(shape));
  harness::round_all(dtype, t.data);
  return t;
}

harness::DeviceBuffer upload_as(DType dtype, const ref::Tensor& t) {
  return harness::upload(harness::encode(dtype, t.data));
}

/// Runs `c` on the GPU and compares o and lse with the reference. Returns the plan's info.
mla::MlaPlanInfo check_case(const MlaCase& c) {
  CAPTURE(c.describe());
  std::mt19937_64 rng = test::case_rng("mla " + c.describe());
  const int batch = static_cast<int>(c.qo_lens.size());
  const int heads = c.num_heads;

  // the page table: each request's pages, drawn without repeats from a shuffled pool
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_len;
  int64_t pages_needed = 0;
  for (int i = 0; i < batch; ++i) {
    qo_indptr.push_back(qo_indptr.back() + c.qo_lens[i]);
    const int pages = (c.kv_lens[i] + c.page_size - 1) / c.page_size;
    kv_indptr.push_back(kv_indptr.back() + pages);
    kv_len.push_back(c.kv_lens[i]);
    pages_needed += pages;
  }
  const int64_t num_pages = pages_needed + 3;  // spare pages nobody reads
  std::vector<int32_t> pool(static_cast<size_t>(num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> kv_indices(pool.begin(), pool.begin() + pages_needed);

  ref::PagedLatentCache cache;
  cache.ckv_pages = rounded(rng, {num_pages, c.page_size, kLatentDim}, c.dtype);
  cache.kpe_pages = rounded(rng, {num_pages, c.page_size, kRopeDim}, c.dtype);
  cache.kv_indptr = kv_indptr;
  cache.kv_indices = kv_indices;
  cache.kv_len = kv_len;
  const int64_t nnz = qo_indptr.back();
  // q_lat spans 512 dims: scaled so the scores are of order one, the softmax not one-hot
  const ref::Tensor q_lat = rounded(rng, {nnz, heads, kLatentDim}, c.dtype);
  const ref::Tensor q_pe = rounded(rng, {nnz, heads, kRopeDim}, c.dtype);
  ref::MlaOptions opt;
  opt.causal = c.causal;
  opt.sm_scale = 1.0 / std::sqrt(192.0);
  const ref::AttentionResult want = ref::batch_mla_paged_attention(q_lat, q_pe, qo_indptr, cache, opt);

  mla::MlaShape shape;
  shape.dtype = c.dtype;
  shape.batch_size = batch;
  shape.num_heads = heads;
  shape.page_size = c.page_size;
  shape.num_pages = num_pages;
  shape.causal = c.causal;
  shape.sm_scale = static_cast<float>(*opt.sm_scale);
  shape.qo_indptr = qo_indptr;
  shape.kv_indptr = kv_indptr;
  shape.kv_len = kv_len;
  shape.forced_chunk_keys = c.forced_chunk_keys;
  REQUIRE(mla::unsupported_reason(shape).empty());

  harness::DeviceBuffer d_qlat = upload_as(c.dtype, q_lat), d_qpe = upload_as(c.dtype, q_pe);
  harness::DeviceBuffer d_ckv = upload_as(c.dtype, cache.ckv_pages), d_kpe = upload_as(c.dtype, cache.kpe_pages);
  harness::DeviceBuffer d_indices = harness::upload(kv_indices);
  harness::DeviceBuffer d_o(static_cast<size_t>(nnz) * heads * kLatentDim * dtype_bytes(c.dtype));
  harness::DeviceBuffer d_lse(static_cast<size_t>(nnz) * heads * sizeof(float));
  const harness::DTypeTolerance& tol = harness::tolerance_for(c.dtype);
  mla::MlaPlanInfo first;
  // the default kernel, then (where that was the Hopper one) the sm_80 kernels on the same inputs
  for (bool portable : {false, true}) {
    shape.portable_only = portable;
    // poisoned: every byte 0xff is a NaN in fp16, bf16 and fp32, so a row never written fails
    if (d_o.bytes() > 0) FLASHSTEP_CUDA_CHECK(cudaMemset(d_o.get(), 0xff, d_o.bytes()));
    if (d_lse.bytes() > 0) FLASHSTEP_CUDA_CHECK(cudaMemset(d_lse.get(), 0xff, d_lse.bytes()));
    mla::MlaRunner runner;
    harness::DeviceBuffer workspace(runner.workspace_bytes(shape));
    runner.plan(shape, workspace.get(), workspace.bytes(), nullptr);
    if (portable && std::string(first.kernel) == "mma_sync") break;  // already checked
    mla::MlaBatch b;
    b.q_nope = d_qlat.get();
    b.q_pe = d_qpe.get();
    b.ckv_pages = d_ckv.get();
    b.kpe_pages = d_kpe.get();
    b.kv_indices = d_indices.as<int32_t>();
    b.o = d_o.get();
    b.lse = d_lse.as<float>();
    runner.run(b, nullptr);
    FLASHSTEP_CUDA_CHECK(cudaDeviceSynchronize());

    const std::vector<double> got_o = harness::decode(c.dtype, d_o.download(), static_cast<size_t>(want.o.numel()));
    const std::vector<float> got_lse_f = harness::download<float>(d_lse);
    const std::vector<double> got_lse(got_lse_f.begin(), got_lse_f.end());
    const harness::Comparison co = harness::compare("o", got_o, want.o.data, tol.o,
                                                    harness::output_label(qo_indptr, heads, kLatentDim));
    const harness::Comparison cl = harness::compare("lse", got_lse, want.lse.data, tol.lse,
                                                    harness::lse_label(qo_indptr, heads));
    CAPTURE(runner.info().kernel);
    CAPTURE(runner.info().rows_per_tile);
    CAPTURE(runner.info().chunk_keys);
    CHECK_MESSAGE(co.passed, co.summary());
    CHECK_MESSAGE(cl.passed, cl.summary());
    if (!portable) first = runner.info();
  }
  return first;
}

MlaCase make(int heads, int page, std::vector<int> qo, std::vector<int> kv, bool causal = false,
             DType dtype = DType::bf16, int chunk = 0) {
  MlaCase c;
  c.num_heads = heads;
  c.page_size = page;
  c.qo_lens = std::move(qo);
  c.kv_lens = std::move(kv);
  c.causal = causal;
  c.dtype = dtype;
  c.forced_chunk_keys = chunk;
  return c;
}

}  // namespace

TEST_CASE("mla: decode grid of pages 1 16 and 64 with 1 to 128 heads and empty requests") {
  for (int page : {1, 16, 64})
    for (int heads : {1, 16, 128})
      for (DType dtype : {DType::bf16, DType::f16}) {
        if (dtype == DType::f16 && heads == 1) continue;
        // lengths cross the 32-key tile and the pages; request 3 is empty (o = 0, lse = -inf)
        check_case(make(heads, page, {1, 1, 1, 1, 1}, {1, 31, 33, 0, 700}, false, dtype));
      }
}

TEST_CASE("mla: causal append of 2 to 9 queries a request with both tiles") {
  for (int heads : {8, 16, 128})
    for (bool causal : {true, false}) {
      const mla::MlaPlanInfo info = check_case(
          make(heads, 16, {4, 9, 2, 1, 3}, {4, 200, 65, 0, 2}, causal));  // request 4: fewer keys than queries
      CHECK(info.rows_per_tile == (heads * 9 > 16 ? 64 : 16));
    }
}

TEST_CASE("mla: splits forced at 32 and 128 keys and chosen by plan() for a short batch") {
  for (int chunk : {32, 128}) {
    const mla::MlaPlanInfo info = check_case(make(16, 16, {1, 3, 1}, {300, 257, 0}, true, DType::bf16, chunk));
    CHECK(info.chunk_keys == chunk);
    CHECK(info.partial_rows > 0);
  }
  // one request of 128 heads: two tiles, far from filling the GPU, so plan() splits
  const mla::MlaPlanInfo one = check_case(make(128, 64, {1}, {5000}));
  CHECK(one.chunk_keys > 0);
  CHECK(one.work_items > 2);
}

TEST_CASE("mla: sanitizer subset") {
  // small cases over both tiles, a split and an empty request, for compute-sanitizer
  check_case(make(16, 16, {1, 1}, {40, 0}));
  check_case(make(128, 1, {2}, {70}, true));
  check_case(make(16, 16, {1, 2}, {100, 65}, true, DType::f16, 32));
  // 128 heads over pages of 64: clusters of two sharing TMA tiles, a gathered last tile
  check_case(make(128, 64, {1, 1}, {200, 0}));
}

TEST_CASE("mla: refuses a shape it cannot run and names the field") {
  mla::MlaShape ok;
  ok.dtype = DType::bf16;
  ok.batch_size = 1;
  ok.num_heads = 16;
  ok.page_size = 16;
  ok.num_pages = 4;
  ok.sm_scale = 0.1f;
  ok.qo_indptr = {0, 1};
  ok.kv_indptr = {0, 2};
  ok.kv_len = {20};
  REQUIRE(mla::unsupported_reason(ok).empty());
  struct Bad {
    const char* field;
    void (*mutate)(mla::MlaShape&);
  };
  const Bad bad[] = {
      {"head_dim_ckv", [](mla::MlaShape& s) { s.head_dim_ckv = 256; }},
      {"head_dim_kpe", [](mla::MlaShape& s) { s.head_dim_kpe = 32; }},
      {"num_heads", [](mla::MlaShape& s) { s.num_heads = 129; }},
      {"dtype", [](mla::MlaShape& s) { s.dtype = DType::f32; }},
      {"sm_scale", [](mla::MlaShape& s) { s.sm_scale = 0.f; }},
      {"kv_len[0]", [](mla::MlaShape& s) { s.kv_len = {33}; }},
      {"kv_len[0]", [](mla::MlaShape& s) { s.kv_len = {16}; }},
      {"qo_indptr", [](mla::MlaShape& s) { s.qo_indptr = {0}; }},
      {"page_size", [](mla::MlaShape& s) { s.page_size = 0; }},
      {"forced_chunk_keys", [](mla::MlaShape& s) { s.forced_chunk_keys = 40; }},
  };
  for (const Bad& b : bad) {
    mla::MlaShape s = ok;
    b.mutate(s);
    CAPTURE(b.field);
    const std::string why = mla::unsupported_reason(s);
    CHECK(why.find(b.field) != std::string::npos);
    mla::MlaRunner runner;
    try {
      runner.workspace_bytes(s);
      FAIL("workspace_bytes accepted a bad shape");
    } catch (const ref::InvalidArgument& e) {
      const std::string msg = e.what();
      CHECK(msg.find("MlaRunner::workspace_bytes") != std::string::npos);
      CHECK(msg.find(b.field) != std::string::npos);
    }
  }
  mla::MlaRunner unplanned;
  CHECK_THROWS_AS(unplanned.run(mla::MlaBatch{}, nullptr), ref::InvalidArgument);
}

TEST_SUITE("host") {
// plan() as a function of the shape and the GPU's facts (make_schedule), for GPUs this
// machine need not have: every (row tile, chunk) once, chunks that cover each request's
// keys, the merge's rows in order, the tile and kernel each GPU can run.
namespace {

mla::MlaDevice h200() { return {9, 0, 132, 232448, 233472, true}; }
mla::MlaDevice a100() { return {8, 0, 108, 166912, 167936, false}; }
mla::MlaDevice rtx3090() { return {8, 6, 82, 101376, 102400, false}; }

mla::MlaShape decode_shape(int batch, int kv, int heads, int qo = 1, int page = 64) {
  mla::MlaShape s;
  s.batch_size = batch;
  s.num_heads = heads;
  s.page_size = page;
  s.sm_scale = 0.07f;
  s.qo_indptr = {0};
  s.kv_indptr = {0};
  for (int i = 0; i < batch; ++i) {
    s.qo_indptr.push_back(s.qo_indptr.back() + qo);
    s.kv_indptr.push_back(s.kv_indptr.back() + (kv + page - 1) / page);
    s.kv_len.push_back(kv);
  }
  s.num_pages = s.kv_indptr.back() + 1;
  return s;
}

// Every row tile of every request meets every key once, in chunks; o_indptr is each
// token's first partial row; the items come longest request first.
void check_covers(const mla::MlaShape& s, const mla::MlaSchedule& p) {
  const int rows = p.info.rows_per_tile;
  const bool split = p.info.partial_rows > 0;
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> ranges;  // (request, row) -> [begin, end)
  int last_kv = std::numeric_limits<int>::max();
  for (const mla::MlaWorkItem& w : p.items) {
    const int request = static_cast<int>(std::find(s.qo_indptr.begin(), s.qo_indptr.end(), w.qo_start) -
                                         s.qo_indptr.begin());
    REQUIRE(request < s.batch_size);
    CHECK(w.kv_len == s.kv_len[request]);
    CHECK(w.page_begin == s.kv_indptr[request]);
    CHECK(w.row_begin % rows == 0);
    CHECK(w.kv_len <= last_kv);  // longest first
    last_kv = w.kv_len;
    CHECK((split ? w.slot_base >= 0 : w.slot_base == -1));
    if (split) CHECK(w.kv_begin % 32 == 0);
    ranges[{request, w.row_begin}].push_back({w.kv_begin, w.kv_end});
  }
  for (int i = 0; i < s.batch_size; ++i) {
    const int qo_rows = (s.qo_indptr[i + 1] - s.qo_indptr[i]) * s.num_heads;
    for (int r = 0; r < qo_rows; r += rows) {
      auto& rs = ranges[{i, r}];
      std::sort(rs.begin(), rs.end());
      REQUIRE(!rs.empty());
      CHECK(rs.front().first == 0);
      CHECK(rs.back().second == s.kv_len[i]);
      for (size_t k = 1; k < rs.size(); ++k) CHECK(rs[k].first == rs[k - 1].second);
    }
  }
  if (split) {
    REQUIRE(p.o_indptr.size() == static_cast<size_t>(s.nnz_qo()) + 1);
    CHECK(p.o_indptr.front() == 0);
    CHECK(p.o_indptr.back() == p.info.partial_rows);
    for (size_t t = 1; t < p.o_indptr.size(); ++t) CHECK(p.o_indptr[t] > p.o_indptr[t - 1]);
  }
}

}  // namespace

TEST_CASE("mla schedule: 128 heads on an H200 take the wgmma tile, and a short batch splits into one wave") {
  const mla::MlaShape big = decode_shape(128, 8192, 128);
  const mla::MlaSchedule p = mla::make_schedule(big, h200());
  CHECK(std::string(p.info.kernel) == "wgmma");
  CHECK(p.info.rows_per_tile == 64);
  CHECK(p.info.chunk_keys == 0);  // 256 tiles, more than 132 SMs hold
  CHECK(p.info.work_items == 256);
  CHECK(p.info.tma_pages);                              // pages of 64: a tile is one page, copied by the TMA
  CHECK(p.info.cluster_blocks == 2);                    // a query token's 128 heads: two row tiles, one cluster
  for (size_t i = 0; i + 1 < p.items.size(); i += 2) {  // blocks 2i and 2i + 1 read the same keys
    CHECK(p.items[i].page_begin == p.items[i + 1].page_begin);
    CHECK(p.items[i].kv_begin == p.items[i + 1].kv_begin);
    CHECK(p.items[i].kv_end == p.items[i + 1].kv_end);
    CHECK(p.items[i].row_begin + 64 == p.items[i + 1].row_begin);
  }
  const mla::MlaSchedule paged16 = mla::make_schedule(decode_shape(128, 8192, 128, 1, 16), h200());
  CHECK(!paged16.info.tma_pages);  // pages of 16: every tile gathered, no cluster
  CHECK(paged16.info.cluster_blocks == 1);
  const mla::MlaSchedule heads16 = mla::make_schedule(decode_shape(128, 8192, 16), h200());
  CHECK(heads16.info.tma_pages);  // one row tile a request: TMA, but nothing to pair
  CHECK(heads16.info.cluster_blocks == 1);
  check_covers(big, p);

  const mla::MlaShape one = decode_shape(1, 16384, 128);
  const mla::MlaSchedule q = mla::make_schedule(one, h200());
  CHECK(q.info.chunk_keys > 0);
  CHECK(q.info.chunk_keys % 32 == 0);
  CHECK(q.info.chunk_keys == 256);  // 66 chunks a tile wanted: 16384 / 66 = 249, whole 32-key tiles
  CHECK(q.info.work_items == 128);  // 2 row tiles x 64 chunks: one block an SM, one wave
  check_covers(one, q);

  mla::MlaShape portable = big;
  portable.portable_only = true;
  CHECK(std::string(mla::make_schedule(portable, h200()).info.kernel) == "mma_sync");
}

TEST_CASE("mla schedule: 16 heads take the 16-row tile off Hopper, and the split counts the blocks an SM holds") {
  const mla::MlaShape s = decode_shape(128, 8192, 16);
  const mla::MlaSchedule w = mla::make_schedule(s, h200());  // Hopper: the wgmma tile, 48 rows of padding
  CHECK(w.info.rows_per_tile == 64);
  CHECK(std::string(w.info.kernel) == "wgmma");
  CHECK(w.info.chunk_keys == 0);  // 128 tiles, one block an SM: no split
  CHECK(w.info.work_items == 128);
  check_covers(s, w);
  mla::MlaShape portable = s;
  portable.portable_only = true;
  const mla::MlaSchedule h = mla::make_schedule(portable, h200());
  CHECK(h.info.rows_per_tile == 16);
  CHECK(std::string(h.info.kernel) == "mma_sync");
  CHECK(h.info.chunk_keys == 4096);  // two 92 KB blocks an SM: 264 slots for 128 tiles
  CHECK(h.info.work_items == 256);
  check_covers(s, h);
  const mla::MlaSchedule a = mla::make_schedule(s, a100());  // one such block an SM on an A100
  CHECK(a.info.chunk_keys == 0);
  CHECK(a.info.work_items == 128);
  check_covers(s, a);
}

TEST_CASE("mla schedule: an RTX 3090 runs 128 heads on the 16-row tile, an empty request still gets an item") {
  mla::MlaShape s = decode_shape(3, 300, 128, 2, 16);
  s.kv_len = {300, 0, 17};
  s.kv_indptr = {0, 19, 19, 21};
  s.num_pages = 22;
  const mla::MlaSchedule p = mla::make_schedule(s, rtx3090());
  CHECK(p.info.rows_per_tile == 16);  // 150 KB for the 64-row tile: more than the 99 KB it allows
  CHECK(std::string(p.info.kernel) == "mma_sync");
  check_covers(s, p);
  int empty = 0;
  for (const mla::MlaWorkItem& w : p.items) empty += w.kv_len == 0 && w.kv_begin == 0 && w.kv_end == 0;
  CHECK(empty == 2 * 128 / 16);  // request 1: 2 queries x 128 heads in 16-row tiles, one chunk
}

TEST_CASE("mla schedule: a GPU before sm_80, or with too little shared memory, is refused by name") {
  const mla::MlaShape s = decode_shape(1, 100, 16);
  mla::MlaDevice t4 = a100();
  t4.major = 7, t4.minor = 5;
  CHECK(mla::unsupported_reason(s, t4).find("sm_80") != std::string::npos);
  CHECK_THROWS_AS(mla::make_schedule(s, t4), ref::InvalidArgument);
  mla::MlaDevice small = a100();
  small.smem_optin = 48 * 1024;
  CHECK(mla::unsupported_reason(s, small).find("shared memory") != std::string::npos);
}
}  // TEST_SUITE("host")
