// Stage 09's mixed step (decode rows, then prefill rows, one causal batch) computed as two
// attention calls, as one call of the prefill stage, and as one launch of POD attention
// (MixedStepAttention, bench/serve/mixed_step.hpp), each against the reference's paged prefill over
// the whole batch; and a timing of the forms over the engine's shape (skipped by default:
// it writes the JSON the chapter's table is generated from).
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "09_engine/arrival_schedule.hpp"
#include "09_engine/engine.hpp"
#include "09_engine/pod_attention.hpp"
#include "09_engine/scheduler.hpp"
#include "fixed_batch.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"
#include "harness/case.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "mixed_step.hpp"   // flashstep::serve_measure_gpu (bench/serve/)
#include "phase_timer.hpp"  // flashstep::serve_measure_gpu
#include "registry.hpp"
#include "support/random.hpp"

using namespace flashstep;
using namespace flashstep::stages;
using namespace flashstep::stages::harness;
using flashstep::bench::MixedForm;
using flashstep::bench::MixedStepAttention;
using flashstep::test::FixedBatch;

namespace {

/// A mixed step: `nd` decode rows (one query each, the last of what build_case drew for
/// them) then `np` prefill rows, causal; the reference answers the whole batch with its
/// paged prefill.
HostCase mixed_case(int nd, int np, int kv_len, int qo_len, int page_size, DType dtype, const std::string& salt) {
  CaseSpec spec;
  spec.mode = Mode::prefill;
  spec.causal = true;
  spec.dtype = dtype;
  spec.batch_size = nd + np;
  spec.kv_len = kv_len;
  spec.qo_len = qo_len;
  spec.lengths = LengthPolicy::ragged;
  spec.num_qo_heads = 8;
  spec.num_kv_heads = 2;
  spec.head_dim = 128;
  spec.page_size = page_size;
  HostCase c = build_case(spec, KVStorage::paged, case_seed(test::run_seed(), salt + spec.describe()));
  BatchShape& s = c.layout.shape;
  const int64_t row = int64_t{s.num_qo_heads} * s.head_dim;
  std::vector<int32_t> qo_indptr{0};
  std::vector<double> q;
  for (int b = 0; b < s.batch_size; ++b) {
    const int32_t first = b < nd ? s.qo_indptr[b + 1] - 1 : s.qo_indptr[b];
    q.insert(q.end(), c.q.data.begin() + first * row, c.q.data.begin() + s.qo_indptr[b + 1] * row);
    qo_indptr.push_back(qo_indptr.back() + s.qo_indptr[b + 1] - first);
  }
  s.qo_indptr = qo_indptr;
  c.q = ref::Tensor({qo_indptr.back(), s.num_qo_heads, s.head_dim});
  c.q.data = q;
  ref::AttentionOptions opt;
  opt.causal = true;
  opt.kv_layout = KVLayout::NHD;
  c.expected = ref::batch_prefill_with_paged_kv_cache(c.q, s.qo_indptr, c.paged, opt);
  return c;
}

struct Variant {
  MixedForm form;
  std::string decode_stage, prefill_stage;
  std::string describe() const {
    return std::string(bench::to_string(form)) + "(" + (decode_stage.empty() ? "default" : decode_stage) + ", " +
           (prefill_stage.empty() ? "default" : prefill_stage) + ")";
  }
};

}  // namespace

TEST_CASE("09_engine mixed step: two calls, one call and POD attention equal the reference") {
  struct Mix {
    int nd, np, kv_len, qo_len, page_size;
  };
  // mixes of decode and prefill rows, decode-only and prefill-only steps, pages of 1
  const Mix mixes[] = {{16, 2, 1000, 200, 16}, {1, 1, 300, 64, 16}, {48, 3, 1200, 100, 16},
                       {0, 2, 500, 100, 16},   {5, 0, 700, 1, 16},  {7, 2, 400, 90, 1}};
  const Variant variants[] = {{MixedForm::two_calls, "", ""},
                              {MixedForm::one_call, "", ""},
                              {MixedForm::one_call, "", "04_tensor_core"},
                              {MixedForm::two_calls, "", "04_tensor_core"},
                              {MixedForm::pod, "", ""}};
  cudaStream_t stream = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int checked = 0;
  for (DType dtype : {DType::f16, DType::bf16}) {
    for (const Mix& x : mixes) {
      const HostCase host = mixed_case(x.nd, x.np, x.kv_len, x.qo_len, x.page_size, dtype, "mixed step");
      const BatchShape& s = host.layout.shape;
      FixedBatch fixed(s, size_t(s.num_pages), 0, host.layout.kv_indices.size());
      for (const Variant& v : variants) {
        INFO(v.describe() << " on " << x.nd << " decodes + " << x.np << " prefills: " << host.spec.describe()
                          << " (case seed " << host.seed << ")");
        MixedStepAttention attention(v.form, v.decode_stage, v.prefill_stage);
        fixed.load(host, stream);
        attention.plan(s, x.nd, stream);
        attention.run(fixed.batch, stream);
        FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (v.form != MixedForm::two_calls) CHECK(attention.decode_stage().empty());
        const ValidationReport r = compare_outputs(v.describe() + " " + attention.decode_stage() + "+" +
                                                       attention.prefill_stage(),
                                                   host, fixed.output(dtype), fixed.lse_values());
        CHECK_MESSAGE(r.passed, r.message());
        ++checked;
      }
    }
  }
  cudaStreamDestroy(stream);
  CHECK(checked == 2 * 6 * 5);
}

TEST_CASE("09_engine: a phase timer times every step, whatever runs it (graphs, cascade, one launch)") {
  // Every combination of cuda_graphs, cascade_when_shared and one_launch with a PhaseTimer
  // (bench/serve/phase_timer.hpp) as the engine's observer: each step's phases are read
  // from its CUDA events (the timer throws when an event was not recorded, or was recorded
  // inside a capture and never replayed), and the phases are times that add up to the
  // step's. Shared prompts and a small budget make eager
  // mixed steps (POD), decode-only graph steps and cascade steps inside graphs; tokens are
  // not checked here (the token checks do that).
  engine::ArrivalParams p;
  p.seed = 11;  // the engine token check's shared workload
  p.num_requests = 64;
  p.arrivals_per_step = 6;
  p.min_prompt_len = 3;
  p.max_prompt_len = 40;
  p.min_new_tokens = 3;
  p.max_new_tokens = 12;
  p.num_shared_prefixes = 2;
  p.shared_prefix_len = 37;
  p.shared_fraction = 0.75;
  const std::vector<engine::Request> reqs = engine::ArrivalSchedule::make(p).requests();
  engine::EngineConfig c;
  c.model.d_model = 1024;
  c.model.num_layers = 2;
  c.model.num_qo_heads = 8;
  c.model.num_kv_heads = 2;
  c.model.position_encoding = ref::PositionEncoding::rope;
  c.scheduler.page_size = 16;
  c.scheduler.num_pages = 0;  // room for every request at once, as the token checks have
  for (const engine::Request& r : reqs)
    c.scheduler.num_pages += (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + 15) / 16;
  c.scheduler.max_running = 8;
  c.scheduler.max_tokens_per_step = 48;
  int64_t graph_steps = 0, cascade_graph_steps = 0, pod_steps = 0;
  for (int variant = 0; variant < 8; ++variant) {
    c.cuda_graphs = (variant & 1) != 0;
    c.cascade_when_shared = (variant & 2) != 0;
    c.one_launch = (variant & 4) != 0;
    INFO("cuda_graphs " << c.cuda_graphs << ", cascade_when_shared " << c.cascade_when_shared << ", one_launch "
                        << c.one_launch);
    bench::PhaseTimer timer(c.model.num_layers);
    c.observer = &timer;
    engine::Engine eng(c);
    engine::Scheduler scheduler(c.scheduler, reqs);
    int64_t steps = 0;
    double attention_ms = 0;
    while (!scheduler.done()) {
      const engine::StepBatch b = scheduler.next_step();
      if (b.batch_size() == 0) {
        scheduler.complete_step({});
        continue;
      }
      const engine::StepOutput out = eng.run_step(b, scheduler);
      const bench::StepTiming& t = timer.last();
      INFO("step " << b.step << ": " << b.describe());
      const double parts[] = {t.embed_ms, t.projection_ms, t.attention_ms, t.logits_ms, t.sampling_ms, t.host_ms};
      double sum = 0;
      for (double x : parts) {
        CHECK((std::isfinite(x) && x >= 0));
        sum += x;
      }
      // the GPU phases split the interval from the first event to the last (each read at
      // about 0.5 us resolution)
      CHECK(std::abs(sum - t.total_ms) <= 0.01 + 0.01 * t.total_ms);
      CHECK(t.total_ms > t.host_ms);
      attention_ms += t.attention_ms;
      ++steps;
      graph_steps += out.graph_batch > 0;
      cascade_graph_steps += out.graph_batch > 0 && out.decode_stage == "05_cascade";
      pod_steps += out.decode_stage == "pod_attention";
      scheduler.complete_step(out.tokens);
    }
    CHECK(steps > 0);
    CHECK(static_cast<int64_t>(timer.steps().size()) == steps);  // one `done` a step
    CHECK(attention_ms > 0);
  }
  CHECK(graph_steps > 0);
  CHECK(cascade_graph_steps > 0);
  CHECK(pod_steps > 0);
}

TEST_SUITE("host") {
TEST_CASE("09_engine POD grid: every prefill and decode block index once, the kinds interleaved") {
  for (int64_t prefill : {0, 1, 7, 128, 1000})
    for (int64_t decode : {0, 1, 2, 64, 256, 999}) {
      const int64_t total = prefill + decode;
      std::vector<int> seen_prefill(static_cast<size_t>(prefill)), seen_decode(static_cast<size_t>(decode));
      int64_t decode_in_first_half = 0;
      for (int64_t b = 0; b < total; ++b) {
        int index = -1;
        const bool is_decode = engine::pod_is_decode(b, total, decode, index);
        std::vector<int>& seen = is_decode ? seen_decode : seen_prefill;
        REQUIRE(index >= 0);
        REQUIRE(index < static_cast<int>(seen.size()));
        ++seen[static_cast<size_t>(index)];
        if (is_decode && 2 * b < total) ++decode_in_first_half;
      }
      CAPTURE(prefill);
      CAPTURE(decode);
      CHECK(std::all_of(seen_prefill.begin(), seen_prefill.end(), [](int n) { return n == 1; }));
      CHECK(std::all_of(seen_decode.begin(), seen_decode.end(), [](int n) { return n == 1; }));
      // interleaved, not one kind after the other: the first half holds half the decodes (+-1)
      CHECK(std::abs(2 * decode_in_first_half - decode) <= 2);
    }
}
}  // TEST_SUITE("host")

TEST_CASE("09_engine mixed step: bad arguments are refused by name") {
  MixedStepAttention attention(MixedForm::two_calls);
  BatchShape s;
  s.mode = Mode::prefill;
  s.storage = KVStorage::paged;
  s.batch_size = 2;
  s.qo_indptr = {0, 3, 4};
  s.kv_indptr = {0, 1, 2};
  s.kv_last_page_len = {3, 1};
  CHECK_THROWS_WITH_AS(attention.plan(s, 3, nullptr), doctest::Contains("num_decodes"), ref::InvalidArgument);
  CHECK_THROWS_WITH_AS(attention.plan(s, 1, nullptr), doctest::Contains("decode row 0"), ref::InvalidArgument);
  s.mode = Mode::decode;
  CHECK_THROWS_WITH_AS(attention.plan(s, 0, nullptr), doctest::Contains("prefill batch"), ref::InvalidArgument);
}

namespace {

/// Median of `reps` CUDA-event timings of run(), each after an L2 flush; plan() once before.
double median_us(MixedStepAttention& attention, const BatchShape& s, int nd, const DeviceBatch& batch,
                 DeviceBuffer& flush, cudaStream_t stream, int reps) {
  attention.plan(s, nd, stream);
  for (int i = 0; i < 3; ++i) attention.run(batch, stream);  // warm-up
  cudaEvent_t start, stop;
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start));
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 0xff, flush.bytes(), stream));
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start, stream));
    attention.run(batch, stream);
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop, stream));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1000.0 * ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

TEST_CASE("09_engine mixed step timing: two calls vs one (writes JSON, not a timed test)" * doctest::skip()) {
  // The engine's shape: 8/2 heads of head_dim 128, fp16, pages of 16. D decode rows with
  // kv lengths drawn uniformly from 1024..4096 (seeded), then one prefill row of P new
  // tokens after a cached prefix of 1024 (kv_len P + 1024), P = 0 meaning no prefill row.
  // The pool holds one constant value (timing does not depend on it); outputs unchecked.
  const char* path = std::getenv("FLASHSTEP_MIXED_STEP_JSON");
  const int reps = 51;
  std::mt19937_64 rng(20261127);
  const int prefill_tokens[] = {0, 128, 512, 2048};
  const int decodes[] = {1, 16, 64, 128};
  const Variant variants[] = {{MixedForm::two_calls, "", ""},
                              {MixedForm::one_call, "", ""},
                              {MixedForm::one_call, "", "04_tensor_core"},
                              {MixedForm::pod, "", ""}};
  cudaStream_t stream = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer flush(size_t{256} << 20);  // past the L2 (50 MiB on an H100)
  std::string rows;
  for (int P : prefill_tokens) {
    for (int D : decodes) {
      BatchShape s;
      s.mode = Mode::prefill;
      s.storage = KVStorage::paged;
      s.dtype = DType::f16;
      s.kv_layout = KVLayout::NHD;
      s.num_qo_heads = 8;
      s.num_kv_heads = 2;
      s.head_dim = 128;
      s.page_size = 16;
      s.causal = true;
      const int np = P > 0 ? 1 : 0;
      s.batch_size = D + np;
      s.qo_indptr = {0};
      s.kv_indptr = {0};
      std::uniform_int_distribution<int> kv(1024, 4096);
      for (int b = 0; b < s.batch_size; ++b) {
        const int qo = b < D ? 1 : P, len = b < D ? kv(rng) : P + 1024;
        const int pages = (len + 15) / 16;
        s.qo_indptr.push_back(s.qo_indptr.back() + qo);
        s.kv_indptr.push_back(s.kv_indptr.back() + pages);
        s.kv_last_page_len.push_back(len - (pages - 1) * 16);
      }
      s.num_pages = s.kv_indptr.back();
      for (int32_t p = 0; p < s.num_pages; ++p) s.kv_indices.push_back(p);
      const size_t elem = 2, row = size_t(s.num_qo_heads) * s.head_dim * elem;
      DeviceBuffer q(size_t(s.nnz_qo()) * row), o(size_t(s.nnz_qo()) * row),
          lse(size_t(s.nnz_qo()) * s.num_qo_heads * sizeof(float)),
          pool(size_t(s.num_pages) * 2 * 16 * s.num_kv_heads * s.head_dim * elem), qo(s.qo_indptr.size() * 4),
          kvp(s.kv_indptr.size() * 4), idx(s.kv_indices.size() * 4), last(s.kv_last_page_len.size() * 4);
      FLASHSTEP_CUDA_CHECK(cudaMemset(q.get(), 0x2c, q.bytes()));  // fp16 0x2c2c ~ 0.06
      FLASHSTEP_CUDA_CHECK(cudaMemset(pool.get(), 0x2c, pool.bytes()));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(qo.get(), s.qo_indptr.data(), qo.bytes(), cudaMemcpyHostToDevice));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(kvp.get(), s.kv_indptr.data(), kvp.bytes(), cudaMemcpyHostToDevice));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(idx.get(), s.kv_indices.data(), idx.bytes(), cudaMemcpyHostToDevice));
      FLASHSTEP_CUDA_CHECK(cudaMemcpy(last.get(), s.kv_last_page_len.data(), last.bytes(), cudaMemcpyHostToDevice));
      DeviceBatch batch;
      batch.q = q.get();
      batch.qo_indptr = qo.as<int32_t>();
      batch.kv_indptr = kvp.as<int32_t>();
      batch.kv_pool = pool.get();
      batch.kv_indices = idx.as<int32_t>();
      batch.kv_last_page_len = last.as<int32_t>();
      batch.o = o.get();
      batch.lse = lse.as<float>();
      std::string cells;
      for (const Variant& v : variants) {
        MixedStepAttention attention(v.form, v.decode_stage, v.prefill_stage);
        const double t = median_us(attention, s, D, batch, flush, stream, reps);
        const std::string stages_used =
            attention.decode_stage().empty()
                ? attention.prefill_stage()
                : attention.decode_stage() + (attention.prefill_stage().empty() ? "" : "+" + attention.prefill_stage());
        std::printf("prefill %4d, decodes %3d: %-34s %9.1f us  (%s)\n", P, D, v.describe().c_str(), t,
                    stages_used.c_str());
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s{\"form\": \"%s\", \"asked\": \"%s\", \"stages\": \"%s\", \"us\": %.2f}",
                      cells.empty() ? "" : ", ", bench::to_string(v.form),
                      v.prefill_stage.empty() ? "default" : v.prefill_stage.c_str(), stages_used.c_str(), t);
        cells += buf;
      }
      char head[160];
      std::snprintf(head, sizeof head, "%s    {\"prefill_tokens\": %d, \"decodes\": %d, \"variants\": [",
                    rows.empty() ? "" : ",\n", P, D);
      rows += head + cells + "]}";
    }
  }
  cudaStreamDestroy(stream);
  const std::string json = "{\n  \"device\": \"" + device_description() + "\",\n  \"reps\": " + std::to_string(reps) +
                           ",\n  \"rows\": [\n" + rows + "\n  ]\n}\n";
  if (path) {
    std::ofstream(path) << json;
    std::printf("wrote %s\n", path);
  } else {
    std::printf("%s", json.c_str());
  }
}
