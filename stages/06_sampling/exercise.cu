// Stage 06 exercise — top-p sampling by rejection, token for token with the reference.
//
// The program below is a small version of the stage's sampler (top-p only, 256 threads,
// one float per thread per tile) built on the stage's exact masses (mass.cuh). It has two
// holes marked TODO:
//   1. the inverse CDF: which thread's entry makes the cumulative mass cross the threshold?
//   2. the rejection: after a pivot fails, how do low, high and q move?
// As shipped it FAILs every case; fill in the two holes until it prints PASS (the tokens
// and the round counts must equal ref::top_p_sampling_from_probs exactly). Then read
// row_passes.cuh and sampling.cu to see what the real stage adds (16-byte loads, every
// filter, per-output parameters, bad-row statuses).
//
//     cmake --build build --target flashstep_exercise_06_sampling
//     build/bin/flashstep_exercise_06_sampling
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "06_sampling/mass.cuh"
#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/philox.cuh"
#include "flashstep/reference/sampling.hpp"
#include "harness/gpu_present.hpp"

namespace {

using namespace flashstep;
using stages::sampling::Mass;
using stages::sampling::mass_fraction_ceil;
using stages::sampling::mass_of;
using stages::sampling::scaled_threshold;

constexpr int kThreads = 256;

struct Above {
  Mass mass_0, mass_1;  // mass of p > pivot_0, of p > pivot_1
};

struct Shared {
  union {
    cub::BlockScan<Mass, kThreads>::TempStorage scan;
    cub::BlockReduce<Mass, kThreads>::TempStorage reduce;
    cub::BlockReduce<Above, kThreads>::TempStorage above;
  } temp;
  int token;
  Mass mass;
  Above above;
};

/// TODO(exercise) 1 — the crossing. This thread holds entry `x` (already known to be a
/// candidate or not: `candidate`), and `before` is the exact candidate mass of every
/// entry before it in vocabulary order. Return true iff this entry is the first whose
/// cumulative mass (before + its own) exceeds `threshold`.
__device__ bool crosses(Mass before, float x, bool candidate, Mass threshold) {
  return false;  // placeholder: no entry ever crosses
}

/// First candidate (p > low) whose cumulative mass exceeds threshold, or -1.
__device__ int inverse_cdf(const float* row, int vocab, float low, Mass threshold, Shared& sh) {
  if (threadIdx.x == 0) sh.token = -1;
  Mass done = 0;  // candidate mass of the earlier tiles
  for (int tile = 0; tile < vocab; tile += kThreads) {
    const int i = tile + threadIdx.x;
    const float x = i < vocab ? row[i] : 0.f;
    const bool candidate = x > low;
    const Mass mine = candidate ? mass_of(x) : 0;
    Mass prefix, tile_mass;
    __syncthreads();
    cub::BlockScan<Mass, kThreads>(sh.temp.scan).ExclusiveSum(mine, prefix, tile_mass);
    if (crosses(done + prefix, x, candidate, threshold)) sh.token = i;
    done += tile_mass;
    if (done > threshold) break;
  }
  __syncthreads();
  return sh.token;
}

__device__ Above mass_above(const float* row, int vocab, float pivot_0, float pivot_1, Shared& sh) {
  Above a{0, 0};
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    if (row[i] > pivot_0) a.mass_0 += mass_of(row[i]);
    if (row[i] > pivot_1) a.mass_1 += mass_of(row[i]);
  }
  a = cub::BlockReduce<Above, kThreads>(sh.temp.above).Reduce(a, [](const Above& x, const Above& y) {
    return Above{x.mass_0 + y.mass_0, x.mass_1 + y.mass_1};
  });
  if (threadIdx.x == 0) sh.above = a;
  __syncthreads();
  a = sh.above;
  __syncthreads();
  return a;
}

/// TODO(exercise) 2 — the rejection step. pivot_0 (the drawn probability) failed the top-p
/// rule; `pivot_1_passes` says whether the midpoint pivot_1 passes it. Move the interval:
/// if pivot_1 passes, the keep threshold lies in (pivot_0, pivot_1], so the candidates
/// become p > pivot_0 and high becomes pivot_1; otherwise the candidates become
/// p > pivot_1. `q` must always be the exact mass of the candidates p > low.
__device__ void reject(float pivot_0, float pivot_1, bool pivot_1_passes, const Above& above, float& low, float& high,
                       Mass& q) {
  low = pivot_0;  // placeholder: forgets pivot_1, high and q
}

__global__ void top_p_kernel(const float* probs, int vocab, float top_p, uint64_t seed, int* samples, int* rounds) {
  __shared__ Shared sh;
  const int out = blockIdx.x;
  const float* row = probs + int64_t{out} * vocab;
  Mass total = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) total += mass_of(row[i]);
  total = cub::BlockReduce<Mass, kThreads>(sh.temp.reduce).Sum(total);
  if (threadIdx.x == 0) sh.mass = total;
  __syncthreads();
  total = sh.mass;
  const Mass bound = mass_fraction_ceil(total, top_p);
  float low = 0.f, high = 1.f;
  Mass q = total;
  int round = 0, token = -1;
  while (low < high && round < 64) {
    const uint32_t u24 = kernels::philox_uniform_bits24(seed, out, round++);
    token = inverse_cdf(row, vocab, low, scaled_threshold(u24, q), sh);
    if (token < 0) break;
    const float pivot_0 = row[token];
    const float pivot_1 = __fmul_rn(__fadd_rn(pivot_0, high), 0.5f);
    const Above above = mass_above(row, vocab, pivot_0, pivot_1, sh);
    if (above.mass_0 < bound) break;  // accepted
    token = -1;
    reject(pivot_0, pivot_1, above.mass_1 < bound, above, low, high, q);
  }
  if (threadIdx.x == 0) samples[out] = token, rounds[out] = round;
}

}  // namespace

int main() {
  std::string why;
  if (!flashstep::stages::harness::gpu_available(&why)) {
    std::printf("SKIPPED: no usable CUDA GPU (%s); the exercise needs one\n", why.c_str());
    return 77;
  }
  const uint64_t seed = 20240606;
  std::mt19937_64 rng(seed);
  bool all = true;
  struct Case {
    int batch, vocab;
    double p;
  };
  for (const Case c : {Case{4, 111, 0.5}, Case{8, 1000, 0.9}, Case{3, 32000, 0.9}, Case{2, 32000, 0.1}}) {
    std::normal_distribution<double> normal(0.0, 2.0);
    std::vector<float> probs(size_t(c.batch) * c.vocab);
    for (int r = 0; r < c.batch; ++r) {
      std::vector<double> w(c.vocab);
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(normal(rng)));
      for (int i = 0; i < c.vocab; ++i) probs[size_t(r) * c.vocab + i] = static_cast<float>(w[i] / sum);
    }
    ref::Tensor t({c.batch, c.vocab});
    for (size_t i = 0; i < probs.size(); ++i) t.data[i] = probs[i];
    ref::SamplingOptions opt;
    opt.seed = seed + c.vocab;
    const ref::SamplingResult expected = ref::top_p_sampling_from_probs(t, c.p, opt);

    float* d_probs;
    int *d_samples, *d_rounds;
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&d_probs, probs.size() * sizeof(float)));
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&d_samples, c.batch * sizeof(int)));
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&d_rounds, c.batch * sizeof(int)));
    FLASHSTEP_CUDA_CHECK(cudaMemcpy(d_probs, probs.data(), probs.size() * sizeof(float), cudaMemcpyHostToDevice));
    top_p_kernel<<<c.batch, kThreads>>>(d_probs, c.vocab, static_cast<float>(c.p), opt.seed, d_samples, d_rounds);
    kernels::check_launch("top_p_kernel");
    std::vector<int> samples(c.batch), rounds(c.batch);
    FLASHSTEP_CUDA_CHECK(cudaMemcpy(samples.data(), d_samples, c.batch * sizeof(int), cudaMemcpyDeviceToHost));
    FLASHSTEP_CUDA_CHECK(cudaMemcpy(rounds.data(), d_rounds, c.batch * sizeof(int), cudaMemcpyDeviceToHost));
    cudaFree(d_probs), cudaFree(d_samples), cudaFree(d_rounds);
    int wrong = 0;
    for (int i = 0; i < c.batch; ++i) wrong += samples[i] != expected.samples[i] || rounds[i] != expected.rounds[i];
    std::printf(
        "%s batch=%d vocab=%d top_p=%.1f seed=%llu: %d of %d outputs differ (first: GPU %d in %d rounds, reference %d in %d)\n",
        wrong ? "FAIL" : "PASS", c.batch, c.vocab, c.p, static_cast<unsigned long long>(opt.seed), wrong, c.batch,
        samples[0], rounds[0], expected.samples[0], expected.rounds[0]);
    all = all && wrong == 0;
  }
  std::printf("%s\n", all ? "PASS" : "FAIL");
  return all ? 0 : 1;
}
