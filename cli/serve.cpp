// `flashstep serve`: stage 09's engine on a seeded workload (the arrival schedule), the
// tiny decoder at the engine's configuration; prints the run and, with --profile, the
// mean time per step split into its phases. Needs a GPU and a CUDA build (exit 77).
#include <chrono>
#include <cstdio>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"

#if defined(FLASHSTEP_CLI_HAVE_ENGINE)
#include "09_engine/arrival_schedule.hpp"
#include "09_engine/engine.hpp"
#include "phase_timer.hpp"  // flashstep::serve_measure_gpu (bench/serve/): --profile's phases
#include "serve_measure.hpp"
#endif

namespace flashstep::cli {

#if defined(FLASHSTEP_CLI_HAVE_ENGINE)

namespace {

using namespace flashstep::stages::engine;
using bench::PhaseTimer;
using bench::StepTiming;

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

int run_serve(const ServeOptions& opt, std::ostream& os) {
  // the values a GPU is not needed to judge, judged first (InvalidArgument: exit 2)
  const SamplingMode mode = parse_sampling_mode(opt.sampling);
  const stages::DType dtype = stages::parse_dtype(opt.dtype);
  std::string why;
  if (!usable_gpu(&why)) {
    os << "flashstep serve: skipped: " << why << ".\n";
    return kExitSkipped;
  }
  ArrivalParams ap;
  ap.seed = opt.seed;
  ap.num_requests = opt.requests;
  ap.arrivals_per_step = opt.arrivals_per_step;
  ap.min_prompt_len = opt.min_prompt;
  ap.max_prompt_len = opt.max_prompt;
  ap.min_new_tokens = opt.min_new;
  ap.max_new_tokens = opt.max_new;
  if (opt.shared_prefix_len > 0) {
    ap.num_shared_prefixes = opt.shared_prefixes;
    ap.shared_prefix_len = opt.shared_prefix_len;
    ap.shared_fraction = opt.shared_fraction;
  }
  const ArrivalSchedule schedule = ArrivalSchedule::make(ap);

  EngineConfig c;
  c.model.d_model = opt.d_model;
  c.model.num_layers = opt.layers;
  c.model.num_qo_heads = opt.qo_heads;
  c.model.num_kv_heads = opt.kv_heads;
  c.model.position_encoding = ref::PositionEncoding::rope;
  c.dtype = dtype;
  c.scheduler.page_size = opt.page_size;
  c.scheduler.max_running = opt.max_running;
  c.scheduler.max_tokens_per_step = opt.budget;
  c.scheduler.prefix_sharing = !opt.no_sharing;
  int64_t pages = 0;
  for (const Request& r : schedule.requests())
    pages += (static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens + opt.page_size - 1) / opt.page_size;
  c.scheduler.num_pages = opt.num_pages > 0 ? opt.num_pages : pages;
  c.sampling.mode = mode;
  c.sampling.temperature = opt.temperature;
  c.sampling.top_k = opt.top_k;
  c.sampling.top_p = opt.top_p;
  c.sampling.seed = opt.seed;
  c.decode_stage = opt.decode_stage;
  c.prefill_stage = opt.prefill_stage;
  c.cuda_graphs = opt.cuda_graphs;
  c.cascade_when_shared = opt.cascade;
  c.one_launch = opt.one_launch;
  c.tuned_gemms = !opt.default_gemms;
  c.fused_rope = opt.fused_rope;

  if (!opt.json.empty()) return run_serve_measure(opt, schedule.requests(), c, os);  // serve_measure.cpp
  // --profile: the engine reports each step's phase boundaries to a timer (before the
  // engine, so that it outlives it)
  std::unique_ptr<PhaseTimer> timer;
  if (opt.profile) {
    timer = std::make_unique<PhaseTimer>(c.model.num_layers);
    c.observer = timer.get();
  }
  Engine engine(c);
  os << "flashstep serve: " << opt.requests << " requests (seed " << opt.seed << "), model d_model " << opt.d_model
     << ", " << opt.layers << " layers, " << opt.qo_heads << "/" << opt.kv_heads << " heads, " << opt.dtype << "; pool "
     << c.scheduler.num_pages << " pages of " << opt.page_size << ", max_running " << opt.max_running << ", budget "
     << opt.budget << " tokens/step, prefix sharing " << (opt.no_sharing ? "off" : "on") << ", sampling "
     << opt.sampling << (opt.fused_rope ? ", RoPE fused into attention" : "") << "\n";
  if (opt.show_step >= 0) {  // one step of the run, as the scheduler built it and the engine ran it
    Scheduler scheduler(c.scheduler, schedule.requests());
    while (!scheduler.done()) {
      const StepBatch b = scheduler.next_step();
      if (b.batch_size() == 0) {
        scheduler.complete_step({});
        continue;
      }
      const StepOutput out = engine.run_step(b, scheduler);
      if (b.step == opt.show_step) {
        os << b.describe();
        os << "attention: ";
        if (out.one_call) os << "decode and prefill rows in one call -> " << out.prefill_stage;
        else
          os << (out.decode_stage.empty() ? std::string("no decode rows") : "decode rows -> " + out.decode_stage)
             << ", "
             << (out.prefill_stage.empty() ? std::string("no prefill rows") : "prefill rows -> " + out.prefill_stage);
        os << (out.graph_batch > 0 ? ", CUDA graph of batch " + std::to_string(out.graph_batch) : std::string())
           << "\nsampled:";
        for (size_t i = 0; i < out.tokens.size(); ++i)
          os << " r" << b.request_ids[static_cast<size_t>(b.sample_rows[i])] << "=" << out.tokens[i];
        os << "\n";
      }
      scheduler.complete_step(out.tokens);
    }
  }
  if (timer) {  // a warm-up run, not reported
    engine.generate(schedule.requests());
    timer->clear();
  }
  const auto t0 = std::chrono::steady_clock::now();
  const GenerationRun run = engine.generate(schedule.requests());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t tokens = 0;
  for (const auto& t : run.tokens) tokens += static_cast<int64_t>(t.size());
  os << run.steps << " steps, " << tokens << " tokens generated in " << ms(seconds * 1e3) << " ms ("
     << static_cast<int64_t>(static_cast<double>(tokens) / seconds) << " tokens/s"
     << (opt.profile ? ", with CUDA events" : "") << "); pages: peak " << run.peak_pages << ", allocated "
     << run.pages_allocated << "\n";
  // K and V of every layer, in the storage dtype, per token slot of a page
  const int64_t slot_bytes = 2 * opt.kv_heads * (opt.d_model / opt.qo_heads) * opt.layers *
                             static_cast<int64_t>(stages::dtype_bytes(dtype));
  os << "KV bytes: peak " << ms(static_cast<double>(run.peak_pages * opt.page_size * slot_bytes) / (1 << 20))
     << " MiB, allocated over the run "
     << ms(static_cast<double>(run.pages_allocated * opt.page_size * slot_bytes) / (1 << 20)) << " MiB (" << slot_bytes
     << " bytes per token slot)\n";
  for (size_t r = 0; r < run.tokens.size() && r < 4; ++r) {
    os << "  r" << r << ":";
    for (int32_t t : run.tokens[r]) os << " " << t;
    os << "\n";
  }
  if (timer && !timer->steps().empty()) {
    const std::vector<StepTiming>& steps = timer->steps();
    StepTiming s;
    for (const StepTiming& t : steps) {
      s.host_ms += t.host_ms, s.embed_ms += t.embed_ms, s.projection_ms += t.projection_ms;
      s.attention_ms += t.attention_ms, s.logits_ms += t.logits_ms, s.sampling_ms += t.sampling_ms;
      s.total_ms += t.total_ms;
    }
    const double n = static_cast<double>(steps.size());
    os << "mean per step over " << steps.size() << " steps (ms): total " << ms(s.total_ms / n) << " = host "
       << ms(s.host_ms / n) << " + embed " << ms(s.embed_ms / n) << " + projections " << ms(s.projection_ms / n)
       << " + attention " << ms(s.attention_ms / n) << " + logits " << ms(s.logits_ms / n) << " + sampling "
       << ms(s.sampling_ms / n) << "\n";
  }
  return 0;
}

#else

int run_serve(const ServeOptions&, std::ostream& os) {
  os << "flashstep serve: skipped: this build has no CUDA engine (configure with a CUDA compiler).\n";
  return kExitSkipped;
}

#endif

}  // namespace flashstep::cli
