// Chain speculative sampling on the CPU, one request at a time, as FlashInfer's kernel
// runs it (one block per request).
#include "flashstep/reference/speculative.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include <flashstep/kernels/philox.cuh>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/sampling.hpp"

namespace flashstep::ref {

namespace {

[[noreturn]] void fail(const char* fn, const std::string& message) {
  throw InvalidArgument(std::string(fn) + ": " + message);
}

std::string where(int64_t b, int64_t j, int64_t i) {
  return "[" + std::to_string(b) + ", " + std::to_string(j) + ", " + std::to_string(i) + "]";
}

std::string number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// Entries finite in [0, 1]; with `positive_rows`, every (b, j) row has positive mass.
void check_probs3(const char* fn, const char* name, const Tensor& t, bool positive_rows) {
  const int64_t B = t.dim(0), J = t.dim(1), V = t.dim(2);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < J; ++j) {
      Mass total = 0;
      for (int64_t i = 0; i < V; ++i) {
        const double p = t.data[static_cast<size_t>((b * J + j) * V + i)];
        if (std::isnan(p)) fail(fn, std::string(name) + where(b, j, i) + " is NaN");
        if (p < 0.0)
          fail(fn, std::string(name) + " must be non-negative, but " + name + where(b, j, i) + " = " + number(p));
        if (p > 1.0) fail(fn, std::string(name) + " must be <= 1, but " + name + where(b, j, i) + " = " + number(p));
        total += mass_of(static_cast<float>(p));
      }
      if (positive_rows && total == 0)
        fail(fn, std::string(name) + "[" + std::to_string(b) + ", " + std::to_string(j) +
                     "] sums to zero (no token can be drawn)");
    }
  }
}

// The first token whose exact cumulative mass exceeds floor(u * total): sampling.hpp's
// inverse CDF, over a float row.
int32_t inverse_cdf(const std::vector<float>& w, uint32_t u24, Mass total) {
  const Mass threshold = scaled_threshold(u24, total);
  Mass cdf = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    cdf += mass_of(w[i]);
    if (cdf > threshold) return static_cast<int32_t>(i);
  }
  return -1;  // unreachable when total > 0
}

}  // namespace

ChainSpeculativeResult chain_speculative_sampling(const Tensor& draft_probs,
                                                  const std::vector<int32_t>& draft_token_ids,
                                                  const Tensor& target_probs, uint64_t seed, uint64_t offset) {
  const char* fn = "chain_speculative_sampling";
  check_rank(fn, "draft_probs", draft_probs, 3);
  check_rank(fn, "target_probs", target_probs, 3);
  const int64_t B = draft_probs.dim(0), n = draft_probs.dim(1), V = draft_probs.dim(2);
  require(V >= 1, fn, "draft_probs must have vocab_size >= 1, got shape " + shape_string(draft_probs.shape));
  check_dim(fn, "target_probs", target_probs, 0, B, "batch_size");
  check_dim(fn, "target_probs", target_probs, 1, n + 1, "num_speculate_tokens + 1");
  check_dim(fn, "target_probs", target_probs, 2, V, "vocab_size");
  require(static_cast<int64_t>(draft_token_ids.size()) == B * n, fn,
          "draft_token_ids must hold batch_size * num_speculate_tokens = " + std::to_string(B * n) + " ids, got " +
              std::to_string(draft_token_ids.size()));
  for (size_t k = 0; k < draft_token_ids.size(); ++k)
    if (draft_token_ids[k] < 0 || draft_token_ids[k] >= V)
      fail(fn, "draft_token_ids[" + std::to_string(static_cast<int64_t>(k) / std::max<int64_t>(n, 1)) + ", " +
                   std::to_string(static_cast<int64_t>(k) % std::max<int64_t>(n, 1)) + "] = " +
                   std::to_string(draft_token_ids[k]) + " is not in [0, vocab_size = " + std::to_string(V) + ")");
  check_probs3(fn, "draft_probs", draft_probs, false);
  check_probs3(fn, "target_probs", target_probs, true);

  ChainSpeculativeResult r;
  r.batch_size = B;
  r.num_speculate_tokens = n;
  r.output_token_ids.assign(static_cast<size_t>(B * (n + 1)), -1);
  r.output_accepted_token_num.assign(static_cast<size_t>(B), 0);
  r.output_emitted_draft_token_num.assign(static_cast<size_t>(B), 0);
  auto draft = [&](int64_t b, int64_t j, int64_t i) {
    return static_cast<float>(draft_probs.data[static_cast<size_t>((b * n + j) * V + i)]);
  };
  auto target = [&](int64_t b, int64_t j, int64_t i) {
    return static_cast<float>(target_probs.data[static_cast<size_t>((b * (n + 1) + j) * V + i)]);
  };
  std::vector<float> residual(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    // Test every draft (FlashInfer keeps testing after the first rejection, to count
    // output_accepted_token_num); the chain stops at the first failure.
    int64_t pos = n;
    int32_t accepted = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int32_t d = draft_token_ids[static_cast<size_t>(b * n + j)];
      const uint32_t u24 = kernels::philox_uniform_bits24(seed, static_cast<uint64_t>(b),
                                                          offset + static_cast<uint64_t>(j));
      // u * q < p with u = u24 / 2^24, compared exactly: both sides are exact doubles.
      const bool pass = static_cast<double>(u24) * draft(b, j, d) <
                        std::ldexp(static_cast<double>(target(b, j, d)), 24);
      if (pass) ++accepted;
      if (pos == n) {
        if (pass) {
          r.output_token_ids[static_cast<size_t>(b * (n + 1) + j)] = d;
        } else {
          pos = j;
        }
      }
    }
    r.output_accepted_token_num[static_cast<size_t>(b)] = accepted;
    r.output_emitted_draft_token_num[static_cast<size_t>(b)] = static_cast<int32_t>(pos);
    // The final token: from relu(p - q) at the rejected position, or p_n (the bonus).
    Mass total = 0;
    for (int64_t i = 0; i < V; ++i) {
      const float p = target(b, pos, i);
      residual[static_cast<size_t>(i)] = pos < n ? std::max(p - draft(b, pos, i), 0.0f) : p;
      total += mass_of(residual[static_cast<size_t>(i)]);
    }
    if (total == 0) {
      // relu(p - q) has no mass (see the header): draw from p at this position.
      for (int64_t i = 0; i < V; ++i) {
        residual[static_cast<size_t>(i)] = target(b, pos, i);
        total += mass_of(residual[static_cast<size_t>(i)]);
      }
    }
    const uint32_t u24 = kernels::philox_uniform_bits24(seed, static_cast<uint64_t>(b),
                                                        offset + static_cast<uint64_t>(n));
    const int32_t token = inverse_cdf(residual, u24, total);
    if (token < 0) require(false, fn, "internal error: inverse CDF ran off the row");
    r.output_token_ids[static_cast<size_t>(b * (n + 1) + pos)] = token;
  }
  return r;
}

}  // namespace flashstep::ref
