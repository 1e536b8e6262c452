// Exercise 3 (chapter 2, "Predicting the next token, and temperature"): turn logits into
// probabilities at a temperature.
//
// Fill in softmax_with_temperature() below: for every row, p = softmax(logits / T) with
// that row's temperature T, computed safely (subtract the row's largest logit first). A
// logit of -inf is a token the model rules out: its probability is 0. The grader compares
// your rows with the reference's softmax.
//
//     cmake --build build --target flashstep_exercise_cpu_03_temperature_softmax
//     flashstep exercise check 3          (or run build/bin/flashstep_exercise_cpu_03_temperature_softmax)
//
// Stuck? `flashstep exercise hint 3`. The solution is solution.cpp beside this file.
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

/// Softmax of logits / temperature, row by row.
/// \param logits (batch, vocab); entries finite or -inf, at least one finite per row
/// \param temperature (batch) one temperature per row, each > 0
/// \return (batch, vocab) probabilities; every row sums to 1
Tensor softmax_with_temperature(const Tensor& logits, const std::vector<double>& temperature) {
  Tensor probs;
  // TODO(exercise): fill probs.
  return probs;
}
