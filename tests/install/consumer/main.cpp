// Uses the installed reference: the course's "A, pos 2" row.
#include <cmath>
#include <cstdio>
#include <flashstep/reference.hpp>

int main() {
  using flashstep::ref::Tensor;
  flashstep::ref::AttentionOptions opt;
  opt.sm_scale = 1.0;
  const auto r = flashstep::ref::single_decode_with_kv_cache(
      Tensor({1, 2}, {1, 1}), Tensor({3, 1, 2}, {1, 0, 0, 1, 1, 1}), Tensor({3, 1, 2}, {1, 1, 2, 0, 0, 1}), opt);
  const double e = std::exp(1.0);
  const bool ok = std::abs(r.o({0, 0}) - 3 / (2 + e)) < 1e-12 && std::abs(r.o({0, 1}) - (1 + e) / (2 + e)) < 1e-12;
  std::printf("consumer: o = [%.4f, %.4f] %s\n", r.o({0, 0}), r.o({0, 1}), ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
