#include "support/random.hpp"

#include <cstdlib>
#include <functional>

namespace flashstep::test {

uint64_t run_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("FLASHSTEP_SEED")) return static_cast<uint64_t>(std::strtoull(env, nullptr, 10));
    return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ static_cast<uint64_t>(std::random_device{}());
  }();
  return seed;
}

std::mt19937_64 case_rng(const std::string& salt) {
  return std::mt19937_64(run_seed() ^ std::hash<std::string>{}(salt));
}

ref::Tensor random_tensor(std::mt19937_64& rng, std::vector<int64_t> shape, double lo, double hi) {
  ref::Tensor t(std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  for (double& x : t.data) x = dist(rng);
  return t;
}

int64_t random_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

}  // namespace flashstep::test
