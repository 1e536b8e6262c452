/// \file tiny_decoder.hpp
/// \brief The course's decoder, end to end, small enough to run in milliseconds: byte
/// tokens, embedding plus positions (sinusoidal, or RoPE on Q and K), L layers of attention
/// with a residual, W_vocab, and sampling; generated three ways that must give the same tokens.
///
/// The model is exactly the course's (no layer norm, no MLP): for each layer
///
///     Q = X W_Q,  K = X W_K,  V = X W_V              (heads of head_dim = d_model / num_qo_heads)
///     Z = softmax(mask(Q K^T) * sm_scale) V          (causal, sm_scale = 1/sqrt(head_dim))
///     Z = Z W_O                                      (optional output projection)
///     X = X + Z                                      (residual)
///
/// then `logits = X[-1] W_vocab` and `next_token = sample(softmax(logits / T))`. Weights
/// are drawn from a fixed seed through Philox (kernels/philox.cuh), so every platform
/// builds the same model: entry i of matrix m is `(2 u - 1) * sqrt(3 / fan_in)` with
/// u = philox_uniform(weight_seed, m, i) (the embedding uses fan_in 1).
///
/// **Positions.** By default (PositionEncoding::sinusoidal) X starts as the token embedding
/// plus the sinusoidal encoding of Vaswani et al. With PositionEncoding::rope, X is the
/// embedding alone and every layer rotates Q and K of the token at position p by RoPE
/// (rope.hpp: rotate-half or interleaved pairs, theta_i = rope_theta^(-2i/head_dim)) before
/// the scores, as Llama does; K enters the cache already rotated.
///
/// ## Three ways to generate (GenerationMode)
///
/// - **recompute**: every step re-runs the whole sequence through every layer (causal
///   prefill over all positions) and keeps nothing: the course's "Next Generation Step".
/// - **contiguous_kv_cache**: the prompt is prefilled once; each step computes Q, K, V for
///   the new token only (the course's query optimization), appends K and V to a
///   ContiguousKVCache per layer, and decodes against it.
/// - **paged_kv_cache**: all requests run as one batch on a paged pool (one pool per layer,
///   one page table shared by all layers, pages from a PageAllocator). Requests are
///   admitted in order: each asks the RadixCache for its longest cached prompt prefix,
///   starts on those pages (their K/V is reused, not recomputed), prefills the rest
///   (append_paged_kv_cache + batch_prefill_with_paged_kv_cache) and caches its prompt.
///   Then every step decodes all requests at once (batch_decode_with_paged_kv_cache).
///
/// All three compute the same function, so greedy decoding (temperature 0) gives identical
/// tokens and logits equal to rounding. Temperature > 0 draws through the sampling
/// operators (softmax with temperature, then sampling_from_probs or top-k/top-p) with
/// Philox key `seed + request index` and offset `step * kSamplingOffsetStride`, so a run
/// is reproducible and a request's tokens do not depend on the batch it runs in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Where the model puts a token's position.
enum class PositionEncoding {
  sinusoidal,  ///< added to the embedding once (Vaswani et al.)
  rope,        ///< Q and K rotated in every layer (Su et al.; Llama)
};
/// "sinusoidal" or "rope".
const char* to_string(PositionEncoding encoding);
/// Parses the names above (InvalidArgument naming `position_encoding` otherwise).
PositionEncoding parse_position_encoding(const std::string& name);

/// Where the model rounds, so that it computes what a GPU engine storing fp16 or bf16
/// computes (stage 09): with f16 or bf16, every weight is rounded once when it is drawn;
/// the rows entering a projection (X before W_Q/W_K/W_V and before W_vocab, Z before W_O)
/// are rounded; Q, K and V are rounded after the projection, Q and K again after RoPE
/// (the K/V an engine's page pool holds). The residual stream X and the logits stay in
/// double (the engine keeps them in fp32). `none`: no rounding anywhere (the course's model).
enum class StorageRounding { none, f16, bf16 };
/// "none", "f16" or "bf16".
const char* to_string(StorageRounding rounding);
/// Parses the names above (InvalidArgument naming `rounding` otherwise).
StorageRounding parse_storage_rounding(const std::string& name);
/// `x` rounded to the nearest value of `rounding`'s format (ties to even; past the largest
/// finite value, infinity; NaN stays NaN); `x` itself for none.
double round_to_storage(double x, StorageRounding rounding);

/// Shape and seed of the tiny decoder.
struct TinyDecoderConfig {
  int64_t vocab_size = 256;         ///< byte tokens: token = byte value
  int64_t d_model = 32;             ///< embedding width
  int64_t num_layers = 2;           ///< attention layers
  int64_t num_qo_heads = 4;         ///< query heads; head_dim = d_model / num_qo_heads
  int64_t num_kv_heads = 2;         ///< K/V heads (GQA when fewer than num_qo_heads)
  bool output_projection = true;    ///< apply W_O after attention
  uint64_t weight_seed = 20240601;  ///< Philox key of every weight
  PositionEncoding position_encoding = PositionEncoding::sinusoidal;  ///< sinusoidal (the course's) or rope
  double rope_theta = 1e4;       ///< rope: base of the frequencies; positive, finite
  bool rope_interleave = false;  ///< rope: pairs (x[2i], x[2i+1]) instead of (x[i], x[i + head_dim/2])
  StorageRounding rounding = StorageRounding::none;  ///< none, or round where an f16/bf16 engine stores
};

/// One layer's weights, row-major (in_features, out_features).
struct TinyDecoderLayer {
  Tensor w_q;  ///< (d_model, num_qo_heads * head_dim)
  Tensor w_k;  ///< (d_model, num_kv_heads * head_dim)
  Tensor w_v;  ///< (d_model, num_kv_heads * head_dim)
  Tensor w_o;  ///< (num_qo_heads * head_dim, d_model); empty without output_projection
};

/// The model: weights and the pieces every generation mode shares.
class TinyDecoder {
 public:
  /// Builds the weights from config.weight_seed (InvalidArgument on a bad shape).
  explicit TinyDecoder(const TinyDecoderConfig& config = {});

  /// The shape and seed the model was built from.
  const TinyDecoderConfig& config() const { return config_; }
  /// d_model / num_qo_heads.
  int64_t head_dim() const { return config_.d_model / config_.num_qo_heads; }
  const Tensor& embedding() const { return embedding_; }  ///< (vocab_size, d_model)
  /// The num_layers layers' weights.
  const std::vector<TinyDecoderLayer>& layers() const { return layers_; }
  const Tensor& w_vocab() const { return w_vocab_; }  ///< (d_model, vocab_size)

  /// Token embedding of each token, plus its sinusoidal position encoding in the
  /// sinusoidal mode (rope mode: the embedding alone; positions enter through rope()).
  /// \param tokens (n) ids in [0, vocab_size)
  /// \param first_position position of tokens[0] in its sequence
  /// \return X, (n, d_model)
  Tensor embed(const std::vector<int32_t>& tokens, int64_t first_position) const;
  /// Q, K or V of the rows of X. \param x (n, d_model) \param w (d_model, heads * head_dim)
  /// \param heads num_qo_heads for Q, num_kv_heads for K and V
  /// \return (n, heads, head_dim)
  Tensor project_heads(const Tensor& x, const Tensor& w, int64_t heads) const;
  /// Q or K rotated by RoPE at each row's position in the rope mode; unchanged otherwise.
  /// \param heads (n, heads, head_dim), the output of project_heads
  /// \param first_position position of row 0; row r is at first_position + r
  /// \return (n, heads, head_dim)
  Tensor rope(const Tensor& heads, int64_t first_position) const;
  /// The same with each row's position given. \param heads (n, heads, head_dim)
  /// \param positions (n) \return (n, heads, head_dim)
  Tensor rope(const Tensor& heads, const std::vector<int32_t>& positions) const;
  /// X + (Z W_O or Z): the residual update. \param x (n, d_model) \param z (n, num_qo_heads, head_dim)
  /// \param layer whose W_O applies
  /// \return the next X, (n, d_model)
  Tensor residual(const Tensor& x, const Tensor& z, int64_t layer) const;
  /// logits = x W_vocab. \param x (d_model) one row \return (vocab_size)
  std::vector<double> logits(const double* x) const;

  /// Logits of the next token after `tokens`, recomputing every layer over every
  /// position (no cache). \param tokens (n >= 1)
  /// \param hidden if given, receives the d_model values of the last row entering W_vocab
  /// \return (vocab_size)
  std::vector<double> next_token_logits(const std::vector<int32_t>& tokens,
                                        std::vector<double>* hidden = nullptr) const;

 private:
  TinyDecoderConfig config_;
  Tensor embedding_;
  std::vector<TinyDecoderLayer> layers_;
  Tensor w_vocab_;
};

/// How generate() runs the model (see the file comment).
enum class GenerationMode { recompute, contiguous_kv_cache, paged_kv_cache };
/// "recompute", "contiguous_kv_cache", "paged_kv_cache".
const char* to_string(GenerationMode mode);
/// Parses the names above (InvalidArgument naming `mode` otherwise).
GenerationMode parse_generation_mode(const std::string& name);

/// Philox offset advanced per decoding step (more than any rejection loop uses).
constexpr uint64_t kSamplingOffsetStride = 64;

/// Options of generate().
struct GenerationOptions {
  int64_t max_new_tokens = 8;  ///< tokens generated per request, >= 0
  double temperature = 0.0;    ///< 0: greedy (argmax, lowest id on ties); > 0: sample softmax(logits / T)
  int64_t top_k = 0;           ///< with temperature > 0: keep the top-k (0 = off)
  double top_p = 1.0;          ///< with temperature > 0: keep the top-p head (1 = off)
  uint64_t seed = 0;           ///< sampling seed (request r uses Philox key seed + r)
  int64_t page_size = 4;       ///< paged mode: tokens per page
  bool share_prefixes = true;  ///< paged mode: reuse cached prompt prefixes (RadixCache)
  int64_t num_pages = 0;       ///< paged mode: pool size; 0 sizes it for the whole run
  bool record_logits = false;  ///< keep each step's logits in the result (for tests)
};

/// One request's result.
struct GeneratedRequest {
  std::string prompt;                            ///< the prompt as given
  std::vector<int32_t> prompt_tokens;            ///< bytes of the prompt
  std::vector<int32_t> generated_tokens;         ///< (max_new_tokens)
  std::string generated_text;                    ///< the generated bytes as a string
  int64_t prefix_tokens_reused = 0;              ///< paged + sharing: prompt tokens whose K/V came from the cache
  std::vector<std::vector<double>> step_logits;  ///< (max_new_tokens, vocab_size) if record_logits
  /// (max_new_tokens, d_model) if record_logits: each step's row entering W_vocab (before
  /// the rounding `logits` applies), from which a caller bounds the logits' rounding error
  std::vector<std::vector<double>> step_hidden;
};

/// What a run kept in memory and computed (K/V counted at fp16, 2 bytes per value, over
/// all layers, as the course's arithmetic does).
struct GenerationMemory {
  int64_t tokens = 0;                         ///< tokens whose K/V the run holds at the end (all requests)
  int64_t kv_bytes_per_token = 0;             ///< 2 (K, V) * num_kv_heads * head_dim * num_layers * 2 bytes
  int64_t kv_bytes_kept = 0;                  ///< recompute: 0; contiguous: tokens * per token;
                                              ///< paged: allocated pages * page_size * per token
  int64_t contiguous_preallocated_bytes = 0;  ///< requests * (prompt + max_new_tokens) * per token
  int64_t page_size = 0;                      ///< paged mode
  int64_t pages_used = 0;                     ///< paged: distinct pages referenced by the requests
  int64_t shared_pages = 0;                   ///< paged: pages referenced by more than one request
  int64_t contiguous_pages_equivalent = 0;    ///< paged: the preallocation in pages (for comparison)
  int64_t prefix_tokens_reused = 0;           ///< paged: prompt tokens served from the radix cache
  int64_t query_rows_computed = 0;            ///< (token, layer) rows pushed through attention: the work
};

/// The result of generate().
struct GenerationResult {
  GenerationMode mode = GenerationMode::recompute;  ///< how it ran
  std::vector<GeneratedRequest> requests;           ///< one per prompt, in order
  GenerationMemory memory;                          ///< memory kept and work done
};

/// Generate `max_new_tokens` tokens after each prompt (bytes of the string).
/// \param model the decoder
/// \param prompts (batch) non-empty strings
/// \param mode recompute, contiguous_kv_cache or paged_kv_cache
/// \param options length, sampling, paging
GenerationResult generate(const TinyDecoder& model, const std::vector<std::string>& prompts, GenerationMode mode,
                          const GenerationOptions& options = {});

/// The tour's demo: "The cat sat" and "The cat ran fast", greedy, three ways.
struct TinyDecoderDemo {
  TinyDecoderConfig config;            ///< the model (default shape and seed)
  GenerationOptions options;           ///< greedy, max_new_tokens, page_size
  std::vector<GenerationResult> runs;  ///< recompute, contiguous_kv_cache, paged_kv_cache
  bool tokens_agree = false;           ///< every run generated the same tokens
};

/// Runs the demo (milliseconds).
/// \param prompts defaults to the course's two prompts
/// \param max_new_tokens tokens generated per prompt
/// \param page_size tokens per page of the paged run
TinyDecoderDemo tiny_decoder_demo(const std::vector<std::string>& prompts = {"The cat sat", "The cat ran fast"},
                                  int64_t max_new_tokens = 8, int64_t page_size = 4);

}  // namespace flashstep::ref
