// FlashInfer's sampling operators on the CPU: validation, the sorting oracle, softmax,
// renorm/mask, and the dispatch of every sampler to the rejection engine.
#include "flashstep/reference/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

const char* to_string(FilterKind kind) {
  switch (kind) {
    case FilterKind::none: return "none";
    case FilterKind::top_k: return "top_k";
    case FilterKind::top_p: return "top_p";
    case FilterKind::min_p: return "min_p";
    case FilterKind::top_k_top_p: return "top_k_top_p";
  }
  return "?";
}

FilterApplyOrder parse_filter_apply_order(const std::string& name) {
  if (name == "top_k_first") return FilterApplyOrder::top_k_first;
  if (name == "joint") return FilterApplyOrder::joint;
  throw InvalidArgument("parse_filter_apply_order: filter_apply_order must be \"top_k_first\" or \"joint\", got \"" +
                        name + "\"");
}

double SamplingResult::mean_rounds() const {
  if (rounds.empty()) return 0.0;
  return std::accumulate(rounds.begin(), rounds.end(), 0.0) / static_cast<double>(rounds.size());
}

int32_t SamplingResult::max_rounds() const {
  return rounds.empty() ? 0 : *std::max_element(rounds.begin(), rounds.end());
}

namespace {

// Vocabularies above 2^30 would let a row's mass overflow the 128-bit Mass.
constexpr int64_t kMaxVocab = int64_t{1} << 30;

std::string at(int64_t r, int64_t i) { return "[" + std::to_string(r) + ", " + std::to_string(i) + "]"; }

[[noreturn]] void fail(const char* fn, const std::string& message) {
  throw InvalidArgument(std::string(fn) + ": " + message);
}

std::string number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// probs: rank 2, vocab >= 1, every entry finite in [0, 1], every row with positive
// mass after rounding to float32. Returns the rows as float32.
std::vector<std::vector<float>> checked_prob_rows(const char* fn, const char* name, const Tensor& probs) {
  check_rank(fn, name, probs, 2);
  const int64_t rows = probs.dim(0), vocab = probs.dim(1);
  require(vocab >= 1, fn,
          std::string(name) + " must have vocab_size >= 1 (got shape " + shape_string(probs.shape) + ")");
  require(vocab <= kMaxVocab, fn, std::string(name) + " vocab_size must be <= 2^30, got " + std::to_string(vocab));
  std::vector<std::vector<float>> out(static_cast<size_t>(rows), std::vector<float>(static_cast<size_t>(vocab)));
  for (int64_t r = 0; r < rows; ++r) {
    Mass total = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double p = probs.data[static_cast<size_t>(r * vocab + i)];
      // Checked before any message is built: this loop runs over every entry.
      if (std::isnan(p)) fail(fn, std::string(name) + at(r, i) + " is NaN");
      if (p < 0.0) fail(fn, std::string(name) + " must be non-negative, but " + name + at(r, i) + " = " + number(p));
      if (p > 1.0)
        fail(fn, std::string(name) + " must be <= 1 (probabilities), but " + name + at(r, i) + " = " + number(p));
      const float pf = static_cast<float>(p);
      out[static_cast<size_t>(r)][static_cast<size_t>(i)] = pf;
      total += mass_of(pf);
    }
    require(total > 0, fn,
            "row " + std::to_string(r) + " of " + name +
                " sums to zero (no token can be drawn; entries below 1.3e-29 count as zero)");
  }
  return out;
}

void check_logits(const char* fn, const char* name, const Tensor& logits) {
  check_rank(fn, name, logits, 2);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  require(vocab >= 1, fn,
          std::string(name) + " must have vocab_size >= 1 (got shape " + shape_string(logits.shape) + ")");
  require(vocab <= kMaxVocab, fn, std::string(name) + " vocab_size must be <= 2^30, got " + std::to_string(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    bool any_finite = false;
    for (int64_t i = 0; i < vocab; ++i) {
      const double x = logits.data[static_cast<size_t>(r * vocab + i)];
      if (std::isnan(x)) fail(fn, std::string(name) + at(r, i) + " is NaN");
      if (x == std::numeric_limits<double>::infinity())
        fail(fn, std::string(name) + at(r, i) + " is +inf (logits must be finite or -inf)");
      any_finite = any_finite || std::isfinite(x);
    }
    require(any_finite, fn, "row " + std::to_string(r) + " of " + name + " is entirely -inf (no token can be drawn)");
  }
}

// Output i -> row; validates indices against the row count.
std::vector<int32_t> output_rows(const char* fn, const std::vector<int32_t>& indices, int64_t rows) {
  if (indices.empty()) {
    std::vector<int32_t> r(static_cast<size_t>(rows));
    std::iota(r.begin(), r.end(), 0);
    return r;
  }
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < 0 || indices[i] >= rows)
      fail(fn, "indices[" + std::to_string(i) + "] = " + std::to_string(indices[i]) +
                   " is not a row of probs (rows: " + std::to_string(rows) + ")");
  return indices;
}

template <typename T>
void check_param_size(const char* fn, const char* name, const RowParam<T>& param, int64_t batch) {
  require(param.values.size() == 1 || static_cast<int64_t>(param.values.size()) == batch, fn,
          std::string(name) + " must be a scalar or have one value per output (" + std::to_string(batch) + "), got " +
              std::to_string(param.values.size()) + " values");
}

void check_top_k(const char* fn, const RowParam<int64_t>& top_k, int64_t batch) {
  check_param_size(fn, "top_k", top_k, batch);
  for (size_t i = 0; i < top_k.values.size(); ++i)
    require(top_k.values[i] >= 1, fn,
            "top_k must be >= 1, but top_k" + (top_k.is_scalar() ? std::string() : "[" + std::to_string(i) + "]") +
                " = " + std::to_string(top_k.values[i]));
}

void check_top_p(const char* fn, const RowParam<double>& top_p, int64_t batch) {
  check_param_size(fn, "top_p", top_p, batch);
  for (size_t i = 0; i < top_p.values.size(); ++i) {
    const double p = top_p.values[i];
    // The float32 value is what the sampler uses: it must be in (0, 1] too.
    require(p > 0.0 && p <= 1.0 && static_cast<float>(p) > 0.0f, fn,
            "top_p must be in (0, 1], but top_p" + (top_p.is_scalar() ? std::string() : "[" + std::to_string(i) + "]") +
                " = " + number(p));
  }
}

void check_min_p(const char* fn, const RowParam<double>& min_p, int64_t batch) {
  check_param_size(fn, "min_p", min_p, batch);
  for (size_t i = 0; i < min_p.values.size(); ++i) {
    const double m = min_p.values[i];
    require(m >= 0.0 && m <= 1.0, fn,
            "min_p must be in [0, 1], but min_p" + (min_p.is_scalar() ? std::string() : "[" + std::to_string(i) + "]") +
                " = " + number(m));
  }
}

// Rows serving at least this many outputs go to the batched evaluation under `automatic`.
constexpr size_t kBatchedFromOutputs = 16;

// Runs the rejection sampler for every output: output i reads rows[out_rows[i]] with
// filters[i] (or filters[0]) and uses Philox subsequence i.
SamplingResult run_sampler(const std::vector<std::vector<float>>& rows, const std::vector<int32_t>& out_rows,
                           const std::vector<SamplingFilter>& filters, const SamplingOptions& opt) {
  const size_t batch = out_rows.size();
  SamplingResult result;
  result.samples.assign(batch, -1);
  result.rounds.assign(batch, 0);
  std::map<int32_t, std::vector<uint32_t>> outputs_of_row;
  for (size_t i = 0; i < batch; ++i) outputs_of_row[out_rows[i]].push_back(static_cast<uint32_t>(i));
  for (const auto& [row, outputs] : outputs_of_row) {
    const std::vector<float>& p = rows[static_cast<size_t>(row)];
    const int64_t vocab = static_cast<int64_t>(p.size());
    const bool batched = opt.evaluation == SamplerEvaluation::batched ||
                         (opt.evaluation == SamplerEvaluation::automatic && outputs.size() >= kBatchedFromOutputs);
    if (batched) {
      std::vector<uint64_t> subsequences(outputs.begin(), outputs.end());
      std::vector<SamplingFilter> f;
      if (filters.size() == 1) {
        f = filters;
      } else {
        for (uint32_t o : outputs) f.push_back(filters[o]);
      }
      const auto draws = rejection_sample_row_batched(p.data(), vocab, f, subsequences, opt.seed, opt.offset);
      for (size_t j = 0; j < outputs.size(); ++j) {
        result.samples[outputs[j]] = draws[j].token;
        result.rounds[outputs[j]] = draws[j].rounds;
      }
    } else {
      for (uint32_t o : outputs) {
        const auto draw = rejection_sample_row(p.data(), vocab, filters.size() == 1 ? filters[0] : filters[o], opt.seed,
                                               o, opt.offset);
        result.samples[o] = draw.token;
        result.rounds[o] = draw.rounds;
      }
    }
  }
  return result;
}

}  // namespace

// ---- The oracle ---------------------------------------------------------------------------

std::vector<double> sampling_target_distribution(const std::vector<float>& probs, const SamplingFilter& filter) {
  const int64_t vocab = static_cast<int64_t>(probs.size());
  std::vector<Mass> mass(probs.size());
  Mass total = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    mass[i] = mass_of(probs[i]);
    total += mass[i];
  }
  require(total > 0, "sampling_target_distribution", "probs has zero total mass");
  // Sort descending; walk groups of equal probability. Before a group, `before` tokens
  // are strictly larger and carry `mass_before`: exactly count_gt and mass_gt of the group.
  std::vector<int64_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  const float max_p = probs[static_cast<size_t>(order[0])];
  const float min_p_pivot = max_p * filter.min_p;
  const Mass top_p_bound = mass_fraction_ceil(total, filter.top_p);
  std::vector<bool> keep(probs.size(), false);
  Mass mass_before = 0;
  for (int64_t start = 0; start < vocab;) {
    const float p = probs[static_cast<size_t>(order[start])];
    int64_t end = start;
    Mass group_mass = 0;
    while (end < vocab && probs[static_cast<size_t>(order[end])] == p)
      group_mass += mass[static_cast<size_t>(order[end++])];
    bool kept = p > 0.0f;
    switch (filter.kind) {
      case FilterKind::none: break;
      case FilterKind::top_k: kept = kept && start < filter.top_k; break;
      case FilterKind::top_p: kept = kept && mass_before < top_p_bound; break;
      case FilterKind::min_p: kept = kept && p >= min_p_pivot; break;
      case FilterKind::top_k_top_p: kept = kept && start < filter.top_k && mass_before < top_p_bound; break;
    }
    for (int64_t j = start; j < end; ++j) keep[static_cast<size_t>(order[j])] = kept;
    mass_before += group_mass;
    start = end;
  }
  Mass kept_mass = 0;
  for (size_t i = 0; i < probs.size(); ++i)
    if (keep[i]) kept_mass += mass[i];
  std::vector<double> target(probs.size(), 0.0);
  const long double denominator = static_cast<long double>(kept_mass);
  for (size_t i = 0; i < probs.size(); ++i)
    if (keep[i]) target[i] = static_cast<double>(static_cast<long double>(mass[i]) / denominator);
  return target;
}

Tensor sampling_target_probs(const Tensor& probs, const std::vector<SamplingFilter>& filters,
                             const std::vector<int32_t>& indices) {
  const char* fn = "sampling_target_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  const auto out_rows = output_rows(fn, indices, probs.dim(0));
  require(filters.size() == 1 || filters.size() == out_rows.size(), fn,
          "filters must hold one filter or one per output");
  Tensor out({static_cast<int64_t>(out_rows.size()), probs.dim(1)});
  for (size_t i = 0; i < out_rows.size(); ++i) {
    const auto t = sampling_target_distribution(rows[static_cast<size_t>(out_rows[i])],
                                                filters.size() == 1 ? filters[0] : filters[i]);
    std::copy(t.begin(), t.end(), out.data.begin() + static_cast<int64_t>(i) * probs.dim(1));
  }
  return out;
}

// ---- Operators ----------------------------------------------------------------------------

Tensor softmax(const Tensor& logits, const RowParam<double>& temperature) {
  const char* fn = "softmax";
  check_logits(fn, "logits", logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  check_param_size(fn, "temperature", temperature, rows);
  for (size_t i = 0; i < temperature.values.size(); ++i) {
    const double t = temperature.values[i];
    require(std::isfinite(t) && t > 0.0, fn,
            "temperature must be finite and > 0, but temperature" +
                (temperature.is_scalar() ? std::string() : "[" + std::to_string(i) + "]") + " = " + number(t) +
                " (temperature 0 means greedy decoding: take the argmax instead of a softmax)");
  }
  Tensor out({rows, vocab});
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = logits.data.data() + r * vocab;
    double* y = out.data.data() + r * vocab;
    const double inv_t = 1.0 / temperature.at(r);
    // Subtract the max before exp (safe softmax); -inf logits give exactly 0.
    const double m = *std::max_element(x, x + vocab) * inv_t;
    double sum = 0.0;
    for (int64_t i = 0; i < vocab; ++i) sum += (y[i] = std::exp(x[i] * inv_t - m));
    for (int64_t i = 0; i < vocab; ++i) y[i] /= sum;
  }
  return out;
}

SamplingResult sampling_from_probs(const Tensor& probs, const SamplingOptions& opt) {
  const char* fn = "sampling_from_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  return run_sampler(rows, output_rows(fn, opt.indices, probs.dim(0)), {SamplingFilter::none()}, opt);
}

SamplingResult sampling_from_logits(const Tensor& logits, const SamplingOptions& opt) {
  check_logits("sampling_from_logits", "logits", logits);
  const auto rows = checked_prob_rows("sampling_from_logits", "softmax(logits)", softmax(logits));
  return run_sampler(rows, output_rows("sampling_from_logits", opt.indices, logits.dim(0)), {SamplingFilter::none()},
                     opt);
}

SamplingResult top_k_sampling_from_probs(const Tensor& probs, const RowParam<int64_t>& top_k,
                                         const SamplingOptions& opt) {
  const char* fn = "top_k_sampling_from_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  const auto out_rows = output_rows(fn, opt.indices, probs.dim(0));
  check_top_k(fn, top_k, static_cast<int64_t>(out_rows.size()));
  std::vector<SamplingFilter> filters;
  for (int64_t v : top_k.values) filters.push_back(SamplingFilter::make_top_k(v));
  return run_sampler(rows, out_rows, filters, opt);
}

SamplingResult top_p_sampling_from_probs(const Tensor& probs, const RowParam<double>& top_p,
                                         const SamplingOptions& opt) {
  const char* fn = "top_p_sampling_from_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  const auto out_rows = output_rows(fn, opt.indices, probs.dim(0));
  check_top_p(fn, top_p, static_cast<int64_t>(out_rows.size()));
  std::vector<SamplingFilter> filters;
  for (double v : top_p.values) filters.push_back(SamplingFilter::make_top_p(v));
  return run_sampler(rows, out_rows, filters, opt);
}

SamplingResult min_p_sampling_from_probs(const Tensor& probs, const RowParam<double>& min_p,
                                         const SamplingOptions& opt) {
  const char* fn = "min_p_sampling_from_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  const auto out_rows = output_rows(fn, opt.indices, probs.dim(0));
  check_min_p(fn, min_p, static_cast<int64_t>(out_rows.size()));
  std::vector<SamplingFilter> filters;
  for (double v : min_p.values) filters.push_back(SamplingFilter::make_min_p(v));
  return run_sampler(rows, out_rows, filters, opt);
}

namespace {

// top_k_first: output i samples top_p from top_k_renorm(row, k_i). Outputs sharing
// (row, k) share one renormalized row; the Philox subsequence stays the output index.
SamplingResult top_k_first(const std::vector<std::vector<float>>& rows, const std::vector<int32_t>& out_rows,
                           const RowParam<int64_t>& top_k, const RowParam<double>& top_p, const SamplingOptions& opt) {
  const size_t batch = out_rows.size();
  std::map<std::pair<int32_t, int64_t>, int32_t> renormed_index;
  std::vector<std::vector<float>> renormed;
  std::vector<int32_t> renormed_rows(batch);
  for (size_t i = 0; i < batch; ++i) {
    const auto key = std::make_pair(out_rows[i], top_k.at(static_cast<int64_t>(i)));
    auto it = renormed_index.find(key);
    if (it == renormed_index.end()) {
      const auto t = sampling_target_distribution(rows[static_cast<size_t>(key.first)],
                                                  SamplingFilter::make_top_k(key.second));
      // The renormalized row is a probs tensor again: read as float32 by the next sampler.
      std::vector<float> f(t.size());
      for (size_t j = 0; j < t.size(); ++j) f[j] = static_cast<float>(t[j]);
      it = renormed_index.emplace(key, static_cast<int32_t>(renormed.size())).first;
      renormed.push_back(std::move(f));
    }
    renormed_rows[i] = it->second;
  }
  std::vector<SamplingFilter> filters;
  for (double v : top_p.values) filters.push_back(SamplingFilter::make_top_p(v));
  return run_sampler(renormed, renormed_rows, filters, opt);
}

std::vector<SamplingFilter> joint_filters(const RowParam<int64_t>& top_k, const RowParam<double>& top_p,
                                          int64_t batch) {
  std::vector<SamplingFilter> filters;
  if (top_k.is_scalar() && top_p.is_scalar()) {
    filters.push_back(SamplingFilter::make_top_k_top_p(top_k.at(0), top_p.at(0)));
  } else {
    for (int64_t i = 0; i < batch; ++i) filters.push_back(SamplingFilter::make_top_k_top_p(top_k.at(i), top_p.at(i)));
  }
  return filters;
}

}  // namespace

SamplingResult top_k_top_p_sampling_from_probs(const Tensor& probs, const RowParam<int64_t>& top_k,
                                               const RowParam<double>& top_p, FilterApplyOrder order,
                                               const SamplingOptions& opt) {
  const char* fn = "top_k_top_p_sampling_from_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  const auto out_rows = output_rows(fn, opt.indices, probs.dim(0));
  const int64_t batch = static_cast<int64_t>(out_rows.size());
  check_top_k(fn, top_k, batch);
  check_top_p(fn, top_p, batch);
  if (order == FilterApplyOrder::top_k_first) return top_k_first(rows, out_rows, top_k, top_p, opt);
  return run_sampler(rows, out_rows, joint_filters(top_k, top_p, batch), opt);
}

SamplingResult top_k_top_p_sampling_from_logits(const Tensor& logits, const RowParam<int64_t>& top_k,
                                                const RowParam<double>& top_p, FilterApplyOrder order,
                                                const SamplingOptions& opt) {
  const char* fn = "top_k_top_p_sampling_from_logits";
  check_logits(fn, "logits", logits);
  const auto out_rows = output_rows(fn, opt.indices, logits.dim(0));
  const int64_t batch = static_cast<int64_t>(out_rows.size());
  check_top_k(fn, top_k, batch);
  check_top_p(fn, top_p, batch);
  if (order == FilterApplyOrder::joint) {
    const auto rows = checked_prob_rows(fn, "softmax(logits)", softmax(logits));
    return run_sampler(rows, out_rows, joint_filters(top_k, top_p, batch), opt);
  }
  // top_k_first: mask the logits to the top-k, softmax, then top-p sampling. Outputs that
  // share (row, k) share one masked row.
  std::map<std::pair<int32_t, int64_t>, int32_t> masked_index;
  std::vector<std::vector<float>> masked_probs;
  std::vector<int32_t> masked_rows(static_cast<size_t>(batch));
  const int64_t vocab = logits.dim(1);
  for (int64_t i = 0; i < batch; ++i) {
    const auto key = std::make_pair(out_rows[static_cast<size_t>(i)], top_k.at(i));
    auto it = masked_index.find(key);
    if (it == masked_index.end()) {
      Tensor row({1, vocab});
      std::copy(logits.data.begin() + key.first * vocab, logits.data.begin() + (key.first + 1) * vocab,
                row.data.begin());
      const auto probs = checked_prob_rows(fn, "softmax(top_k_mask_logits(logits))",
                                           softmax(top_k_mask_logits(row, key.second)));
      it = masked_index.emplace(key, static_cast<int32_t>(masked_probs.size())).first;
      masked_probs.push_back(probs[0]);
    }
    masked_rows[static_cast<size_t>(i)] = it->second;
  }
  std::vector<SamplingFilter> filters;
  for (double v : top_p.values) filters.push_back(SamplingFilter::make_top_p(v));
  return run_sampler(masked_probs, masked_rows, filters, opt);
}

Tensor top_k_renorm_probs(const Tensor& probs, const RowParam<int64_t>& top_k) {
  const char* fn = "top_k_renorm_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  check_top_k(fn, top_k, probs.dim(0));
  Tensor out(probs.shape);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto t = sampling_target_distribution(rows[r], SamplingFilter::make_top_k(top_k.at(static_cast<int64_t>(r))));
    std::copy(t.begin(), t.end(), out.data.begin() + static_cast<int64_t>(r) * probs.dim(1));
  }
  return out;
}

Tensor top_p_renorm_probs(const Tensor& probs, const RowParam<double>& top_p) {
  const char* fn = "top_p_renorm_probs";
  const auto rows = checked_prob_rows(fn, "probs", probs);
  check_top_p(fn, top_p, probs.dim(0));
  Tensor out(probs.shape);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto t = sampling_target_distribution(rows[r], SamplingFilter::make_top_p(top_p.at(static_cast<int64_t>(r))));
    std::copy(t.begin(), t.end(), out.data.begin() + static_cast<int64_t>(r) * probs.dim(1));
  }
  return out;
}

Tensor top_k_mask_logits(const Tensor& logits, const RowParam<int64_t>& top_k) {
  const char* fn = "top_k_mask_logits";
  check_logits(fn, "logits", logits);
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  check_top_k(fn, top_k, rows);
  Tensor out(logits.shape);
  std::vector<float> sorted(static_cast<size_t>(vocab));
  for (int64_t r = 0; r < rows; ++r) {
    const double* x = logits.data.data() + r * vocab;
    for (int64_t i = 0; i < vocab; ++i) sorted[static_cast<size_t>(i)] = static_cast<float>(x[i]);
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const int64_t k = top_k.at(r);
    for (int64_t i = 0; i < vocab; ++i) {
      // Kept iff fewer than k logits are strictly larger (as float32, like the samplers).
      const float xi = static_cast<float>(x[i]);
      const int64_t greater = std::partition_point(sorted.begin(), sorted.end(), [xi](float v) { return v > xi; }) -
                              sorted.begin();
      out.data[static_cast<size_t>(r * vocab + i)] = greater < k ? x[i] : -std::numeric_limits<double>::infinity();
    }
  }
  return out;
}

}  // namespace flashstep::ref
