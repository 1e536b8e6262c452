// Exercise 4's solution: one vector-matrix product, then an argmax.
#include <cstdint>
#include <vector>

#include <flashstep/reference.hpp>

using flashstep::ref::Tensor;

std::vector<double> vocab_logits(const std::vector<double>& z, const Tensor& w_vocab) {
  const int64_t d_model = w_vocab.dim(0), vocab = w_vocab.dim(1);
  std::vector<double> logits(static_cast<size_t>(vocab), 0.0);
  // the axes swap roles here: each column of W_vocab scores one candidate token
  for (int64_t k = 0; k < d_model; ++k)
    for (int64_t c = 0; c < vocab; ++c) logits[static_cast<size_t>(c)] += z[static_cast<size_t>(k)] * w_vocab({k, c});
  return logits;
}

int32_t greedy_token(const std::vector<double>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);  // strict: the first max wins
  return best;
}
