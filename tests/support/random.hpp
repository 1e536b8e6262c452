// Seeded random inputs for tests. One run seed per process (printed at start-up, or
// taken from FLASHSTEP_SEED to reproduce a failure); each test case derives its own
// stream from it and its name, so cases stay independent of the order they run in.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::test {

/// The run's seed: FLASHSTEP_SEED if set, else drawn fresh (and printed by main).
uint64_t run_seed();

/// A generator for the current test case, seeded from run_seed() and `salt`.
/// Call CAPTURE on the seed it reports so a failure prints it.
std::mt19937_64 case_rng(const std::string& salt);

/// Uniform values in [lo, hi) — never all zeros, so unwritten outputs cannot hide.
ref::Tensor random_tensor(std::mt19937_64& rng, std::vector<int64_t> shape, double lo = -1.0, double hi = 1.0);
/// Uniform integer in [lo, hi].
int64_t random_int(std::mt19937_64& rng, int64_t lo, int64_t hi);

/// max |a - b| (ref::max_abs_diff: NaN or a shape mismatch is +inf).
using ref::max_abs_diff;

}  // namespace flashstep::test
