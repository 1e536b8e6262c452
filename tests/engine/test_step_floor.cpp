// The floor of an engine step (bench/serve/step_floor.hpp) and what `flashstep serve --json`
// records (bench/serve/serve_results.hpp), on the CPU: every expected number below is
// worked by hand in the comments, none is computed by the code under test.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "serve_results.hpp"  // flashstep::serve_measure (bench/serve/)
#include "step_floor.hpp"
#include "support/expect_error.hpp"

using namespace flashstep::bench;
using flashstep::stages::engine::StepBatch;
using flashstep::test::expect_error;

namespace {

// The course's engine model: d_model 1024, 4 layers, 8 query / 2 kv heads (head_dim 128).
flashstep::ref::TinyDecoderConfig engine_model() {
  flashstep::ref::TinyDecoderConfig m;
  m.d_model = 1024;
  m.num_layers = 4;
  m.num_qo_heads = 8;
  m.num_kv_heads = 2;
  return m;
}

// Page size 4. Rows 0 and 1 decode and share page 7 (a cached prefix of 4 tokens); row 2
// is a prefill and is not counted.
//   r0: pages [7 3], last_page_len 2 -> kv_len 6
//   r1: pages [7 5], last_page_len 1 -> kv_len 5
//   r2: pages [9],   last_page_len 3 -> kv_len 3 (prefill)
StepBatch shared_step() {
  StepBatch b;
  b.num_decodes = 2;
  b.num_prefills = 1;
  b.request_ids = {0, 1, 2};
  b.qo_indptr = {0, 1, 2, 5};
  b.kv_indptr = {0, 2, 4, 5};
  b.kv_indices = {7, 3, 7, 5, 9};
  b.kv_last_page_len = {2, 1, 3};
  b.kv_lens = {6, 5, 3};
  return b;
}

StepRecord decode_step(int64_t step, int64_t batch, double wall, double floor) {
  StepRecord s;
  s.step = step;
  s.decodes = batch;
  s.tokens = batch;
  s.kv_flat = 100;
  s.kv_unique = 40;
  s.wall_us = wall;
  s.floor_us = floor;
  return s;
}

}  // namespace

TEST_CASE("09_engine floor: the bytes of the engine model's decode step, by hand") {
  const auto m = engine_model();
  // 2 (K, V) x 2 kv heads x 128 x 4 layers x 2 bytes = 4096
  CHECK(kv_slot_bytes(m, 2) == 4096);
  // per layer: W_Q 1024x1024 + W_K, W_V 1024x256 each + W_O 1024x1024 = 2,621,440 elements;
  // 4 layers 10,485,760; W_vocab 1024x256 = 262,144; 64 embedding rows 65,536:
  // 10,813,440 elements, 21,626,880 bytes in fp16
  CHECK(step_weight_bytes(m, 2, 64) == 21626880);
  // without W_O: 4 x 1,048,576 fewer elements -> 6,619,136 elements
  auto no_o = m;
  no_o.output_projection = false;
  CHECK(step_weight_bytes(no_o, 2, 64) == 13238272);
  // one token, fp32: (10,485,760 + 262,144 + 1,024) x 4
  CHECK(step_weight_bytes(m, 4, 1) == 42995712);
}

TEST_CASE("09_engine floor: KV slots of the decode rows, a shared page counted once") {
  const KvSlots s = decode_kv_slots(shared_step(), 4);
  CHECK(s.flat == 11);   // 6 + 5 (the prefill row's 3 left out)
  CHECK(s.unique == 7);  // page 7: 4 slots, page 3: 2, page 5: 1
  StepBatch none = shared_step();
  none.num_decodes = 0;
  const KvSlots z = decode_kv_slots(none, 4);
  CHECK(z.flat == 0);
  CHECK(z.unique == 0);
}

TEST_CASE("09_engine floor: bytes at the read ceiling plus the launch floor") {
  // 3e9 bytes at 3000 GB/s = 1 ms = 1000 us, plus 5 us
  CHECK(floor_us(3000000000, 3000.0, 5.0) == doctest::Approx(1005.0));
  // the engine model's step at batch 64 over 20,000 KV slots: 21,626,880 + 20,000 x 4096 =
  // 103,546,880 bytes at 2,500 GB/s = 41.418752 us, plus 60 us
  CHECK(floor_us(21626880 + 20000 * 4096, 2500.0, 60.0) == doctest::Approx(101.418752));
  expect_error([] { floor_us(1, 0.0, 1.0); }, {"floor_us", "read_gbps", "> 0"});
  expect_error([] { floor_us(1, 1.0, -1.0); }, {"floor_us", "launch_floor_us", ">= 0"});
}

TEST_CASE("09_engine results: the decode steps of a variant summarised, the goals judged") {
  ServeRecord r;
  r.goal_batch = 4;
  r.slot_bytes = 10;
  VariantRecord g;
  g.name = "graphs";
  g.cuda_graphs = true;
  // three decode steps at batch 4 (ratios 1.2, 2.0, 1.4: median 1.4, largest 2.0), one at
  // batch 3 and one with a prefill row, both left out
  g.steps_recorded = {decode_step(1, 4, 120, 100), decode_step(2, 4, 200, 100), decode_step(3, 4, 140, 100),
                      decode_step(4, 3, 900, 100), decode_step(5, 4, 900, 100)};
  g.steps_recorded[4].prefills = 1;
  // the split of the three steps: host 5, 10, 15 (mean 10) of totals 100, 100, 130 (mean 110)
  const double host[] = {5, 10, 15}, total[] = {100, 100, 130};
  for (int i = 0; i < 3; ++i) {
    StepRecord& s = g.steps_recorded[static_cast<size_t>(i)];
    s.host_us = host[i], s.total_us = total[i];
    s.embed_us = s.projection_us = s.attention_us = s.logits_us = s.sampling_us = 1;
  }
  const DecodeSummary d = summarize_decode(g, 4, r.slot_bytes);
  CHECK(d.steps == 3);
  CHECK(d.wall_us == doctest::Approx(140));  // 120, 140, 200
  CHECK(d.floor_us == doctest::Approx(100));
  CHECK(d.ratio == doctest::Approx(1.4));
  CHECK(d.ratio_max == doctest::Approx(2.0));
  CHECK(d.host_us == doctest::Approx(10));
  CHECK(d.total_us == doctest::Approx(110));
  CHECK(d.kv_bytes_flat == doctest::Approx(1000));   // 100 slots x 10 bytes
  CHECK(d.kv_bytes_unique == doctest::Approx(400));  // 40 x 10

  // the goals: none judged without a "graphs" variant; not measured without its steps
  r.variants = {};
  CHECK(evaluate_goals(r).empty());
  VariantRecord empty;
  empty.name = "graphs";
  r.variants = {empty};
  std::vector<Goal> goals = evaluate_goals(r);
  REQUIRE(goals.size() == 2);
  CHECK(goals[0].met == -1);
  CHECK(goals[1].met == -1);
  // ratio 1.4 <= 1.5: met; host 10 / 110 = 0.0909 <= 0.10: met
  r.variants = {g};
  goals = evaluate_goals(r);
  CHECK(goals[0].ratio == doctest::Approx(1.4));
  CHECK(goals[0].met == 1);
  CHECK(goals[1].ratio == doctest::Approx(10.0 / 110.0));
  CHECK(goals[1].met == 1);
  // a slower step in the middle: 120, 160, 200 over 100 -> median 1.6 > 1.5: missed;
  // host 15 / 110 > 0.10: missed
  r.variants[0].steps_recorded[2].wall_us = 160;
  r.variants[0].steps_recorded[0].host_us = 10;
  r.variants[0].steps_recorded[1].host_us = 20;
  goals = evaluate_goals(r);
  CHECK(goals[0].ratio == doctest::Approx(1.6));
  CHECK(goals[0].met == 0);
  CHECK(goals[1].ratio == doctest::Approx(15.0 / 110.0));
  CHECK(goals[1].met == 0);
}

TEST_CASE("09_engine results: the JSON file's fields") {
  CHECK(json_string("a\"b\\c\nd\te") == "\"a\\\"b\\\\c\\nd\\te\"");
  CHECK(json_string(std::string(1, '\x01')) == "\"\\u0001\"");
  CHECK(json_number(3) == "3");
  CHECK(json_number(-2.5) == "-2.5");
  CHECK(json_number(1.0 / 3.0) == "0.333333");
  CHECK(json_number(1.0 / 0.0) == "null");

  ServeRecord r;
  r.what = "decode64";
  r.device = "NVIDIA H100 80GB HBM3";
  r.commit = "abc1234";
  r.tree = "clean";
  r.date = "2026-11-27T09:00:00Z";
  r.read_gbps = 3000;
  r.launch_floor_1_us = 2.5;
  r.config = {{"requests", json_number(64)}, {"dtype", json_string("f16")}};
  r.weight_bytes = 21626880;
  r.slot_bytes = 4096;
  r.page_size = 16;
  r.goal_batch = 64;
  VariantRecord v;
  v.name = "graphs";
  v.cuda_graphs = true;
  v.steps = 2;
  v.tokens = 128;
  v.seconds = 0.5;  // 256 tokens/s, 250,000 us a step
  v.peak_pages = 3;
  v.pages_allocated = 5;
  v.steps_recorded = {decode_step(0, 64, 150, 100)};
  v.steps_recorded[0].decode_stage = "03_split_kv";
  r.variants = {v};
  r.shown.step = 0;
  r.shown.arrays = "step 0: \"x\"\n";
  r.shown.decode_stage = "03_split_kv";
  r.shown.sampled_requests = {0, 1};
  r.shown.sampled_tokens = {65, 66};
  r.shown.num_decodes = 1;
  r.shown.qo_indptr = {0, 1, 4};
  r.shown.kv_indptr = {0, 2, 3};
  r.shown.kv_indices = {7, 3, 9};
  r.shown.kv_last_page_len = {2, 3};
  const std::string j = to_json(r);
  for (const char* want : {
           "\"format\": \"flashstep results 1\"",
           "\"stage\": \"09_engine\"",
           "\"what\": \"decode64\"",
           "\"device\": \"NVIDIA H100 80GB HBM3\"",
           "\"commit\": \"abc1234\"",
           "\"command\": null",  // not recorded
           "\"ceilings\": {\"read_ceiling_GB/s\": 3000, \"launch_floor_1_us\": 2.5}",
           "\"config\": {\"requests\": 64, \"dtype\": \"f16\"}",
           "\"weight_bytes_per_decode_step\": 21626880",
           "\"kv_bytes_per_token_slot\": 4096",
           "\"tokens_per_s\": 256",
           // 3 pages x 16 slots x 4096 bytes; 5 pages
           "\"kv_bytes_peak\": 196608",
           "\"kv_bytes_allocated\": 327680",
           // the step: columns in step_columns' order, unprofiled phases as null
           "[0, 64, 0, 64, 100, 40, 0, 0, 150, null, null, null, null, null, null, null, 100, \"03_split_kv\", \"\"]",
           "\"decode_steps\": 1, \"wall_us\": 150, \"floor_us\": 100, \"ratio\": 1.5",
           "\"kv_bytes_flat\": 409600, \"kv_bytes_unique\": 163840",
           "{\"name\": \"09_engine/decode64_graphs/step_mean\", \"impl\": \"09_engine\", \"shape\": "
           "\"decode64_graphs\", \"median_us\": 250000, \"unit\": \"us\", \"tokens_per_s\": 256}",
           "\"name\": \"09_engine/decode64_graphs/decode_b64\"",
           // 1.5 is within the goal; the host share was not measured
           "\"ratio\": 1.5, \"goal\": \"<= 1.5\", \"met\": true}",
           "\"ratio\": null, \"goal\": \"<= 0.10\", \"met\": null}",
           "\"arrays\": \"step 0: \\\"x\\\"\\n\"",
           "\"sampled_requests\": [0, 1], \"sampled_tokens\": [65, 66]",
           "\"num_decodes\": 1, \"qo_indptr\": [0, 1, 4], \"kv_indptr\": [0, 2, 3], \"kv_indices\": [7, 3, 9], "
           "\"kv_last_page_len\": [2, 3]",
       })
    CHECK_MESSAGE(j.find(want) != std::string::npos, "missing: ", want, "\nin:\n", j);
  // a ratio that is a whole number is still written as a float (readers check its type)
  r.variants[0].steps_recorded[0].wall_us = 200;  // 200 / 100
  CHECK(to_json(r).find("\"ratio\": 2.0, \"goal\": \"<= 1.5\", \"met\": false}") != std::string::npos);
  // no shown step: null
  r.shown = {};
  CHECK(to_json(r).find("\"shown_step\": null") != std::string::npos);
}
