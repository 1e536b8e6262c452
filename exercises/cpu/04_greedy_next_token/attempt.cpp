// Exercise 4 (chapter 2, "Only the last row matters"): from the model's last row to the
// next token, greedily.
//
// Fill in the two functions below: vocab_logits() multiplies the last row z of the final
// layer by W_vocab, one logit per vocabulary entry; greedy_token() picks the most likely
// token (temperature -> 0). The grader runs the reference's tiny decoder (random weights,
// byte tokens) on random prompts, compares your logits with the model's and your token
// with the one its greedy generation produces.
//
//     cmake --build build --target flashstep_exercise_cpu_04_greedy_next_token
//     flashstep exercise check 4          (or run build/bin/flashstep_exercise_cpu_04_greedy_next_token)
//
// Stuck? `flashstep exercise hint 4`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

/// logits = z W_vocab.
/// \param z (d_model) the last row of the last layer
/// \param w_vocab (d_model, vocab_size), row-major
/// \return (vocab_size) one logit per token
std::vector<double> vocab_logits(const std::vector<double>& z, const Tensor& w_vocab) {
  std::vector<double> logits;
  // TODO(exercise): fill logits.
  return logits;
}

/// Greedy decoding: the token with the largest logit; on a tie, the lowest token id.
/// \param logits (vocab_size)
int32_t greedy_token(const std::vector<double>& logits) {
  // TODO(exercise): return the argmax.
  return -1;
}
