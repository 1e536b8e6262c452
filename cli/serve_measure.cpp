// `flashstep serve --json FILE` (serve_measure.hpp): every variant of a workload run by the
// engine twice after a warm-up each (without CUDA events: each step's time on the host's
// clock; with them: the phases of each step, bench/serve/phase_timer.hpp), the read ceiling and the launch floor
// measured in the same process, each decode step's floor (bench/serve/step_floor.hpp),
// the goals, and the results file (bench/serve/serve_results.hpp).
#if defined(FLASHSTEP_CLI_HAVE_ENGINE)

#include "serve_measure.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch_floor.hpp"  // flashstep::ceilings (bench/ceilings/), one of the two libraries of bench/ the CLI links
#include "measured_model.hpp"  // flashstep::ceilings
#include "phase_timer.hpp"     // flashstep::serve_measure_gpu (bench/serve/), the other
#include "read_ceiling.hpp"    // flashstep::ceilings
#include "serve_results.hpp"   // flashstep::serve_measure
#include "step_floor.hpp"      // flashstep::serve_measure

namespace flashstep::cli {

namespace {

using namespace flashstep::stages::engine;
using namespace flashstep::bench;
using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("serve --json: ") + what + ": " + cudaGetErrorString(e));
}

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

// The median of the times (us) `run` takes between two events, over `repeats` calls after
// `warmups` untimed ones.
template <typename Run>
double median_us(Run run, int warmups, int repeats, cudaStream_t stream) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < warmups; ++i) run();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    check(cudaEventRecord(a, stream), "cudaEventRecord");
    run();
    check(cudaEventRecord(b, stream), "cudaEventRecord");
    check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The read ceiling (bench/ceilings/read_ceiling.hpp): GB/s of the read kernel streaming a
// buffer of at least 1 GiB and 16 times the L2, the median of 10 passes.
double read_ceiling(double* buffer_bytes, cudaStream_t stream) {
  int device = 0, l2 = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
  const size_t bytes = std::max<size_t>(size_t{1} << 30, size_t{16} * static_cast<size_t>(l2)) / 16 * 16;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  check(cudaMalloc(&buf, bytes), "cudaMalloc (read ceiling buffer)");
  check(cudaMemset(buf, 1, bytes), "cudaMemset");
  const bench::ReadConfig rc;
  const int blocks = bench::read_grid_blocks(rc);
  check(cudaMalloc(reinterpret_cast<void**>(&sink), static_cast<size_t>(blocks) * 4), "cudaMalloc");
  const double us = median_us([&] { bench::read_only(buf, bytes, sink, blocks, rc.threads, stream); }, 3, 10, stream);
  cudaFree(buf);
  cudaFree(sink);
  *buffer_bytes = static_cast<double>(bytes);
  return static_cast<double>(bytes) / (us * 1e3);
}

// The launch floor of `kernels` launches: a graph of that many empty kernels
// (bench/ceilings/launch_floor.hpp), the median of 50 replays.
double launch_floor(int kernels, cudaStream_t stream) {
  const bench::LaunchFloor floor(kernels);
  return median_us([&] { floor.run(stream); }, 10, 50, stream);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct Variant {
  std::string name;
  EngineConfig config;
};

struct RunResult {
  std::vector<StepRecord> steps;
  int64_t n_steps = 0, tokens = 0, peak_pages = 0, pages_allocated = 0;
  double seconds = 0;  // next_step, run_step and complete_step of every step, nothing else
};

// One run of the workload on `engine`: each step timed on the host's clock around
// run_step (and its phases, from `timer`, where it is the engine's observer). Records step
// `show` into `shown`.
RunResult run_once(Engine& engine, const EngineConfig& c, const std::vector<Request>& requests, int64_t show,
                   ShownStep* shown, const PhaseTimer* timer, std::ostream& os) {
  RunResult r;
  Scheduler scheduler(c.scheduler, requests);
  while (!scheduler.done()) {
    auto t0 = Clock::now();
    const StepBatch b = scheduler.next_step();
    double spent = us_since(t0);
    if (b.batch_size() == 0) {
      t0 = Clock::now();
      scheduler.complete_step({});
      r.seconds += (spent + us_since(t0)) * 1e-6;
      continue;
    }
    t0 = Clock::now();
    const StepOutput out = engine.run_step(b, scheduler);
    const double wall = us_since(t0);
    t0 = Clock::now();
    scheduler.complete_step(out.tokens);
    r.seconds += (spent + wall + us_since(t0)) * 1e-6;
    // bookkeeping, outside the time
    StepRecord s;
    s.step = b.step;
    s.decodes = b.num_decodes;
    s.prefills = b.num_prefills;
    s.tokens = b.nnz();
    const KvSlots kv = decode_kv_slots(b, c.scheduler.page_size);
    s.kv_flat = kv.flat;
    s.kv_unique = kv.unique;
    s.graph_batch = out.graph_batch;
    s.graph_launches = out.graph_launches;
    s.wall_us = wall;
    s.decode_stage = out.decode_stage;
    s.prefill_stage = out.prefill_stage;
    if (timer != nullptr) {
      const StepTiming& t = timer->last();
      s.host_us = t.host_ms * 1e3, s.embed_us = t.embed_ms * 1e3, s.projection_us = t.projection_ms * 1e3;
      s.attention_us = t.attention_ms * 1e3, s.logits_us = t.logits_ms * 1e3, s.sampling_us = t.sampling_ms * 1e3;
      s.total_us = t.total_ms * 1e3;
    }
    r.steps.push_back(s);
    if (shown != nullptr && b.step == show) {
      shown->step = b.step;
      shown->arrays = b.describe();
      shown->decode_stage = out.decode_stage;
      shown->prefill_stage = out.prefill_stage;
      shown->graph_batch = out.graph_batch;
      shown->group_size = c.model.num_qo_heads / c.model.num_kv_heads;
      std::map<int32_t, int> readers;
      for (int32_t p = 0; p < b.kv_indptr[static_cast<size_t>(b.num_decodes)]; ++p)
        ++readers[b.kv_indices[static_cast<size_t>(p)]];
      shown->shared_pages = std::count_if(readers.begin(), readers.end(), [](const auto& kv) { return kv.second > 1; });
      shown->cascade_option = c.cascade_when_shared;
      shown->num_decodes = b.num_decodes;
      shown->qo_indptr = b.qo_indptr;
      shown->kv_indptr = b.kv_indptr;
      shown->kv_indices = b.kv_indices;
      shown->kv_last_page_len = b.kv_last_page_len;
      for (size_t i = 0; i < out.tokens.size(); ++i) {
        shown->sampled_requests.push_back(b.request_ids[static_cast<size_t>(b.sample_rows[i])]);
        shown->sampled_tokens.push_back(out.tokens[i]);
      }
      os << b.describe() << "attention: "
         << (out.decode_stage.empty() ? std::string("no decode rows") : "decode rows -> " + out.decode_stage) << ", "
         << (out.prefill_stage.empty() ? std::string("no prefill rows") : "prefill rows -> " + out.prefill_stage)
         << (out.graph_batch > 0 ? ", CUDA graph of batch " + std::to_string(out.graph_batch) : std::string())
         << "\nsampled:";
      for (size_t i = 0; i < out.tokens.size(); ++i)
        os << " r" << shown->sampled_requests[i] << "=" << shown->sampled_tokens[i];
      os << "\n";
    }
  }
  r.n_steps = scheduler.steps();
  r.peak_pages = scheduler.peak_used_pages();
  r.pages_allocated = scheduler.pages_allocated();
  for (size_t q = 0; q < requests.size(); ++q)
    r.tokens += static_cast<int64_t>(scheduler.state(static_cast<int32_t>(q)).generated.size());
  return r;
}

std::string f1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}
std::string f3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

}  // namespace

int run_serve_measure(const ServeOptions& opt, const std::vector<Request>& workload, const EngineConfig& base,
                      std::ostream& os) {
  std::vector<Request> requests = workload;
  if (opt.prefix_study)  // the first request alone; the others find its prefix cached
    for (size_t i = 0; i < requests.size(); ++i) requests[i].arrival_step = i == 0 ? 0 : 1;
  std::vector<Variant> variants;
  if (opt.prefix_study) {  // each eager, then with CUDA graphs
    for (const bool graphs : {false, true})
      for (const std::string name : {"sharing_cascade", "sharing", "no_sharing"}) {
        Variant v{graphs ? name + "_graphs" : name, base};
        v.config.scheduler.prefix_sharing = name != "no_sharing";
        v.config.cascade_when_shared = name == "sharing_cascade";
        v.config.cuda_graphs = graphs;
        variants.push_back(v);
      }
  } else {
    for (const bool graphs : {false, true}) {
      Variant v{graphs ? "graphs" : "eager", base};
      v.config.cuda_graphs = graphs;
      variants.push_back(v);
    }
  }

  ServeRecord rec;
  rec.what = opt.what;
  cudaDeviceProp prop{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  rec.device = prop.name;
  rec.commit = env("FLASHSTEP_COMMIT").empty() ? "unknown" : env("FLASHSTEP_COMMIT");
  rec.tree = env("FLASHSTEP_TREE");
  rec.command = opt.command;
  rec.date = utc_now();
  rec.note = opt.note;
  const EngineConfig& c = base;
  const int64_t elem = static_cast<int64_t>(stages::dtype_bytes(c.dtype));
  rec.slot_bytes = kv_slot_bytes(c.model, elem);
  rec.page_size = c.scheduler.page_size;
  rec.goal_batch = 64;
  rec.weight_bytes = step_weight_bytes(c.model, elem, rec.goal_batch);
  auto num = [](double x) { return json_number(x); };
  rec.config = {{"requests", num(static_cast<double>(opt.requests))},
                {"seed", num(static_cast<double>(opt.seed))},
                {"arrivals_per_step", num(opt.arrivals_per_step)},
                {"min_prompt", num(static_cast<double>(opt.min_prompt))},
                {"max_prompt", num(static_cast<double>(opt.max_prompt))},
                {"min_new", num(static_cast<double>(opt.min_new))},
                {"max_new", num(static_cast<double>(opt.max_new))},
                {"shared_prefix_len", num(static_cast<double>(opt.shared_prefix_len))},
                {"shared_prefixes", num(static_cast<double>(opt.shared_prefix_len > 0 ? opt.shared_prefixes : 0))},
                {"shared_fraction", num(opt.shared_prefix_len > 0 ? opt.shared_fraction : 0)},
                {"first_request_alone", opt.prefix_study ? "true" : "false"},
                {"d_model", num(static_cast<double>(c.model.d_model))},
                {"layers", num(static_cast<double>(c.model.num_layers))},
                {"qo_heads", num(static_cast<double>(c.model.num_qo_heads))},
                {"kv_heads", num(static_cast<double>(c.model.num_kv_heads))},
                {"vocab_size", num(static_cast<double>(c.model.vocab_size))},
                {"position_encoding", json_string(ref::to_string(c.model.position_encoding))},
                {"dtype", json_string(opt.dtype)},
                {"page_size", num(static_cast<double>(c.scheduler.page_size))},
                {"num_pages", num(static_cast<double>(c.scheduler.num_pages))},
                {"max_running", num(static_cast<double>(c.scheduler.max_running))},
                {"budget", num(static_cast<double>(c.scheduler.max_tokens_per_step))},
                {"prefix_sharing", opt.no_sharing ? "false" : "true"},
                {"cascade", opt.cascade ? "true" : "false"},
                {"cuda_graphs", opt.cuda_graphs ? "true" : "false"},
                {"sampling", json_string(opt.sampling)},
                {"temperature", num(opt.temperature)},
                {"top_k", num(static_cast<double>(opt.top_k))},
                {"top_p", num(opt.top_p)},
                {"decode_stage", json_string(opt.decode_stage)},
                {"prefill_stage", json_string(opt.prefill_stage)}};

  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  rec.read_gbps = read_ceiling(&rec.read_buffer_bytes, stream);
  rec.launch_floor_1_us = launch_floor(1, stream);
  os << "flashstep serve --json: " << rec.device << "; read ceiling " << f1(rec.read_gbps) << " GB/s ("
     << f1(rec.read_buffer_bytes / (1 << 20)) << " MiB streamed), launch floor of one kernel "
     << f3(rec.launch_floor_1_us) << " us\n";
  // The planners of every variant price with what was just measured on this GPU.
  stages::use_device_model(bench::measured_device_model(stages::device_model(), rec.read_gbps, rec.launch_floor_1_us));

  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const Variant& v = variants[vi];
    VariantRecord vr;
    vr.name = v.name;
    vr.cuda_graphs = v.config.cuda_graphs;
    vr.prefix_sharing = v.config.scheduler.prefix_sharing;
    vr.cascade = v.config.cascade_when_shared;
    RunResult timed, profiled;
    {
      EngineConfig plain = v.config;
      plain.observer = nullptr;
      Engine engine(plain);
      run_once(engine, plain, requests, -1, nullptr, nullptr, os);  // warm-up: cuBLAS, first launches, graph captures
      timed = run_once(engine, plain, requests, vi == 0 ? opt.show_step : -1, vi == 0 ? &rec.shown : nullptr, nullptr,
                       os);
    }
    {
      PhaseTimer timer(v.config.model.num_layers);  // before the engine: it outlives the engine
      EngineConfig prof = v.config;
      prof.observer = &timer;
      Engine engine(prof);
      run_once(engine, prof, requests, -1, nullptr, &timer, os);
      profiled = run_once(engine, prof, requests, -1, nullptr, &timer, os);
    }
    vr.steps = timed.n_steps;
    vr.tokens = timed.tokens;
    vr.seconds = timed.seconds;
    vr.peak_pages = timed.peak_pages;
    vr.pages_allocated = timed.pages_allocated;
    vr.steps_recorded = timed.steps;
    // the phases of the same step of the run with events (the same schedule: the same steps)
    std::map<int64_t, const StepRecord*> by_step;
    for (const StepRecord& s : profiled.steps) by_step[s.step] = &s;
    for (StepRecord& s : vr.steps_recorded) {
      const auto it = by_step.find(s.step);
      if (it == by_step.end() || it->second->decodes != s.decodes || it->second->prefills != s.prefills) continue;
      const StepRecord& p = *it->second;
      s.host_us = p.host_us, s.embed_us = p.embed_us, s.projection_us = p.projection_us;
      s.attention_us = p.attention_us, s.logits_us = p.logits_us, s.sampling_us = p.sampling_us;
      s.total_us = p.total_us;
    }
    rec.variants.push_back(vr);
  }

  // Each decode-only step's floor: its weight and KV bytes at the read ceiling, plus the
  // launch floor of its graph's launches and the sampler's one (an eager step: those of the
  // graph of the same padded batch in any variant, the same kernels launched one by one).
  std::map<int64_t, int64_t> launches_of_batch;
  for (const VariantRecord& v : rec.variants)
    for (const StepRecord& s : v.steps_recorded)
      if (s.graph_batch > 0) launches_of_batch[s.graph_batch] = s.graph_launches + 1;
  std::map<int64_t, double> floor_of_launches;
  for (VariantRecord& v : rec.variants) {
    for (StepRecord& s : v.steps_recorded) {
      if (s.prefills != 0 || s.decodes == 0) continue;
      int64_t padded = 1;
      while (padded < s.decodes) padded *= 2;
      const auto it = launches_of_batch.find(s.graph_batch > 0 ? s.graph_batch : padded);
      if (it == launches_of_batch.end()) continue;
      auto& lf = floor_of_launches[it->second];
      if (lf <= 0) lf = launch_floor(static_cast<int>(it->second), stream);
      const int64_t bytes = step_weight_bytes(c.model, elem, s.decodes) + s.kv_unique * rec.slot_bytes;
      s.floor_us = floor_us(bytes, rec.read_gbps, lf);
      if (s.decodes == rec.goal_batch) v.launch_floor_us = lf;
    }
  }
  cudaStreamDestroy(stream);

  // the summary
  const double page_mib = static_cast<double>(rec.slot_bytes * rec.page_size) / (1 << 20);
  for (const VariantRecord& v : rec.variants) {
    os << v.name << ": " << v.steps << " steps, " << v.tokens << " tokens in " << f1(v.seconds * 1e3) << " ms ("
       << static_cast<int64_t>(static_cast<double>(v.tokens) / v.seconds) << " tokens/s); pages peak " << v.peak_pages
       << " (" << f1(static_cast<double>(v.peak_pages) * page_mib) << " MiB of K/V), allocated " << v.pages_allocated
       << " (" << f1(static_cast<double>(v.pages_allocated) * page_mib) << " MiB)\n";
    const DecodeSummary d = summarize_decode(v, rec.goal_batch, rec.slot_bytes);
    if (d.steps == 0) {
      os << "  no decode-only step at batch " << rec.goal_batch << "\n";
      continue;
    }
    os << "  " << d.steps << " decode steps at batch " << rec.goal_batch << ": median " << f1(d.wall_us)
       << " us a step, floor "
       << (d.floor_us > 0 ? f1(d.floor_us) + " us, " + f3(d.ratio) + "x the floor (largest " + f3(d.ratio_max) + "x)"
                          : std::string("not known"))
       << "; K/V read " << f1(d.kv_bytes_flat / (1 << 20)) << " MiB by the rows, " << f1(d.kv_bytes_unique / (1 << 20))
       << " MiB of distinct pages\n";
    if (d.total_us > 0)
      os << "  with CUDA events, mean us: total " << f1(d.total_us) << " = host " << f1(d.host_us) << " + embed "
         << f1(d.embed_us) << " + projections " << f1(d.projection_us) << " + attention " << f1(d.attention_us)
         << " + logits " << f1(d.logits_us) << " + sampling " << f1(d.sampling_us) << "\n";
  }
  for (const Goal& g : evaluate_goals(rec)) {
    os << (g.met < 0 ? "NOT MEASURED"
           : g.met   ? "MET"
                     : "MISS")
       << "  " << g.what << ": " << (g.ratio < 0 ? std::string("-") : f3(g.ratio)) << " (goal " << g.goal << ")\n";
  }
  std::ofstream f(opt.json);
  f << to_json(rec);
  f.close();
  if (!f) {
    os << "flashstep serve: could not write " << opt.json << "\n";
    return 1;
  }
  os << "wrote " << opt.json << "\n";
  return 0;
}

}  // namespace flashstep::cli

#endif  // FLASHSTEP_CLI_HAVE_ENGINE
