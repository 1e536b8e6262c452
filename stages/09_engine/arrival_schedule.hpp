/// \file arrival_schedule.hpp
/// \brief Stage 09's workload: a seeded schedule of requests arriving over engine steps.
///
/// An engine is tested and timed on a stream of requests, not on one batch: requests
/// arrive while others run, with prompts of different lengths, some of them opening with
/// the same system prompt. ArrivalSchedule::make draws such a stream from a seed and a few
/// parameters, and the same (seed, parameters) always give the same stream, on every
/// platform (the draws use a fixed generator, splitmix64, and no std::*_distribution,
/// whose results differ between standard libraries).
///
/// - Arrivals: the number of requests arriving at each step is Poisson with mean
///   `arrivals_per_step` (a Poisson process observed once per step), until
///   `num_requests` have arrived.
/// - Prompts: with probability `shared_fraction` a prompt opens with one of
///   `num_shared_prefixes` shared prefixes (each `shared_prefix_len` tokens, chosen
///   uniformly); then comes its own part, uniform in [min_prompt_len, max_prompt_len]
///   tokens. Tokens are uniform in [0, vocab_size).
/// - max_new_tokens: uniform in [min_new_tokens, max_new_tokens].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flashstep::stages::engine {

/// One request of a workload.
struct Request {
  int64_t arrival_step = 0;     ///< first step at which the scheduler may admit it
  std::vector<int32_t> prompt;  ///< token ids, at least one
  int64_t max_new_tokens = 1;   ///< tokens to generate, >= 1 (the first comes from the prefill)
  int32_t shared_prefix = -1;   ///< which shared prefix the prompt opens with, -1 if none
};

/// The parameters of ArrivalSchedule::make.
struct ArrivalParams {
  uint64_t seed = 0;                ///< the whole schedule follows from it
  int64_t num_requests = 16;        ///< requests in the schedule, >= 1
  double arrivals_per_step = 1.0;   ///< Poisson mean of arrivals per step, in (0, 1000]
  int64_t min_prompt_len = 8;       ///< shortest own part of a prompt, >= 1
  int64_t max_prompt_len = 64;      ///< longest own part, >= min_prompt_len
  int64_t min_new_tokens = 4;       ///< fewest tokens to generate, >= 1
  int64_t max_new_tokens = 32;      ///< most tokens to generate, >= min_new_tokens
  int32_t vocab_size = 256;         ///< tokens are drawn from [0, vocab_size), >= 2
  int64_t num_shared_prefixes = 0;  ///< distinct shared prefixes, >= 0
  int64_t shared_prefix_len = 0;    ///< tokens of each shared prefix, >= 1 if there are any
  double shared_fraction = 0.0;     ///< probability that a prompt opens with one, in [0, 1]
};

/// A reproducible stream of requests, in arrival order.
class ArrivalSchedule {
 public:
  /// Draws the schedule. Throws ref::InvalidArgument naming a parameter out of range.
  static ArrivalSchedule make(const ArrivalParams& params);

  /// The parameters it was drawn from.
  const ArrivalParams& params() const { return params_; }
  /// The requests, in arrival order (arrival_step never decreases).
  const std::vector<Request>& requests() const { return requests_; }
  /// The shared prefixes (num_shared_prefixes of shared_prefix_len tokens).
  const std::vector<std::vector<int32_t>>& shared_prefixes() const { return prefixes_; }
  /// The step at which the last request arrives.
  int64_t last_arrival_step() const;
  /// One line per request: arrival step, prompt length, shared prefix, max_new_tokens.
  std::string describe() const;

 private:
  ArrivalParams params_;
  std::vector<Request> requests_;
  std::vector<std::vector<int32_t>> prefixes_;
};

/// The generator behind ArrivalSchedule (splitmix64; Steele, Lea and Flood, "Fast
/// Splittable Pseudorandom Number Generators", OOPSLA 2014): public so that tests and
/// examples draw from the same portable stream.
class SplitMix64 {
 public:
  /// A stream starting from `seed`.
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  /// The next 64 random bits.
  uint64_t next();
  /// Uniform in [0, 1) with 53 random bits.
  double uniform();
  /// Uniform integer in [lo, hi] (lo <= hi), without modulo bias.
  int64_t uniform_int(int64_t lo, int64_t hi);
  /// Poisson with mean `mean` in (0, 1000] (Knuth's product of uniforms).
  int64_t poisson(double mean);

 private:
  uint64_t state_;
};

}  // namespace flashstep::stages::engine
