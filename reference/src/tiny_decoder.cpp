// The course's tiny decoder: weights from Philox, the shared forward pieces, and the three
// generation modes (recompute, contiguous KV cache, paged KV cache with radix sharing).
#include "flashstep/reference/tiny_decoder.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

#include <flashstep/kernels/philox.cuh>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/kv_cache.hpp"
#include "flashstep/reference/page_allocator.hpp"
#include "flashstep/reference/radix_cache.hpp"
#include "flashstep/reference/rope.hpp"
#include "flashstep/reference/sampling.hpp"

namespace flashstep::ref {

namespace {

// Matrix m of the model, filled with (2u - 1) * sqrt(3 / fan_in): variance 1 / fan_in.
Tensor philox_matrix(uint64_t seed, uint64_t m, int64_t rows, int64_t cols, double fan_in) {
  Tensor t({rows, cols});
  const double scale = std::sqrt(3.0 / fan_in);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = (2.0 * kernels::philox_uniform(seed, m, i) - 1.0) * scale;
  return t;
}

AttentionOptions causal() {
  AttentionOptions opt;
  opt.causal = true;  // sm_scale not given: 1/sqrt(head_dim)
  return opt;
}

// Every entry of `t` rounded to the storage format (nothing for none).
void round_tensor(Tensor& t, StorageRounding rounding) {
  if (rounding == StorageRounding::none) return;
  for (double& x : t.data) x = round_to_storage(x, rounding);
}

}  // namespace

const char* to_string(StorageRounding rounding) {
  switch (rounding) {
    case StorageRounding::none: return "none";
    case StorageRounding::f16: return "f16";
    case StorageRounding::bf16: return "bf16";
  }
  return "?";
}

StorageRounding parse_storage_rounding(const std::string& name) {
  if (name == "none") return StorageRounding::none;
  if (name == "f16") return StorageRounding::f16;
  if (name == "bf16") return StorageRounding::bf16;
  throw InvalidArgument("parse_storage_rounding: rounding must be \"none\", \"f16\" or \"bf16\", got \"" + name + "\"");
}

double round_to_storage(double x, StorageRounding rounding) {
  if (rounding == StorageRounding::none || !std::isfinite(x) || x == 0.0) return x;
  // significand bits (with the implicit one), smallest normal exponent, largest finite value
  const bool f16 = rounding == StorageRounding::f16;
  const int bits = f16 ? 11 : 8;
  const int min_exponent = f16 ? -14 : -126;
  const double largest = f16 ? 65504.0 : 0x1.FEp127;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 1, min_exponent) - (bits - 1));
  const double r = std::nearbyint(x / ulp) * ulp;  // x / ulp is exact; nearbyint: ties to even
  return std::fabs(r) > largest ? std::copysign(HUGE_VAL, x) : r;
}

const char* to_string(PositionEncoding encoding) { return encoding == PositionEncoding::rope ? "rope" : "sinusoidal"; }

PositionEncoding parse_position_encoding(const std::string& name) {
  if (name == "sinusoidal") return PositionEncoding::sinusoidal;
  if (name == "rope") return PositionEncoding::rope;
  throw InvalidArgument("parse_position_encoding: position_encoding must be \"sinusoidal\" or \"rope\", got \"" + name +
                        "\"");
}

TinyDecoder::TinyDecoder(const TinyDecoderConfig& config) : config_(config) {
  const char* fn = "TinyDecoder";
  const auto& c = config_;
  require(c.vocab_size >= 1 && c.vocab_size <= 256, fn,
          "vocab_size must be in [1, 256] (byte tokens), got " + std::to_string(c.vocab_size));
  require(c.d_model >= 1 && c.num_layers >= 1, fn,
          "d_model and num_layers must be >= 1, got " + std::to_string(c.d_model) + " and " +
              std::to_string(c.num_layers));
  check_heads(fn, c.num_qo_heads, c.num_kv_heads);
  require(c.d_model % c.num_qo_heads == 0, fn,
          "d_model (" + std::to_string(c.d_model) + ") must be a multiple of num_qo_heads (" +
              std::to_string(c.num_qo_heads) + ")");
  const int64_t hd = head_dim();
  if (c.position_encoding == PositionEncoding::rope) {
    require(hd % 2 == 0, fn,
            "position_encoding rope needs an even head_dim (it rotates pairs), got d_model / num_qo_heads = " +
                std::to_string(hd));
    require(std::isfinite(c.rope_theta) && c.rope_theta > 0, fn,
            "rope_theta must be positive and finite, got " + std::to_string(c.rope_theta));
  }
  uint64_t m = 0;
  embedding_ = philox_matrix(c.weight_seed, m++, c.vocab_size, c.d_model, 1.0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    TinyDecoderLayer layer;
    layer.w_q = philox_matrix(c.weight_seed, m++, c.d_model, c.num_qo_heads * hd, static_cast<double>(c.d_model));
    layer.w_k = philox_matrix(c.weight_seed, m++, c.d_model, c.num_kv_heads * hd, static_cast<double>(c.d_model));
    layer.w_v = philox_matrix(c.weight_seed, m++, c.d_model, c.num_kv_heads * hd, static_cast<double>(c.d_model));
    if (c.output_projection)
      layer.w_o = philox_matrix(c.weight_seed, m, c.num_qo_heads * hd, c.d_model, static_cast<double>(c.d_model));
    ++m;
    layers_.push_back(std::move(layer));
  }
  w_vocab_ = philox_matrix(c.weight_seed, m, c.d_model, c.vocab_size, static_cast<double>(c.d_model));
  if (c.rounding != StorageRounding::none) {
    round_tensor(embedding_, c.rounding);
    for (auto& layer : layers_)
      for (Tensor* w : {&layer.w_q, &layer.w_k, &layer.w_v, &layer.w_o}) round_tensor(*w, c.rounding);
    round_tensor(w_vocab_, c.rounding);
  }
}

Tensor TinyDecoder::embed(const std::vector<int32_t>& tokens, int64_t first_position) const {
  const int64_t d = config_.d_model;
  Tensor x({static_cast<int64_t>(tokens.size()), d});
  for (size_t t = 0; t < tokens.size(); ++t) {
    require(tokens[t] >= 0 && tokens[t] < config_.vocab_size, "TinyDecoder::embed",
            "tokens[" + std::to_string(t) + "] = " + std::to_string(tokens[t]) +
                " is not in [0, vocab_size = " + std::to_string(config_.vocab_size) + ")");
    const double pos = static_cast<double>(first_position + static_cast<int64_t>(t));
    if (config_.position_encoding == PositionEncoding::rope) {  // positions enter Q and K instead
      std::copy_n(embedding_.data.begin() + tokens[t] * d, d, x.data.begin() + static_cast<int64_t>(t) * d);
      continue;
    }
    for (int64_t j = 0; j < d; ++j) {
      // Sinusoidal encoding (Vaswani et al.): sin on even, cos on odd dimensions.
      const double angle = pos / std::pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(d));
      x.data[t * static_cast<size_t>(d) + static_cast<size_t>(j)] =
          embedding_.data[static_cast<size_t>(tokens[t] * d + j)] + (j % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
  return x;
}

Tensor TinyDecoder::project_heads(const Tensor& x, const Tensor& w, int64_t heads) const {
  const int64_t n = x.dim(0), d = config_.d_model, out = w.dim(1);
  Tensor xr = x;
  round_tensor(xr, config_.rounding);
  Tensor y({n, heads, head_dim()}, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < d; ++k) {  // row r of X times W, W read row by row
      const double a = xr.data[static_cast<size_t>(r * d + k)];
      const double* wk = w.data.data() + k * out;
      double* yr = y.data.data() + r * out;
      for (int64_t c = 0; c < out; ++c) yr[c] += a * wk[c];
    }
  round_tensor(y, config_.rounding);
  return y;
}

Tensor TinyDecoder::rope(const Tensor& heads, int64_t first_position) const {
  std::vector<int32_t> positions(static_cast<size_t>(heads.dim(0)));
  for (size_t r = 0; r < positions.size(); ++r)
    positions[r] = static_cast<int32_t>(first_position + static_cast<int64_t>(r));
  return rope(heads, positions);
}

Tensor TinyDecoder::rope(const Tensor& heads, const std::vector<int32_t>& positions) const {
  if (config_.position_encoding != PositionEncoding::rope) return heads;
  Tensor out = apply_rotary_embedding(heads, std::vector<int64_t>(positions.begin(), positions.end()),
                                      rope_frequencies(head_dim(), 1.0, config_.rope_theta), config_.rope_interleave);
  round_tensor(out, config_.rounding);
  return out;
}

Tensor TinyDecoder::residual(const Tensor& x, const Tensor& z, int64_t layer) const {
  const int64_t n = x.dim(0), d = config_.d_model, width = config_.num_qo_heads * head_dim();
  Tensor out = x;
  Tensor zr = z;  // the attention output, as the engine stores it
  round_tensor(zr, config_.rounding);
  const Tensor& w_o = layers_[static_cast<size_t>(layer)].w_o;
  for (int64_t r = 0; r < n; ++r) {
    double* outr = out.data.data() + r * d;
    const double* zrow = zr.data.data() + r * width;
    if (!config_.output_projection) {
      for (int64_t c = 0; c < d; ++c) outr[c] += zrow[c];  // width == d_model
      continue;
    }
    std::vector<double> s(static_cast<size_t>(d), 0.0);
    for (int64_t k = 0; k < width; ++k) {  // W_O read row by row
      const double* wk = w_o.data.data() + k * d;
      for (int64_t c = 0; c < d; ++c) s[static_cast<size_t>(c)] += zrow[k] * wk[c];
    }
    for (int64_t c = 0; c < d; ++c) outr[c] += s[static_cast<size_t>(c)];
  }
  return out;
}

std::vector<double> TinyDecoder::logits(const double* x) const {
  const int64_t d = config_.d_model, v = config_.vocab_size;
  std::vector<double> out(static_cast<size_t>(v), 0.0);
  for (int64_t k = 0; k < d; ++k) {
    const double xk = round_to_storage(x[k], config_.rounding);  // the row entering W_vocab
    for (int64_t c = 0; c < v; ++c) out[static_cast<size_t>(c)] += xk * w_vocab_.data[static_cast<size_t>(k * v + c)];
  }
  return out;
}

std::vector<double> TinyDecoder::next_token_logits(const std::vector<int32_t>& tokens,
                                                   std::vector<double>* hidden) const {
  require(!tokens.empty(), "TinyDecoder::next_token_logits", "tokens must not be empty");
  Tensor x = embed(tokens, 0);
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const auto& w = layers_[static_cast<size_t>(l)];
    const Tensor q = rope(project_heads(x, w.w_q, config_.num_qo_heads), 0);
    const Tensor k = rope(project_heads(x, w.w_k, config_.num_kv_heads), 0);
    const Tensor v = project_heads(x, w.w_v, config_.num_kv_heads);
    x = residual(x, single_prefill_with_kv_cache(q, k, v, causal()).o, l);
  }
  const double* last = x.data.data() + (x.dim(0) - 1) * config_.d_model;
  if (hidden != nullptr) hidden->assign(last, last + config_.d_model);
  return logits(last);
}

const char* to_string(GenerationMode mode) {
  switch (mode) {
    case GenerationMode::recompute: return "recompute";
    case GenerationMode::contiguous_kv_cache: return "contiguous_kv_cache";
    case GenerationMode::paged_kv_cache: return "paged_kv_cache";
  }
  return "?";
}

GenerationMode parse_generation_mode(const std::string& name) {
  if (name == "recompute") return GenerationMode::recompute;
  if (name == "contiguous_kv_cache") return GenerationMode::contiguous_kv_cache;
  if (name == "paged_kv_cache") return GenerationMode::paged_kv_cache;
  throw InvalidArgument(
      "parse_generation_mode: mode must be \"recompute\", \"contiguous_kv_cache\" or "
      "\"paged_kv_cache\", got \"" +
      name + "\"");
}

namespace {

// The next token of request r at step t: argmax at temperature 0, else a draw through
// the sampling operators with key seed + r and offset t * kSamplingOffsetStride.
int32_t choose_token(const std::vector<double>& logits, const GenerationOptions& o, int64_t r, int64_t t) {
  if (o.temperature == 0.0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const Tensor probs = softmax(Tensor({1, static_cast<int64_t>(logits.size())}, logits), o.temperature);
  SamplingOptions s;
  s.seed = o.seed + static_cast<uint64_t>(r);
  s.offset = static_cast<uint64_t>(t) * kSamplingOffsetStride;
  if (o.top_k > 0 && o.top_p < 1.0)
    return top_k_top_p_sampling_from_probs(probs, o.top_k, o.top_p, FilterApplyOrder::top_k_first, s).samples[0];
  if (o.top_k > 0) return top_k_sampling_from_probs(probs, o.top_k, s).samples[0];
  if (o.top_p < 1.0) return top_p_sampling_from_probs(probs, o.top_p, s).samples[0];
  return sampling_from_probs(probs, s).samples[0];
}

// `hidden`: the d_model values of the row whose logits these are (the row entering W_vocab).
void record(GeneratedRequest& req, const std::vector<double>& logits, int32_t token, const GenerationOptions& o,
            const double* hidden, int64_t d_model) {
  req.generated_tokens.push_back(token);
  req.generated_text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
  if (o.record_logits) {
    req.step_logits.push_back(logits);
    req.step_hidden.emplace_back(hidden, hidden + d_model);
  }
}

// The rows of a (n, heads, head_dim) tensor as (heads, head_dim) for a decode call.
Tensor drop_first_axis(const Tensor& t) { return Tensor({t.dim(1), t.dim(2)}, t.data); }

void generate_recompute(const TinyDecoder& model, const GenerationOptions& o, GenerationResult& result) {
  const int64_t L = model.config().num_layers;
  for (size_t r = 0; r < result.requests.size(); ++r) {
    auto& req = result.requests[r];
    std::vector<int32_t> tokens = req.prompt_tokens;
    for (int64_t t = 0; t < o.max_new_tokens; ++t) {
      // Everything again, every step: the whole sequence through every layer.
      std::vector<double> hidden;
      const auto logits = model.next_token_logits(tokens, &hidden);
      result.memory.query_rows_computed += static_cast<int64_t>(tokens.size()) * L;
      const int32_t token = choose_token(logits, o, static_cast<int64_t>(r), t);
      record(req, logits, token, o, hidden.data(), model.config().d_model);
      tokens.push_back(token);
    }
  }
}

void generate_contiguous(const TinyDecoder& model, const GenerationOptions& o, GenerationResult& result) {
  const auto& c = model.config();
  for (size_t r = 0; r < result.requests.size(); ++r) {
    auto& req = result.requests[r];
    if (o.max_new_tokens == 0) continue;
    std::vector<ContiguousKVCache> caches(static_cast<size_t>(c.num_layers),
                                          ContiguousKVCache(c.num_kv_heads, model.head_dim()));
    // Prefill: every prompt position once, K and V kept.
    Tensor x = model.embed(req.prompt_tokens, 0);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const auto& w = model.layers()[static_cast<size_t>(l)];
      const Tensor q = model.rope(model.project_heads(x, w.w_q, c.num_qo_heads), 0);
      auto& cache = caches[static_cast<size_t>(l)];
      cache.append(model.rope(model.project_heads(x, w.w_k, c.num_kv_heads), 0),
                   model.project_heads(x, w.w_v, c.num_kv_heads));
      x = model.residual(x, single_prefill_with_kv_cache(q, cache.k(), cache.v(), causal()).o, l);
    }
    result.memory.query_rows_computed += x.dim(0) * c.num_layers;
    int64_t pos = x.dim(0);
    auto logits = model.logits(x.data.data() + (pos - 1) * c.d_model);
    int32_t token = choose_token(logits, o, static_cast<int64_t>(r), 0);
    record(req, logits, token, o, x.data.data() + (pos - 1) * c.d_model, c.d_model);
    // Decode: only the new token's row, the query optimization; K/V appended.
    for (int64_t t = 1; t < o.max_new_tokens; ++t, ++pos) {
      Tensor xt = model.embed({token}, pos);
      for (int64_t l = 0; l < c.num_layers; ++l) {
        const auto& w = model.layers()[static_cast<size_t>(l)];
        const Tensor q = model.rope(model.project_heads(xt, w.w_q, c.num_qo_heads), pos);
        auto& cache = caches[static_cast<size_t>(l)];
        cache.append(model.rope(model.project_heads(xt, w.w_k, c.num_kv_heads), pos),
                     model.project_heads(xt, w.w_v, c.num_kv_heads));
        const Tensor o1 = single_decode_with_kv_cache(drop_first_axis(q), cache.k(), cache.v()).o;
        xt = model.residual(xt, Tensor({1, c.num_qo_heads, model.head_dim()}, o1.data), l);
      }
      result.memory.query_rows_computed += c.num_layers;
      logits = model.logits(xt.data.data());
      token = choose_token(logits, o, static_cast<int64_t>(r), t);
      record(req, logits, token, o, xt.data.data(), c.d_model);
    }
    result.memory.tokens += caches[0].kv_len();
  }
  result.memory.kv_bytes_kept = result.memory.tokens * result.memory.kv_bytes_per_token;
}

// The paged pools of every layer share one page table.
void set_page_table(std::vector<PagedKVCache>& pools, const PageTable& table) {
  for (auto& pool : pools) {
    pool.kv_indptr = table.kv_indptr;
    pool.kv_indices = table.kv_indices;
    pool.kv_last_page_len = table.kv_last_page_len;
  }
}

void apply_copies(std::vector<PagedKVCache>& pools, const std::vector<PageCopy>& copies) {
  if (copies.empty()) return;
  for (auto& pool : pools) copy_pages(pool.pages, copies);
}

void generate_paged(const TinyDecoder& model, const GenerationOptions& o, GenerationResult& result) {
  const auto& c = model.config();
  const int64_t B = static_cast<int64_t>(result.requests.size()), P = o.page_size, hd = model.head_dim();
  result.memory.page_size = P;
  if (o.max_new_tokens == 0) return;
  int64_t needed = 0;
  for (const auto& req : result.requests)
    needed += (static_cast<int64_t>(req.prompt_tokens.size()) + o.max_new_tokens + P - 1) / P;
  const int64_t num_pages = o.num_pages > 0 ? o.num_pages : needed + B;  // + B: room for copy-on-write
  PageAllocator allocator(num_pages, P);
  PagedSequences seqs(allocator);
  std::unique_ptr<RadixCache> radix;
  if (o.share_prefixes) radix = std::make_unique<RadixCache>(allocator);
  std::vector<PagedKVCache> pools(static_cast<size_t>(c.num_layers));
  for (auto& pool : pools) pool.pages = Tensor({num_pages, 2, P, c.num_kv_heads, hd}, 0.0);

  // Admission, one request at a time: reuse the cached prefix, prefill the rest.
  std::vector<int32_t> seq_of(static_cast<size_t>(B)), last_token(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r) {
    auto& req = result.requests[static_cast<size_t>(r)];
    const auto& tokens = req.prompt_tokens;
    const int64_t len = static_cast<int64_t>(tokens.size());
    RadixMatch match;
    if (radix) {
      // Match at most len - 1 tokens: the last prompt token must run to give the first logits.
      match = radix->match_prefix(std::vector<int32_t>(tokens.begin(), tokens.end() - 1));
    }
    const int64_t reused = match.length;
    const int32_t seq = seqs.add_sequence(match.pages, reused);
    seq_of[static_cast<size_t>(r)] = seq;
    req.prefix_tokens_reused = reused;
    result.memory.prefix_tokens_reused += reused;
    apply_copies(pools, seqs.append_tokens(seq, len - reused).copies);
    set_page_table(pools, seqs.page_table({seq}));
    std::vector<int32_t> suffix(tokens.begin() + reused, tokens.end()), batch_indices(suffix.size(), 0), positions;
    for (int64_t p = reused; p < len; ++p) positions.push_back(static_cast<int32_t>(p));
    Tensor x = model.embed(suffix, reused);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const auto& w = model.layers()[static_cast<size_t>(l)];
      auto& pool = pools[static_cast<size_t>(l)];
      append_paged_kv_cache(model.rope(model.project_heads(x, w.w_k, c.num_kv_heads), positions),
                            model.project_heads(x, w.w_v, c.num_kv_heads), batch_indices, positions, pool);
      const Tensor q = model.rope(model.project_heads(x, w.w_q, c.num_qo_heads), positions);
      x = model.residual(
          x, batch_prefill_with_paged_kv_cache(q, {0, static_cast<int32_t>(suffix.size())}, pool, causal()).o, l);
    }
    result.memory.query_rows_computed += x.dim(0) * c.num_layers;
    const auto logits = model.logits(x.data.data() + (x.dim(0) - 1) * c.d_model);
    last_token[static_cast<size_t>(r)] = choose_token(logits, o, r, 0);
    record(req, logits, last_token[static_cast<size_t>(r)], o, x.data.data() + (x.dim(0) - 1) * c.d_model, c.d_model);
    // Cache the prompt (whole pages) so that later requests can start on it.
    if (radix) radix->insert(tokens, seqs.pages(seq));
  }

  // Decode: every request's newest token, all requests in one batch.
  for (int64_t t = 1; t < o.max_new_tokens; ++t) {
    std::vector<int32_t> batch_indices(static_cast<size_t>(B)), positions(static_cast<size_t>(B));
    Tensor x({B, c.d_model});
    for (int64_t r = 0; r < B; ++r) {
      const int32_t seq = seq_of[static_cast<size_t>(r)];
      const int64_t pos = seqs.seq_len(seq);
      apply_copies(pools, seqs.append_tokens(seq, 1).copies);
      batch_indices[static_cast<size_t>(r)] = static_cast<int32_t>(r);
      positions[static_cast<size_t>(r)] = static_cast<int32_t>(pos);
      const Tensor row = model.embed({last_token[static_cast<size_t>(r)]}, pos);
      std::copy(row.data.begin(), row.data.end(), x.data.begin() + r * c.d_model);
    }
    set_page_table(pools, seqs.page_table(seq_of));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const auto& w = model.layers()[static_cast<size_t>(l)];
      auto& pool = pools[static_cast<size_t>(l)];
      append_paged_kv_cache(model.rope(model.project_heads(x, w.w_k, c.num_kv_heads), positions),
                            model.project_heads(x, w.w_v, c.num_kv_heads), batch_indices, positions, pool);
      const Tensor q = model.rope(model.project_heads(x, w.w_q, c.num_qo_heads), positions);
      const Tensor o_b = batch_decode_with_paged_kv_cache(Tensor({B, c.num_qo_heads, hd}, q.data), pool).o;
      x = model.residual(x, o_b, l);
    }
    result.memory.query_rows_computed += B * c.num_layers;
    for (int64_t r = 0; r < B; ++r) {
      const auto logits = model.logits(x.data.data() + r * c.d_model);
      last_token[static_cast<size_t>(r)] = choose_token(logits, o, r, t);
      record(result.requests[static_cast<size_t>(r)], logits, last_token[static_cast<size_t>(r)], o,
             x.data.data() + r * c.d_model, c.d_model);
    }
  }

  int64_t max_len = 0;
  for (const auto& req : result.requests)
    max_len = std::max(max_len, static_cast<int64_t>(req.prompt_tokens.size()) + o.max_new_tokens);
  const MemoryReport report = seqs.memory_report(max_len);
  result.memory.tokens = report.tokens;
  result.memory.pages_used = report.pages_in_use;
  result.memory.shared_pages = report.shared_pages;
  result.memory.kv_bytes_kept = report.slots_allocated * result.memory.kv_bytes_per_token;
  // Finished requests hand their sequences to the cache, then drop their own references.
  for (int64_t r = 0; r < B; ++r) {
    const int32_t seq = seq_of[static_cast<size_t>(r)];
    if (radix) {
      std::vector<int32_t> held = result.requests[static_cast<size_t>(r)].prompt_tokens;
      const auto& gen = result.requests[static_cast<size_t>(r)].generated_tokens;
      held.insert(held.end(), gen.begin(), gen.end() - 1);  // the last token has no K/V yet
      radix->insert(held, seqs.pages(seq));
    }
    seqs.free_sequence(seq);
  }
}

}  // namespace

GenerationResult generate(const TinyDecoder& model, const std::vector<std::string>& prompts, GenerationMode mode,
                          const GenerationOptions& options) {
  const char* fn = "generate";
  const auto& c = model.config();
  require(!prompts.empty(), fn, "prompts must hold at least one prompt");
  require(options.max_new_tokens >= 0, fn,
          "max_new_tokens must be >= 0, got " + std::to_string(options.max_new_tokens));
  require(std::isfinite(options.temperature) && options.temperature >= 0.0, fn,
          "temperature must be finite and >= 0 (0 is greedy), got " + std::to_string(options.temperature));
  require(options.top_k >= 0, fn, "top_k must be >= 0 (0 turns it off), got " + std::to_string(options.top_k));
  require(options.top_p > 0.0 && options.top_p <= 1.0, fn,
          "top_p must be in (0, 1], got " + std::to_string(options.top_p));
  require(options.page_size >= 1, fn, "page_size must be >= 1, got " + std::to_string(options.page_size));
  require(options.num_pages >= 0, fn,
          "num_pages must be >= 0 (0 sizes the pool), got " + std::to_string(options.num_pages));
  GenerationResult result;
  result.mode = mode;
  int64_t preallocated_slots = 0;  // contiguous preallocation: prompt + max_new_tokens per request
  for (size_t i = 0; i < prompts.size(); ++i) {
    require(!prompts[i].empty(), fn, "prompts[" + std::to_string(i) + "] is empty (a prompt needs at least one token)");
    GeneratedRequest req;
    req.prompt = prompts[i];
    for (unsigned char b : prompts[i]) {
      require(b < c.vocab_size, fn,
              "prompts[" + std::to_string(i) + "] has byte " + std::to_string(b) + ", not a token of vocab_size " +
                  std::to_string(c.vocab_size));
      req.prompt_tokens.push_back(b);
    }
    preallocated_slots += static_cast<int64_t>(req.prompt_tokens.size()) + options.max_new_tokens;
    result.requests.push_back(std::move(req));
  }
  result.memory.kv_bytes_per_token = 2 * c.num_kv_heads * model.head_dim() * c.num_layers * 2;
  result.memory.contiguous_preallocated_bytes = preallocated_slots * result.memory.kv_bytes_per_token;
  result.memory.contiguous_pages_equivalent = (preallocated_slots + options.page_size - 1) / options.page_size;
  switch (mode) {
    case GenerationMode::recompute: generate_recompute(model, options, result); break;
    case GenerationMode::contiguous_kv_cache: generate_contiguous(model, options, result); break;
    case GenerationMode::paged_kv_cache: try { generate_paged(model, options, result);
      } catch (const OutOfPages& e) {
        throw InvalidArgument(std::string(fn) + ": num_pages = " + std::to_string(options.num_pages) +
                              " is too small for these prompts and max_new_tokens (" + e.what() + ")");
      }
      break;
  }
  return result;
}

TinyDecoderDemo tiny_decoder_demo(const std::vector<std::string>& prompts, int64_t max_new_tokens, int64_t page_size) {
  TinyDecoderDemo demo;
  demo.options.max_new_tokens = max_new_tokens;
  demo.options.page_size = page_size;
  const TinyDecoder model(demo.config);
  for (GenerationMode mode :
       {GenerationMode::recompute, GenerationMode::contiguous_kv_cache, GenerationMode::paged_kv_cache})
    demo.runs.push_back(generate(model, prompts, mode, demo.options));
  demo.tokens_agree = true;
  for (const auto& run : demo.runs)
    for (size_t r = 0; r < run.requests.size(); ++r)
      demo.tokens_agree = demo.tokens_agree &&
                          run.requests[r].generated_tokens == demo.runs[0].requests[r].generated_tokens;
  return demo;
}

}  // namespace flashstep::ref
