// Stage 06 against the reference, token for token: every sampler on a rotated grid of
// vocab {2, 111, 32000, 128256, 151936} x batch {1, 7, 128} x parameters x seeds x
// offsets, with scalar and per-output parameters and identity or random `indices`; the
// GPU's tokens and rejection rounds must equal ref::*_sampling_from_probs' exactly. The
// operators that go through an intermediate (softmax, top-k renorm or mask into the
// workspace) are checked in two steps: the intermediate against the reference within
// float tolerance, then the tokens exactly against the reference sampler run on the
// GPU's own intermediate. Renorm and mask outputs, chain speculative sampling, bad rows
// (status codes, sentinels, untouched neighbours), host-side argument errors, and the
// exact-mass arithmetic (suite "host", runs without a GPU) complete it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "06_sampling/launch.hpp"
#include "06_sampling/mass.cuh"
#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/philox.cuh"
#include "flashstep/reference/sampling.hpp"
#include "flashstep/reference/speculative.hpp"
#include "sampling_support.hpp"
#include "support/expect_error.hpp"
#include "support/random.hpp"

namespace gpu = flashstep::stages::sampling;
namespace ref = flashstep::ref;
using flashstep::test::as_tensor;
using flashstep::test::bf16_bits;
using flashstep::test::bf16_value;
using flashstep::test::DeviceArray;
using flashstep::test::random_prob_rows;

namespace {

const int64_t kVocabs[] = {2, 111, 32000, 128256, 151936};
const int64_t kBatches[] = {1, 7, 128};
const uint64_t kOffsets[] = {0, 1, 7, (uint64_t{1} << 32) + 3};

enum class Op { plain, top_k, top_p, min_p, joint, top_k_first };
const char* op_name(Op op) {
  switch (op) {
    case Op::plain: return "sampling_from_probs";
    case Op::top_k: return "top_k_sampling_from_probs";
    case Op::top_p: return "top_p_sampling_from_probs";
    case Op::min_p: return "min_p_sampling_from_probs";
    case Op::joint: return "top_k_top_p_sampling_from_probs joint";
    case Op::top_k_first: return "top_k_top_p_sampling_from_probs top_k_first";
  }
  return "?";
}

// One cell of the rotated grid.
struct Cell {
  Op op;
  int64_t vocab, batch, rows;
  bool per_output, shuffled;  // per-output parameters; random indices
  uint64_t seed, offset;
  std::vector<int64_t> top_k;
  std::vector<double> top_p, min_p;
  std::vector<int32_t> indices;
  std::string describe() const {
    char buf[256];
    std::snprintf(
        buf, sizeof buf, "%s vocab=%lld batch=%lld rows=%lld %s %s seed=%llu offset=%llu k=%lld p=%.3g min_p=%.3g",
        op_name(op), static_cast<long long>(vocab), static_cast<long long>(batch), static_cast<long long>(rows),
        per_output ? "per-output" : "scalar", shuffled ? "indices" : "identity", static_cast<unsigned long long>(seed),
        static_cast<unsigned long long>(offset), static_cast<long long>(top_k[0]), top_p[0], min_p[0]);
    return buf;
  }
};

// k, p and min_p values the grid rotates through (k = vocab and beyond keep all).
int64_t pick_k(size_t i, int64_t vocab) {
  const int64_t ks[] = {1, 2, 10, 50, 500, vocab, vocab + 5};
  return ks[i % 7];
}
double pick_p(size_t i) {
  const double ps[] = {0.1, 0.5, 0.9, 0.99, 1.0, 0.7};
  return ps[i % 6];
}
double pick_min_p(size_t i) {
  const double ms[] = {0.05, 0.5, 0.0, 1.0, 0.2};
  return ms[i % 5];
}

std::vector<Cell> make_grid(Op op, std::mt19937_64& rng) {
  std::vector<Cell> cells;
  size_t n = 0;
  for (int64_t vocab : kVocabs) {
    for (int64_t batch : kBatches) {
      Cell c;
      c.op = op;
      c.vocab = vocab;
      c.batch = batch;
      c.per_output = n % 2 == 1;
      c.shuffled = n % 3 != 0;
      c.rows = c.shuffled ? batch / 2 + 1 : batch;
      c.seed = rng();
      c.offset = kOffsets[n % 4];
      const size_t params = c.per_output ? static_cast<size_t>(batch) : 1;
      for (size_t i = 0; i < params; ++i) {
        c.top_k.push_back(pick_k(n + i * 3, vocab));
        c.top_p.push_back(pick_p(n + i * 5));
        c.min_p.push_back(pick_min_p(n + i * 2));
      }
      if (c.shuffled) {
        for (int64_t i = 0; i < batch; ++i)
          c.indices.push_back(static_cast<int32_t>(flashstep::test::random_int(rng, 0, c.rows - 1)));
      }
      cells.push_back(std::move(c));
      ++n;
    }
  }
  return cells;
}

// First few mismatching outputs, with everything needed to reproduce them.
void check_tokens(const std::string& what, const std::vector<int32_t>& gpu_tokens,
                  const std::vector<int32_t>& gpu_rounds, const std::vector<int32_t>& gpu_status,
                  const ref::SamplingResult& expected, const std::vector<int32_t>& indices) {
  size_t mismatches = 0;
  std::string first;
  for (size_t i = 0; i < gpu_tokens.size(); ++i) {
    const bool same = gpu_tokens[i] == expected.samples[i] && gpu_rounds[i] == expected.rounds[i] && gpu_status[i] == 0;
    if (same) continue;
    if (++mismatches <= 5)
      first += "  output " + std::to_string(i) + " (row " + std::to_string(indices.empty() ? int32_t(i) : indices[i]) +
               "): GPU token " + std::to_string(gpu_tokens[i]) + " rounds " + std::to_string(gpu_rounds[i]) +
               " status " + std::to_string(gpu_status[i]) + ", reference token " + std::to_string(expected.samples[i]) +
               " rounds " + std::to_string(expected.rounds[i]) + "\n";
  }
  INFO(what);
  INFO(first);
  CHECK_MESSAGE(mismatches == 0, mismatches, " of ", gpu_tokens.size(), " outputs differ");
}

// Float rows (n, vocab) against reference rows within atol + rtol * |ref|; NaN never passes.
void check_close(const std::string& what, const std::vector<float>& got, const ref::Tensor& expected, double atol,
                 double rtol) {
  REQUIRE(got.size() == expected.data.size());
  size_t bad = 0;
  std::string first;
  const int64_t vocab = expected.dim(1);
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = expected.data[i], g = got[i];
    const bool ok = (std::isinf(e) && g == e) || std::abs(g - e) <= atol + rtol * std::abs(e);
    if (ok) continue;
    if (++bad <= 5)
      first += "  [" + std::to_string(static_cast<int64_t>(i) / vocab) + ", " +
               std::to_string(static_cast<int64_t>(i) % vocab) + "]: GPU " + std::to_string(g) + " reference " +
               std::to_string(e) + "\n";
  }
  INFO(what);
  INFO(first);
  CHECK_MESSAGE(bad == 0, bad, " of ", got.size(), " entries outside tolerance");
}

// Tensor of rows gathered by indices (identity when empty).
ref::Tensor gather(const ref::Tensor& t, const std::vector<int32_t>& indices, int64_t batch) {
  const int64_t vocab = t.dim(1);
  ref::Tensor out({batch, vocab});
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t r = indices.empty() ? i : indices[static_cast<size_t>(i)];
    std::copy(t.data.begin() + r * vocab, t.data.begin() + (r + 1) * vocab, out.data.begin() + i * vocab);
  }
  return out;
}

template <typename T>
std::vector<T> to_float_vector(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

// Device-side parameters of a cell (kept alive for the call).
struct CellParams {
  DeviceArray<int32_t> indices, top_k;
  DeviceArray<float> top_p, min_p;
  gpu::TopK k{1};
  gpu::Fraction p{1.0}, m{0.0};
  CellParams(const Cell& c) {
    if (!c.indices.empty()) indices = DeviceArray<int32_t>(c.indices);
    if (c.per_output) {
      std::vector<int32_t> ks;
      for (int64_t k : c.top_k) ks.push_back(static_cast<int32_t>(std::min<int64_t>(k, INT32_MAX)));
      top_k = DeviceArray<int32_t>(ks);
      top_p = DeviceArray<float>(to_float_vector<float>(c.top_p));
      min_p = DeviceArray<float>(to_float_vector<float>(c.min_p));
      k = gpu::TopK::per_row(top_k.get());
      p = gpu::Fraction::per_row(top_p.get());
      m = gpu::Fraction::per_row(min_p.get());
    } else {
      k = gpu::TopK(c.top_k[0]);
      p = gpu::Fraction(c.top_p[0]);
      m = gpu::Fraction(c.min_p[0]);
    }
  }
};

ref::RowParam<int64_t> ref_k(const Cell& c) {
  return c.per_output ? ref::RowParam<int64_t>(c.top_k) : ref::RowParam<int64_t>(c.top_k[0]);
}
ref::RowParam<double> ref_fraction(const Cell& c, const std::vector<double>& v) {
  // per-output values go to the device as float: the reference gets the same float values
  if (!c.per_output) return ref::RowParam<double>(v[0]);
  std::vector<double> f;
  for (double x : v) f.push_back(static_cast<float>(x));
  return ref::RowParam<double>(f);
}

void run_cell(const Cell& c, std::mt19937_64& rng) {
  CAPTURE(c.describe());
  const std::vector<float> rows = random_prob_rows(rng, c.rows, c.vocab, 2.0, c.vocab >= 111);
  const ref::Tensor probs = as_tensor(rows, c.vocab);
  DeviceArray<float> d_probs(rows);
  CellParams params(c);
  DeviceArray<int32_t> samples(static_cast<size_t>(c.batch)), rounds(static_cast<size_t>(c.batch)),
      status(static_cast<size_t>(c.batch));
  samples.poison(), rounds.poison(), status.poison();
  gpu::SamplingOptions opt;
  opt.indices = params.indices.get();
  opt.batch = c.batch;
  opt.seed = c.seed;
  opt.offset = c.offset;
  const gpu::SamplingOutputs out{samples.get(), rounds.get(), status.get()};
  const gpu::DeviceRows in{d_probs.get(), c.rows, c.vocab};
  ref::SamplingOptions ropt;
  ropt.indices = c.indices;
  ropt.seed = c.seed;
  ropt.offset = c.offset;
  ref::SamplingResult expected;
  switch (c.op) {
    case Op::plain:
      gpu::sampling_from_probs(in, out, opt);
      expected = ref::sampling_from_probs(probs, ropt);
      break;
    case Op::top_k:
      gpu::top_k_sampling_from_probs(in, params.k, out, opt);
      expected = ref::top_k_sampling_from_probs(probs, ref_k(c), ropt);
      break;
    case Op::top_p:
      gpu::top_p_sampling_from_probs(in, params.p, out, opt);
      expected = ref::top_p_sampling_from_probs(probs, ref_fraction(c, c.top_p), ropt);
      break;
    case Op::min_p:
      gpu::min_p_sampling_from_probs(in, params.m, out, opt);
      expected = ref::min_p_sampling_from_probs(probs, ref_fraction(c, c.min_p), ropt);
      break;
    case Op::joint:
      gpu::top_k_top_p_sampling_from_probs(in, params.k, params.p, ref::FilterApplyOrder::joint, out, {}, opt);
      expected = ref::top_k_top_p_sampling_from_probs(probs, ref_k(c), ref_fraction(c, c.top_p),
                                                      ref::FilterApplyOrder::joint, ropt);
      break;
    case Op::top_k_first: {
      const size_t bytes = gpu::workspace_bytes("top_k_top_p_sampling_from_probs", c.rows, c.batch, c.vocab);
      DeviceArray<uint8_t> ws(bytes);
      ws.poison();
      gpu::top_k_top_p_sampling_from_probs(in, params.k, params.p, ref::FilterApplyOrder::top_k_first, out,
                                           {ws.get(), bytes}, opt);
      // the intermediate: the workspace starts with the (batch, vocab) renormalized rows
      const auto bytes_back = ws.download();
      std::vector<float> renormed(static_cast<size_t>(c.batch * c.vocab));
      std::memcpy(renormed.data(), bytes_back.data(), renormed.size() * sizeof(float));
      const ref::Tensor gathered = gather(probs, c.indices, c.batch);
      ref::Tensor expected_renorm({c.batch, c.vocab});
      for (int64_t i = 0; i < c.batch; ++i) {
        ref::Tensor one({1, c.vocab});
        std::copy(gathered.data.begin() + i * c.vocab, gathered.data.begin() + (i + 1) * c.vocab, one.data.begin());
        const ref::Tensor r = ref::top_k_renorm_probs(one, c.top_k[c.per_output ? static_cast<size_t>(i) : 0]);
        std::copy(r.data.begin(), r.data.end(), expected_renorm.data.begin() + i * c.vocab);
      }
      check_close("top_k_renorm_probs intermediate", renormed, expected_renorm, 1e-9, 1e-6);
      ref::SamplingOptions on_gpu_rows = ropt;
      on_gpu_rows.indices.clear();
      expected = ref::top_p_sampling_from_probs(as_tensor(renormed, c.vocab), ref_fraction(c, c.top_p), on_gpu_rows);
      break;
    }
  }
  check_tokens(c.describe(), samples.download(), rounds.download(), status.download(), expected, c.indices);
}

void run_grid(Op op) {
  auto rng = flashstep::test::case_rng(std::string("stage 06 grid ") + op_name(op));
  for (const Cell& c : make_grid(op, rng)) run_cell(c, rng);
}

}  // namespace

TEST_CASE("sampling_from_probs: GPU tokens equal the reference's on the grid") { run_grid(Op::plain); }
TEST_CASE("top_k_sampling_from_probs: GPU tokens and rounds equal the reference's") { run_grid(Op::top_k); }
TEST_CASE("top_p_sampling_from_probs: GPU tokens and rounds equal the reference's") { run_grid(Op::top_p); }
TEST_CASE("min_p_sampling_from_probs: GPU tokens equal the reference's") { run_grid(Op::min_p); }
TEST_CASE("top_k_top_p_sampling_from_probs joint: GPU tokens and rounds equal the reference's") { run_grid(Op::joint); }
TEST_CASE("top_k_top_p_sampling_from_probs top_k_first: renorm within tolerance, tokens exact on it") {
  run_grid(Op::top_k_first);
}

namespace {

// An engine step samples every request in one launch, each with its own Philox key and
// offset. An output with its own key is subsequence 0 of that key (a one-output call);
// with only its own offset it stays subsequence i of the shared key. Batch 3 takes the
// cluster kernel (a row split over several blocks), batch 37 one block per output.
void check_per_output_keys(int64_t batch) {
  auto rng = flashstep::test::case_rng("stage 06 per-output seeds " + std::to_string(batch));
  const int64_t vocab = 32000, rows = 20;
  const std::vector<float> host_rows = random_prob_rows(rng, rows, vocab);
  DeviceArray<float> d_probs(host_rows);
  std::vector<int32_t> indices;
  std::vector<uint64_t> seeds, offsets;
  for (int64_t i = 0; i < batch; ++i) {
    indices.push_back(static_cast<int32_t>(flashstep::test::random_int(rng, 0, rows - 1)));
    seeds.push_back(rng());
    offsets.push_back(i % 3 == 0 ? (uint64_t{1} << 32) + static_cast<uint64_t>(i) : static_cast<uint64_t>(64 * i));
  }
  DeviceArray<int32_t> d_indices(indices);
  DeviceArray<uint64_t> d_seeds(seeds), d_offsets(offsets);
  const uint64_t shared_seed = rng(), shared_offset = 5;
  const int64_t k = 50;
  const double p = 0.9, m = 0.05;
  const gpu::DeviceRows in{d_probs.get(), rows, vocab};
  for (Op op : {Op::plain, Op::top_k, Op::top_p, Op::min_p, Op::joint, Op::top_k_first}) {
    for (int keys = 0; keys < 3; ++keys) {  // 0: seeds and offsets, 1: seeds only, 2: offsets only
      const bool own_seed = keys != 2, own_offset = keys != 1;
      CAPTURE(op_name(op));
      CAPTURE(own_seed);
      CAPTURE(own_offset);
      DeviceArray<int32_t> samples(static_cast<size_t>(batch)), rounds(static_cast<size_t>(batch)),
          status(static_cast<size_t>(batch));
      samples.poison(), rounds.poison(), status.poison();
      gpu::SamplingOptions opt;
      opt.indices = d_indices.get();
      opt.batch = batch;
      opt.seed = shared_seed;
      opt.offset = shared_offset;
      opt.seed_per_output = own_seed ? d_seeds.get() : nullptr;
      opt.offset_per_output = own_offset ? d_offsets.get() : nullptr;
      const gpu::SamplingOutputs out{samples.get(), rounds.get(), status.get()};
      ref::SamplingFilter filter;
      std::vector<float> drawn_rows;  // (batch, vocab) the rows the sampler drew from
      const size_t ws_bytes = gpu::workspace_bytes("top_k_top_p_sampling_from_probs", rows, batch, vocab);
      DeviceArray<uint8_t> ws(ws_bytes);
      switch (op) {
        case Op::plain: gpu::sampling_from_probs(in, out, opt); break;
        case Op::top_k:
          gpu::top_k_sampling_from_probs(in, gpu::TopK(k), out, opt);
          filter = ref::SamplingFilter::make_top_k(k);
          break;
        case Op::top_p:
          gpu::top_p_sampling_from_probs(in, gpu::Fraction(p), out, opt);
          filter = ref::SamplingFilter::make_top_p(p);
          break;
        case Op::min_p:
          gpu::min_p_sampling_from_probs(in, gpu::Fraction(m), out, opt);
          filter = ref::SamplingFilter::make_min_p(m);
          break;
        case Op::joint:
          gpu::top_k_top_p_sampling_from_probs(in, gpu::TopK(k), gpu::Fraction(p), ref::FilterApplyOrder::joint, out,
                                               {}, opt);
          filter = ref::SamplingFilter::make_top_k_top_p(k, p);
          break;
        case Op::top_k_first: {
          gpu::top_k_top_p_sampling_from_probs(in, gpu::TopK(k), gpu::Fraction(p), ref::FilterApplyOrder::top_k_first,
                                               out, {ws.get(), ws_bytes}, opt);
          // top-p on the renormalized rows the workspace holds (checked by the grid above)
          const auto bytes_back = ws.download();
          drawn_rows.resize(static_cast<size_t>(batch * vocab));
          std::memcpy(drawn_rows.data(), bytes_back.data(), drawn_rows.size() * sizeof(float));
          filter = ref::SamplingFilter::make_top_p(p);
          break;
        }
      }
      const std::vector<int32_t> got = samples.download(), got_rounds = rounds.download(),
                                 got_status = status.download();
      ref::SamplingResult expected;
      for (int64_t i = 0; i < batch; ++i) {
        const float* row = drawn_rows.empty() ? host_rows.data() + int64_t{indices[static_cast<size_t>(i)]} * vocab
                                              : drawn_rows.data() + i * vocab;
        const uint64_t key = own_seed ? seeds[static_cast<size_t>(i)] : shared_seed;
        const uint64_t subsequence = own_seed ? 0 : static_cast<uint64_t>(i);
        const uint64_t offset = own_offset ? offsets[static_cast<size_t>(i)] : shared_offset;
        const ref::RejectionDraw d = ref::rejection_sample_row(row, vocab, filter, key, subsequence, offset);
        expected.samples.push_back(d.token);
        expected.rounds.push_back(d.rounds);
      }
      check_tokens(std::string(op_name(op)) + " per-output keys", got, got_rounds, got_status, expected, indices);
    }
  }
  // The engine's case, against the operator itself: output i with key seeds[i] and offset
  // offsets[i] draws what a one-output top-k/top-p call with that seed and offset draws.
  DeviceArray<int32_t> samples(static_cast<size_t>(batch)), status(static_cast<size_t>(batch));
  gpu::SamplingOptions opt;
  opt.indices = d_indices.get();
  opt.batch = batch;
  opt.seed_per_output = d_seeds.get();
  opt.offset_per_output = d_offsets.get();
  gpu::top_k_top_p_sampling_from_probs(in, gpu::TopK(k), gpu::Fraction(p), ref::FilterApplyOrder::joint,
                                       {samples.get(), nullptr, status.get()}, {}, opt);
  const std::vector<int32_t> got = samples.download();
  const ref::Tensor probs = as_tensor(host_rows, vocab);
  for (int64_t i = 0; i < batch; ++i) {
    ref::SamplingOptions one;
    one.indices = {indices[static_cast<size_t>(i)]};
    one.seed = seeds[static_cast<size_t>(i)];
    one.offset = offsets[static_cast<size_t>(i)];
    const ref::SamplingResult r = ref::top_k_top_p_sampling_from_probs(
        probs, ref::RowParam<int64_t>(k), ref::RowParam<double>(p), ref::FilterApplyOrder::joint, one);
    CHECK_MESSAGE(got[static_cast<size_t>(i)] == r.samples[0], "output ", i, ": GPU ", got[static_cast<size_t>(i)],
                  ", one-output reference call ", r.samples[0]);
  }
}

}  // namespace

TEST_CASE("per-output seeds and offsets: one launch draws what each output's own call would") {
  check_per_output_keys(3);
  check_per_output_keys(37);
}

namespace {

std::vector<double> random_logits(std::mt19937_64& rng, int64_t n, double neg_inf_fraction) {
  std::normal_distribution<double> normal(0.0, 2.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v)
    x = unit(rng) < neg_inf_fraction ? -std::numeric_limits<double>::infinity()
                                     : static_cast<float>(std::round(8.0 * normal(rng)) / 8.0);
  return v;
}

// Logit rows on the device as f32 or bf16; `values` are what the device holds, as doubles.
struct DeviceLogits {
  DeviceArray<float> f32;
  DeviceArray<uint16_t> bf16;
  ref::Tensor values;
  gpu::DeviceRows rows;
  DeviceLogits(const ref::Tensor& logits, bool as_bf16) : values(logits) {
    const int64_t n_rows = logits.dim(0), vocab = logits.dim(1);
    if (as_bf16) {
      std::vector<uint16_t> b;
      for (double x : logits.data) b.push_back(bf16_bits(static_cast<float>(x)));
      for (size_t i = 0; i < b.size(); ++i) values.data[i] = bf16_value(b[i]);
      bf16 = DeviceArray<uint16_t>(b);
      rows = {bf16.get(), n_rows, vocab, gpu::ElementType::bf16};
    } else {
      std::vector<float> f(logits.data.begin(), logits.data.end());
      for (size_t i = 0; i < f.size(); ++i) values.data[i] = f[i];
      f32 = DeviceArray<float>(f);
      rows = {f32.get(), n_rows, vocab, gpu::ElementType::f32};
    }
  }
};

}  // namespace

TEST_CASE("from logits (f32 and bf16): fused softmax within float tolerance, tokens exact on it") {
  auto rng = flashstep::test::case_rng("stage 06 logits");
  size_t n = 0;
  for (bool as_bf16 : {false, true}) {
    for (int64_t vocab : {int64_t{2}, int64_t{111}, int64_t{32000}, int64_t{151936}}) {
      for (int64_t batch : {int64_t{1}, int64_t{7}}) {
        for (int variant = 0; variant < 3; ++variant, ++n) {
          const bool shuffled = n % 2 == 1;
          const int64_t rows = shuffled ? batch / 2 + 1 : batch;
          ref::Tensor raw({rows, vocab});
          raw.data = random_logits(rng, rows * vocab, vocab > 2 ? 0.02 : 0.0);
          if (as_bf16) {  // off the 1/8 grid, so that rounding to bf16 changes most values
            std::normal_distribution<double> jitter(0.0, 0.01);
            for (auto& x : raw.data) x += std::isinf(x) ? 0.0 : jitter(rng);
          }
          for (int64_t r = 0; r < rows; ++r) raw.data[static_cast<size_t>(r * vocab)] = 0.5;  // one finite per row
          const DeviceLogits dl(raw, as_bf16);
          const ref::Tensor& logits = dl.values;
          std::vector<int32_t> indices;
          if (shuffled)
            for (int64_t i = 0; i < batch; ++i)
              indices.push_back(static_cast<int32_t>(flashstep::test::random_int(rng, 0, rows - 1)));
          const int64_t k = pick_k(n, vocab);
          const double p = pick_p(n);
          const uint64_t seed = rng(), offset = kOffsets[n % 4];
          CAPTURE(as_bf16);
          CAPTURE(vocab);
          CAPTURE(batch);
          CAPTURE(variant);
          CAPTURE(seed);
          CAPTURE(k);
          CAPTURE(p);
          DeviceArray<int32_t> d_indices(indices), samples(static_cast<size_t>(batch)),
              rounds(static_cast<size_t>(batch)), status(static_cast<size_t>(batch));
          DeviceArray<float> probs(static_cast<size_t>(batch * vocab));
          samples.poison(), rounds.poison(), status.poison(), probs.poison();
          gpu::SamplingOptions opt;
          opt.indices = shuffled ? d_indices.get() : nullptr;
          opt.batch = batch;
          opt.seed = seed;
          opt.offset = offset;
          const gpu::SamplingOutputs out{samples.get(), rounds.get(), status.get(), probs.get()};
          const auto order = variant == 1 ? ref::FilterApplyOrder::joint : ref::FilterApplyOrder::top_k_first;
          const char* name = variant == 0 ? "sampling_from_logits" : "top_k_top_p_sampling_from_logits";
          const size_t bytes = gpu::workspace_bytes(name, rows, batch, vocab, order);
          if (variant < 2) CHECK(bytes == 0);  // fused: only top_k_first keeps a workspace
          DeviceArray<uint8_t> ws(bytes);
          ws.poison();
          if (variant == 0) {
            gpu::sampling_from_logits(dl.rows, out, {}, opt);
          } else {
            gpu::top_k_top_p_sampling_from_logits(dl.rows, gpu::TopK(k), gpu::Fraction(p), order, out,
                                                  {ws.get(), bytes}, opt);
          }
          // the probabilities each output drew from: the fused softmax, written on request
          const std::vector<float> used = probs.download();
          const ref::Tensor gathered = gather(logits, indices, batch);
          ref::SamplingOptions on_rows;
          on_rows.seed = seed;
          on_rows.offset = offset;  // output i drew from row i of `used`, subsequence i
          ref::SamplingResult expected;
          if (variant == 2) {
            const ref::Tensor masked = ref::top_k_mask_logits(gathered, k);
            const auto ws_bytes = ws.download();
            std::vector<float> ws_masked(static_cast<size_t>(batch * vocab));
            std::memcpy(ws_masked.data(), ws_bytes.data(), ws_masked.size() * sizeof(float));
            check_close("top_k_mask_logits intermediate (exact)", ws_masked, masked, 0.0, 0.0);
            check_close("fused softmax(top_k_mask_logits)", used, ref::softmax(masked), 1e-7, 2e-5);
            expected = ref::top_p_sampling_from_probs(as_tensor(used, vocab), p, on_rows);
          } else {
            check_close("fused softmax", used, ref::softmax(gathered), 1e-7, 2e-5);
            expected = variant == 0 ? ref::sampling_from_probs(as_tensor(used, vocab), on_rows)
                                    : ref::top_k_top_p_sampling_from_probs(as_tensor(used, vocab), k, p,
                                                                           ref::FilterApplyOrder::joint, on_rows);
            // softmax() is the same device function: bit for bit the rows the sampler used
            DeviceArray<float> soft(static_cast<size_t>(rows * vocab));
            gpu::softmax(dl.rows, 1.0, soft.get());
            const ref::Tensor soft_rows = gather(as_tensor(soft.download(), vocab), indices, batch);
            size_t differ = 0;
            for (size_t i = 0; i < used.size(); ++i) differ += static_cast<float>(soft_rows.data[i]) != used[i];
            CHECK_MESSAGE(differ == 0, differ, " entries of softmax() differ from the fused softmax");
          }
          check_tokens(name, samples.download(), rounds.download(), status.download(), expected, {});
        }
      }
    }
  }
}

TEST_CASE("top_k_renorm_probs, top_p_renorm_probs, top_k_mask_logits and softmax match the reference") {
  auto rng = flashstep::test::case_rng("stage 06 transforms");
  size_t n = 0;
  for (int64_t vocab : {int64_t{2}, int64_t{111}, int64_t{32000}, int64_t{128256}}) {
    for (int64_t rows : {int64_t{1}, int64_t{7}}) {
      ++n;
      const std::vector<float> pr = random_prob_rows(rng, rows, vocab, 2.0, vocab >= 111);
      const ref::Tensor probs = as_tensor(pr, vocab);
      ref::Tensor logits({rows, vocab});
      logits.data = random_logits(rng, rows * vocab, 0.02);
      for (int64_t r = 0; r < rows; ++r) logits.data[static_cast<size_t>(r * vocab)] = 0.25;
      const std::vector<float> lf(logits.data.begin(), logits.data.end());
      DeviceArray<float> d_probs(pr), d_logits(lf), d_out(pr.size());
      DeviceArray<int32_t> status(static_cast<size_t>(rows));
      const int64_t k = pick_k(n, vocab);
      const double p = pick_p(n);
      const double temperature = n % 2 ? 0.7 : 1.0;
      CAPTURE(vocab);
      CAPTURE(rows);
      CAPTURE(k);
      CAPTURE(p);
      auto statuses_ok = [&] {
        const auto s = status.download();
        CHECK(std::all_of(s.begin(), s.end(), [](int32_t x) { return x == 0; }));
      };
      d_out.poison(), status.poison();
      gpu::top_k_renorm_probs({d_probs.get(), rows, vocab}, gpu::TopK(k), d_out.get(), status.get());
      check_close("top_k_renorm_probs", d_out.download(), ref::top_k_renorm_probs(probs, k), 1e-9, 1e-6);
      statuses_ok();
      d_out.poison(), status.poison();
      gpu::top_p_renorm_probs({d_probs.get(), rows, vocab}, gpu::Fraction(p), d_out.get(), status.get());
      check_close("top_p_renorm_probs", d_out.download(), ref::top_p_renorm_probs(probs, p), 1e-9, 1e-6);
      statuses_ok();
      d_out.poison(), status.poison();
      gpu::top_k_mask_logits({d_logits.get(), rows, vocab}, gpu::TopK(k), d_out.get(), status.get());
      check_close("top_k_mask_logits (exact)", d_out.download(), ref::top_k_mask_logits(logits, k), 0.0, 0.0);
      statuses_ok();
      d_out.poison(), status.poison();
      gpu::softmax({d_logits.get(), rows, vocab}, temperature, d_out.get(), status.get());
      check_close("softmax", d_out.download(), ref::softmax(logits, temperature), 1e-7, 2e-5);
      statuses_ok();
      // bf16 logits (off the 1/8 grid): the reference gets the bf16-rounded values
      ref::Tensor jittered = logits;
      std::normal_distribution<double> jitter(0.0, 0.01);
      for (auto& x : jittered.data) x += std::isinf(x) ? 0.0 : jitter(rng);
      const DeviceLogits bf(jittered, true);
      d_out.poison(), status.poison();
      gpu::top_k_mask_logits(bf.rows, gpu::TopK(k), d_out.get(), status.get());
      check_close("top_k_mask_logits bf16 (exact)", d_out.download(), ref::top_k_mask_logits(bf.values, k), 0.0, 0.0);
      statuses_ok();
      d_out.poison(), status.poison();
      gpu::softmax(bf.rows, temperature, d_out.get(), status.get());
      check_close("softmax bf16", d_out.download(), ref::softmax(bf.values, temperature), 1e-7, 2e-5);
      statuses_ok();
    }
  }
}

TEST_CASE("chain_speculative_sampling: every output equals the reference's") {
  auto rng = flashstep::test::case_rng("stage 06 speculative");
  size_t n_case = 0;
  for (int64_t vocab : {int64_t{2}, int64_t{111}, int64_t{32000}}) {
    for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{33}}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{4}}) {
        ++n_case;
        // draft rows are sharper or flatter variants of the target, so both outcomes occur
        const std::vector<float> target = random_prob_rows(rng, batch * (n + 1), vocab, 1.5, false, 0.05);
        std::vector<float> draft = random_prob_rows(rng, batch * n, vocab, 1.5, false, 0.05);
        if (n_case % 3 == 0 && n > 0)  // draft == target on position 0: relu(p - q) is empty, the fallback draws from p
          for (int64_t b = 0; b < batch; ++b)
            std::copy(target.begin() + b * (n + 1) * vocab, target.begin() + (b * (n + 1) + 1) * vocab,
                      draft.begin() + b * n * vocab);
        std::vector<int32_t> ids(static_cast<size_t>(batch * n));
        for (auto& d : ids) d = static_cast<int32_t>(flashstep::test::random_int(rng, 0, vocab - 1));
        const uint64_t seed = rng(), offset = kOffsets[n_case % 4];
        CAPTURE(vocab);
        CAPTURE(batch);
        CAPTURE(n);
        CAPTURE(seed);
        ref::Tensor td({batch, n + 1, vocab}), dd({batch, n, vocab});
        std::copy(target.begin(), target.end(), td.data.begin());
        std::copy(draft.begin(), draft.end(), dd.data.begin());
        const auto expected = ref::chain_speculative_sampling(dd, ids, td, seed, offset);
        DeviceArray<float> d_target(target), d_draft(draft);
        DeviceArray<int32_t> d_ids(ids), tokens(static_cast<size_t>(batch * (n + 1))),
            accepted(static_cast<size_t>(batch)), emitted(static_cast<size_t>(batch)),
            status(static_cast<size_t>(batch));
        tokens.poison(), accepted.poison(), emitted.poison(), status.poison();
        gpu::chain_speculative_sampling(d_draft.get(), d_ids.get(), d_target.get(), batch, n, vocab,
                                        {tokens.get(), accepted.get(), emitted.get(), status.get()}, seed, offset);
        CHECK(tokens.download() == expected.output_token_ids);
        CHECK(accepted.download() == expected.output_accepted_token_num);
        CHECK(emitted.download() == expected.output_emitted_draft_token_num);
        const auto s = status.download();
        CHECK(std::all_of(s.begin(), s.end(), [](int32_t x) { return x == 0; }));
      }
    }
  }
}

TEST_CASE("bad rows and bad per-output parameters get a status and a sentinel, and good rows are untouched") {
  auto rng = flashstep::test::case_rng("stage 06 bad rows");
  int64_t vocab = 1000;
  // 40000 entries are 5 tiles: at this batch each probability row is split over a cluster
  SUBCASE("vocab 1000, one block per row") { vocab = 1000; }
  SUBCASE("vocab 40000, rows split over a cluster") { vocab = 40000; }
  CAPTURE(vocab);
  const int64_t good_rows = 4;
  // rows 0..3 good; then one defect per row
  std::vector<float> rows = random_prob_rows(rng, good_rows, vocab);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Defect {
    const char* what;
    std::function<void(float*)> apply;
    gpu::Status expected;
  };
  const std::vector<Defect> defects = {
      {"NaN entry", [&](float* r) { r[17] = nan; }, gpu::Status::not_finite},
      {"+inf entry", [&](float* r) { r[0] = inf; }, gpu::Status::not_finite},
      {"-inf entry", [&](float* r) { r[vocab - 1] = -inf; }, gpu::Status::not_finite},
      {"negative entry", [&](float* r) { r[vocab / 2 + 5] = -1e-3f; }, gpu::Status::negative},
      {"entry > 1", [&](float* r) { r[5] = 1.5f; }, gpu::Status::above_one},
      {"all zeros", [&](float* r) { std::fill(r, r + vocab, 0.f); }, gpu::Status::zero_row},
      {"all below one mass unit", [&](float* r) { std::fill(r, r + vocab, 1e-30f); }, gpu::Status::zero_row},
      {"all NaN", [&](float* r) { std::fill(r, r + vocab, nan); }, gpu::Status::not_finite},
  };
  const int64_t n_rows = good_rows + static_cast<int64_t>(defects.size());
  rows.resize(static_cast<size_t>(n_rows * vocab), 1.0f / vocab);
  for (size_t d = 0; d < defects.size(); ++d)
    defects[d].apply(rows.data() + (good_rows + static_cast<int64_t>(d)) * vocab);
  DeviceArray<float> d_rows(rows);
  // outputs: every row once, then bad indices; per-output parameters with bad values on the good rows
  std::vector<int32_t> indices;
  for (int64_t r = 0; r < n_rows; ++r) indices.push_back(static_cast<int32_t>(r));
  indices.push_back(-1);
  indices.push_back(static_cast<int32_t>(n_rows));
  const int64_t batch = static_cast<int64_t>(indices.size());
  std::vector<int32_t> top_k(static_cast<size_t>(batch), 10);
  std::vector<float> top_p(static_cast<size_t>(batch), 0.9f), min_p(static_cast<size_t>(batch), 0.1f);
  top_k[1] = 0;
  top_p[1] = 0.f;
  top_p[2] = 1.5f;
  top_p[3] = nan;
  min_p[1] = -0.1f;
  min_p[2] = 2.f;
  min_p[3] = nan;
  DeviceArray<int32_t> d_indices(indices), d_k(top_k), samples(static_cast<size_t>(batch)),
      rounds(static_cast<size_t>(batch)), status(static_cast<size_t>(batch));
  DeviceArray<float> d_p(top_p), d_m(min_p);
  gpu::SamplingOptions opt;
  opt.indices = d_indices.get();
  opt.batch = batch;
  opt.seed = rng();
  const gpu::DeviceRows in{d_rows.get(), n_rows, vocab};
  const gpu::SamplingOutputs out{samples.get(), rounds.get(), status.get()};
  const ref::Tensor good = as_tensor(std::vector<float>(rows.begin(), rows.begin() + good_rows * vocab), vocab);

  auto check = [&](const char* op, std::function<void()> call, std::vector<gpu::Status> good_status,
                   std::function<ref::SamplingResult(const ref::SamplingOptions&)> reference) {
    CAPTURE(op);
    samples.poison(), rounds.poison(), status.poison();
    call();
    const auto s = samples.download(), st = status.download(), rd = rounds.download();
    for (int64_t i = 0; i < batch; ++i) {
      CAPTURE(i);
      gpu::Status want = gpu::Status::ok;
      if (i < good_rows) want = good_status[static_cast<size_t>(i)];
      else if (i < n_rows) want = defects[static_cast<size_t>(i - good_rows)].expected;
      else want = gpu::Status::bad_index;
      CHECK(gpu::to_string(static_cast<gpu::Status>(st[static_cast<size_t>(i)])) == std::string(gpu::to_string(want)));
      if (want != gpu::Status::ok) {
        CHECK(s[static_cast<size_t>(i)] == gpu::kInvalidToken);
        CHECK(rd[static_cast<size_t>(i)] == 0);
      }
    }
    // outputs on good rows with good parameters equal the reference (same output indices)
    ref::SamplingOptions ropt;
    ropt.seed = opt.seed;
    ropt.indices.assign(static_cast<size_t>(good_rows), 0);
    for (int64_t i = 0; i < good_rows; ++i) ropt.indices[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    const auto expected = reference(ropt);
    for (int64_t i = 0; i < good_rows; ++i)
      if (good_status[static_cast<size_t>(i)] == gpu::Status::ok)
        CHECK(s[static_cast<size_t>(i)] == expected.samples[static_cast<size_t>(i)]);
  };
  using S = gpu::Status;
  check(
      "sampling_from_probs", [&] { gpu::sampling_from_probs(in, out, opt); }, {S::ok, S::ok, S::ok, S::ok},
      [&](const ref::SamplingOptions& o) { return ref::sampling_from_probs(good, o); });
  check(
      "top_k_sampling_from_probs", [&] { gpu::top_k_sampling_from_probs(in, gpu::TopK::per_row(d_k.get()), out, opt); },
      {S::ok, S::bad_top_k, S::ok, S::ok},
      [&](const ref::SamplingOptions& o) { return ref::top_k_sampling_from_probs(good, 10, o); });
  check(
      "top_p_sampling_from_probs",
      [&] { gpu::top_p_sampling_from_probs(in, gpu::Fraction::per_row(d_p.get()), out, opt); },
      {S::ok, S::bad_top_p, S::bad_top_p, S::bad_top_p},
      [&](const ref::SamplingOptions& o) { return ref::top_p_sampling_from_probs(good, static_cast<float>(0.9), o); });
  check(
      "min_p_sampling_from_probs",
      [&] { gpu::min_p_sampling_from_probs(in, gpu::Fraction::per_row(d_m.get()), out, opt); },
      {S::ok, S::bad_min_p, S::bad_min_p, S::bad_min_p},
      [&](const ref::SamplingOptions& o) { return ref::min_p_sampling_from_probs(good, static_cast<float>(0.1), o); });
  check(
      "top_k_top_p joint",
      [&] {
        gpu::top_k_top_p_sampling_from_probs(in, gpu::TopK::per_row(d_k.get()), gpu::Fraction::per_row(d_p.get()),
                                             ref::FilterApplyOrder::joint, out, {}, opt);
      },
      {S::ok, S::bad_top_k, S::bad_top_p, S::bad_top_p},
      [&](const ref::SamplingOptions& o) {
        return ref::top_k_top_p_sampling_from_probs(good, 10, static_cast<float>(0.9), ref::FilterApplyOrder::joint, o);
      });
  {
    const size_t bytes = gpu::workspace_bytes("top_k_top_p_sampling_from_probs", n_rows, batch, vocab);
    DeviceArray<uint8_t> ws(bytes);
    check(
        "top_k_top_p top_k_first",
        [&] {
          gpu::top_k_top_p_sampling_from_probs(in, gpu::TopK::per_row(d_k.get()), gpu::Fraction::per_row(d_p.get()),
                                               ref::FilterApplyOrder::top_k_first, out, {ws.get(), bytes}, opt);
        },
        {S::ok, S::bad_top_k, S::bad_top_p, S::bad_top_p},
        [&](const ref::SamplingOptions& o) {
          return ref::top_k_top_p_sampling_from_probs(good, 10, static_cast<float>(0.9),
                                                      ref::FilterApplyOrder::top_k_first, o);
        });
  }
  // renorm: a bad row becomes NaN with its status, the good rows are renormalized
  DeviceArray<float> renormed(rows.size());
  DeviceArray<int32_t> row_status(static_cast<size_t>(n_rows));
  gpu::top_p_renorm_probs(in, 0.5, renormed.get(), row_status.get());
  const auto rs = row_status.download();
  const auto rv = renormed.download();
  for (int64_t r = 0; r < n_rows; ++r) {
    CAPTURE(r);
    const auto want = r < good_rows ? gpu::Status::ok : defects[static_cast<size_t>(r - good_rows)].expected;
    CHECK(rs[static_cast<size_t>(r)] == static_cast<int32_t>(want));
    if (want != gpu::Status::ok) CHECK(std::isnan(rv[static_cast<size_t>(r * vocab)]));
  }
  // logits: NaN and +inf rows, an all -inf row
  std::vector<float> logits(static_cast<size_t>(3 * vocab), 0.5f);
  logits[3] = nan;
  logits[static_cast<size_t>(vocab) + 7] = inf;
  std::fill(logits.begin() + 2 * vocab, logits.end(), -inf);
  DeviceArray<float> d_logits(logits), probs_out(logits.size());
  DeviceArray<int32_t> logit_status(3);
  gpu::softmax({d_logits.get(), 3, vocab}, 1.0, probs_out.get(), logit_status.get());
  CHECK(logit_status.download() == std::vector<int32_t>{int32_t(gpu::Status::not_finite),
                                                        int32_t(gpu::Status::not_finite),
                                                        int32_t(gpu::Status::zero_row)});
  gpu::top_k_mask_logits({d_logits.get(), 3, vocab}, 5, probs_out.get(), logit_status.get());
  CHECK(logit_status.download() == std::vector<int32_t>{int32_t(gpu::Status::not_finite),
                                                        int32_t(gpu::Status::not_finite),
                                                        int32_t(gpu::Status::zero_row)});
  // the fused from-logits samplers, f32 and bf16: the same statuses, -1 tokens, NaN probs
  // rows; a good fourth row still samples the reference's token
  for (bool as_bf16 : {false, true}) {
    CAPTURE(as_bf16);
    ref::Tensor four({4, vocab});
    std::copy(logits.begin(), logits.end(), four.data.begin());
    for (int64_t i = 0; i < vocab; ++i)
      four.data[static_cast<size_t>(3 * vocab + i)] = 0.001 * static_cast<double>(i % 97);
    const DeviceLogits dl(four, as_bf16);
    DeviceArray<int32_t> tok(4), st(4), rd(4);
    DeviceArray<float> used(static_cast<size_t>(4 * vocab));
    tok.poison(), st.poison(), rd.poison(), used.poison();
    gpu::SamplingOptions o;
    o.seed = opt.seed;
    gpu::sampling_from_logits(dl.rows, {tok.get(), rd.get(), st.get(), used.get()}, {}, o);
    const auto t = tok.download();
    const auto u = used.download();
    CHECK(st.download() == std::vector<int32_t>{int32_t(gpu::Status::not_finite), int32_t(gpu::Status::not_finite),
                                                int32_t(gpu::Status::zero_row), 0});
    CHECK(std::vector<int32_t>(t.begin(), t.begin() + 3) == std::vector<int32_t>(3, gpu::kInvalidToken));
    for (int64_t r = 0; r < 3; ++r) CHECK(std::isnan(u[static_cast<size_t>(r * vocab)]));
    ref::SamplingOptions ro;
    ro.seed = opt.seed;
    ref::Tensor padded({4, vocab});  // output 3 reads Philox subsequence 3: rows 0..2 are placeholders
    std::copy(u.begin() + 3 * vocab, u.end(), padded.data.begin() + 3 * vocab);
    std::fill(padded.data.begin(), padded.data.begin() + 3 * vocab, 1.0 / static_cast<double>(vocab));
    ro.indices = {0, 1, 2, 3};
    CHECK(t[3] == ref::sampling_from_probs(padded, ro).samples[3]);
  }
  // speculative: a draft id out of range and a NaN target
  {
    const int64_t b = 2, n = 2;
    std::vector<float> target(static_cast<size_t>(b * (n + 1) * vocab), 1.0f / vocab),
        draft(static_cast<size_t>(b * n * vocab), 1.0f / vocab);
    target[5] = nan;
    std::vector<int32_t> ids = {1, 2, 3, static_cast<int32_t>(vocab)};
    DeviceArray<float> dt(target), dd(draft);
    DeviceArray<int32_t> di(ids), tok(static_cast<size_t>(b * (n + 1))), acc(2), emi(2), st(2);
    gpu::chain_speculative_sampling(dd.get(), di.get(), dt.get(), b, n, vocab,
                                    {tok.get(), acc.get(), emi.get(), st.get()}, 1, 0);
    CHECK(st.download() ==
          std::vector<int32_t>{int32_t(gpu::Status::not_finite), int32_t(gpu::Status::bad_draft_token)});
    CHECK(tok.download() == std::vector<int32_t>(6, gpu::kInvalidToken));
  }
}

TEST_CASE("host-side arguments are checked before any launch, naming the argument") {
  using flashstep::test::expect_error;
  DeviceArray<float> probs(std::vector<float>(8, 0.125f));
  DeviceArray<int32_t> samples(1);
  const gpu::DeviceRows in{probs.get(), 1, 8};
  const gpu::SamplingOutputs out{samples.get()};
  expect_error([&] { gpu::top_k_sampling_from_probs(in, 0, out); }, {"top_k_sampling_from_probs", "top_k", ">= 1"});
  expect_error([&] { gpu::top_p_sampling_from_probs(in, 0.0, out); }, {"top_p_sampling_from_probs", "top_p", "(0, 1]"});
  expect_error([&] { gpu::top_p_sampling_from_probs(in, 1.5, out); }, {"top_p", "(0, 1]"});
  expect_error([&] { gpu::min_p_sampling_from_probs(in, -0.1, out); },
               {"min_p_sampling_from_probs", "min_p", "[0, 1]"});
  expect_error([&] { gpu::min_p_sampling_from_probs(in, 1.5, out); }, {"min_p", "[0, 1]"});
  expect_error([&] { gpu::sampling_from_probs({probs.get(), 1, 0}, out); }, {"sampling_from_probs", "vocab_size"});
  expect_error([&] { gpu::top_k_top_p_sampling_from_logits(in, 2, 0.5, ref::FilterApplyOrder::top_k_first, out, {}); },
               {"top_k_top_p_sampling_from_logits", "workspace"});
  const gpu::DeviceRows as_bf16{probs.get(), 1, 8, gpu::ElementType::bf16};
  expect_error([&] { gpu::sampling_from_probs(as_bf16, out); }, {"sampling_from_probs", "probs", "f32"});
  expect_error([&] { gpu::top_k_renorm_probs(as_bf16, 2, probs.get()); }, {"top_k_renorm_probs", "probs", "f32"});
  const gpu::DeviceRows bad_type{probs.get(), 1, 8, static_cast<gpu::ElementType>(7)};
  expect_error([&] { gpu::softmax(bad_type, 1.0, probs.get()); }, {"softmax", "logits", "f32 or bf16"});
  expect_error(
      [&] {
        gpu::sampling_from_probs(in, {samples.get(), nullptr, nullptr, probs.get()});
      },
      {"sampling_from_probs", "probs", "from-logits"});
  expect_error([&] { gpu::softmax(in, 0.0, probs.get()); }, {"softmax", "temperature", "greedy"});
  expect_error(
      [&] {
        gpu::SamplingOptions o;
        o.indices = samples.get();
        gpu::sampling_from_probs(in, out, o);
      },
      {"batch", "indices"});
}

TEST_CASE("the GPU Philox stream is cuRAND's and the CPU's") {
  // philox.cuh's mapping, checked on the device the stage runs on
  extern std::vector<uint32_t> curand_words(uint64_t seed, uint64_t offset, int subsequences, int words);
  extern std::vector<uint32_t> device_philox_words(uint64_t seed, uint64_t offset, int subsequences, int words);
  auto rng = flashstep::test::case_rng("stage 06 philox");
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 33) + 1}) {
    const uint64_t seed = rng();
    CAPTURE(seed);
    CAPTURE(offset);
    const auto cur = curand_words(seed, offset, 257, 9);
    const auto mine = device_philox_words(seed, offset, 257, 9);
    CHECK(cur == mine);
    bool host_same = true;
    for (int s = 0; s < 257; ++s)
      for (int j = 0; j < 9; ++j)
        host_same = host_same && mine[static_cast<size_t>(s * 9 + j)] ==
                                     flashstep::kernels::philox_word(seed, static_cast<uint64_t>(s),
                                                                     offset + static_cast<uint64_t>(j));
    CHECK(host_same);
  }
}

namespace {
/// The values both MassAcc checks use: specials, 20 000 random probabilities, and every
/// exponent with the smallest, the largest and a random significand, both signs. `inside`
/// gets the positive floats below 2 (mass_of gives them a mass), `outside` the rest
/// (from 2 up, or with the sign bit set: zero).
void mass_test_values(std::mt19937_64& rng, std::vector<float>& inside, std::vector<float>& outside) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  inside = {0.f,  -0.f, 1.f,        1e-30f,   1e-28f,          1e-22f,   1.2e-38f,   1e-45f,   0.5f,    0.99999994f,
            0.1f, 1.5f, 1.9999999f, 0x1p-48f, 0x1.fffffep-49f, 0x1p-73f, 0x1.8p-74f, 0x1p-96f, 0x1p-97f};
  for (int i = 0; i < 20000; ++i) inside.push_back(static_cast<float>(std::pow(unit(rng), 1 + 40 * unit(rng))));
  outside = {-1.f, -1e-30f, 2.f, 3.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t mantissa : {0u, 0x7FFFFFu, static_cast<uint32_t>(rng() & 0x7FFFFFu)}) {
      for (uint32_t sign : {0u, 1u}) {
        const uint32_t bits = (sign << 31) | (e << 23) | mantissa;
        float p;
        std::memcpy(&p, &bits, sizeof p);
        (sign == 0 && e < 128 ? inside : outside).push_back(p);
      }
    }
}
}  // namespace

TEST_SUITE("host") {
TEST_CASE("stage 06 mass arithmetic equals the reference's") {
  auto rng = flashstep::test::case_rng("stage 06 mass");
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<float> specials = {0.f, -0.f, 1.f, 1e-30f, 1e-28f, 1e-22f, 1.2e-38f, 1e-45f, 0.5f, 0.99999994f, 0.1f};
  for (int i = 0; i < 20000; ++i) specials.push_back(static_cast<float>(std::pow(unit(rng), 1 + 40 * unit(rng))));
  size_t bad = 0;
  for (float p : specials) {
    bad += gpu::mass_of(p) != ref::mass_of(p);
    const uint32_t u24 = static_cast<uint32_t>(rng() >> 40);
    ref::Mass q = 0;
    for (int j = 0; j < 50; ++j) q += ref::mass_of(specials[static_cast<size_t>(rng() % specials.size())]);
    bad += gpu::scaled_threshold(u24, q) != ref::scaled_threshold(u24, q);
    const float f = static_cast<float>(unit(rng));
    bad += gpu::mass_fraction_ceil(q, f) != ref::mass_fraction_ceil(q, f);
    bad += gpu::mass_fraction_ceil(q, 1.0f) != ref::mass_fraction_ceil(q, 1.0f);
  }
  CHECK(bad == 0);
}

TEST_CASE("stage 06 MassAcc sums exactly the reference's masses") {
  // the passes' cheap per-thread sum (mass.cuh) against the reference's mass_of, 16
  // entries at a time as a tile; outside [0, 2) it must give mass_of's zero
  auto rng = flashstep::test::case_rng("stage 06 MassAcc");
  std::vector<float> values, zeros;
  mass_test_values(rng, values, zeros);
  size_t bad = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    gpu::MassAcc one;
    one.add(values[i]);
    bad += one.value() != ref::mass_of(values[i]);
    gpu::MassAcc tile;
    ref::Mass want = 0;
    for (int j = 0; j < 16; ++j) {
      const float p = values[static_cast<size_t>(rng() % values.size())];
      tile.add(p);
      want += ref::mass_of(p);
    }
    bad += tile.value() != want;
    // the counting pass's form: each entry converted once, added where it is kept
    gpu::MassAcc kept;
    ref::Mass kept_want = 0;
    for (int j = 0; j < 16; ++j) {
      const float p = values[static_cast<size_t>(rng() % values.size())];
      const bool keep = rng() % 2 == 0;
      kept.add_if(keep, gpu::MassAcc::parts(p));
      kept_want += keep ? ref::mass_of(p) : 0;
    }
    bad += kept.value() != kept_want;
  }
  for (float p : zeros) {
    gpu::MassAcc acc;
    acc.add(p);
    bad += acc.value() != 0 || gpu::mass_of(p) != 0;
  }
  CHECK(bad == 0);
}

TEST_CASE("the stage 06 registry lists every reference operator once") {
  std::vector<std::string> names;
  for (const auto& op : gpu::operators()) names.push_back(op.name);
  for (const char* want :
       {"sampling_from_probs", "sampling_from_logits", "top_k_sampling_from_probs", "top_p_sampling_from_probs",
        "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits",
        "top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits", "softmax", "chain_speculative_sampling"}) {
    CAPTURE(want);
    CHECK(std::count(names.begin(), names.end(), want) == 1);
  }
  flashstep::test::expect_error([] { gpu::workspace_bytes("sort_and_sample", 1, 1, 1); },
                                {"workspace_bytes", "sort_and_sample"});
  CHECK(gpu::workspace_bytes("top_k_top_p_sampling_from_probs", 3, 5, 100, ref::FilterApplyOrder::joint) == 0);
  CHECK(gpu::workspace_bytes("sampling_from_logits", 3, 5, 100) == 0);  // softmax fused
  CHECK(gpu::workspace_bytes("top_k_top_p_sampling_from_logits", 3, 5, 100, ref::FilterApplyOrder::joint) == 0);
  CHECK(gpu::workspace_bytes("top_k_top_p_sampling_from_logits", 3, 5, 100, ref::FilterApplyOrder::top_k_first) >=
        5 * 100 * sizeof(float) + 5 * sizeof(int32_t));
}

TEST_CASE("a launch leaves out the ring, then the list, only where the shared memory is short") {
  // fit_shared_memory (launch.hpp): the ring needs 100 bytes, the list 60, both 160
  struct Params {
    bool stream = true, compact = true;
  };
  auto bytes = [](const Params& q) { return (q.stream ? 100u : 0u) + (q.compact ? 60u : 0u); };
  auto fit = [&](size_t allowed) { return gpu::detail::fit_shared_memory(Params{}, allowed, bytes); };
  CHECK((fit(160).stream && fit(160).compact));
  CHECK((!fit(159).stream && fit(159).compact));
  CHECK((!fit(59).stream && !fit(59).compact));
}
}  // TEST_SUITE("host")

TEST_CASE("stage 06 MassAcc on the GPU splits exactly the reference's masses") {
  // the device's own instructions for MassAcc (mass.cuh's device branch) against
  // ref::mass_of, on the host check's values: parts() of every value (zero outside
  // [0, 2)), add_unit() of the values it is meant for ([0, 1] and -0)
  extern std::vector<uint64_t> device_mass_parts(const std::vector<float>& values);
  auto rng = flashstep::test::case_rng("stage 06 MassAcc GPU");
  std::vector<float> values, zeros;
  mass_test_values(rng, values, zeros);
  std::vector<float> all = values;
  all.insert(all.end(), zeros.begin(), zeros.end());
  const std::vector<uint64_t> got = device_mass_parts(all);
  constexpr ref::Mass kLow48 = (ref::Mass{1} << 48) - 1;
  size_t bad_parts = 0, bad_unit = 0, units = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const float p = all[i];
    const ref::Mass want = i < values.size() ? ref::mass_of(p) : 0;
    const uint64_t hi = static_cast<uint64_t>(want >> 48), lo = static_cast<uint64_t>(want & kLow48);
    // the device's (hi, lo) at got[at], got[at + 1] against the reference's, the first few misses shown
    const auto check = [&](size_t at, const char* what, size_t& bad) {
      if ((got[at] != hi || got[at + 1] != lo) && bad++ < 5)
        MESSAGE(what << "(" << p << ") = " << got[at] << ", " << got[at + 1]);
    };
    check(4 * i, "parts", bad_parts);
    if (p >= 0.f && p <= 1.f) {  // -0 included (-0 >= 0)
      ++units;
      check(4 * i + 2, "add_unit", bad_unit);
    }
  }
  CHECK(units > 20000);
  CHECK(bad_parts == 0);
  CHECK(bad_unit == 0);
}
