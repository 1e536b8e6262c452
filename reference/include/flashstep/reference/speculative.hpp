/// \file speculative.hpp
/// \brief Chain speculative sampling (Leviathan et al. / Chen et al., 2023) with
/// FlashInfer's conventions (flashinfer.sampling.chain_speculative_sampling).
///
/// A small draft model proposes `n` tokens d_0..d_{n-1} for a request, with draft
/// distributions q_j; the target model scores all of them at once, giving target
/// distributions p_0..p_n (one more: the token after the last draft). Verification walks
/// the chain:
///
///     for j in 0..n-1:  accept d_j with probability min(1, p_j[d_j] / q_j[d_j])
///                       (test: u_j * q_j[d_j] < p_j[d_j]); stop at the first rejection
///     at the stop position j: draw one token from relu(p_j - q_j), renormalized
///     if all n were accepted: draw the "bonus" token from p_n
///
/// Every emitted token is then distributed exactly as if the target had decoded alone.
///
/// ## FlashInfer's output conventions
///
/// - output_token_ids (batch, n + 1): the accepted drafts, then the resampled (or bonus)
///   token, then -1 padding.
/// - output_emitted_draft_token_num (batch): drafts emitted = position of the first
///   rejection (n if none). The request produced emitted + 1 tokens.
/// - output_accepted_token_num (batch): drafts that *would* pass their test considered
///   independently (the test keeps drawing uniforms after the first rejection). A measure
///   of draft/target agreement, not of tokens produced.
///
/// ## Random numbers
///
/// Request b uses Philox subsequence b (see kernels/philox.cuh): draft position j uses
/// stream word `offset + j` for its acceptance test (for all j < n, as FlashInfer keeps
/// drawing after a rejection), and the final draw uses word `offset + n`. Probabilities
/// are read as float32; the acceptance test `u * q < p` is exact (u = U / 2^24, both
/// products fit a double); the final draw uses the exact-mass inverse CDF of
/// sampling.hpp on relu(p - q) computed in float, as FlashInfer computes it.
///
/// One difference: if relu(p_j - q_j) has no mass at the stop position (possible only
/// for inputs where p_j <= q_j everywhere, e.g. q_j == p_j and a zero-probability
/// draft token), FlashInfer returns an undefined id; flashstep draws from p_j instead.
#pragma once

#include <cstdint>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Result of chain_speculative_sampling (row-major, FlashInfer's names).
struct ChainSpeculativeResult {
  int64_t batch_size = 0;                               ///< requests
  int64_t num_speculate_tokens = 0;                     ///< draft tokens per request (n)
  std::vector<int32_t> output_token_ids;                ///< (batch_size, num_speculate_tokens + 1), -1 padded
  std::vector<int32_t> output_accepted_token_num;       ///< (batch_size)
  std::vector<int32_t> output_emitted_draft_token_num;  ///< (batch_size)
};

/// Verify a chain of draft tokens per request against the target model.
/// \param draft_probs (batch_size, num_speculate_tokens, vocab_size): q_j, entries in [0, 1]
/// \param draft_token_ids (batch_size * num_speculate_tokens), row-major (batch, position),
///        each in [0, vocab_size)
/// \param target_probs (batch_size, num_speculate_tokens + 1, vocab_size): p_j, entries in
///        [0, 1], every row with positive mass
/// \param seed Philox key; \param offset first stream word of every request
ChainSpeculativeResult chain_speculative_sampling(const Tensor& draft_probs,
                                                  const std::vector<int32_t>& draft_token_ids,
                                                  const Tensor& target_probs, uint64_t seed = 0, uint64_t offset = 0);

}  // namespace flashstep::ref
