// Stage 09's GPU engine against the reference's generation (ref::generate with the same
// model config, `rounding` set to the engine's dtype): over seeded workloads with and
// without shared prefixes, batches of 1 to 64 running requests, page sizes 1 and 16,
// greedy and seeded top-k/top-p sampling, the engine's tokens must equal the
// reference's. Where they differ, the reference's own decision must have been within
// rounding (the bound below); such steps are counted, reported and must stay under 1%,
// and the run continues from the reference's token. Every step's logits are compared
// within the same bound.
//
// The bound on a logit. The engine and the reference round at the same points (weights,
// the rows entering every projection, Q/K/V in the pool, the attention output), so what
// separates them is fp32 against double arithmetic and, where a value falls within that
// difference of a rounding midpoint, one rounding going the other way: one ulp of the
// storage format, 2u relative (u = 2^-11 for fp16). The budget: the row x entering
// W_vocab carries such differences from the L layers and from its own rounding, L + 1
// rounding stages, each allowed one ulp (2u|x_k|) on every x_k at once, added without
// cancellation. So logit c may move by
//     delta_c = (L + 1) * 2u * sum_k |x_k| |W_vocab[k][c]|,
// computed from the reference's own x (GeneratedRequest::step_hidden). Norm-wise, the same
// budget on the whole row gives ||logits - ref|| <= (L + 1) * 2u * ||ref||. (A budget per
// rounding stage, not a proof over every input: a layer's attention could amplify an
// earlier difference; the test reports each run's largest ratio to it.)
//
// A flipped token is within rounding when
// - greedy: the reference's logit of the engine's token is within delta of its maximum
//   (the top-2 margin is below the two tokens' bounds), and the engine's token is the
//   argmax of the engine's own logits;
// - sampling: the engine's probability row (stage 06 softmax) is within the bound that
//   delta implies (p' / p in [exp(-2 delta / T), exp(2 delta / T)], plus the float
//   softmax's rounding), and the reference's sampler, run on the engine's row with the
//   request's seed and offset, draws the engine's token: the reference's draw lay within
//   that distance of a CDF boundary.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "09_engine/arrival_schedule.hpp"
#include "09_engine/engine.hpp"
#include "09_engine/scheduler.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/sampling.hpp"
#include "flashstep/reference/tiny_decoder.hpp"
#include "phase_timer.hpp"  // flashstep::serve_measure_gpu (bench/serve/): the timing case's phases
#include "registry.hpp"     // default_stage
#include "support/expect_error.hpp"

using namespace flashstep;
using namespace flashstep::stages::engine;
using flashstep::stages::DType;
namespace stages = flashstep::stages;

namespace {

/// The course's engine model: d_model 1024, 8 query / 2 kv heads of head_dim 128, 4 layers, RoPE.
ref::TinyDecoderConfig engine_model() {
  ref::TinyDecoderConfig m;
  m.d_model = 1024;
  m.num_layers = 4;
  m.num_qo_heads = 8;
  m.num_kv_heads = 2;
  m.position_encoding = ref::PositionEncoding::rope;
  m.rope_theta = 1e4;
  return m;
}

double unit_roundoff(DType d) { return d == DType::f16 ? 0x1p-11 : 0x1p-8; }

std::vector<Request> workload(bool shared, int64_t n, uint64_t seed) {
  ArrivalParams p;
  p.seed = seed;
  p.num_requests = n;
  p.arrivals_per_step = 6;
  p.min_prompt_len = 3;
  p.max_prompt_len = 40;
  p.min_new_tokens = 3;
  p.max_new_tokens = 12;
  if (shared) {
    p.num_shared_prefixes = 2;
    p.shared_prefix_len = 37;
    p.shared_fraction = 0.75;
  }
  return ArrivalSchedule::make(p).requests();
}

/// The reference's generation of every request alone (request r draws with key seed + r),
/// logits and hidden rows recorded; requests in parallel threads.
std::vector<ref::GeneratedRequest> reference_run(const ref::TinyDecoder& model, const std::vector<Request>& reqs,
                                                 const SamplingParams& sp) {
  std::vector<ref::GeneratedRequest> out(reqs.size());
  const unsigned workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (unsigned w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      for (size_t r = w; r < reqs.size(); r += workers) {
        ref::GenerationOptions o;
        o.max_new_tokens = reqs[r].max_new_tokens;
        o.temperature = sp.mode == SamplingMode::greedy ? 0.0 : sp.temperature;
        o.top_k = sp.top_k;
        o.top_p = sp.top_p;
        o.seed = sp.seed + r;
        o.record_logits = true;
        const std::string prompt(reqs[r].prompt.begin(), reqs[r].prompt.end());
        out[r] = ref::generate(model, {prompt}, ref::GenerationMode::contiguous_kv_cache, o).requests[0];
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

/// The reference's sampler on one float row (what ref::generate's sampling step does
/// after its softmax), for replaying a draw on the engine's probabilities.
int32_t reference_draw(const std::vector<float>& row, const SamplingParams& sp, uint64_t seed, uint64_t offset) {
  ref::Tensor probs({1, static_cast<int64_t>(row.size())});
  for (size_t i = 0; i < row.size(); ++i) probs.data[i] = row[i];
  ref::SamplingOptions s;
  s.seed = seed;
  s.offset = offset;
  if (sp.top_k > 0 && sp.top_p < 1.0)
    return ref::top_k_top_p_sampling_from_probs(probs, sp.top_k, sp.top_p, ref::FilterApplyOrder::top_k_first, s)
        .samples[0];
  if (sp.top_k > 0) return ref::top_k_sampling_from_probs(probs, sp.top_k, s).samples[0];
  if (sp.top_p < 1.0) return ref::top_p_sampling_from_probs(probs, sp.top_p, s).samples[0];
  return ref::sampling_from_probs(probs, s).samples[0];
}

struct Tally {
  int64_t steps = 0, flips = 0, bad = 0, graph_steps = 0;
  int64_t cascade_graph_steps = 0;  ///< steps whose decode rows ran stage 05 inside a CUDA graph
  int64_t one_call_steps = 0;       ///< mixed steps whose attention was one call (one_launch)
  double worst_ratio = 0;           ///< max over logits of |engine - ref| / delta
  double worst_norm_ratio = 0;      ///< max over steps of ||engine - ref|| / (norm bound)
  double max_abs = 0;               ///< max |engine - ref| over logits
  std::vector<std::string> stages;
  std::vector<std::string> failures;
  void note_stage(const std::string& s) {
    if (!s.empty() && std::find(stages.begin(), stages.end(), s) == stages.end()) stages.push_back(s);
  }
};

struct RunSpec {
  int64_t page_size, max_running, max_tokens_per_step;
  std::string decode_stage, prefill_stage;
  bool cuda_graphs = false;
  bool cascade_when_shared = false;
  bool one_launch = false;
  bool fused_rope = false;  ///< RoPE in the attention stages' loads instead of the RoPE kernel
};

/// Runs the engine over `reqs` step by step against `want` (the reference's tokens and
/// logits), continuing from the reference's token after a flip.
void check_run(const ref::TinyDecoder& model, const EngineConfig& cfg, const std::vector<Request>& reqs,
               const std::vector<ref::GeneratedRequest>& want, Tally& tally) {
  Engine engine(cfg);
  Scheduler scheduler(cfg.scheduler, reqs);
  const double u = unit_roundoff(cfg.dtype);
  const int64_t vocab = model.config().vocab_size, d = model.config().d_model;
  const double rounds = static_cast<double>(model.config().num_layers + 1);
  const ref::Tensor& w = model.w_vocab();
  const SamplingParams& sp = cfg.sampling;
  while (!scheduler.done()) {
    const StepBatch b = scheduler.next_step();
    if (b.batch_size() == 0) {
      scheduler.complete_step({});
      continue;
    }
    const StepOutput out = engine.run_step(b, scheduler);
    tally.graph_steps += out.graph_batch > 0 ? 1 : 0;
    tally.cascade_graph_steps += out.graph_batch > 0 && out.decode_stage == "05_cascade" ? 1 : 0;
    tally.one_call_steps += out.one_call ? 1 : 0;
    CHECK(out.one_call == (cfg.one_launch && b.num_decodes > 0 && b.num_decodes < b.batch_size()));
    if (out.graph_batch > 0) CHECK(out.graph_batch >= b.num_decodes);
    tally.note_stage(out.decode_stage);
    tally.note_stage(out.prefill_stage);
    REQUIRE(out.tokens.size() == b.sample_rows.size());
    REQUIRE(out.logits.size() == b.sample_rows.size() * static_cast<size_t>(vocab));
    std::vector<int32_t> next;
    for (size_t i = 0; i < b.sample_rows.size(); ++i) {
      const int32_t r = b.request_ids[static_cast<size_t>(b.sample_rows[i])];
      const size_t t = scheduler.state(r).generated.size();
      const ref::GeneratedRequest& g = want[static_cast<size_t>(r)];
      REQUIRE(t < g.generated_tokens.size());
      const std::vector<double>& rl = g.step_logits[t];
      const std::vector<double>& x = g.step_hidden[t];
      const float* el = out.logits.data() + i * static_cast<size_t>(vocab);
      ++tally.steps;
      // logits within delta, element-wise and norm-wise
      std::vector<double> delta(static_cast<size_t>(vocab), 0.0);
      for (int64_t k = 0; k < d; ++k)
        for (int64_t c = 0; c < vocab; ++c)
          delta[c] += std::abs(x[k]) * std::abs(w.data[static_cast<size_t>(k * vocab + c)]);
      double err2 = 0, ref2 = 0, worst = 0;
      int64_t worst_c = 0;
      for (int64_t c = 0; c < vocab; ++c) {
        delta[c] *= rounds * 2 * u;
        const double e = std::abs(static_cast<double>(el[c]) - rl[c]);
        err2 += e * e;
        ref2 += rl[c] * rl[c];
        tally.max_abs = std::max(tally.max_abs, e);
        if (!(e / delta[c] <= worst)) worst = e / delta[c], worst_c = c;  // NaN counts as worst
      }
      const double norm_ratio = std::sqrt(err2) / (rounds * 2 * u * std::sqrt(ref2));
      tally.worst_ratio = std::max(tally.worst_ratio, worst);
      tally.worst_norm_ratio = std::max(tally.worst_norm_ratio, norm_ratio);
      const std::string where = "request " + std::to_string(r) + " token " + std::to_string(t) + " (step " +
                                std::to_string(b.step) + ")";
      if (!(worst <= 1.0) || !(norm_ratio <= 1.0)) {
        ++tally.bad;
        if (tally.failures.size() < 8)
          tally.failures.push_back(where + ": logits off: logit " + std::to_string(worst_c) + " |err| / delta = " +
                                   std::to_string(worst) + ", norm ratio " + std::to_string(norm_ratio));
      }
      const int32_t ref_token = g.generated_tokens[t], got = out.tokens[i];
      if (got != ref_token) {
        bool within = false;
        std::string why;
        if (sp.mode == SamplingMode::greedy) {
          const int64_t arg = std::max_element(el, el + vocab) - el;
          within = got >= 0 && got < vocab && arg == got &&
                   rl[static_cast<size_t>(got)] >= rl[static_cast<size_t>(ref_token)] - delta[got] - delta[ref_token];
          why = "reference logits " + std::to_string(rl[ref_token]) + " (its token " + std::to_string(ref_token) +
                ") vs " + std::to_string(rl[got]) + " (engine's " + std::to_string(got) + "), bounds " +
                std::to_string(delta[ref_token]) + " + " + std::to_string(delta[got]);
        } else {
          REQUIRE(out.probs.size() == out.logits.size());
          const std::vector<float> row(out.probs.begin() + static_cast<int64_t>(i * vocab),
                                       out.probs.begin() + static_cast<int64_t>((i + 1) * vocab));
          const double dmax = *std::max_element(delta.begin(), delta.end());
          const double rel = std::expm1(2 * dmax / sp.temperature) + 0x1p-18;
          // the reference's probabilities, in double, as generate() computes them
          double mx = -HUGE_VAL, sum = 0;
          for (double l : rl) mx = std::max(mx, l / sp.temperature);
          std::vector<double> p(rl.size());
          for (size_t c = 0; c < rl.size(); ++c) sum += (p[c] = std::exp(rl[c] / sp.temperature - mx));
          bool close = true;
          double l1 = 0;
          for (size_t c = 0; c < p.size(); ++c) {
            p[c] /= sum;
            l1 += std::abs(row[c] - p[c]);
            close = close && std::abs(row[c] - p[c]) <= rel * p[c] + 0x1p-40;
          }
          const uint64_t seed = sp.seed + static_cast<uint64_t>(r), offset = t * ref::kSamplingOffsetStride;
          const int32_t replay = reference_draw(row, sp, seed, offset);
          within = close && replay == got;
          why = "probabilities within bound: " + std::string(close ? "yes" : "no") + ", L1 distance " +
                std::to_string(l1) + ", reference sampler on the engine's row draws " + std::to_string(replay);
        }
        if (within) {
          ++tally.flips;
          std::printf("  flip within rounding: %s: engine %d, reference %d; %s\n", where.c_str(), got, ref_token,
                      why.c_str());
        } else {
          ++tally.bad;
          if (tally.failures.size() < 8)
            tally.failures.push_back(where + ": engine token " + std::to_string(got) + " != reference " +
                                     std::to_string(ref_token) + ", not within rounding: " + why);
        }
      }
      next.push_back(ref_token);  // continue from the reference's token
    }
    scheduler.complete_step(next);
  }
  // every request generated the reference's tokens (after substitution) to the end
  for (size_t r = 0; r < reqs.size(); ++r)
    REQUIRE(scheduler.state(static_cast<int32_t>(r)).generated == want[r].generated_tokens);
}

EngineConfig make_config(const ref::TinyDecoderConfig& model, DType dtype, const SamplingParams& sp, const RunSpec& run,
                         const std::vector<Request>& reqs) {
  EngineConfig c;
  c.model = model;
  c.dtype = dtype;
  c.sampling = sp;
  c.record_logits = true;
  c.decode_stage = run.decode_stage;
  c.prefill_stage = run.prefill_stage;
  c.cuda_graphs = run.cuda_graphs;
  c.cascade_when_shared = run.cascade_when_shared;
  c.one_launch = run.one_launch;
  c.fused_rope = run.fused_rope;
  c.scheduler.page_size = run.page_size;
  c.scheduler.max_running = run.max_running;
  c.scheduler.max_tokens_per_step = run.max_tokens_per_step;
  int64_t pages = 0;  // room for every request at once
  for (const Request& r : reqs)
    pages += (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + run.page_size - 1) / run.page_size;
  c.scheduler.num_pages = pages;
  return c;
}

void token_check(const ref::TinyDecoderConfig& model_cfg, DType dtype, const std::vector<RunSpec>& runs,
                 const std::vector<SamplingParams>& samplings, int64_t num_requests) {
  ref::TinyDecoderConfig rounded = model_cfg;
  rounded.rounding = dtype == DType::f16 ? ref::StorageRounding::f16 : ref::StorageRounding::bf16;
  const ref::TinyDecoder model(rounded);
  Tally total;
  for (bool shared : {false, true}) {
    const std::vector<Request> reqs = workload(shared, num_requests, shared ? 11 : 7);
    for (const SamplingParams& sp : samplings) {
      const auto want = reference_run(model, reqs, sp);
      for (const RunSpec& run : runs) {
        const EngineConfig cfg = make_config(model_cfg, dtype, sp, run, reqs);
        // The engine computes the reference's model: the same config once rounding is set.
        Tally t;
        try {  // one run's exception is reported and the other runs still go
          check_run(model, cfg, reqs, want, t);
        } catch (const std::exception& e) {
          ++t.bad;
          t.failures.push_back(std::string("exception: ") + e.what());
        }
        std::string stages;
        for (const auto& s : t.stages) stages += (stages.empty() ? "" : ",") + s;
        std::printf(
            "%s prompts, %s, page %lld, max_running %lld, budget %lld%s%s%s: %lld steps (%lld in graphs, %lld cascade "
            "in graphs, %lld one call), %lld flips, %lld failures, max |err| %.3g, max |err|/delta %.3f, max norm ratio "
            "%.3f, stages %s\n",
            shared ? "shared" : "independent", sp.mode == SamplingMode::greedy ? "greedy" : "top-k/top-p sample",
            static_cast<long long>(run.page_size), static_cast<long long>(run.max_running),
            static_cast<long long>(run.max_tokens_per_step), run.cuda_graphs ? ", CUDA graphs" : "",
            run.cascade_when_shared ? ", cascade when shared" : "", run.one_launch ? ", one launch" : "",
            static_cast<long long>(t.steps), static_cast<long long>(t.graph_steps),
            static_cast<long long>(t.cascade_graph_steps), static_cast<long long>(t.one_call_steps),
            static_cast<long long>(t.flips), static_cast<long long>(t.bad), t.max_abs, t.worst_ratio,
            t.worst_norm_ratio, stages.c_str());
        for (const auto& f : t.failures) std::printf("  FAIL %s\n", f.c_str());
        total.steps += t.steps;
        total.flips += t.flips;
        total.bad += t.bad;
        CHECK(t.bad == 0);
        CHECK((t.graph_steps > 0) == run.cuda_graphs);
        // shared prefixes: some decode steps share pages, and with graphs they run stage 05 captured
        if (shared && run.cuda_graphs && run.cascade_when_shared) CHECK(t.cascade_graph_steps > 0);
        if (run.one_launch) CHECK(t.one_call_steps > 0);
      }
    }
  }
  std::printf("total: %lld steps, %lld flips within rounding (%.3f%%), %lld failures\n",
              static_cast<long long>(total.steps), static_cast<long long>(total.flips),
              100.0 * static_cast<double>(total.flips) / static_cast<double>(std::max<int64_t>(total.steps, 1)),
              static_cast<long long>(total.bad));
  CHECK(total.steps > 0);
  CHECK(total.flips * 100 < total.steps);  // under 1% of steps
}

SamplingParams greedy() { return {}; }
SamplingParams top_k_top_p(uint64_t seed) {
  SamplingParams s;
  s.mode = SamplingMode::sample;
  s.temperature = 0.8;
  s.top_k = 40;
  s.top_p = 0.9;
  s.seed = seed;
  return s;
}

}  // namespace

TEST_CASE("09_engine: tokens and logits equal the reference's generation (f16, d_model 1024, 8/2 heads, 4 layers)") {
  // batch 1, 8 and 64 running requests; page sizes 1 and 16; a budget that chunks prompts
  const std::vector<RunSpec> runs = {{16, 64, 512, "", ""},
                                     {1, 64, 512, "", ""},
                                     {16, 8, 48, "", ""},
                                     {1, 1, 16, "", ""},
                                     {16, 64, 512, "05_cascade", "05_cascade"},
                                     {16, 64, 512, "", "", true},
                                     {1, 8, 48, "", "", true},
                                     {16, 64, 512, "", "", true, true}};
  token_check(engine_model(), DType::f16, runs, {greedy(), top_k_top_p(2024)}, 64);
}

TEST_CASE("09_engine: mixed steps in one launch, cascade steps in CUDA graphs: tokens equal the reference's") {
  // one_launch (POD attention) at 64 running requests, and as one call of stage 04 (named
  // prefill stage) at pages of 1 (budgets that mix chunked prefills with decodes);
  // cascade_when_shared with CUDA graphs at 64 running requests; all three at 8
  RunSpec one{16, 64, 512, "", ""}, one_small{1, 8, 48, "", "04_tensor_core"};
  one.one_launch = one_small.one_launch = true;
  RunSpec graphs_cascade{16, 64, 512, "", "", true, true}, all{16, 8, 48, "", "", true, true};
  all.one_launch = true;
  token_check(engine_model(), DType::f16, {one, one_small, graphs_cascade, all}, {greedy(), top_k_top_p(2024)}, 64);
}

TEST_CASE("09_engine: RoPE fused into attention (stage 03 decode, stage 04 prefill) equals the reference") {
  // The pool holds K un-rotated and the stages rotate q and each key as they load them,
  // rounded to the dtype as the RoPE kernel's output is: the reference's model is the
  // same, and a rotation that rounds the other way at a midpoint is one of the ulps the
  // bound allows.
  const ref::TinyDecoderConfig m = engine_model();
  // batch 64 eager and in CUDA graphs (page 16), batch 1 with page 1 and a budget that chunks prompts
  std::vector<RunSpec> runs = {{16, 64, 512, "", "", false, false},
                               {16, 64, 512, "", "", true, false},
                               {1, 1, 16, "03_split_kv", "04_tensor_core", true, false}};
  for (RunSpec& r : runs) r.fused_rope = true;
  token_check(m, DType::f16, runs, {greedy(), top_k_top_p(2024)}, 64);
  token_check(m, DType::bf16, {runs[0], runs[1]}, {greedy()}, 32);
}

TEST_CASE("09_engine: fused_rope refuses what ROPE_LLAMA cannot do, naming it") {
  EngineConfig c;
  c.model = engine_model();
  c.model.num_layers = 1;
  c.scheduler.num_pages = 16;
  c.fused_rope = true;
  EngineConfig interleaved = c;
  interleaved.model.rope_interleave = true;
  test::expect_error([&] { Engine e(interleaved); }, {"fused_rope", "rope_interleave"});
  EngineConfig sinusoidal = c;
  sinusoidal.model.position_encoding = ref::PositionEncoding::sinusoidal;
  test::expect_error([&] { Engine e(sinusoidal); }, {"fused_rope", "position_encoding"});
  EngineConfig cascade = c;
  cascade.cascade_when_shared = true;
  test::expect_error([&] { Engine e(cascade); }, {"fused_rope", "cascade_when_shared"});
  EngineConfig hopper = c;
  hopper.prefill_stage = "07_hopper";
  test::expect_error(
      [&] {
        Engine e(hopper);
        e.generate(workload(false, 1, 1));
      },
      {"prefill_stage", "07_hopper"});
}

TEST_CASE("09_engine: model variants: sinusoidal positions, no W_O, interleaved RoPE, head_dim 64, GQA 4") {
  ref::TinyDecoderConfig a;
  a.d_model = 256;
  a.num_layers = 2;
  a.num_qo_heads = 4;
  a.num_kv_heads = 1;
  a.output_projection = false;
  a.position_encoding = ref::PositionEncoding::sinusoidal;
  ref::TinyDecoderConfig b = a;
  b.output_projection = true;
  b.position_encoding = ref::PositionEncoding::rope;
  b.rope_interleave = true;
  b.rope_theta = 5e5;
  b.weight_seed = 99;
  const std::vector<RunSpec> runs = {{16, 32, 256, "", ""}, {1, 5, 24, "", ""}};
  for (const auto& m : {a, b}) token_check(m, DType::f16, runs, {greedy(), top_k_top_p(5)}, 24);
}

TEST_CASE(
    "09_engine: stage 05 runs (named, and cascade_when_shared eager and in CUDA graphs): tokens equal the reference's") {
  // the cascade's runs of the two cases above, greedy only: a quick check of stage 05's
  // planner as the engine drives it (workspace_bytes, then plan, every step)
  RunSpec named{16, 64, 512, "05_cascade", "05_cascade"}, eager{16, 64, 512, "", ""};
  eager.cascade_when_shared = true;
  RunSpec graphs{16, 64, 512, "", "", true, true}, small{16, 8, 48, "", "", true, true};
  token_check(engine_model(), DType::f16, {named, eager, graphs, small}, {greedy()}, 64);
}

namespace {
/// A two-layer engine over 64 pages of 16, 4 requests at a time: the short runs below.
EngineConfig short_run_config() {
  EngineConfig c;
  c.model = engine_model();
  c.model.num_layers = 2;
  c.scheduler.page_size = 16;
  c.scheduler.num_pages = 64;
  c.scheduler.max_running = 4;
  c.scheduler.max_tokens_per_step = 64;
  return c;
}
}  // namespace

TEST_CASE("09_engine: a short run (for compute-sanitizer)") {
  EngineConfig c = short_run_config();
  c.sampling = top_k_top_p(1);
  const auto reqs = workload(true, 4, 3);
  for (int variant = 0; variant < 3; ++variant) {  // eager; decode steps as CUDA graphs; + cascade, one launch
    c.cuda_graphs = variant > 0;
    c.cascade_when_shared = c.one_launch = variant == 2;
    Engine engine(c);
    const GenerationRun run = engine.generate(reqs);
    REQUIRE(run.tokens.size() == reqs.size());
    for (size_t r = 0; r < reqs.size(); ++r)
      CHECK(static_cast<int64_t>(run.tokens[r].size()) == reqs[r].max_new_tokens);
  }
}

// Records each boundary an engine reports: the phase, its layer, and whether the stream was
// being captured into a CUDA graph.
struct PhaseLog : StepObserver {
  struct Call {
    StepPhase phase;
    int64_t layer;
    bool captured;
  };
  std::vector<Call> calls;
  void on_phase(StepPhase phase, int64_t layer, cudaStream_t stream) override {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    REQUIRE(cudaStreamIsCapturing(stream, &capturing) == cudaSuccess);
    calls.push_back({phase, layer, capturing == cudaStreamCaptureStatusActive});
  }
};

TEST_CASE("09_engine: an observer hears every step's phases in order, a graph's only when it is captured") {
  EngineConfig c = short_run_config();
  c.cuda_graphs = true;
  PhaseLog log;
  c.observer = &log;
  Engine engine(c);
  Scheduler scheduler(c.scheduler, workload(true, 4, 3));
  // what forward() reports: the embedding, every layer's three phases, the logits
  std::vector<std::pair<StepPhase, int64_t>> forward{{StepPhase::embed, -1}};
  for (int64_t l = 0; l < c.model.num_layers; ++l)
    for (StepPhase p : {StepPhase::projection, StepPhase::attention, StepPhase::output}) forward.push_back({p, l});
  forward.push_back({StepPhase::logits, -1});
  int64_t eager = 0, captured = 0, replayed = 0;
  while (!scheduler.done()) {
    const StepBatch b = scheduler.next_step();
    if (b.batch_size() == 0) {
      scheduler.complete_step({});
      continue;
    }
    log.calls.clear();
    const StepOutput out = engine.run_step(b, scheduler);
    scheduler.complete_step(out.tokens);
    const std::vector<PhaseLog::Call>& calls = log.calls;
    INFO("step " << b.step << ", graph batch " << out.graph_batch << ", " << calls.size() << " boundaries");
    // host, model, then forward() 0 times (a replay), once (eager) or twice (the eager pass
    // before a capture, then the capture), then sampling, read_back, done
    REQUIRE(calls.size() >= 5);
    const size_t passes = (calls.size() - 5) / forward.size();
    REQUIRE(calls.size() == 5 + passes * forward.size());
    CHECK(calls[0].phase == StepPhase::host);
    CHECK(calls[1].phase == StepPhase::model);
    for (size_t pass = 0; pass < passes; ++pass)
      for (size_t i = 0; i < forward.size(); ++i) {
        const PhaseLog::Call& call = calls[2 + pass * forward.size() + i];
        CHECK(call.phase == forward[i].first);
        CHECK(call.layer == forward[i].second);
        CHECK(call.captured == (pass == 1));  // only the second pass is the capture
      }
    CHECK(calls[calls.size() - 3].phase == StepPhase::sampling);
    CHECK(calls[calls.size() - 2].phase == StepPhase::read_back);
    CHECK(calls[calls.size() - 1].phase == StepPhase::done);
    if (out.graph_batch == 0) {
      CHECK(passes == 1);
      ++eager;
    } else {
      CHECK((passes == 0 || passes == 2));
      ++(passes == 2 ? captured : replayed);
    }
  }
  CHECK(eager > 0);     // the prefill steps
  CHECK(captured > 0);  // a padded decode batch's first step
  CHECK(replayed > 0);  // its later steps
}

TEST_CASE("09_engine: bad input is refused, naming it") {
  EngineConfig c;
  c.model = engine_model();
  c.model.num_layers = 1;
  c.scheduler.page_size = 16;
  c.scheduler.num_pages = 4;
  c.scheduler.max_running = 4;
  c.scheduler.max_tokens_per_step = 64;
  using flashstep::test::expect_error;
  expect_error([] { parse_sampling_mode("beam"); }, {"sampling mode", "beam"});
  {
    EngineConfig bad = c;
    bad.dtype = DType::f32;
    expect_error([&] { Engine e(bad); }, {"Engine", "dtype", "f32"});
    bad = c;
    bad.sampling.mode = static_cast<SamplingMode>(7);
    expect_error([&] { Engine e(bad); }, {"Engine", "sampling mode"});
    bad = c;
    bad.sampling.mode = SamplingMode::sample;
    bad.sampling.temperature = 0;
    expect_error([&] { Engine e(bad); }, {"Engine", "temperature"});
    bad = c;
    bad.prefill_stage = "99_nothing";
    expect_error([&] { Engine e(bad); }, {"find_stage", "99_nothing"});
  }
  Engine engine(c);
  Request ok{0, {1, 2, 3}, 4, -1};
  expect_error([&] { engine.generate({ok, Request{0, {}, 4, -1}}); }, {"Scheduler", "request 1", "prompt is empty"});
  Request long_prompt{0, std::vector<int32_t>(65, 7), 1, -1};  // the pool holds 4 * 16 = 64 slots
  expect_error([&] { engine.generate({long_prompt}); }, {"Scheduler", "longer than the whole pool"});
  Request big{0, std::vector<int32_t>(40, 7), 40, -1};  // 79 tokens: 5 pages, the pool has 4
  expect_error([&] { engine.generate({big}); }, {"Scheduler", "num_pages 4 is too small to admit any request"});
  expect_error([&] { engine.generate({Request{0, {1, 300}, 2, -1}}); }, {"Engine::generate", "prompt[1] = 300"});
  // a stage that cannot run the step is refused with its reason
  EngineConfig ragged = c;
  ragged.prefill_stage = "04_tensor_core_ragged";
  Engine wrong(ragged);
  expect_error([&] { wrong.generate({ok}); }, {"prefill_stage", "04_tensor_core_ragged", "cannot run this step"});
}

TEST_CASE("09_engine: step timing, batch 64 decode (prints, not a timed test)" * doctest::skip()) {
  EngineConfig c;
  c.model = engine_model();
  c.scheduler.page_size = 16;
  c.scheduler.max_running = 64;
  c.scheduler.max_tokens_per_step = 64 * 256;  // every prompt in step 0
  c.scheduler.num_pages = 64 * 20;
  std::vector<Request> reqs;
  for (int r = 0; r < 64; ++r) reqs.push_back(Request{0, std::vector<int32_t>(256, 32 + r), 32, -1});
  for (int variant = 0; variant < 3; ++variant) {
    const SamplingMode mode = variant == 1 ? SamplingMode::sample : SamplingMode::greedy;
    c.sampling = mode == SamplingMode::greedy ? greedy() : top_k_top_p(3);
    c.cuda_graphs = variant == 2;
    bench::PhaseTimer timer(c.model.num_layers);
    c.observer = &timer;
    Engine engine(c);
    engine.generate(reqs);  // warm-up (cuBLAS heuristics, first launches)
    timer.clear();
    engine.generate(reqs);
    const std::vector<bench::StepTiming>& timing = timer.steps();
    bench::StepTiming sum;
    int n = 0;
    for (size_t s = 1; s < timing.size(); ++s, ++n) {  // step 0 is the prefill of every prompt
      const bench::StepTiming& t = timing[s];
      sum.host_ms += t.host_ms, sum.embed_ms += t.embed_ms, sum.projection_ms += t.projection_ms;
      sum.attention_ms += t.attention_ms, sum.logits_ms += t.logits_ms, sum.sampling_ms += t.sampling_ms;
      sum.total_ms += t.total_ms;
    }
    REQUIRE(n > 0);
    std::printf(
        "%s, %s, batch 64 decode, kv 257-287, %d steps, mean ms per step (CUDA events): total %.3f = host %.3f + "
        "embed %.3f + projections %.3f + attention %.3f + logits %.3f + sampling %.3f; prefill step 0 %.3f ms\n",
        to_string(mode), c.cuda_graphs ? "CUDA graphs" : "eager", n, sum.total_ms / n, sum.host_ms / n,
        sum.embed_ms / n, sum.projection_ms / n, sum.attention_ms / n, sum.logits_ms / n, sum.sampling_ms / n,
        timing[0].total_ms);
  }
}

TEST_SUITE("host") {
TEST_CASE("09_engine: default_stage applies flashstep.cuda's rule, and a shape no stage runs is refused with reasons") {
  stages::BatchShape s;
  s.mode = stages::Mode::decode;
  s.storage = stages::KVStorage::paged;
  s.dtype = DType::f16;
  s.num_qo_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.page_size = 16;
  s.num_pages = 4;
  s.batch_size = 1;
  s.qo_indptr = {0, 1};
  s.kv_indptr = {0, 1};
  s.kv_last_page_len = {3};
  s.kv_indices = {0};
  CHECK(default_stage(s) == "03_split_kv");  // a decode of GQA group <= 8
  s.head_dim = 96;  // group <= 8 but no stage takes it: every stage is asked, every reason listed
  flashstep::test::expect_error([&] { default_stage(s); },
                                {"default_stage", "no stage runs", "03_split_kv", "02_paged", "head_dim 96"});
  s.head_dim = 64;
  s.num_qo_heads = 32;  // group 16: past the decode stages' groups
  CHECK(default_stage(s) != "03_split_kv");
  s.num_qo_heads = 8;
  s.mode = stages::Mode::prefill;
  s.causal = true;
  CHECK(default_stage(s) == "04_tensor_core");  // head_dim 64 paged prefill: stage 07 takes 128 only
  s.head_dim = 96;
  flashstep::test::expect_error([&] { default_stage(s); }, {"default_stage", "no stage runs", "head_dim 96"});
  CHECK(to_string(parse_sampling_mode("sample")) == std::string("sample"));
}
}  // TEST_SUITE("host")
