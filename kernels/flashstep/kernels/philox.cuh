/// \file philox.cuh
/// \brief Philox4x32-10, the counter-based random number generator shared by the CPU
/// reference and the CUDA sampling stage, so that both draw the *same* uniforms.
///
/// Philox (Salmon, Moraes, Dror and Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3",
/// SC 2011) is a keyed bijection of a 128-bit counter, so the n-th number of any stream
/// is computed directly, on any device, in any order (docs/concepts/10_sampling.md). The
/// layout is cuRAND's for `curand_init(seed, subsequence, offset)`, as FlashInfer's
/// sampling kernels use it; the n-th 32-bit word of the stream (seed, subsequence) is
///
///     counter = { lo32(n / 4), hi32(n / 4), lo32(subsequence), hi32(subsequence) }
///     key     = { lo32(seed),  hi32(seed) }
///     word    = Philox4x32-10(counter, key)[n % 4]
///
/// and a sampler's j-th draw uses word offset + j of subsequence = output row, so
/// uniform(row r, round j) = philox_uniform(seed, r, offset + j) on the CPU and the GPU.
/// A uniform is the top 24 bits of a word / 2^24: exact in float, so the CPU (double) and
/// the GPU (float) hold the identical number (cuRAND's curand_uniform, in (0, 1], is not
/// used). tests/reference/test_philox.cpp checks the Random123 known-answer vectors. The
/// header compiles with nvcc and with a plain C++ compiler.
#pragma once

#include <cstdint>

/// `__host__ __device__ __forceinline__` under nvcc, `inline` for a plain C++ compiler.
#if defined(__CUDACC__)
#define FLASHSTEP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHSTEP_HOST_DEVICE inline
#endif

namespace flashstep::kernels {

/// Four 32-bit words: a Philox counter or output block.
struct Philox4x32 {
  uint32_t v[4];  ///< words 0..3 (counter: v[0] is the least significant)
};

/// A Philox key: two 32-bit words (the seed).
struct PhiloxKey {
  uint32_t v[2];  ///< words 0..1 (v[0] is the low half of the seed)
};

// Round multipliers and Weyl key increments of Philox4x32 (Salmon et al., Table 2; the
// increments are the golden ratio and sqrt(3) - 1 in 0.32 fixed point).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  ///< multiplier of counter word 0
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  ///< multiplier of counter word 2
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  ///< key word 0 increment (golden ratio)
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  ///< key word 1 increment (sqrt(3) - 1)

/// hi and lo 32-bit halves of the 64-bit product a * b.
FLASHSTEP_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
#endif
}

/// One Philox4x32 round: two multiplies, the halves crossed over and mixed with the key.
FLASHSTEP_HOST_DEVICE Philox4x32 philox_round(Philox4x32 ctr, PhiloxKey key) {
  uint32_t hi0, lo0, hi1, lo1;
  philox_mulhilo(kPhiloxM0, ctr.v[0], hi0, lo0);
  philox_mulhilo(kPhiloxM1, ctr.v[2], hi1, lo1);
  Philox4x32 out;
  out.v[0] = hi1 ^ ctr.v[1] ^ key.v[0];
  out.v[1] = lo1;
  out.v[2] = hi0 ^ ctr.v[3] ^ key.v[1];
  out.v[3] = lo0;
  return out;
}

/// Philox4x32 with `Rounds` rounds (10 is the standard, Crush-resistant choice). The key
/// is bumped by the Weyl increments between rounds.
/// \param ctr the 128-bit counter
/// \param key the 64-bit key
template <int Rounds>
FLASHSTEP_HOST_DEVICE Philox4x32 philox4x32(Philox4x32 ctr, PhiloxKey key) {
  static_assert(Rounds >= 1 && Rounds <= 16, "Philox4x32 is defined for 1..16 rounds");
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < Rounds; ++r) {
    if (r > 0) {
      key.v[0] += kPhiloxW0;
      key.v[1] += kPhiloxW1;
    }
    ctr = philox_round(ctr, key);
  }
  return ctr;
}

/// Philox4x32-10 (the generator cuRAND calls CURAND_RNG_PSEUDO_PHILOX4_32_10).
FLASHSTEP_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 ctr, PhiloxKey key) { return philox4x32<10>(ctr, key); }

/// Word `n` of the stream (seed, subsequence): the mapping documented at the top.
/// \param seed 64-bit seed (the Philox key)
/// \param subsequence independent stream id (flashstep: the output row)
/// \param n position in the stream (flashstep: offset + rejection round)
FLASHSTEP_HOST_DEVICE uint32_t philox_word(uint64_t seed, uint64_t subsequence, uint64_t n) {
  const uint64_t block = n >> 2;
  Philox4x32 ctr;
  ctr.v[0] = static_cast<uint32_t>(block);
  ctr.v[1] = static_cast<uint32_t>(block >> 32);
  ctr.v[2] = static_cast<uint32_t>(subsequence);
  ctr.v[3] = static_cast<uint32_t>(subsequence >> 32);
  PhiloxKey key;
  key.v[0] = static_cast<uint32_t>(seed);
  key.v[1] = static_cast<uint32_t>(seed >> 32);
  return philox4x32_10(ctr, key).v[n & 3];
}

/// The 24-bit integer U behind a uniform: the top 24 bits of the word, so the uniform
/// is exactly U / 2^24. Samplers that compare exactly use U itself.
FLASHSTEP_HOST_DEVICE uint32_t philox_uniform_bits24(uint64_t seed, uint64_t subsequence, uint64_t n) {
  return philox_word(seed, subsequence, n) >> 8;
}

/// A uniform in [0, 1): philox_uniform_bits24(...) / 2^24, exact in float and double.
FLASHSTEP_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t subsequence, uint64_t n) {
  return static_cast<float>(philox_uniform_bits24(seed, subsequence, n)) * (1.0f / 16777216.0f);
}

}  // namespace flashstep::kernels
