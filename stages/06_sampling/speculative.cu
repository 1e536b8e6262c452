// Stage 06 — chain speculative sampling, one block per request
// (ref::chain_speculative_sampling, draw for draw).
//
// The acceptance tests are n scalar comparisons (u * q < p, exact in double) that every
// thread of the block evaluates alike; the only row work is the final draw, one inverse
// CDF (row_passes.cuh) over relu(p - q) at the stop position, or over p_n when every
// draft was accepted. Validating the 2n + 1 rows first costs 2n + 1 passes: the price of
// never reading a NaN row as if it were a distribution.
#include <string>

#include "06_sampling/row_passes.cuh"
#include "06_sampling/sampling.hpp"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/philox.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::sampling {

namespace device {

/// relu(p - q) in float as the reference computes it, or p alone when q is null.
struct ResidualRow {
  const float* p;  ///< (vocab) target row
  const float* q;  ///< (vocab) draft row, or null
  int64_t vocab;   ///< entries
  /// Entries i .. i + VEC - 1 into v (0 past the end).
  template <int VEC>
  __device__ __forceinline__ void load(int64_t i, float (&v)[VEC]) const {
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = i + j < vocab ? at(i + j) : 0.f;
  }
  /// Entry i.
  __device__ __forceinline__ float at(int64_t i) const { return q ? fmaxf(__fsub_rn(p[i], q[i]), 0.f) : p[i]; }
  /// No L2 prefetch (row_passes.cuh: prefetch_tile).
  __device__ __forceinline__ void prefetch_entries(int64_t, int64_t) const {}
};

struct SpeculativeParams {
  const float* draft_probs;        ///< (batch, n, vocab)
  const int32_t* draft_token_ids;  ///< (batch, n)
  const float* target_probs;       ///< (batch, n + 1, vocab)
  int64_t n, vocab;
  uint64_t seed, offset;
  SpeculativeOutputs out;
};

/// Step 1: draft ids in range, every row's entries in [0, 1], every target row with mass.
__device__ Status check_request(const SpeculativeParams& p, int64_t b, SharedState& sh) {
  for (int64_t j = 0; j < p.n; ++j) {
    const int32_t d = p.draft_token_ids[b * p.n + j];
    if (d < 0 || d >= p.vocab) return Status::bad_draft_token;
  }
  uint32_t flags = 0;
  bool zero_target = false;
  for (int64_t j = 0; j < p.n; ++j)
    flags |= summarize_row<8>(ProbRow{p.draft_probs + (b * p.n + j) * p.vocab, p.vocab}, sh).flags;
  for (int64_t j = 0; j <= p.n; ++j) {
    const RowSummary s = summarize_row<8>(ProbRow{p.target_probs + (b * (p.n + 1) + j) * p.vocab, p.vocab}, sh);
    flags |= s.flags;
    zero_target = zero_target || s.total == 0;
  }
  if (flags & kFlagNotFinite) return Status::not_finite;
  if (flags & kFlagNegative) return Status::negative;
  if (flags & kFlagAboveOne) return Status::above_one;
  if (zero_target) return Status::zero_row;
  return Status::ok;
}

__global__ void __launch_bounds__(kBlock) chain_speculative_kernel(SpeculativeParams p) {
  __shared__ SharedState sh;
  const int64_t b = blockIdx.x, n = p.n;
  int32_t* ids = p.out.output_token_ids + b * (n + 1);
  const Status status = check_request(p, b, sh);
  if (status != Status::ok) {
    if (threadIdx.x == 0) {
      for (int64_t j = 0; j <= n; ++j) ids[j] = kInvalidToken;
      p.out.output_accepted_token_num[b] = 0;
      p.out.output_emitted_draft_token_num[b] = 0;
      if (p.out.status) p.out.status[b] = static_cast<int32_t>(status);
    }
    return;
  }
  // Step 2: the acceptance tests, u * q < p compared exactly (both products fit a double)
  int64_t pos = n;
  int32_t accepted = 0;
  for (int64_t j = 0; j < n; ++j) {
    const int32_t d = p.draft_token_ids[b * n + j];
    const uint32_t u24 = kernels::philox_uniform_bits24(p.seed, static_cast<uint64_t>(b),
                                                        p.offset + static_cast<uint64_t>(j));
    const double q = p.draft_probs[(b * n + j) * p.vocab + d];
    const double t = p.target_probs[(b * (n + 1) + j) * p.vocab + d];
    const bool pass = static_cast<double>(u24) * q < t * 16777216.0;  // t * 2^24, exact
    accepted += pass ? 1 : 0;
    if (pos == n && !pass) pos = j;
  }
  // Step 3: one draw from relu(p - q) at the stop position (p_n if all accepted)
  const float* target = p.target_probs + (b * (n + 1) + pos) * p.vocab;
  ResidualRow row{target, pos < n ? p.draft_probs + (b * n + pos) * p.vocab : nullptr, p.vocab};
  auto any = [](float) { return true; };
  Mass total = sum_mass_where<8>(row, any, sh);
  if (total == 0) {  // relu(p - q) has no mass: draw from p (the reference's documented choice)
    row.q = nullptr;
    total = sum_mass_where<8>(row, any, sh);
  }
  const uint32_t u24 = kernels::philox_uniform_bits24(p.seed, static_cast<uint64_t>(b),
                                                      p.offset + static_cast<uint64_t>(n));
  const int32_t token = inverse_cdf<8>(row, any, scaled_threshold(u24, total), sh);
  if (threadIdx.x == 0) {
    for (int64_t j = 0; j <= n; ++j)
      ids[j] = j < pos ? p.draft_token_ids[b * n + j] : (j == pos ? token : kInvalidToken);
    p.out.output_accepted_token_num[b] = accepted;
    p.out.output_emitted_draft_token_num[b] = static_cast<int32_t>(pos);
    if (p.out.status) p.out.status[b] = static_cast<int32_t>(token < 0 ? Status::internal_error : Status::ok);
  }
}

}  // namespace device

void chain_speculative_sampling(const float* draft_probs, const int32_t* draft_token_ids, const float* target_probs,
                                int64_t batch, int64_t n, int64_t vocab, SpeculativeOutputs out, uint64_t seed,
                                uint64_t offset, cudaStream_t stream) {
  const char* fn = "chain_speculative_sampling";
  auto fail = [fn](const std::string& m) { throw ref::InvalidArgument(std::string(fn) + ": " + m); };
  if (batch < 0 || n < 0) fail("batch_size and num_speculate_tokens must be >= 0");
  if (vocab < 1 || vocab > (int64_t{1} << 30)) fail("vocab_size must be in [1, 2^30], got " + std::to_string(vocab));
  if (batch == 0) return;
  if (!target_probs || (n > 0 && (!draft_probs || !draft_token_ids)))
    fail("draft_probs, draft_token_ids and target_probs must not be null");
  if (!out.output_token_ids || !out.output_accepted_token_num || !out.output_emitted_draft_token_num)
    fail("output_token_ids, output_accepted_token_num and output_emitted_draft_token_num must not be null");
  const device::SpeculativeParams p{draft_probs, draft_token_ids, target_probs, n, vocab, seed, offset, out};
  device::chain_speculative_kernel<<<static_cast<unsigned>(batch), device::kBlock, 0, stream>>>(p);
  kernels::check_launch("chain_speculative_kernel");
}

}  // namespace flashstep::stages::sampling
