#include "09_engine/arrival_schedule.hpp"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::engine {

using ref::require;

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int64_t SplitMix64::uniform_int(int64_t lo, int64_t hi) {
  require(lo <= hi, "SplitMix64::uniform_int",
          "lo must be <= hi (got " + std::to_string(lo) + " > " + std::to_string(hi) + ")");
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  if (span == 0) return static_cast<int64_t>(next());  // the whole int64 range
  // Reject the top partial copy of [0, span) so every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t x;
  do {
    x = next();
  } while (x >= limit);
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + x % span);
}

int64_t SplitMix64::poisson(double mean) {
  require(mean > 0 && mean <= 1000, "SplitMix64::poisson",
          "mean must be in (0, 1000] (got " + std::to_string(mean) + ")");
  // exp(-1000) underflows a double, so large means are drawn as a sum of Poisson(<= 100).
  int64_t total = 0;
  double left = mean;
  while (left > 0) {
    const double m = left > 100 ? 100 : left;
    left -= m;
    const double limit = std::exp(-m);
    double product = uniform();
    int64_t k = 0;
    while (product > limit) {
      ++k;
      product *= uniform();
    }
    total += k;
  }
  return total;
}

namespace {

void check_params(const ArrivalParams& p) {
  const char* fn = "ArrivalSchedule::make";
  auto s = [](auto v) { return std::to_string(v); };
  require(p.num_requests >= 1, fn, "num_requests must be >= 1 (got " + s(p.num_requests) + ")");
  require(p.arrivals_per_step > 0 && p.arrivals_per_step <= 1000, fn,
          "arrivals_per_step must be in (0, 1000] (got " + s(p.arrivals_per_step) + ")");
  require(p.min_prompt_len >= 1, fn,
          "min_prompt_len must be >= 1, a prompt cannot be empty (got " + s(p.min_prompt_len) + ")");
  require(p.max_prompt_len >= p.min_prompt_len, fn,
          "max_prompt_len must be >= min_prompt_len (got " + s(p.max_prompt_len) + " < " + s(p.min_prompt_len) + ")");
  require(p.min_new_tokens >= 1, fn, "min_new_tokens must be >= 1 (got " + s(p.min_new_tokens) + ")");
  require(p.max_new_tokens >= p.min_new_tokens, fn,
          "max_new_tokens must be >= min_new_tokens (got " + s(p.max_new_tokens) + " < " + s(p.min_new_tokens) + ")");
  require(p.vocab_size >= 2, fn, "vocab_size must be >= 2 (got " + s(p.vocab_size) + ")");
  require(p.num_shared_prefixes >= 0, fn, "num_shared_prefixes must be >= 0 (got " + s(p.num_shared_prefixes) + ")");
  require(p.shared_fraction >= 0 && p.shared_fraction <= 1, fn,
          "shared_fraction must be in [0, 1] (got " + s(p.shared_fraction) + ")");
  if (p.num_shared_prefixes > 0) {
    require(p.shared_prefix_len >= 1, fn,
            "shared_prefix_len must be >= 1 when num_shared_prefixes > 0 (got " + s(p.shared_prefix_len) + ")");
  } else {
    require(p.shared_fraction == 0, fn,
            "shared_fraction must be 0 when num_shared_prefixes is 0 (got " + s(p.shared_fraction) + ")");
  }
}

}  // namespace

ArrivalSchedule ArrivalSchedule::make(const ArrivalParams& params) {
  check_params(params);
  ArrivalSchedule out;
  out.params_ = params;
  SplitMix64 rng(params.seed);
  auto token = [&] { return static_cast<int32_t>(rng.uniform_int(0, params.vocab_size - 1)); };
  for (int64_t i = 0; i < params.num_shared_prefixes; ++i) {
    std::vector<int32_t> prefix(static_cast<size_t>(params.shared_prefix_len));
    for (auto& t : prefix) t = token();
    out.prefixes_.push_back(std::move(prefix));
  }
  int64_t step = 0;
  while (static_cast<int64_t>(out.requests_.size()) < params.num_requests) {
    const int64_t arrivals = rng.poisson(params.arrivals_per_step);
    for (int64_t a = 0; a < arrivals && static_cast<int64_t>(out.requests_.size()) < params.num_requests; ++a) {
      Request r;
      r.arrival_step = step;
      // Always draw both numbers, so shared_fraction 0 and 1 keep the other draws aligned.
      const double u = rng.uniform();
      const int64_t which = params.num_shared_prefixes > 0 ? rng.uniform_int(0, params.num_shared_prefixes - 1) : -1;
      if (params.num_shared_prefixes > 0 && u < params.shared_fraction) {
        r.shared_prefix = static_cast<int32_t>(which);
        r.prompt = out.prefixes_[static_cast<size_t>(which)];
      }
      const int64_t own = rng.uniform_int(params.min_prompt_len, params.max_prompt_len);
      for (int64_t t = 0; t < own; ++t) r.prompt.push_back(token());
      r.max_new_tokens = rng.uniform_int(params.min_new_tokens, params.max_new_tokens);
      out.requests_.push_back(std::move(r));
    }
    ++step;
  }
  return out;
}

int64_t ArrivalSchedule::last_arrival_step() const { return requests_.back().arrival_step; }

std::string ArrivalSchedule::describe() const {
  std::ostringstream os;
  os << std::left << std::setw(9) << "request" << std::setw(16) << "arrival step" << std::setw(15) << "prompt tokens"
     << std::setw(15) << "shared prefix"
     << "max_new_tokens\n";
  for (size_t i = 0; i < requests_.size(); ++i) {
    const Request& r = requests_[i];
    os << std::setw(9) << ("r" + std::to_string(i)) << std::setw(16) << r.arrival_step << std::setw(15)
       << r.prompt.size() << std::setw(15) << (r.shared_prefix < 0 ? std::string("-") : std::to_string(r.shared_prefix))
       << r.max_new_tokens << "\n";
  }
  return os.str();
}

}  // namespace flashstep::stages::engine
