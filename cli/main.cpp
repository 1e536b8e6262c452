// The `flashstep` command: tour, explain, validate, bench, serve, exercise (CLI11 parses the command line;
// commands.hpp does the work).
//
// Exit codes: 0 success (every check passed), 1 a check failed, 2 bad command line or
// bad argument value, 77 nothing could run here (no GPU, or a build without CUDA).
#include <CLI/CLI.hpp>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>

#include <flashstep/reference/errors.hpp>

#include "commands.hpp"

namespace {

constexpr int kExitUsage = 2;

// A fresh seed unless --seed is given; every command prints the seed it used.
uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// An integer flag, checked as the Python module checks the same argument: decimal digits
// (no sign, no spaces, no fraction) in [lo, hi], else exit 2 naming the flag and the
// range. CLI11 alone would wrap "--seed -1" around to 2^64 - 1 and saturate a number past
// the range.
uint64_t parse_integer(const std::string& text, const std::string& flag, uint64_t lo, uint64_t hi) {
  bool ok = !text.empty() && text.size() <= 20;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') {
      ok = false;
      break;
    }
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) {
      ok = false;
      break;
    }
    value = value * 10 + digit;
  }
  if (!ok || value < lo || value > hi)
    throw flashstep::ref::InvalidArgument(flag + " must be an integer in [" + std::to_string(lo) + ", " +
                                          std::to_string(hi) + "], got \"" + text + "\"");
  return value;
}

uint64_t parse_seed(const std::string& text, const std::string& flag) {
  return parse_integer(text, flag, 0, UINT64_MAX);
}

// A check's message without the name of the function that made it ("flashstep: ",
// "find_stage: "): the command line is what the user wrote, so the message names the flag.
std::string without_function_prefix(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return message;
  for (size_t i = 0; i < colon; ++i) {
    const char c = message[i];
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return message;
  }
  return message.substr(colon + 2);
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = flashstep::cli;
  CLI::App app{
      "flashstep: an LLM attention engine (the ideas of FlashInfer, PagedAttention and\n"
      "RadixAttention) built step by step and checked against a CPU reference.\n"
      "Exit codes: 0 pass, 1 a check failed, 2 bad arguments, 77 nothing to run here\n"
      "(no GPU or no CUDA build).",
      "flashstep"};
  app.require_subcommand(1, 1);
  app.set_version_flag("--version", std::string("flashstep ") + FLASHSTEP_VERSION);
  app.footer("Run `flashstep <command> --help` for a command's options.");
  // Every command-line error reads like the others: "flashstep: error: <what>".
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("flashstep: error: ") + e.what() + "\nRun with --help for more information.\n";
  });

  cli::TourOptions tour;
  std::string tour_seed;
  auto* tour_cmd = app.add_subcommand(
      "tour",
      "Walk the course's story on its example (\"The cat sat\", \"The cat ran fast\"): tokens,\n"
      "radix tree, page tables, the block-sparse matrix (Br=1 and Br=3), cascade levels,\n"
      "the numbers of row \"A, pos 2\", the tiny decoder; then, where a GPU is present,\n"
      "validate every stage. Ends with PASS or FAIL.");
  tour_cmd->add_option("--section", tour.sections, "Only this section (repeatable): " + joined(cli::tour_sections()))
      ->check(CLI::IsMember(cli::tour_sections()))
      ->allow_extra_args(false);
  tour_cmd->add_flag("--no-gpu", tour.no_gpu, "Skip the GPU part even where a GPU is present");
  // Integers are parsed by parse_integer (as text, so that "-1" is not wrapped around);
  // --help shows them as INT all the same.
  auto* tour_seed_opt = tour_cmd
                            ->add_option("--seed", tour_seed, "Seed of the random values, 0 to 2^64-1 (default: fresh)")
                            ->type_name("INT");

  cli::ExplainOptions explain;
  std::string explain_seed;
  auto* explain_cmd = app.add_subcommand("explain",
                                         "The tour's views for your own prompts: tokens, radix tree, page tables,\n"
                                         "block-sparse matrix, cascade levels, tiny decoder. Ends with PASS or FAIL.");
  explain_cmd
      ->add_option("--prompt", explain.prompts,
                   "A prompt, one request (repeat for a batch: --prompt \"...\" --prompt \"...\")")
      ->required()
      ->allow_extra_args(false);
  std::string page_size_text, br_text;  // checked by parse_integer, 1 to 4096
  auto* page_size_opt =
      explain_cmd->add_option("--page-size", page_size_text, "Tokens per KV page, i.e. Bc, 1 to 4096 (default 1)")
          ->type_name("INT");
  auto* br_opt =
      explain_cmd->add_option("--br", br_text, "The larger query tile Br shown next to Br = 1, 1 to 4096 (default 4)")
          ->type_name("INT");
  explain_cmd
      ->add_option("--section", explain.sections, "Only this section (repeatable): " + joined(cli::explain_sections()))
      ->check(CLI::IsMember(cli::explain_sections()))
      ->allow_extra_args(false);
  auto* explain_seed_opt =
      explain_cmd->add_option("--seed", explain_seed, "Seed of the random K/V, 0 to 2^64-1 (default: fresh)")
          ->type_name("INT");

  cli::ValidateOptions validate;
  std::string validate_seed;
  auto* validate_cmd = app.add_subcommand(
      "validate",
      "Run the validation harness over the case grid: every registered stage (or --stage)\n"
      "against the CPU reference. Exit 0 only if every case passes; 77 without a GPU.");
  validate_cmd->add_option("--stage", validate.stages, "Only this stage (repeatable; see --list)")
      ->allow_extra_args(false);
  validate_cmd->add_flag("--quick", validate.quick, "The quick case grid");
  validate_cmd->add_flag("--list", validate.list, "List the registered stages and exit");
  auto* validate_seed_opt =
      validate_cmd->add_option("--seed", validate_seed, "Seed of the random cases, 0 to 2^64-1 (default: fresh)")
          ->type_name("INT");

  cli::BenchOptions bench;
  bench.out = "flashstep-bench.json";
  auto* bench_cmd = app.add_subcommand(
      "bench",
      "Run the benchmark (ceilings, every stage) and write the results JSON that the docs'\n"
      "tables and plots are generated from. Needs a GPU (exit 77 without one).");
  bench_cmd->add_option("--out", bench.out, "Results JSON to write (default flashstep-bench.json)");
  bench_cmd->add_flag("--quick", bench.quick, "Fewer shapes and repeats");
  bench_cmd->add_option("--shapes", bench.shapes,
                        "Shapes file: bench/shapes.csv (decode, the default), bench/shapes_prefill.csv "
                        "(prefill, stage 04), bench/shapes_split_kv.csv; relative to the source tree");
  bench_cmd->add_option("--filter", bench.filter, "Only benchmarks whose name matches this regex");

  cli::ServeOptions serve;
  std::string serve_seed, serve_requests, serve_page_size, serve_running, serve_budget, serve_layers, serve_shared;
  auto* serve_cmd = app.add_subcommand(
      "serve",
      "Stage 09's engine: the tiny decoder (d_model 1024, 8/2 heads of 128, 4 layers, RoPE) on\n"
      "the GPU serving a seeded stream of requests with continuous batching and prefix sharing.\n"
      "Prints the run; --profile adds the time per step by phase. Needs a GPU (exit 77 without one).");
  auto* serve_seed_opt =
      serve_cmd->add_option("--seed", serve_seed, "Seed of the workload and the sampling, 0 to 2^64-1 (default 0)")
          ->type_name("INT");
  auto* serve_requests_opt =
      serve_cmd->add_option("--requests", serve_requests, "Requests, 1 to 100000 (default 64)")->type_name("INT");
  auto* serve_page_opt =
      serve_cmd->add_option("--page-size", serve_page_size, "Tokens per page, 1 to 64 (default 16)")->type_name("INT");
  auto* serve_running_opt =
      serve_cmd->add_option("--max-running", serve_running, "Requests running at once, 1 to 4096 (default 64)")
          ->type_name("INT");
  auto* serve_budget_opt =
      serve_cmd->add_option("--budget", serve_budget, "Query tokens per step, 1 to 65536 (default 2048)")
          ->type_name("INT");
  auto* serve_layers_opt =
      serve_cmd->add_option("--layers", serve_layers, "Decoder layers, 1 to 64 (default 4)")->type_name("INT");
  std::string serve_show;
  auto* serve_show_opt = serve_cmd
                             ->add_option("--show-step", serve_show,
                                          "Print this step's arrays, the stages that ran it and its tokens, 0 to 10^6")
                             ->type_name("INT");
  auto* serve_shared_opt = serve_cmd
                               ->add_option("--shared-prefix", serve_shared,
                                            "Two shared prefixes of this many tokens, 0 to 65536 (default 0: none)")
                               ->type_name("INT");
  std::string serve_prefixes, serve_min_prompt, serve_max_prompt, serve_min_new, serve_max_new, serve_pages;
  auto* serve_prefixes_opt =
      serve_cmd->add_option("--shared-prefixes", serve_prefixes, "Distinct shared prefixes, 1 to 64 (default 2)")
          ->type_name("INT");
  serve_cmd->add_option("--shared-fraction", serve.shared_fraction,
                        "Fraction of prompts opening with a shared prefix, 0 to 1 (default 0.75)");
  serve_cmd->add_option("--arrivals-per-step", serve.arrivals_per_step,
                        "Poisson mean of arrivals per step, (0, 1000] (default 8)");
  auto* serve_min_prompt_opt =
      serve_cmd->add_option("--min-prompt", serve_min_prompt, "Shortest own part of a prompt (default 16)")
          ->type_name("INT");
  auto* serve_max_prompt_opt =
      serve_cmd->add_option("--max-prompt", serve_max_prompt, "Longest own part of a prompt (default 128)")
          ->type_name("INT");
  auto* serve_min_new_opt =
      serve_cmd->add_option("--min-new", serve_min_new, "Fewest tokens to generate (default 16)")->type_name("INT");
  auto* serve_max_new_opt =
      serve_cmd->add_option("--max-new", serve_max_new, "Most tokens to generate (default 64)")->type_name("INT");
  auto* serve_pages_opt =
      serve_cmd->add_option("--num-pages", serve_pages, "Pages in the pool (default 0: room for every request)")
          ->type_name("INT");
  serve_cmd->add_option("--json", serve.json,
                        "Measure (each variant without and with CUDA events, the read ceiling and the launch "
                        "floor, each decode step's floor, the goals) and write the results JSON here");
  serve_cmd->add_option("--what", serve.what, "The workload's name in the results JSON (default serve)");
  serve_cmd->add_option("--note", serve.note, "A note recorded in the results JSON");
  serve_cmd->add_flag("--prefix-study", serve.prefix_study,
                      "With --json: measure prefix sharing with the cascade, sharing alone and no sharing, each eager "
                      "and with CUDA graphs (the first request alone, the others one step later)");
  serve_cmd->add_option("--dtype", serve.dtype, "Storage dtype: f16 or bf16 (default f16)");
  serve_cmd->add_option("--sampling", serve.sampling, "greedy or sample (default greedy)");
  serve_cmd->add_option("--temperature", serve.temperature, "Sampling temperature (default 1)");
  serve_cmd->add_option("--top-k", serve.top_k, "Sampling top-k, 0 = off (default 0)");
  serve_cmd->add_option("--top-p", serve.top_p, "Sampling top-p, 1 = off (default 1)");
  serve_cmd->add_option("--decode-stage", serve.decode_stage,
                        "Stage for the decode rows (default: the registry's rule)");
  serve_cmd->add_option("--prefill-stage", serve.prefill_stage,
                        "Stage for the prefill rows (default: the registry's rule)");
  serve_cmd->add_flag("--no-sharing", serve.no_sharing, "Turn prefix sharing off");
  serve_cmd->add_flag("--cascade", serve.cascade,
                      "Decode rows that share pages (a cached prefix) run on stage 05's cascade (its planner decides)");
  serve_cmd->add_flag("--one-launch", serve.one_launch,
                      "A mixed step's decode and prefill rows in one launch (POD attention) instead of two calls");
  serve_cmd->add_flag("--default-gemms", serve.default_gemms,
                      "Projections by cublasGemmEx's default algorithm instead of the one measured per shape");
  serve_cmd->add_flag(
      "--fused-rope", serve.fused_rope,
      "RoPE inside the attention stages' Q/K loads (ROPE_LLAMA: K appended un-rotated, no RoPE kernel)");
  serve_cmd->add_flag("--cuda-graphs", serve.cuda_graphs,
                      "Run decode steps as CUDA graphs captured at padded batch sizes (plan outside the graph)");
  serve_cmd->add_flag("--profile", serve.profile, "Time each step's phases with CUDA events (after a warm-up run)");

  cli::ExerciseOptions exercise;
  std::string exercise_seed;
  auto* exercise_cmd = app.add_subcommand(
      "exercise",
      "The course's exercises: functions to fill in for each concept chapter (CPU, no GPU\n"
      "needed) and one per stage (a kernel on a GPU; stage 09's on the CPU). list shows them,\n"
      "check N runs one's built program, hint N gives a hint.");
  exercise_cmd->require_subcommand(1, 1);
  auto* exercise_list = exercise_cmd->add_subcommand("list",
                                                     "Every exercise: number, name, topic, what it needs, file");
  auto* exercise_check = exercise_cmd->add_subcommand(
      "check", "Run exercise N's program (built from your file; this builds nothing) and show its verdict");
  exercise_check->add_option("exercise", exercise.which, "Its number or name (see list)")->required();
  auto* exercise_seed_opt = exercise_check
                                ->add_option("--seed", exercise_seed, "Seed of a CPU exercise's inputs, 0 to 2^64-1")
                                ->type_name("INT");
  auto* exercise_hint = exercise_cmd->add_subcommand("hint", "Show exercise N's hint");
  exercise_hint->add_option("exercise", exercise.which, "Its number or name (see list)")->required();

  // CLI11 reports an unknown command as "A subcommand is required"; name it instead.
  const std::string first = argc > 1 ? argv[1] : "";
  if (!first.empty() && first[0] != '-' && first != "tour" && first != "explain" && first != "validate" &&
      first != "bench" && first != "serve" && first != "exercise") {
    std::cerr << "flashstep: error: unknown command '" << argv[1]
              << "' (commands: tour, explain, validate, bench, serve, exercise)\n"
                 "Run with --help for more information.\n";
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, version, or the error and a hint
    return code == 0 ? 0 : kExitUsage;
  }

  try {
    if (*tour_cmd) {
      tour.seed = *tour_seed_opt ? parse_seed(tour_seed, "--seed") : fresh_seed();
      return cli::run_tour(tour, std::cout);
    }
    if (*explain_cmd) {
      if (*page_size_opt) explain.page_size = static_cast<int>(parse_integer(page_size_text, "--page-size", 1, 4096));
      if (*br_opt) explain.br = static_cast<int>(parse_integer(br_text, "--br", 1, 4096));
      explain.seed = *explain_seed_opt ? parse_seed(explain_seed, "--seed") : fresh_seed();
      return cli::run_explain(explain, std::cout);
    }
    if (*validate_cmd) {
      validate.seed = *validate_seed_opt ? parse_seed(validate_seed, "--seed") : fresh_seed();
      return cli::run_validate(validate, std::cout, std::cerr);
    }
    if (*bench_cmd) return cli::run_bench(bench, std::cout);
    if (*exercise_cmd) {
      exercise.action = *exercise_list ? "list" : *exercise_check ? "check" : "hint";
      if (*exercise_seed_opt) exercise.seed = parse_seed(exercise_seed, "--seed");
      return cli::run_exercise_command(exercise, std::cout);
    }
    if (*serve_cmd) {
      if (*serve_seed_opt) serve.seed = parse_seed(serve_seed, "--seed");
      if (*serve_requests_opt)
        serve.requests = static_cast<int64_t>(parse_integer(serve_requests, "--requests", 1, 100000));
      if (*serve_page_opt) serve.page_size = static_cast<int64_t>(parse_integer(serve_page_size, "--page-size", 1, 64));
      if (*serve_running_opt)
        serve.max_running = static_cast<int64_t>(parse_integer(serve_running, "--max-running", 1, 4096));
      if (*serve_budget_opt) serve.budget = static_cast<int64_t>(parse_integer(serve_budget, "--budget", 1, 65536));
      if (*serve_layers_opt) serve.layers = static_cast<int64_t>(parse_integer(serve_layers, "--layers", 1, 64));
      if (*serve_shared_opt)
        serve.shared_prefix_len = static_cast<int64_t>(parse_integer(serve_shared, "--shared-prefix", 0, 65536));
      if (*serve_show_opt) serve.show_step = static_cast<int64_t>(parse_integer(serve_show, "--show-step", 0, 1000000));
      if (*serve_prefixes_opt)
        serve.shared_prefixes = static_cast<int64_t>(parse_integer(serve_prefixes, "--shared-prefixes", 1, 64));
      if (*serve_min_prompt_opt)
        serve.min_prompt = static_cast<int64_t>(parse_integer(serve_min_prompt, "--min-prompt", 1, 65536));
      if (*serve_max_prompt_opt)
        serve.max_prompt = static_cast<int64_t>(parse_integer(serve_max_prompt, "--max-prompt", 1, 65536));
      if (*serve_min_new_opt) serve.min_new = static_cast<int64_t>(parse_integer(serve_min_new, "--min-new", 1, 65536));
      if (*serve_max_new_opt) serve.max_new = static_cast<int64_t>(parse_integer(serve_max_new, "--max-new", 1, 65536));
      if (*serve_pages_opt)
        serve.num_pages = static_cast<int64_t>(parse_integer(serve_pages, "--num-pages", 0, 100000000));
      // the command line as recorded in the results: the results file by its name alone
      for (int i = 0; i < argc; ++i) {
        std::string arg = i == 0 ? "flashstep" : argv[i];
        if (std::string(argv[i - (i > 0)]) == "--json" && i > 0) arg = arg.substr(arg.find_last_of('/') + 1);
        if (arg.rfind("--json=", 0) == 0) {
          const std::string file = arg.substr(7);
          arg = "--json=" + file.substr(file.find_last_of('/') + 1);
        }
        serve.command += (i ? " " : "") + arg;
      }
      if (serve.prefix_study && serve.json.empty())
        throw flashstep::ref::InvalidArgument("serve: --prefix-study measures, so it needs --json FILE");
      return cli::run_serve(serve, std::cout);
    }
  } catch (const flashstep::ref::InvalidArgument& e) {
    std::cerr << "flashstep: error: " << without_function_prefix(e.what()) << "\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "flashstep: internal error: " << e.what() << "\n";
    return 1;
  }
  return kExitUsage;
}
