// The tiny decoder (reference/tiny_decoder.hpp): weights from the documented Philox
// formula, the forward pass against a naive transcription of the course's equations, the
// three generation modes giving the same tokens (greedy and seeded sampling), the memory
// numbers by hand (pages, sharing, prefix reuse), and bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <flashstep/kernels/philox.cuh>
#include <flashstep/reference/errors.hpp>
#include <flashstep/reference/tiny_decoder.hpp>

#include "support/expect_error.hpp"
#include "support/random.hpp"

using namespace flashstep;
using ref::GenerationMode;
using ref::GenerationOptions;
using ref::TinyDecoder;
using ref::TinyDecoderConfig;

using flashstep::test::expect_error;

namespace {

const GenerationMode kModes[] = {GenerationMode::recompute, GenerationMode::contiguous_kv_cache,
                                 GenerationMode::paged_kv_cache};

// The course's equations, transcribed with plain loops: X = embedding + positions; per
// layer Q, K, V, masked softmax(Q K^T / sqrt(d)) V per head (GQA: head h reads kv head
// h / group), optional W_O, residual; logits = X[-1] W_vocab. In the rope mode X is the
// embedding alone and each head of Q and K at position t has its pairs turned by
// t * rope_theta^(-2i / head_dim), written out here from the formula.
std::vector<double> naive_next_token_logits(const TinyDecoder& m, const std::vector<int32_t>& tokens) {
  const auto& c = m.config();
  const int64_t n = static_cast<int64_t>(tokens.size()), d = c.d_model, hd = m.head_dim();
  const int64_t group = c.num_qo_heads / c.num_kv_heads;
  std::vector<std::vector<double>> x(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(d)));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < d; ++j) {
      const double freq = std::pow(10000.0, -static_cast<double>(2 * (j / 2)) / static_cast<double>(d));
      const double pe = j % 2 == 0 ? std::sin(t * freq) : std::cos(t * freq);
      const bool rope = c.position_encoding == ref::PositionEncoding::rope;
      x[t][j] = m.embedding().data[static_cast<size_t>(tokens[t] * d + j)] + (rope ? 0.0 : pe);
    }
  // Turns every head of row (one token's Q or K, heads * hd values) to position t.
  auto rotate = [&](std::vector<double>& row, int64_t t) {
    if (c.position_encoding != ref::PositionEncoding::rope) return;
    for (size_t h0 = 0; h0 < row.size(); h0 += static_cast<size_t>(hd))
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double angle = static_cast<double>(t) * std::pow(c.rope_theta, -2.0 * i / static_cast<double>(hd));
        double& a = row[h0 + static_cast<size_t>(c.rope_interleave ? 2 * i : i)];
        double& b = row[h0 + static_cast<size_t>(c.rope_interleave ? 2 * i + 1 : i + hd / 2)];
        const double a0 = a, b0 = b;
        a = a0 * std::cos(angle) - b0 * std::sin(angle);
        b = b0 * std::cos(angle) + a0 * std::sin(angle);
      }
  };
  auto matmul = [&](const std::vector<double>& row, const ref::Tensor& w) {
    std::vector<double> out(static_cast<size_t>(w.dim(1)), 0.0);
    for (int64_t k = 0; k < w.dim(0); ++k)
      for (int64_t col = 0; col < w.dim(1); ++col) out[col] += row[k] * w.data[static_cast<size_t>(k * w.dim(1) + col)];
    return out;
  };
  for (const auto& layer : m.layers()) {
    std::vector<std::vector<double>> q, k, v;
    for (const auto& row : x) {
      q.push_back(matmul(row, layer.w_q));
      k.push_back(matmul(row, layer.w_k));
      v.push_back(matmul(row, layer.w_v));
      rotate(q.back(), static_cast<int64_t>(q.size()) - 1);
      rotate(k.back(), static_cast<int64_t>(k.size()) - 1);
    }
    auto next = x;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> z(static_cast<size_t>(c.num_qo_heads * hd), 0.0);
      for (int64_t h = 0; h < c.num_qo_heads; ++h) {
        const int64_t kvh = h / group;
        std::vector<double> s(static_cast<size_t>(i + 1));  // causal: keys 0..i
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < hd; ++e) dot += q[i][h * hd + e] * k[j][kvh * hd + e];
          s[j] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (auto& sj : s) sum += (sj = std::exp(sj - mx));
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e) z[h * hd + e] += s[j] / sum * v[j][kvh * hd + e];
      }
      const auto out = c.output_projection ? matmul(z, layer.w_o) : z;
      for (int64_t e = 0; e < d; ++e) next[i][e] += out[e];
    }
    x = next;
  }
  return matmul(x.back(), m.w_vocab());
}

std::string random_prompt(std::mt19937_64& rng, int64_t len) {
  std::string s;
  for (int64_t i = 0; i < len; ++i) s.push_back(static_cast<char>(test::random_int(rng, 32, 126)));
  return s;
}

}  // namespace

TEST_CASE("tiny_decoder: weights follow the documented Philox formula and are deterministic") {
  TinyDecoderConfig c;
  const TinyDecoder a(c), b(c);
  CHECK(a.embedding().data == b.embedding().data);
  CHECK(a.w_vocab().data == b.w_vocab().data);
  // Matrix 0 is the embedding (fan_in 1); matrix 1 is layer 0's W_Q (fan_in d_model).
  for (uint64_t i : {0u, 7u, 1000u}) {
    CAPTURE(i);
    CHECK(a.embedding().data[i] == (2.0 * kernels::philox_uniform(c.weight_seed, 0, i) - 1.0) * std::sqrt(3.0));
    CHECK(a.layers()[0].w_q.data[i % 512] ==
          (2.0 * kernels::philox_uniform(c.weight_seed, 1, i % 512) - 1.0) * std::sqrt(3.0 / c.d_model));
  }
  c.weight_seed += 1;
  CHECK(TinyDecoder(c).embedding().data != a.embedding().data);
}

TEST_CASE("tiny_decoder: the forward pass is the course's equations (naive transcription)") {
  auto rng = test::case_rng("tiny decoder forward");
  for (int variant = 0; variant < 8; ++variant) {
    TinyDecoderConfig c;
    // Variants 4..7: RoPE instead of sinusoidal positions, both layouts, two thetas.
    if (variant >= 4) {
      c.position_encoding = ref::PositionEncoding::rope;
      c.rope_interleave = variant % 2 == 1;
      c.rope_theta = variant < 6 ? 1e4 : 5e5;
    }
    c.num_layers = 1 + variant % 3;
    c.num_qo_heads = variant < 2 ? 4 : 2;
    c.num_kv_heads = variant % 2 == 0 ? c.num_qo_heads : 1;
    c.output_projection = variant != 1;
    c.weight_seed = rng();
    CAPTURE(variant);
    CAPTURE(c.weight_seed);
    const TinyDecoder m(c);
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < test::random_int(rng, 1, 12); ++t)
      tokens.push_back(static_cast<int32_t>(test::random_int(rng, 0, 255)));
    const auto got = m.next_token_logits(tokens), want = naive_next_token_logits(m, tokens);
    REQUIRE(got.size() == 256);
    const double kTol = 1e-11;  // double rounding of a few hundred products
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      REQUIRE(std::abs(got[i] - want[i]) <= kTol * (1.0 + std::abs(want[i])));
    }
  }
}

TEST_CASE("tiny_decoder: recompute, contiguous KV cache and paged KV cache generate the same tokens") {
  auto rng = test::case_rng("tiny decoder three ways");
  struct Variant {
    int64_t layers, qo_heads, kv_heads, page_size;
    bool output_projection, share;
  };
  const Variant variants[] = {{2, 4, 2, 4, true, true},
                              {1, 4, 4, 1, false, true},
                              {3, 2, 1, 3, true, true},
                              {2, 4, 2, 16, true, false},
                              {2, 8, 2, 2, true, true}};
  for (const auto& v : variants)
    for (ref::PositionEncoding encoding : {ref::PositionEncoding::sinusoidal, ref::PositionEncoding::rope}) {
      TinyDecoderConfig c;
      c.position_encoding = encoding;
      c.rope_interleave = v.layers == 3;
      c.num_layers = v.layers;
      c.num_qo_heads = v.qo_heads;
      c.num_kv_heads = v.kv_heads;
      c.output_projection = v.output_projection;
      c.weight_seed = rng();
      const TinyDecoder m(c);
      // Prompts that share prefixes of various lengths, and one that does not.
      const std::string base = random_prompt(rng, 9);
      const std::vector<std::string> prompts = {base + random_prompt(rng, 3), base + random_prompt(rng, 5),
                                                base.substr(0, 4), random_prompt(rng, 7), base + random_prompt(rng, 3)};
      GenerationOptions o;
      o.max_new_tokens = 6;
      o.page_size = v.page_size;
      o.share_prefixes = v.share;
      o.record_logits = true;
      CAPTURE(c.weight_seed);
      CAPTURE(v.page_size);
      CAPTURE(ref::to_string(encoding));
      std::vector<ref::GenerationResult> runs;
      for (GenerationMode mode : kModes) runs.push_back(ref::generate(m, prompts, mode, o));
      for (size_t r = 0; r < prompts.size(); ++r) {
        CAPTURE(r);
        for (size_t k = 1; k < runs.size(); ++k) {
          CAPTURE(ref::to_string(runs[k].mode));
          REQUIRE(runs[k].requests[r].generated_tokens == runs[0].requests[r].generated_tokens);
          for (size_t t = 0; t < runs[0].requests[r].step_logits.size(); ++t)
            for (size_t i = 0; i < 256; ++i)
              REQUIRE(std::abs(runs[k].requests[r].step_logits[t][i] - runs[0].requests[r].step_logits[t][i]) <= 1e-10);
        }
        // Greedy: each token is the argmax of its step's logits, and the first step's
        // logits are next_token_logits(prompt).
        const auto& req = runs[0].requests[r];
        REQUIRE(req.generated_tokens.size() == 6);
        for (size_t t = 0; t < 6; ++t)
          CHECK(req.generated_tokens[t] ==
                std::max_element(req.step_logits[t].begin(), req.step_logits[t].end()) - req.step_logits[t].begin());
        CHECK(req.step_logits[0] == m.next_token_logits(req.prompt_tokens));
      }
    }
}

TEST_CASE("tiny_decoder: the course's two prompts share \"The cat \" through the radix cache") {
  const TinyDecoder m;
  const std::vector<std::string> prompts = {"The cat sat", "The cat ran fast"};  // 11 and 16 bytes
  GenerationOptions o;
  o.max_new_tokens = 8;
  const int64_t per_token = 2 * 2 * 8 * 2 * 2;  // K and V, 2 kv heads, head_dim 8, 2 layers, fp16
  // Held at the end: 11 + 7 and 16 + 7 tokens (the last generated token has no K/V yet).
  const int64_t len_a = 18, len_b = 23;
  struct Expect {
    int64_t page_size, reused;
  };
  // "The cat " is 8 bytes: whole pages of it are shared (page_size 3: "The", " ca").
  for (const Expect e : {Expect{1, 8}, Expect{3, 6}, Expect{4, 8}, Expect{16, 0}}) {
    CAPTURE(e.page_size);
    o.page_size = e.page_size;
    o.share_prefixes = true;
    const auto shared = ref::generate(m, prompts, GenerationMode::paged_kv_cache, o);
    o.share_prefixes = false;
    const auto alone = ref::generate(m, prompts, GenerationMode::paged_kv_cache, o);
    const int64_t P = e.page_size;
    const int64_t pages_alone = (len_a + P - 1) / P + (len_b + P - 1) / P;
    CHECK(shared.memory.prefix_tokens_reused == e.reused);
    CHECK(shared.requests[1].prefix_tokens_reused == e.reused);
    CHECK(shared.requests[0].prefix_tokens_reused == 0);
    CHECK(shared.memory.shared_pages == e.reused / P);
    CHECK(shared.memory.pages_used == pages_alone - e.reused / P);
    CHECK(alone.memory.pages_used == pages_alone);
    CHECK(alone.memory.shared_pages == 0);
    CHECK(shared.memory.kv_bytes_kept == shared.memory.pages_used * P * per_token);
    CHECK(shared.memory.kv_bytes_per_token == per_token);
    CHECK(shared.memory.tokens == len_a + len_b);
    // Contiguous preallocation reserves prompt + max_new_tokens per request.
    CHECK(shared.memory.contiguous_preallocated_bytes == (11 + 8 + 16 + 8) * per_token);
    CHECK(shared.memory.contiguous_pages_equivalent == (43 + P - 1) / P);
    // Reused K/V is not recomputed: 8 fewer prompt rows per layer when 8 tokens are reused.
    CHECK(alone.memory.query_rows_computed - shared.memory.query_rows_computed == e.reused * 2);
    CHECK(shared.requests[1].generated_tokens == alone.requests[1].generated_tokens);
  }
  // The other modes' numbers: recompute keeps nothing, contiguous keeps exactly its tokens.
  const auto recompute = ref::generate(m, prompts, GenerationMode::recompute, o);
  const auto contiguous = ref::generate(m, prompts, GenerationMode::contiguous_kv_cache, o);
  CHECK(recompute.memory.kv_bytes_kept == 0);
  CHECK(contiguous.memory.kv_bytes_kept == (len_a + len_b) * per_token);
  // Work: recompute runs sum over steps of the sequence length; the cache runs each token once.
  int64_t recompute_rows = 0;
  for (int64_t len0 : {11, 16})
    for (int64_t t = 0; t < 8; ++t) recompute_rows += (len0 + t) * 2;
  CHECK(recompute.memory.query_rows_computed == recompute_rows);
  CHECK(contiguous.memory.query_rows_computed == (len_a + len_b) * 2);

  const auto demo = ref::tiny_decoder_demo();
  CHECK(demo.tokens_agree);
  REQUIRE(demo.runs.size() == 3);
  CHECK(demo.runs[2].memory.prefix_tokens_reused == 8);
}

TEST_CASE("tiny_decoder: sampling at temperature > 0 is seeded, reproducible and the same in every mode") {
  auto rng = test::case_rng("tiny decoder sampling");
  const TinyDecoder m;
  const std::vector<std::string> prompts = {random_prompt(rng, 6), random_prompt(rng, 10), "The cat sat"};
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.temperature = 1.5;
  o.seed = rng();
  CAPTURE(o.seed);
  // The modes' logits differ by rounding (~1e-15); a draw could only differ if its uniform
  // fell within that distance of a CDF boundary (probability ~1e-7 per draw).
  std::vector<ref::GenerationResult> runs;
  for (GenerationMode mode : kModes) runs.push_back(ref::generate(m, prompts, mode, o));
  for (size_t r = 0; r < prompts.size(); ++r)
    for (const auto& run : runs) CHECK(run.requests[r].generated_tokens == runs[0].requests[r].generated_tokens);
  CHECK(ref::generate(m, prompts, GenerationMode::paged_kv_cache, o).requests[1].generated_tokens ==
        runs[0].requests[1].generated_tokens);
  // Another seed draws other tokens (30 draws at temperature 1.5 all agreeing is implausible).
  GenerationOptions other = o;
  other.seed = o.seed + 1000;
  const auto moved = ref::generate(m, prompts, GenerationMode::contiguous_kv_cache, other);
  bool differs = false;
  for (size_t r = 0; r < prompts.size(); ++r)
    differs = differs || moved.requests[r].generated_tokens != runs[0].requests[r].generated_tokens;
  CHECK(differs);
  // top_k = 1 keeps only the argmax: the same tokens as greedy decoding.
  GenerationOptions top1 = o, greedy = o;
  top1.top_k = 1;
  greedy.temperature = 0.0;
  for (GenerationMode mode : kModes) {
    const auto a = ref::generate(m, prompts, mode, top1), b = ref::generate(m, prompts, mode, greedy);
    for (size_t r = 0; r < prompts.size(); ++r) CHECK(a.requests[r].generated_tokens == b.requests[r].generated_tokens);
  }
  // top-k with top-p also runs (through top_k_top_p_sampling_from_probs).
  GenerationOptions both = o;
  both.top_k = 20;
  both.top_p = 0.8;
  const auto kp = ref::generate(m, prompts, GenerationMode::paged_kv_cache, both);
  CHECK(kp.requests[0].generated_tokens.size() == 10);
}

TEST_CASE("tiny_decoder: bad input names the argument") {
  TinyDecoderConfig c;
  c.num_qo_heads = 3;
  expect_error([&] { TinyDecoder{c}; }, {"TinyDecoder", "num_qo_heads", "num_kv_heads"});
  c = {};
  c.d_model = 30;
  c.num_qo_heads = 4;
  c.num_kv_heads = 4;
  expect_error([&] { TinyDecoder{c}; }, {"d_model (30) must be a multiple of num_qo_heads (4)"});
  c = {};
  c.vocab_size = 300;
  expect_error([&] { TinyDecoder{c}; }, {"vocab_size must be in [1, 256]", "300"});
  const TinyDecoder m;
  GenerationOptions o;
  expect_error([&] { ref::generate(m, {}, GenerationMode::recompute, o); }, {"generate", "prompts"});
  expect_error([&] { ref::generate(m, {"ok", ""}, GenerationMode::recompute, o); }, {"prompts[1] is empty"});
  o.max_new_tokens = -1;
  expect_error([&] { ref::generate(m, {"a"}, GenerationMode::recompute, o); }, {"max_new_tokens must be >= 0"});
  o = {};
  o.temperature = -0.5;
  expect_error([&] { ref::generate(m, {"a"}, GenerationMode::recompute, o); }, {"temperature must be finite and >= 0"});
  o = {};
  o.top_p = 0.0;
  expect_error([&] { ref::generate(m, {"a"}, GenerationMode::recompute, o); }, {"top_p must be in (0, 1]"});
  o = {};
  o.page_size = 0;
  expect_error([&] { ref::generate(m, {"a"}, GenerationMode::paged_kv_cache, o); }, {"page_size must be >= 1"});
  o = {};
  o.num_pages = 2;
  expect_error(
      [&] {
        ref::generate(m, {"The cat sat", "The cat ran fast"}, GenerationMode::paged_kv_cache, o);
      },
      {"num_pages = 2 is too small"});
  c = {};
  c.vocab_size = 100;
  expect_error([&] { ref::generate(TinyDecoder(c), {"~~~"}, GenerationMode::recompute, {}); },
               {"prompts[0] has byte 126", "vocab_size 100"});
  expect_error([] { ref::parse_generation_mode("paged"); }, {"mode must be", "\"paged\""});
  c = {};
  c.position_encoding = ref::PositionEncoding::rope;
  c.rope_theta = 0;
  expect_error([&] { TinyDecoder{c}; }, {"TinyDecoder", "rope_theta must be positive"});
  c.rope_theta = 1e4;
  c.d_model = 12;
  c.num_qo_heads = 4;
  c.num_kv_heads = 4;
  expect_error([&] { TinyDecoder{c}; }, {"TinyDecoder", "rope", "even head_dim", "3"});
  expect_error([] { ref::parse_position_encoding("alibi"); }, {"position_encoding", "\"alibi\""});
}

TEST_CASE("tiny_decoder: the rope mode is a different model whose positions enter Q and K only") {
  TinyDecoderConfig c;
  const TinyDecoder sinusoidal(c);
  c.position_encoding = ref::PositionEncoding::rope;
  const TinyDecoder rope(c);
  CHECK(ref::to_string(ref::parse_position_encoding("rope")) == std::string("rope"));
  // Same weights; embed() drops the sinusoid, so row t of X is the token's embedding.
  CHECK(rope.embedding().data == sinusoidal.embedding().data);
  const ref::Tensor x = rope.embed({65, 66}, 5);
  for (int64_t j = 0; j < c.d_model; ++j) CHECK(x({1, j}) == rope.embedding()({66, j}));
  // rope() moves Q at position 3 and leaves it at position 0; the sinusoidal model's rope()
  // is the identity.
  const ref::Tensor q = rope.project_heads(x, rope.layers()[0].w_q, c.num_qo_heads);
  CHECK(ref::max_abs_diff(rope.rope(q, 0), q) > 0);  // row 1 sits at position 1
  CHECK(ref::max_abs_diff(rope.rope(q, std::vector<int32_t>{0, 0}), q) == 0);
  CHECK(ref::max_abs_diff(sinusoidal.rope(q, 3), q) == 0);
  const std::vector<int32_t> tokens{84, 104, 101, 32, 99, 97, 116};
  CHECK(rope.next_token_logits(tokens) != sinusoidal.next_token_logits(tokens));
}

namespace {

// The value of a 16-bit pattern of fp16 (1 sign, 5 exponent, 10 fraction bits) or bf16
// (1, 8, 7), decoded from the format's definition; NaN for the NaN patterns.
double decode16(uint32_t bits, bool f16) {
  const int fraction_bits = f16 ? 10 : 7, exponent_bits = f16 ? 5 : 8, bias = f16 ? 15 : 127;
  const uint32_t fraction = bits & ((1u << fraction_bits) - 1);
  const uint32_t exponent = (bits >> fraction_bits) & ((1u << exponent_bits) - 1);
  const double sign = bits >> 15 ? -1.0 : 1.0;
  if (exponent == (1u << exponent_bits) - 1) return fraction ? std::nan("") : sign * HUGE_VAL;
  if (exponent == 0) return sign * std::ldexp(static_cast<double>(fraction), 1 - bias - fraction_bits);
  return sign * std::ldexp(static_cast<double>(fraction | (1u << fraction_bits)),
                           static_cast<int>(exponent) - bias - fraction_bits);
}

}  // namespace

TEST_CASE("tiny_decoder: round_to_storage is round-to-nearest-even in fp16 and bf16, every value checked") {
  for (bool f16 : {true, false}) {
    const ref::StorageRounding r = f16 ? ref::StorageRounding::f16 : ref::StorageRounding::bf16;
    CAPTURE(ref::to_string(r));
    // Every non-negative finite value: itself; the midpoint to the next goes to the even
    // pattern; just off the midpoint goes to the nearer one. Negatives mirror.
    const uint32_t last = f16 ? 0x7BFF : 0x7F7F;  // the largest finite pattern
    for (uint32_t b = 0; b < last; ++b) {
      const double lo = decode16(b, f16), hi = decode16(b + 1, f16), mid = (lo + hi) / 2;
      const double even = b % 2 == 0 ? lo : hi;
      CAPTURE(b);
      REQUIRE(ref::round_to_storage(lo, r) == lo);
      REQUIRE(ref::round_to_storage(-lo, r) == -lo);
      REQUIRE(ref::round_to_storage(mid, r) == even);
      REQUIRE(ref::round_to_storage(-mid, r) == -even);
      REQUIRE(ref::round_to_storage(std::nextafter(mid, 0.0), r) == lo);
      REQUIRE(ref::round_to_storage(std::nextafter(mid, HUGE_VAL), r) == hi);
    }
    // Past the largest finite value: its midpoint with the next power of two overflows.
    const double largest = decode16(last, f16), ulp = largest - decode16(last - 1, f16);
    CHECK(ref::round_to_storage(largest, r) == largest);
    CHECK(ref::round_to_storage(largest + ulp / 2, r) == HUGE_VAL);
    CHECK(ref::round_to_storage(-(largest + ulp / 2), r) == -HUGE_VAL);
    CHECK(ref::round_to_storage(std::nextafter(largest + ulp / 2, 0.0), r) == largest);
    CHECK(std::isnan(ref::round_to_storage(std::nan(""), r)));
  }
  CHECK(ref::round_to_storage(0.1, ref::StorageRounding::none) == 0.1);
  CHECK(ref::round_to_storage(1.0 + 0x1p-11, ref::StorageRounding::f16) == 1.0);  // a tie, to even
  CHECK(ref::round_to_storage(1.0 + 0x1p-8, ref::StorageRounding::bf16) == 1.0);
  CHECK(ref::parse_storage_rounding("bf16") == ref::StorageRounding::bf16);
  expect_error([] { ref::parse_storage_rounding("fp16"); }, {"parse_storage_rounding", "rounding", "fp16"});
}

TEST_CASE("tiny_decoder: with rounding, weights and the stored Q/K/V are fp16 or bf16 values and generation agrees") {
  auto rng = test::case_rng("tiny decoder rounding");
  for (ref::StorageRounding r : {ref::StorageRounding::f16, ref::StorageRounding::bf16}) {
    CAPTURE(ref::to_string(r));
    TinyDecoderConfig c;
    c.position_encoding = ref::PositionEncoding::rope;
    c.num_layers = 2;
    const TinyDecoder exact(c);
    c.rounding = r;
    const TinyDecoder m(c);
    auto representable = [&](const ref::Tensor& t) {
      return std::all_of(t.data.begin(), t.data.end(), [&](double x) { return ref::round_to_storage(x, r) == x; });
    };
    // Each weight is the unrounded model's weight, rounded.
    for (size_t i = 0; i < m.embedding().data.size(); ++i)
      REQUIRE(m.embedding().data[i] == ref::round_to_storage(exact.embedding().data[i], r));
    for (size_t l = 0; l < m.layers().size(); ++l) {
      const auto& w = m.layers()[l];
      const auto& e = exact.layers()[l];
      for (size_t i = 0; i < w.w_k.data.size(); ++i) REQUIRE(w.w_k.data[i] == ref::round_to_storage(e.w_k.data[i], r));
      CHECK(representable(w.w_q));
      CHECK(representable(w.w_v));
      CHECK(representable(w.w_o));
    }
    CHECK(representable(m.w_vocab()));
    // Q, K and V as the engine stores them: representable after the projection and after RoPE.
    const ref::Tensor x = m.embed({72, 105, 33}, 0);
    const ref::Tensor k = m.project_heads(x, m.layers()[0].w_k, c.num_kv_heads);
    CHECK(representable(k));
    CHECK(representable(m.rope(k, 4)));
    CHECK(representable(m.project_heads(x, m.layers()[1].w_v, c.num_kv_heads)));
    // Rounding moves the logits by about the format's precision, not more, not zero.
    const std::vector<int32_t> tokens{84, 104, 101, 32, 99, 97, 116};
    const auto a = m.next_token_logits(tokens), b = exact.next_token_logits(tokens);
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i)
      diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
    CHECK(diff > 0);
    CHECK(diff < (r == ref::StorageRounding::f16 ? 0.02 : 0.2) * scale);
    // The three generation modes still compute one function.
    const std::vector<std::string> prompts = {"The cat sat", "The cat ran fast", random_prompt(rng, 6)};
    GenerationOptions o;
    o.max_new_tokens = 5;
    o.record_logits = true;
    std::vector<ref::GenerationResult> runs;
    for (GenerationMode mode : kModes) runs.push_back(ref::generate(m, prompts, mode, o));
    for (size_t q = 0; q < prompts.size(); ++q)
      for (size_t k2 = 1; k2 < runs.size(); ++k2) {
        CHECK(runs[k2].requests[q].generated_tokens == runs[0].requests[q].generated_tokens);
        for (size_t t = 0; t < runs[0].requests[q].step_logits.size(); ++t) {
          for (size_t i = 0; i < 256; ++i)
            REQUIRE(std::abs(runs[k2].requests[q].step_logits[t][i] - runs[0].requests[q].step_logits[t][i]) <= 1e-9);
          // step_hidden is the row the step's logits come from
          REQUIRE(runs[k2].requests[q].step_hidden[t].size() == static_cast<size_t>(c.d_model));
          CHECK(m.logits(runs[k2].requests[q].step_hidden[t].data()) == runs[k2].requests[q].step_logits[t]);
        }
      }
  }
}
