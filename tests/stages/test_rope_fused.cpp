// RoPE fused into the attention stages' loads (pos_encoding rope_llama, FlashInfer's
// pos_encoding_mode="ROPE_LLAMA"): the pool holds un-rotated keys and the stage rotates q
// and each key. Stage 03 takes rope/'s policy (rope_in_loads.cuh: K tiles rotated in shared
// memory, q in registers); stage 04 rotates its tiles in shared memory; both round to the
// dtype. The harness's reference rotates the same
// stored values with ref::rope_llama_fp32 (the kernels' arithmetic, bit for bit), rounds
// where the stage declares it rounds, and attends in double, so the dtype's usual
// tolerances apply; tests/reference/test_rope_fp32.cpp bounds that rotation against the
// one in double.
#include <cuda_fp16.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "03_split_kv/split_kv.hpp"
#include "04_tensor_core/tensor_core.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/rope.hpp"
#include "grid_runner.hpp"
#include "harness/cases.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "rope/rope_gpu.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using flashstep::test::check_grid;
namespace grids = flashstep::stages::harness::grids;

namespace {

BatchShape rope_decode_shape() {
  BatchShape s;
  s.mode = Mode::decode;
  s.storage = KVStorage::paged;
  s.dtype = DType::f16;
  s.batch_size = 2;
  s.num_qo_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 128;
  s.page_size = 16;
  s.num_pages = 8;
  s.qo_indptr = {0, 1, 2};
  s.kv_indptr = {0, 2, 4};
  s.kv_last_page_len = {3, 16};
  s.pos_encoding = PosEncoding::rope_llama;
  return s;
}

}  // namespace

TEST_SUITE("host") {

TEST_CASE("rope_llama: the stages that rotate say so, the others refuse it by name") {
  const BatchShape s = rope_decode_shape();
  CHECK(split_kv::stage_info().unsupported_reason(s).empty());
  CHECK(tensor_core::stage_info().unsupported_reason(s).empty());
  for (const StageInfo& stage : registry()) {
    const bool rotates = stage.name == "03_split_kv" || stage.name == "04_tensor_core" ||
                         stage.name == "04_tensor_core_ragged";
    if (rotates || stage.storage != KVStorage::paged) continue;
    const std::string reason = stage.unsupported_reason(s);
    CAPTURE(stage.name);
    CHECK(reason.find("pos_encoding rope_llama") != std::string::npos);
  }
  BatchShape f32 = s;
  f32.dtype = DType::f32;
  CHECK(split_kv::stage_info().unsupported_reason(f32).find("fp16/bf16") != std::string::npos);
  BatchShape d256 = s;
  d256.head_dim = 256;
  CHECK(split_kv::stage_info().unsupported_reason(d256).find("head_dim 64 or 128") != std::string::npos);
  BatchShape fp8 = s;
  fp8.kv_dtype = DType::e4m3;
  CHECK(split_kv::stage_info().unsupported_reason(fp8).find("FP8") != std::string::npos);
  BatchShape bad_theta = s;
  bad_theta.rope_theta = 0.f;
  CHECK(tensor_core::stage_info().unsupported_reason(bad_theta).find("rope_theta") != std::string::npos);
  CHECK(split_kv::stage_info().rope_rounds_to_dtype);  // the default: K tiles rotated in shared memory
  CHECK(tensor_core::stage_info().rope_rounds_to_dtype);
}

TEST_CASE("rope_llama: the harness's reference is attention over q and k rotated in double, to the fp32 bound") {
  using namespace stages::harness;
  // A prefill case (queries at kv_len - qo_len + i) and a decode case, unrounded model.
  for (int n : {1, 2}) {
    CaseSpec spec = grids::rope_sanitizer_grid()[static_cast<size_t>(n)];
    spec.rope_scale = 2.0;
    spec.rope_theta = 5e5;
    spec.kv_layout = KVLayout::NHD;  // ragged storage
    const HostCase host = build_case(spec, KVStorage::ragged, 99);
    const BatchShape& s = host.layout.shape;
    std::vector<int64_t> q_pos, k_pos;
    for (int b = 0; b < s.batch_size; ++b) {
      const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
      for (int64_t i = 0; i < qo_len; ++i) q_pos.push_back(s.kv_len(b) - qo_len + i);
      for (int64_t j = 0; j < s.kv_len(b); ++j) k_pos.push_back(j);
    }
    const std::vector<double> theta = ref::rope_frequencies(s.head_dim, 2.0, 5e5);
    const ref::Tensor q = ref::apply_rotary_embedding(host.q, q_pos, theta, false);
    const ref::Tensor k = ref::apply_rotary_embedding(host.k, k_pos, theta, false);
    std::vector<int32_t> token_indptr{0};
    for (int b = 0; b < s.batch_size; ++b)
      token_indptr.push_back(token_indptr.back() + static_cast<int32_t>(s.kv_len(b)));
    ref::AttentionOptions opt;
    opt.causal = s.causal;
    const ref::AttentionResult exact = ref::batch_prefill_with_ragged_kv_cache(q, s.qo_indptr, k, host.v, token_indptr,
                                                                               opt);
    // |q| <= 3, |k| <= 1: rotated elements within 6 (2^-21 + 2^-23) and 2 (2^-21 + 2^-23)
    // (test_rope_fp32.cpp), so a score within sm_scale * D * 2 * 3 * 2 (2^-21 + 2^-23) of
    // the exact one: the lse moves at most that, and o by at most twice that (max |v| 1).
    const double ds = 1.0 / std::sqrt(double(s.head_dim)) * s.head_dim * 12 * (0x1p-21 + 0x1p-23);
    double worst_lse = 0, worst_o = 0, moved = 0;
    for (size_t i = 0; i < exact.lse.data.size(); ++i)
      if (std::isfinite(exact.lse.data[i]))
        worst_lse = std::max(worst_lse, std::abs(exact.lse.data[i] - host.expected.lse.data[i]));
    for (size_t i = 0; i < exact.o.data.size(); ++i)
      worst_o = std::max(worst_o, std::abs(exact.o.data[i] - host.expected.o.data[i]));
    // and RoPE moved the answer: the same case without it differs by far more
    CaseSpec plain = spec;
    plain.pos_encoding = PosEncoding::none;
    const HostCase without = build_case(plain, KVStorage::ragged, 99);
    for (size_t i = 0; i < exact.o.data.size(); ++i)
      moved = std::max(moved, std::abs(exact.o.data[i] - without.expected.o.data[i]));
    MESSAGE("lse within " << worst_lse << ", o within " << worst_o << " of the rotation in double (bound " << ds << ", "
                          << 2 * ds << "); without RoPE o moves by " << moved);
    CHECK(worst_lse <= ds);
    CHECK(worst_o <= 2 * ds);
    CHECK(moved > 100 * 2 * ds);
  }
}

}  // TEST_SUITE("host")

TEST_CASE("rope_llama decode: 03_split_kv (rope/'s policy: K tiles rotated in shared memory) against the reference") {
  const auto ran = check_grid(grids::rope_decode_grid());
  CHECK(ran.count("03_split_kv") == 1);
  CHECK(ran.count("04_tensor_core") == 1);  // its large-group decode takes the grid's groups too
}

TEST_CASE("rope_llama prefill: 04_tensor_core (tiles rotated in shared memory) against the reference") {
  const auto ran = check_grid(grids::rope_prefill_grid());
  CHECK(ran.count("04_tensor_core") == 1);
  CHECK(ran.count("04_tensor_core_ragged") == 1);
}

TEST_CASE("rope_llama: forced splits (chunks that start past position 0) in both stages") {
  using namespace stages::harness;
  int failures = 0, n = 0;
  for (const CaseSpec& spec : grids::rope_decode_grid()) {
    if (spec.kv_len < 300 || n++ % 2) continue;
    StageInfo stage = split_kv::stage_info();
    stage.make_runner = test::split_kv_forced_split();
    const ValidationReport r = validate(stage, spec, case_seed(test::run_seed(), "rope split " + spec.describe()));
    CHECK_MESSAGE(r.passed, r.message());
    if (!r.passed && ++failures >= 5) break;
  }
  for (const CaseSpec& spec : grids::rope_prefill_grid()) {
    if (spec.kv_len < 100) continue;
    StageInfo stage = tensor_core::stage_info();
    stage.make_runner = test::tensor_core_forced_split(KVStorage::paged);
    const ValidationReport r = validate(stage, spec, case_seed(test::run_seed(), "rope split " + spec.describe()));
    CHECK_MESSAGE(r.passed, r.message());
    if (!r.passed && ++failures >= 5) break;
  }
}

TEST_CASE("rope_llama: the check can fail: a stage told not to rotate misses the reference") {
  using namespace stages::harness;
  for (Mode mode : {Mode::decode, Mode::prefill}) {
    CaseSpec spec = grids::rope_sanitizer_grid()[mode == Mode::decode ? 1 : 2];
    const StageInfo stage = mode == Mode::decode ? split_kv::stage_info() : tensor_core::stage_info();
    HostCase host = build_case(for_stage(spec, stage), stage.storage, 2701);
    host.layout.shape.pos_encoding = PosEncoding::none;  // the same pool and q, attended without RoPE
    const ValidationReport r = run_and_compare(stage, host);
    CAPTURE(r.message());
    CHECK_FALSE(r.passed);
  }
}

TEST_CASE("rope_llama: sanitizer subset") {
  const auto ran = check_grid(grids::rope_sanitizer_grid());
  CHECK(ran.count("03_split_kv") == 1);
  CHECK(ran.count("04_tensor_core") == 1);
}

// ---- The measured comparison (a timing case, skipped by default; run it with
// `flashstep_stage_tests -tc="rope_llama timing*" --no-skip`): per layer, the RoPE kernel
// on the step's new q and k rows plus the attention stage, against the stage with RoPE in
// its loads, at the engine's shapes (8 query / 2 kv heads of head_dim 128, fp16, pages of
// 16): a decode step of 64 requests over 2048 keys (stage 03) and two prefill chunks
// (stage 04). CUDA events around each variant's launches, the L2 overwritten before each
// repetition, the median of 50. The append of K/V is the same in both and not timed.

namespace {

struct TimedShape {
  const char* name;
  Mode mode;
  int batch, qo_len, kv_len;
};

/// Median of `reps` timings (ms) of `launch` on `stream`, each after an L2-sized overwrite.
template <typename Launch>
double median_ms(const Launch& launch, cudaStream_t stream, void* flush, size_t flush_bytes, int reps = 50) {
  cudaEvent_t start, stop;
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start));
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 5; ++i) launch();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(flush, i & 0xff, flush_bytes, stream));
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start, stream));
    launch();
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop, stream));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  FLASHSTEP_CUDA_CHECK(cudaEventDestroy(start));
  FLASHSTEP_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Host fp16 bits of uniform values in [-1, 1].
std::vector<uint16_t> random_halves(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> out(n);
  for (uint16_t& h : out) {
    const __half x = __float2half_rn(dist(rng));
    std::memcpy(&h, &x, sizeof h);
  }
  return out;
}

}  // namespace

TEST_CASE("rope_llama timing: RoPE kernel + attention vs RoPE in the attention's loads (prints)" * doctest::skip()) {
  using harness::DeviceBuffer;
  const int hq = 8, hkv = 2, d = 128, page = 16;
  const TimedShape shapes[] = {{"decode b64 x kv 2048 (stage 03)", Mode::decode, 64, 1, 2048},
                               {"prefill chunk 1 x 512 new, kv 512 (stage 04)", Mode::prefill, 1, 512, 512},
                               {"prefill chunk 4 x 128 new, kv 2048 (stage 04)", Mode::prefill, 4, 128, 2048}};
  cudaStream_t stream;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t flush_bytes = size_t{256} << 20;
  DeviceBuffer flush(flush_bytes);
  std::mt19937_64 rng(27);
  cudaDeviceProp prop{};
  FLASHSTEP_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("rope_llama timing on %s, median of 50, per layer (ms):\n", prop.name);
  for (const TimedShape& ts : shapes) {
    BatchShape s;
    s.mode = ts.mode;
    s.storage = KVStorage::paged;
    s.dtype = DType::f16;
    s.batch_size = ts.batch;
    s.num_qo_heads = hq;
    s.num_kv_heads = hkv;
    s.head_dim = d;
    s.page_size = page;
    s.causal = ts.mode == Mode::prefill;
    const int pages_per_req = (ts.kv_len + page - 1) / page;
    s.num_pages = int64_t{ts.batch} * pages_per_req;
    s.qo_indptr = {0};
    s.kv_indptr = {0};
    for (int b = 0; b < ts.batch; ++b) {
      s.qo_indptr.push_back(s.qo_indptr.back() + ts.qo_len);
      s.kv_indptr.push_back(s.kv_indptr.back() + pages_per_req);
      s.kv_last_page_len.push_back(ts.kv_len - (pages_per_req - 1) * page);
    }
    std::vector<int32_t> indices(static_cast<size_t>(s.num_pages));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), rng);  // a server after many evictions
    s.kv_indices = indices;
    const int64_t nnz = s.nnz_qo();
    const auto q_host = random_halves(rng, static_cast<size_t>(nnz * hq * d));
    const auto k_new_host = random_halves(rng, static_cast<size_t>(nnz * hkv * d));
    const auto pool_host = random_halves(rng, static_cast<size_t>(s.num_pages * 2 * page * hkv * d));
    DeviceBuffer q(q_host.data(), q_host.size() * 2), k_new(k_new_host.data(), k_new_host.size() * 2);
    DeviceBuffer pool(pool_host.data(), pool_host.size() * 2);
    DeviceBuffer q_rot(q_host.size() * 2), k_rot(k_new_host.size() * 2);
    DeviceBuffer qo_indptr = harness::upload(s.qo_indptr), kv_indptr = harness::upload(s.kv_indptr);
    DeviceBuffer kv_indices = harness::upload(indices), last = harness::upload(s.kv_last_page_len);
    std::vector<int32_t> pos_host;  // each new row's position: kv_len - qo_len + i
    for (int b = 0; b < ts.batch; ++b)
      for (int i = 0; i < ts.qo_len; ++i) pos_host.push_back(ts.kv_len - ts.qo_len + i);
    DeviceBuffer pos = harness::upload(pos_host);
    DeviceBuffer o(q_host.size() * 2), lse(static_cast<size_t>(nnz * hq) * sizeof(float));

    const StageInfo& stage = find_stage(ts.mode == Mode::decode ? "03_split_kv" : "04_tensor_core");
    auto make = [&](PosEncoding enc, std::unique_ptr<StageRunner>& runner, DeviceBuffer& ws) {
      BatchShape shape = s;
      shape.pos_encoding = enc;
      REQUIRE(stage.unsupported_reason(shape).empty());
      runner = stage.make_runner();
      ws = DeviceBuffer(std::max<size_t>(runner->workspace_bytes(shape), 256));
      runner->plan(shape, ws.get(), ws.bytes(), stream);
    };
    std::unique_ptr<StageRunner> plain, fused;
    DeviceBuffer ws_plain, ws_fused;
    make(PosEncoding::none, plain, ws_plain);
    make(PosEncoding::rope_llama, fused, ws_fused);
    DeviceBatch batch;
    batch.qo_indptr = static_cast<const int32_t*>(qo_indptr.get());
    batch.kv_indptr = static_cast<const int32_t*>(kv_indptr.get());
    batch.kv_pool = pool.get();
    batch.kv_indices = static_cast<const int32_t*>(kv_indices.get());
    batch.kv_last_page_len = static_cast<const int32_t*>(last.get());
    batch.o = o.get();
    batch.lse = static_cast<float*>(lse.get());
    DeviceBatch plain_batch = batch, fused_batch = batch;
    plain_batch.q = q_rot.get();
    fused_batch.q = q.get();

    stages::RopeLaunch r;
    r.dtype = DType::f16;
    r.q = q.get();
    r.k = k_new.get();
    r.q_out = q_rot.get();
    r.k_out = k_rot.get();
    r.nnz = nnz;
    r.num_q_heads = hq;
    r.num_k_heads = hkv;
    r.head_dim = d;
    r.rotary_dim = d;
    r.pos_ids = static_cast<const int32_t*>(pos.get());
    const std::vector<double> freqs = ref::rope_frequencies(d, 1.0, 1e4);

    const double rope_ms = median_ms([&] { stages::launch_rope(r, freqs, stream); }, stream, flush.get(), flush_bytes);
    const double attn_ms = median_ms([&] { plain->run(plain_batch, stream); }, stream, flush.get(), flush_bytes);
    const double both_ms = median_ms(
        [&] {
          stages::launch_rope(r, freqs, stream);
          plain->run(plain_batch, stream);
        },
        stream, flush.get(), flush_bytes);
    const double fused_ms = median_ms([&] { fused->run(fused_batch, stream); }, stream, flush.get(), flush_bytes);
    std::printf("  %-48s RoPE kernel %.4f + attention %.4f, together %.4f | fused %.4f | fused / together %.3f\n",
                ts.name, rope_ms, attn_ms, both_ms, fused_ms, fused_ms / both_ms);
  }
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(stream));
}
