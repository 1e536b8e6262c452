// Exercise 18's solution: the sink is one more state to merge, one whose output is 0.
#include <algorithm>
#include <cmath>
#include <flashstep/reference.hpp>
#include <limits>

using flashstep::ref::AttentionResult;
using flashstep::ref::Tensor;

AttentionResult add_sink(const AttentionResult& state, const std::vector<double>& sinks) {
  const int64_t rows = state.o.dim(0), heads = state.o.dim(1), head_dim = state.o.dim(2);
  AttentionResult out{Tensor(state.o.shape), Tensor(state.lse.shape)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const double lse = state.lse({r, h}), sink = sinks[static_cast<size_t>(h)];
      // log(e^lse + e^sink) with the larger one taken out first; e^{-inf} is 0, so an
      // empty state gives lse' = sink and weight 0 on its (zero) output.
      const double m = std::max(lse, sink);
      const double merged = m + std::log(std::exp(lse - m) + std::exp(sink - m));
      out.lse({r, h}) = merged;
      const double w = std::exp(lse - merged);
      for (int64_t d = 0; d < head_dim; ++d) out.o({r, h, d}) = state.o({r, h, d}) * w;
    }
  return out;
}
