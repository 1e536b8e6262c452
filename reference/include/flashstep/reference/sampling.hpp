/// \file sampling.hpp
/// \brief Reference token sampling under FlashInfer's names (flashinfer.sampling): softmax
/// with temperature, plain / top-k / top-p / min-p / top-k-top-p sampling, the renorm and
/// mask operators, and the exact oracle that defines what every sampler must draw.
///
/// The course ends every decoding step with `next_token = sample(probabilities)`. This
/// file is that line, twice over:
///
/// 1. **The oracle** (sampling_target_distribution): sort the row, truncate it by the
///    filter's rule, renormalize. Obviously right, O(V log V), and the *target
///    distribution* every sampler is tested against.
/// 2. **The sorting-free rejection sampler** (rejection_sample_row) that FlashInfer runs on
///    the GPU and flashstep's stage 06 will run too: draw a token by inverse CDF over
///    the candidates `p > low`, test it against the filter with one counting pass, and if
///    it is rejected raise `low` (two pivots per pass) and draw again. No sort, a few
///    passes over the vocabulary, and the same Philox uniforms on CPU and GPU.
///
/// ## Keep rules (the acceptance set of each filter)
///
/// With `count_gt(x)` = number of tokens with p > x and `mass_gt(x)` = their total mass:
/// - none:        p_i > 0
/// - top_k (k):   count_gt(p_i) < k          (every token tied with the k-th largest is kept)
/// - top_p (P):   mass_gt(p_i) < P * total   (the smallest head of the sorted row reaching P)
/// - min_p (m):   p_i >= float(max_p * m)    (and p_i > 0)
/// - top_k_top_p, joint: both the top_k and the top_p rule, each on the original row.
/// These are exactly the tests FlashInfer's kernels apply to a sampled pivot
/// (`count > pivot < k`, `mass > pivot < top_p`, `p >= max_p * min_p`), so the rejection
/// sampler and the oracle agree by construction, ties included.
///
/// ## Arithmetic: float32 inputs, exact masses
///
/// Like FlashInfer's kernels, the samplers read probabilities as float32 (a double input
/// is rounded to float first) and compute pivots in float (`pivot_1 = (pivot_0 + high) *
/// 0.5f`). Unlike a float kernel, every *mass* is exact: each probability is turned into
/// an integer number of 2^-96 units (`mass_of`, truncating; only p < 2^-73 loses bits and
/// p < 2^-96 ~ 1.3e-29 counts as zero mass), and sums of those integers do not depend on
/// the order of addition. Every decision (`cdf > u * q`, `mass < P * total`) is an exact
/// integer comparison. That makes the reference a pure function of (float row, seed),
/// lets the batched evaluation below reorder its work freely and still return the same
/// tokens, and gives the GPU stage a way to be bit-exact too (128-bit integer sums are
/// associative, float block reductions are not).
///
/// Two deliberate differences from FlashInfer, both so that rows need not sum to exactly 1
/// (a float32 softmax row never does): the first round draws `u * total` (FlashInfer:
/// `u * 1`), and top-p compares against `top_p * total` (FlashInfer: `top_p`). For a row
/// that sums to 1 the rules coincide. sampling_from_logits is softmax followed by
/// sampling_from_probs; FlashInfer's kernel draws the same distribution with Gumbel-max
/// (one uniform per token), which flashstep does not reproduce.
///
/// ## Random numbers: (seed, offset) -> (output, round)
///
/// Output i (the i-th entry of the result, which reads row `indices[i]`) draws its j-th
/// uniform (rejection round j, counted from 0) as
///
///     u(i, j) = philox_uniform_bits24(seed, /*subsequence=*/i, offset + j) / 2^24
///
/// from kernels/philox.cuh: FlashInfer's `curand_init(seed, blockIdx.x, offset)` layout.
/// A GPU block that handles output i and a CPU loop therefore use the same u(i, j).
/// To draw fresh numbers on the next call, advance `offset` by at least the largest number
/// of rounds used (SamplingResult::rounds) or change the seed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Exact probability mass: an integer number of 2^-96 units (see "Arithmetic" above).
/// A row of at most 2^30 probabilities in [0, 1] sums to less than 2^126 units.
__extension__ typedef unsigned __int128 Mass;

/// Fraction bits of Mass: one unit is 2^-kMassFractionBits.
constexpr int kMassFractionBits = 96;

/// The exact mass of one float probability in [0, 1]: floor(p * 2^96).
Mass mass_of(float p);
/// A mass as a double (rounded to nearest): mass * 2^-96.
double mass_to_double(Mass m);
/// floor(u24 * q / 2^24): the inverse-CDF threshold of uniform u24 / 2^24 over mass q.
/// \param u24 a 24-bit uniform (philox_uniform_bits24), < 2^24
/// \param q a mass below 2^127
Mass scaled_threshold(uint32_t u24, Mass q);
/// ceil(fraction * total): the top-p bound, exact for any float fraction in [0, 1].
Mass mass_fraction_ceil(Mass total, float fraction);

/// A per-output parameter: one scalar for every output, or one value per output
/// (FlashInfer's `Union[torch.Tensor, float]` arguments).
template <typename T>
struct RowParam {
  std::vector<T> values;  ///< size 1 (broadcast) or one per output

  /// One value for every output (implicit, so `top_k_sampling_from_probs(probs, 10)` reads well).
  RowParam(T scalar) : values{scalar} {}  // NOLINT(google-explicit-constructor)
  /// One value per output. \param per_row (batch) values
  RowParam(std::vector<T> per_row) : values(std::move(per_row)) {}  // NOLINT(google-explicit-constructor)
  /// Value for output `i` (the scalar when broadcast).
  T at(int64_t i) const { return values.size() == 1 ? values[0] : values[static_cast<size_t>(i)]; }
  /// True when one value serves every output.
  bool is_scalar() const { return values.size() == 1; }
};

/// Which truncation a sampler applies before it draws.
enum class FilterKind {
  none,         ///< sampling_from_probs
  top_k,        ///< top_k_sampling_from_probs
  top_p,        ///< top_p_sampling_from_probs
  min_p,        ///< min_p_sampling_from_probs
  top_k_top_p,  ///< top_k_top_p_sampling_from_probs with filter_apply_order "joint"
};

/// "none", "top_k", "top_p", "min_p", "top_k_top_p".
const char* to_string(FilterKind kind);

/// A filter and its parameters, in the float32 form the samplers use.
struct SamplingFilter {
  FilterKind kind = FilterKind::none;  ///< which keep rule applies
  int64_t top_k = 0;                   ///< top_k, top_k_top_p: >= 1
  float top_p = 1.0f;                  ///< top_p, top_k_top_p: in (0, 1]
  float min_p = 0.0f;                  ///< min_p: in [0, 1]

  /// No truncation.
  static SamplingFilter none() { return {}; }
  /// Top-k. \param k >= 1
  static SamplingFilter make_top_k(int64_t k) { return {FilterKind::top_k, k, 1.0f, 0.0f}; }
  /// Top-p. \param p in (0, 1], rounded to float32
  static SamplingFilter make_top_p(double p) { return {FilterKind::top_p, 0, static_cast<float>(p), 0.0f}; }
  /// Min-p. \param m in [0, 1], rounded to float32
  static SamplingFilter make_min_p(double m) { return {FilterKind::min_p, 0, 1.0f, static_cast<float>(m)}; }
  /// Top-k and top-p, joint. \param k >= 1 \param p in (0, 1], rounded to float32
  static SamplingFilter make_top_k_top_p(int64_t k, double p) {
    return {FilterKind::top_k_top_p, k, static_cast<float>(p), 0.0f};
  }
};

/// Order of the two filters of top_k_top_p_sampling_* (FlashInfer's filter_apply_order).
enum class FilterApplyOrder {
  top_k_first,  ///< top_k_renorm_probs, then top-p sampling on the renormalized row
  joint,        ///< one rejection loop testing both rules on the original row
};
/// Parses "top_k_first" / "joint" (InvalidArgument naming `filter_apply_order` otherwise).
FilterApplyOrder parse_filter_apply_order(const std::string& name);

/// How the reference evaluates the rejection sampler. Both give identical tokens and
/// round counts (tests/reference/test_sampling.cpp checks it draw for draw).
enum class SamplerEvaluation {
  automatic,   ///< batched where a row serves many outputs, per_output otherwise
  per_output,  ///< one output at a time, passes over the vocabulary as the GPU kernel runs them
  batched,     ///< all outputs of a row together (sorted sweeps, a Fenwick tree): fast for 10^6 draws
};

/// Keyword arguments shared by the sampling operators (FlashInfer's indices, seed, offset).
struct SamplingOptions {
  /// (batch) output i draws from row indices[i]; empty means output i draws from row i.
  std::vector<int32_t> indices;
  uint64_t seed = 0;    ///< Philox key
  uint64_t offset = 0;  ///< first stream position of every output (see the file comment)
  SamplerEvaluation evaluation = SamplerEvaluation::automatic;  ///< how the loop is evaluated
};

/// Tokens drawn by a sampling operator, one per output.
struct SamplingResult {
  std::vector<int32_t> samples;  ///< (batch) token id of each output
  std::vector<int32_t> rounds;   ///< (batch) rejection rounds each output used (>= 1)
  /// Mean of `rounds` (0 for an empty batch).
  double mean_rounds() const;
  /// Largest entry of `rounds` (0 for an empty batch): advance `offset` by this much.
  int32_t max_rounds() const;
};

// ---- The oracle --------------------------------------------------------------------------

/// The exact target distribution of one row under a filter: sort, truncate by the keep
/// rule, renormalize the kept exact masses. Entries sum to 1 (up to double rounding).
/// \param probs (vocab) the row as float32, entries in [0, 1], positive total mass
/// \param filter the keep rule and its parameters
/// \return (vocab) probability of each token under the filtered, renormalized row
std::vector<double> sampling_target_distribution(const std::vector<float>& probs, const SamplingFilter& filter);

/// The oracle for a batch: row `indices[i]` (or i) of `probs` under `filters.at(i)`.
/// \param probs (rows, vocab)
/// \param filters one filter for every output (size 1) or one per output (size batch)
/// \param indices (batch) row of each output; empty means output i reads row i
/// \return (batch, vocab) target distribution of each output
Tensor sampling_target_probs(const Tensor& probs, const std::vector<SamplingFilter>& filters,
                             const std::vector<int32_t>& indices = {});

// ---- The sorting-free rejection sampler --------------------------------------------------

/// One output's draw: the token and the rounds it took.
struct RejectionDraw {
  int32_t token = -1;  ///< the accepted token
  int32_t rounds = 0;  ///< uniforms used (1 = accepted in the first round)
};

/// The rejection sampler for one output, written the way the GPU kernel runs it (one
/// thread block per output; each loop over `i` below is one block-wide pass):
///
///     total = sum of masses                                     (pass 0)
///     low = 0, high = 1, q = total
///     do:
///       u = uniform(output, round); threshold = floor(u * q)
///       s = first token, in vocabulary order, among p > low,    (pass 1)
///           whose cumulative mass exceeds threshold
///       pivot_0 = p[s]; pivot_1 = (pivot_0 + high) * 0.5f
///       count and mass of p > pivot_0 and of p > pivot_1        (pass 2)
///       if pivot_0 passes the filter: accept s
///       elif pivot_1 passes: low = pivot_0, high = pivot_1, q = mass_gt(pivot_0)
///       else:                low = pivot_1,                  q = mass_gt(pivot_1)
///
/// Every token the filter keeps stays a candidate (the keep set is the top of the sorted
/// row and `low` stays below it), so conditioned on acceptance the draw has the target
/// distribution; each rejection removes at least the rejected token and halves
/// [low, high]. min_p draws once from p >= pivot; none draws once from the whole row.
/// \param probs (vocab) float32 probabilities in [0, 1] with positive total (validated by
///        the operators, not here)
/// \param vocab number of entries of `probs`
/// \param filter keep rule and parameters
/// \param seed Philox key
/// \param subsequence the output index i (Philox subsequence)
/// \param offset stream word of round 0 (round j reads word offset + j)
RejectionDraw rejection_sample_row(const float* probs, int64_t vocab, const SamplingFilter& filter, uint64_t seed,
                                   uint64_t subsequence, uint64_t offset);

/// The same sampler for many outputs of one row at once, returning exactly what
/// rejection_sample_row returns for each. Each round sorts the active outputs by `low`,
/// inserts tokens p > low into a Fenwick tree of exact masses in descending-p order, and
/// answers every inverse-CDF lookup in O(log V); counts and masses above a pivot come from
/// one sorted copy of the row. Cost O((V + n) log V) per round instead of O(n V).
/// \param probs (vocab) as for rejection_sample_row
/// \param vocab number of entries of `probs`
/// \param filters one filter shared by all outputs (size 1) or one per output (size n)
/// \param subsequences (n) the output index of each draw
/// \param seed Philox key
/// \param offset stream word of round 0
/// \return (n) draws, in the order of `subsequences`
std::vector<RejectionDraw> rejection_sample_row_batched(const float* probs, int64_t vocab,
                                                        const std::vector<SamplingFilter>& filters,
                                                        const std::vector<uint64_t>& subsequences, uint64_t seed,
                                                        uint64_t offset);

// ---- FlashInfer's operators --------------------------------------------------------------

/// Softmax of logits / temperature per row, computed in double.
/// \param logits (batch, vocab); entries finite or -inf, at least one finite per row
/// \param temperature scalar or (batch), each finite and > 0. Temperature 0 (greedy) is
///        not a softmax: take the argmax (the tiny decoder does so for temperature 0).
/// \return (batch, vocab) probabilities, rows summing to 1
Tensor softmax(const Tensor& logits, const RowParam<double>& temperature = 1.0);

/// Draw from each row in proportion to its probabilities.
/// \param probs (rows, vocab) entries in [0, 1], finite, each row with positive sum
/// \param opt indices (batch), seed, offset, evaluation
/// \return one token per output (batch = indices.size(), or rows)
SamplingResult sampling_from_probs(const Tensor& probs, const SamplingOptions& opt = {});

/// softmax(logits) then sampling_from_probs (see the file comment on Gumbel-max).
/// \param logits (rows, vocab), finite or -inf
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult sampling_from_logits(const Tensor& logits, const SamplingOptions& opt = {});

/// Top-k sampling by rejection.
/// \param probs (rows, vocab) as for sampling_from_probs
/// \param top_k scalar or (batch), each >= 1 (k >= vocab keeps all)
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult top_k_sampling_from_probs(const Tensor& probs, const RowParam<int64_t>& top_k,
                                         const SamplingOptions& opt = {});

/// Top-p (nucleus) sampling by rejection.
/// \param probs (rows, vocab) as for sampling_from_probs
/// \param top_p scalar or (batch), each in (0, 1]
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult top_p_sampling_from_probs(const Tensor& probs, const RowParam<double>& top_p,
                                         const SamplingOptions& opt = {});

/// Min-p sampling: one draw among p >= max_p * min_p.
/// \param probs (rows, vocab) as for sampling_from_probs
/// \param min_p scalar or (batch), each in [0, 1]
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult min_p_sampling_from_probs(const Tensor& probs, const RowParam<double>& min_p,
                                         const SamplingOptions& opt = {});

/// Top-k and top-p together.
/// \param probs (rows, vocab)
/// \param top_k scalar or (batch), each >= 1
/// \param top_p scalar or (batch), each in (0, 1]
/// \param order top_k_first: renormalize the top-k, then top-p sampling on that row;
///        joint: one rejection loop testing both rules on the original row
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult top_k_top_p_sampling_from_probs(const Tensor& probs, const RowParam<int64_t>& top_k,
                                               const RowParam<double>& top_p,
                                               FilterApplyOrder order = FilterApplyOrder::top_k_first,
                                               const SamplingOptions& opt = {});

/// Top-k and top-p from logits. top_k_first: top_k_mask_logits, softmax, top-p sampling;
/// joint: softmax, then the joint rejection loop.
/// \param logits (rows, vocab), finite or -inf
/// \param top_k scalar or (batch), each >= 1
/// \param top_p scalar or (batch), each in (0, 1]
/// \param order top_k_first or joint
/// \param opt indices (batch), seed, offset, evaluation
SamplingResult top_k_top_p_sampling_from_logits(const Tensor& logits, const RowParam<int64_t>& top_k,
                                                const RowParam<double>& top_p,
                                                FilterApplyOrder order = FilterApplyOrder::top_k_first,
                                                const SamplingOptions& opt = {});

/// Keep the top-k of each row (ties with the k-th largest kept), zero the rest, renormalize.
/// \param probs (batch, vocab) \param top_k scalar or (batch), each >= 1
/// \return (batch, vocab) kept p_i / (sum of kept), read as float32 like the samplers
Tensor top_k_renorm_probs(const Tensor& probs, const RowParam<int64_t>& top_k);

/// Keep the top-p head of each row (the top_p keep rule above), zero the rest, renormalize.
/// \param probs (batch, vocab) \param top_p scalar or (batch), each in (0, 1]
Tensor top_p_renorm_probs(const Tensor& probs, const RowParam<double>& top_p);

/// Keep the top-k logits of each row (ties with the k-th largest kept, compared as
/// float32), set the rest to -inf. \param logits (batch, vocab) \param top_k scalar or (batch)
/// \return (batch, vocab) the kept logits unchanged, -inf elsewhere
Tensor top_k_mask_logits(const Tensor& logits, const RowParam<int64_t>& top_k);

}  // namespace flashstep::ref
