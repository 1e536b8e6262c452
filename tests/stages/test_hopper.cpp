// Stage 07 (Hopper) beyond the registry's prefill grids: the tails of its 128 x 128 tiles,
// ragged batches with empty requests, long sequences, and what it refuses.
#include <doctest/doctest.h>

#include "07_hopper/hopper.hpp"
#include "flashstep/reference/errors.hpp"
#include "grid_runner.hpp"
#include "harness/case.hpp"
#include "harness/cases.hpp"
#include "harness/device.hpp"
#include "harness/validate.hpp"
#include "registry.hpp"
#include "support/random.hpp"

#include <set>
#include <tuple>

using namespace flashstep;
using namespace flashstep::stages;
namespace grids = flashstep::stages::harness::grids;

/// Stage 07 runs only from a build with sm_90a code on an sm_90 GPU; anywhere else (an
/// A100, or a Hopper running a compute_80 build's PTX) its rules refuse every batch by
/// name, and the cases that run its kernels say why they skip instead of failing.
bool hopper_runs_here() {
  const std::string why = hopper::hopper_unavailable_reason();
  if (!why.empty()) MESSAGE("skipped, stage 07 does not run here: " << why);
  return why.empty();
}

TEST_CASE("07_hopper: tails of the 128-row, 128-key tiles, groups 1..32, head_dim 64, 128 and 256, causal and not") {
  if (!hopper_runs_here()) return;
  // over ragged K/V and over shuffled pages of 1, 3, 16 and 64 tokens, NHD and HND
  const auto ran = test::check_grid(grids::hopper_tail_grid());
  CHECK(ran.count("07_hopper_ragged"));
  CHECK(ran.count("07_hopper"));
}

TEST_CASE("07_hopper: one long request (4096, 16384 and 32768 tokens), and more units than multiprocessors") {
  if (!hopper_runs_here()) return;
  // on stage 07 alone: the double-precision reference of a 16384-token request is the cost
  const StageInfo& stage = find_stage("07_hopper_ragged");
  for (const harness::CaseSpec& c : grids::hopper_long_grid()) {
    const harness::ValidationReport r = harness::validate(stage, c, harness::case_seed(test::run_seed(), c.describe()));
    CHECK_MESSAGE(r.passed, r.message());
  }
}

/// Stage 07's entry with its planner's options (forced splits).
StageInfo with_options(StageInfo info, hopper::HopperOptions options) {
  info.make_runner = [options] { return std::make_unique<hopper::HopperRunner>(options); };
  return info;
}

/// Runs stage 04's sanitizer and decode grids (batches under 150) and every `tail_step`-th
/// case of the tail grid from `tail_first` through both entries, the n-th case with the
/// options `options_for(n)` gives; `what` names the run in the cases' seeds and messages.
/// Returns the cases run.
template <typename OptionsFor>
int run_grids_with(const std::string& what, size_t tail_first, size_t tail_step, OptionsFor options_for) {
  using namespace stages::harness;
  std::vector<CaseSpec> cases = grids::tensor_core_sanitizer_grid();
  for (const CaseSpec& c : grids::tensor_core_decode_grid())
    if (c.batch_size < 150) cases.push_back(c);
  const std::vector<CaseSpec> tails = grids::hopper_tail_grid();
  for (size_t i = tail_first; i < tails.size(); i += tail_step) cases.push_back(tails[i]);
  int n = 0, ran = 0, failures = 0;
  for (const char* name : {"07_hopper_ragged", "07_hopper"})
    for (const CaseSpec& spec : cases) {
      const hopper::HopperOptions opt = options_for(n++);
      const StageInfo stage = with_options(find_stage(name), opt);
      std::mt19937_64 layout_rng(1);
      if (std::find(stage.kv_layouts.begin(), stage.kv_layouts.end(), spec.kv_layout) == stage.kv_layouts.end() ||
          !stage.supports(make_layout(spec, stage.storage, layout_rng).shape))
        continue;
      const uint64_t seed = case_seed(test::run_seed(), what + " " + spec.describe());
      const ValidationReport r = validate(stage, spec, seed);
      ++ran;
      CHECK_MESSAGE(r.passed, name << ", " << what << ", chunk " << opt.kv_chunk_size << ": " << r.message());
      if (!r.passed && ++failures >= 5) break;
    }
  return ran;
}

TEST_CASE("07_hopper: forced KV splits (chunks of 128 and 256 keys) merged by stage 03's kernel") {
  if (!hopper_runs_here()) return;
  // stage 04's sanitizer and decode grids (windows, soft caps, groups 16 and 32) and a
  // quarter of the tail grid, on both entries, every case split
  const int ran = run_grids_with("split", 0, 4, [](int n) {
    hopper::HopperOptions opt;
    opt.kv_chunk_size = n % 2 ? 128 : 256;
    return opt;
  });
  MESSAGE(ran << " split cases ran");
  CHECK(ran > 20);
}

TEST_CASE("07_hopper: a persistent grid of 3 blocks, each claiming tens of units across tails and splits") {
  if (!hopper_runs_here()) return;
  // Every block runs units of all kinds in a row (solo last tiles beside full ones, units
  // without keys, tiles of 1 key to many, over TMA tiles, page copies and the gather): the
  // Q and ring barriers' phases, the consumers' turns and the claim counter run on across
  // all of them. (Decode batches keep a block per unit; they run here too.)
  const int ran = run_grids_with("persistent", 1, 3, [](int n) {
    hopper::HopperOptions opt;
    opt.max_blocks = 3;
    opt.kv_chunk_size = n % 3 == 2 ? 128 : 0;
    return opt;
  });
  MESSAGE(ran << " cases ran on 3 blocks");
  CHECK(ran > 20);
}

/// Runs an MLA prefill grid through `stage_name`, every other case split in chunks of 128
/// keys (so the merge runs at o's width); returns the cases run.
int check_mla_grid(const std::string& stage_name, const std::vector<stages::harness::CaseSpec>& grid) {
  using namespace stages::harness;
  int ran = 0;
  for (const CaseSpec& spec : grid) {
    hopper::HopperOptions opt;
    opt.kv_chunk_size = ran % 2 ? 128 : 0;
    const StageInfo stage = with_options(find_stage(stage_name), opt);
    const uint64_t seed = case_seed(test::run_seed(), "mla prefill " + stage_name + " " + spec.describe());
    const ValidationReport r = validate(stage, spec, seed);
    ++ran;
    CHECK_MESSAGE(r.passed, "chunk " << opt.kv_chunk_size << ": " << r.message());
  }
  return ran;
}

TEST_CASE("07_hopper_ragged: MLA's prefill, head_dim 192 with head_dim_vo 128, causal and not, whole and split") {
  if (!hopper_runs_here()) return;
  // the reference: ragged prefill with v narrower than q and k (attention.cpp), itself held
  // to ref::mla_naive in tests/reference/test_mla.cpp
  CHECK(check_mla_grid("07_hopper_ragged", stages::harness::grids::mla_prefill_grid()) == 16);
}

TEST_CASE("07_hopper: MLA's prefill over pages, K's pool and V's own, whole and split") {
  if (!hopper_runs_here()) return;
  // the reference: paged prefill with V in a pool of its own (PagedKVCache::v_pages), which
  // build_case holds to the ragged answer on small cases
  using namespace stages::harness;
  CHECK(check_mla_grid("07_hopper", grids::mla_paged_prefill_grid()) == 12);
  // run() refuses a batch without V's pool by name (before any launch)
  CaseSpec spec = grids::mla_paged_prefill_grid().front();
  const HostCase host = build_case(spec, KVStorage::paged, 7);
  DeviceCase dev(host);
  DeviceBatch batch = dev.batch();
  batch.v_pool = nullptr;
  hopper::HopperRunner runner;
  const BatchShape& s = host.layout.shape;
  DeviceBuffer ws(runner.workspace_bytes(s));
  runner.plan(s, ws.get(), ws.bytes(), nullptr);
  CHECK_THROWS_WITH_AS(runner.run(batch, nullptr), doctest::Contains("batch.v_pool is null"), ref::InvalidArgument);
}

TEST_SUITE("host") {
TEST_CASE("07_hopper: refuses what it is not built for, naming the rule") {
  const StageInfo& stage = find_stage("07_hopper_ragged");
  BatchShape s;
  s.mode = Mode::prefill;
  s.storage = KVStorage::ragged;
  s.dtype = DType::bf16;
  s.batch_size = 1;
  s.num_qo_heads = 28;
  s.num_kv_heads = 4;
  s.head_dim = 128;
  s.qo_indptr = {0, 5};
  s.kv_indptr = {0, 9};
  CHECK(stage.unsupported_reason(s).find("divides 128") != std::string::npos);  // group 7
  // head_dim 64's blocks have 192 rows (three consumer warp groups): group 7 still
  // straddles them, group 3 does not (at head_dim 128 it does)
  s.head_dim = 64;
  CHECK(stage.unsupported_reason(s).find("divides 192 at head_dim 64") != std::string::npos);
  s.num_qo_heads = 12;
  CHECK(stage.unsupported_reason(s).find("divides") == std::string::npos);
  s.head_dim = 128;
  CHECK(stage.unsupported_reason(s).find("divides 128 at head_dim 128") != std::string::npos);
  s.num_qo_heads = 32;
  s.head_dim = 96;
  CHECK(stage.unsupported_reason(s).find("head_dim 96") != std::string::npos);
  s.head_dim = 128;
  s.dtype = DType::f32;
  CHECK(stage.unsupported_reason(s).find("dtype") != std::string::npos);
  s.dtype = DType::bf16;
  s.kv_dtype = DType::e4m3;
  CHECK(!stage.unsupported_reason(s).empty());
}

TEST_CASE("07_hopper: head_dim_vo other than head_dim: MLA's 192 / 128, ragged and paged, plain, named") {
  BatchShape s;
  s.mode = Mode::prefill;
  s.storage = KVStorage::ragged;
  s.dtype = DType::bf16;
  s.batch_size = 1;
  s.num_qo_heads = 16;
  s.num_kv_heads = 16;
  s.head_dim = 192;
  s.head_dim_vo = 128;
  s.causal = true;
  s.qo_indptr = {0, 5};
  s.kv_indptr = {0, 9};
  const StageInfo ragged = hopper::ragged_stage_info();
  const std::string gpu = hopper::hopper_unavailable_reason();
  CHECK(ragged.unsupported_reason(s) == gpu);  // built for it: only the GPU may refuse
  CHECK(s.describe().find("head_dim=192 head_dim_vo=128") != std::string::npos);
  CHECK(ragged.capabilities().find("192/128") != std::string::npos);
  s.window_left = 16;
  CHECK(ragged.unsupported_reason(s).find("without window_left and logits_soft_cap") != std::string::npos);
  s.window_left = -1;
  s.logits_soft_cap = 30.f;
  CHECK(ragged.unsupported_reason(s).find("without window_left and logits_soft_cap") != std::string::npos);
  s.logits_soft_cap = 0.f;
  s.head_dim_vo = 64;
  CHECK(ragged.unsupported_reason(s).find("head_dim 192 with head_dim_vo 64") != std::string::npos);
  s.head_dim_vo = -1;
  CHECK(ragged.unsupported_reason(s).find("head_dim_vo must be 0") != std::string::npos);
  // the other entries take v and o as wide as q and k only, and say so
  s.head_dim_vo = 128;
  for (const StageInfo& stage : registry()) {
    if (stage.name == "07_hopper_ragged" || stage.name == "07_hopper") continue;
    BatchShape t = s;
    t.storage = stage.storage;
    if (!stage.supports(Mode::prefill)) {
      t.mode = Mode::decode;
      t.qo_indptr = {0, 1};
    }
    if (t.storage == KVStorage::paged) {
      t.page_size = 16;
      t.kv_indptr = {0, 1};
      t.kv_last_page_len = {9};
    }
    CAPTURE(stage.name);
    const std::string why = stage.unsupported_reason(t);
    CHECK(!why.empty());
    if (stage.supports(t.dtype)) CHECK(why.find("head_dim 192 with head_dim_vo 128") != std::string::npos);
  }
  s.storage = KVStorage::paged;
  s.page_size = 16;
  s.kv_indptr = {0, 1};
  s.kv_last_page_len = {9};
  const StageInfo paged = hopper::stage_info();
  CHECK(paged.unsupported_reason(s) == gpu);  // built for it over pages too (V in a pool of its own)
  CHECK(paged.capabilities().find("192/128") != std::string::npos);
  s.window_left = 16;
  CHECK(paged.unsupported_reason(s).find("without window_left and logits_soft_cap") != std::string::npos);
}

TEST_CASE(
    "07_hopper schedule: a split when the grid is short, every (request, tile, chunk) once, partial rows per query") {
  // MQA decode, 3 requests of 1000, 0 and 300 keys, 32 query heads on 1 kv head: 3 work
  // items against a target of 24 blocks: 8 splits of the longest, chunks of 128 keys
  BatchShape s;
  s.mode = Mode::decode;
  s.storage = KVStorage::ragged;
  s.dtype = DType::bf16;
  s.batch_size = 3;
  s.num_qo_heads = 32;
  s.num_kv_heads = 1;
  s.head_dim = 128;
  s.qo_indptr = {0, 1, 2, 3};
  s.kv_indptr = {0, 1000, 1000, 1300};
  hopper::HopperOptions opt;
  opt.target_blocks = 24;
  const hopper::Schedule sched = hopper::HopperRunner(opt).make_schedule(s);
  CHECK(sched.kv_chunk_size == 128);  // ceil(1000 / 8) = 125, rounded up to the key tile
  // chunks per request: 8, 1 (an empty request still gets one item: its row is -inf), 3
  CHECK(sched.partial_indptr == std::vector<int32_t>{0, 8, 9, 12});
  CHECK(sched.num_items() == 12);
  std::set<std::tuple<int, int, int>> seen;
  for (int64_t i = 0; i < sched.num_items(); ++i)
    seen.insert({sched.request_indices[i], sched.qo_tile_indices[i], sched.kv_chunk_indices[i]});
  CHECK(seen.size() == 12);
  // longest first: full chunks of request 0 and 2, then the two short ones (1000 - 896 =
  // 104 keys, 300 - 256 = 44), then the empty request
  CHECK(sched.request_indices.back() == 1);
  // a full grid is not split
  opt.target_blocks = 3;
  CHECK(hopper::HopperRunner(opt).make_schedule(s).kv_chunk_size == 0);
  // a forced chunk must be a multiple of the key tile
  opt.kv_chunk_size = 64;
  CHECK_THROWS_AS(hopper::HopperRunner(opt).make_schedule(s), ref::InvalidArgument);
  // and a persistent grid has at least one block (0: one per multiprocessor)
  opt.kv_chunk_size = 0;
  opt.max_blocks = -1;
  CHECK_THROWS_WITH_AS(hopper::HopperRunner(opt).make_schedule(s), doctest::Contains("max_blocks must be 0"),
                       ref::InvalidArgument);
}
}  // TEST_SUITE("host")

TEST_CASE("07_hopper: sanitizer subset") {
  if (!hopper_runs_here()) return;
  // a few small cases on stage 07 alone, for compute-sanitizer (memcheck, racecheck,
  // synccheck): head_dim 64, 128 and 256, both dtypes, causal and not, a tail, an empty request, GQA
  // groups 1 and 4, and one batch of more units than multiprocessors
  std::vector<harness::CaseSpec> cases;
  for (int n = 0; n < 4; ++n) {
    harness::CaseSpec c;
    c.mode = Mode::prefill;
    c.batch_size = 3;
    c.qo_len = n % 2 ? 65 : 130;
    c.kv_len = c.qo_len + 70;
    c.num_qo_heads = n < 2 ? 8 : 32;
    c.num_kv_heads = 8;
    c.head_dim = n % 2 ? 64 : 128;
    if (n == 2) c.head_dim = 256;
    c.dtype = n % 2 ? DType::f16 : DType::bf16;
    c.causal = n < 2;
    c.lengths = harness::LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  harness::CaseSpec many = cases[0];
  many.batch_size = 2;
  many.qo_len = 600;
  many.kv_len = 600;
  many.num_qo_heads = 32;  // 2 x 19 tiles x 8 kv heads = 304 units
  cases.push_back(many);
  // both entries: the TMA tiles over ragged K/V; over pages (HND) the page copies and the gather
  for (const char* name : {"07_hopper_ragged", "07_hopper"}) {
    const StageInfo& stage = find_stage(name);
    for (harness::CaseSpec c : cases) {
      if (stage.storage == KVStorage::paged) {
        // pages of 3 are gathered; pages of 16 go by TMA, a copy per page, except the
        // last tile of each request
        c.page_size = c.qo_len % 2 ? 3 : 16;
        c.kv_layout = KVLayout::HND;
        if (c.head_dim == 64) c.head_dim = 128;  // the paged entry reads 128 and 256
      }
      const harness::ValidationReport r = harness::validate(stage, c,
                                                            harness::case_seed(test::run_seed(), c.describe()));
      INFO(name);
      CHECK_MESSAGE(r.passed, r.message());
    }
  }
}
