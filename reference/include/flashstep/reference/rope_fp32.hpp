/// \file rope_fp32.hpp
/// \brief The rotation an attention kernel computes when RoPE is fused into its Q/K loads
/// (FlashInfer's pos_encoding_mode="ROPE_LLAMA"), written once for the host and the device
/// so that the reference can compute the very fp32 values a kernel computes.
///
/// ROPE_LLAMA rotates every rotate-half pair (x[i], x[i + head_dim/2]) of q at its
/// position and of each key at its position in the sequence by p * theta_i, theta_i =
/// rope_theta^(-2i/head_dim) / rope_scale (rope.hpp). A fused kernel does this for every
/// key it reads, so the angle must be cheap and still exact at long positions. Here:
///
///     t = p * f_i                  in double, f_i = theta_i / (2 pi) (turns per position)
///     r = t - rint(t)              exact: the fraction of a turn, in [-1/2, 1/2]
///     x = float(r), quadrant q = rint(4 x), y = x - q / 4 (exact, |y| <= 1/8 turn)
///     z = 2 pi y                   |z| <= pi / 4
///     sin z, cos z                 Taylor polynomials to z^9 and z^10 (remainder < 2e-9)
///     (cos, sin)(2 pi x)           (cos z, sin z) turned by q quarter turns
///     (a, b) -> (a cos - b sin, b cos + a sin)    in fp32
///
/// Every step is an IEEE operation named explicitly (fma, rint, a conversion), never left
/// to the compiler to contract, so the host and a CUDA kernel get the same bits. The error
/// against the rotation in double (apply_rotary_embedding) is bounded in
/// tests/reference/test_rope_fp32.cpp: cos and sin within 2^-21 of the exact values at any
/// position below 2^24.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashstep/reference/tensor.hpp"

/// \def FLASHSTEP_HOST_DEVICE
/// A function both the host and a CUDA kernel compile (plain `inline` without nvcc).
#if defined(__CUDACC__)
#define FLASHSTEP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHSTEP_HOST_DEVICE inline
#endif

namespace flashstep::ref {

/// cos and sin of 2 pi * frac(p * turns), in fp32, exactly as the fused kernels compute them.
/// \param position the token's position, -2^24 .. 2^24 (a query of a non-causal prefill
///        with more queries than keys sits before 0: kv_len - qo_len + i)
/// \param turns f_i = theta_i / (2 pi) (rope_llama_turns)
/// \param c receives the cosine \param s receives the sine
FLASHSTEP_HOST_DEVICE void rope_cos_sin_fp32(int position, double turns, float& c, float& s) {
  // The fraction of a turn: an RN product, then an exact difference. rint by the magic
  // number 1.5 * 2^52 (two additions, not the slower conversion unit; |t| < 2^51).
  const double t = fma(static_cast<double>(position), turns, -0.0);
  const double r = t - ((t + 0x1.8p52) - 0x1.8p52);
  const float x = static_cast<float>(r);
  // The quadrant, -2 .. 2 (rint as above), and what is left of it, exact, |y| <= 1/8.
  const float q = (fmaf(x, 4.f, -0.f) + 0x1.8p23f) - 0x1.8p23f;
  const float y = fmaf(q, -0.25f, x);
  const float z = fmaf(y, 6.28318530717958647692f, -0.f);
  const float z2 = fmaf(z, z, -0.f);
  // sin z = z (1 - z^2/3! + z^4/5! - z^6/7! + z^8/9!), cos z = 1 - z^2/2! + ... - z^10/10!
  float sp = fmaf(z2, 2.7557319224e-6f, -1.9841269841e-4f);
  sp = fmaf(z2, sp, 8.3333333333e-3f);
  sp = fmaf(z2, sp, -1.6666666667e-1f);
  sp = fmaf(z2, sp, 1.f);
  sp = fmaf(z, sp, -0.f);
  float cp = fmaf(z2, -2.7557319224e-7f, 2.4801587302e-5f);
  cp = fmaf(z2, cp, -1.3888888889e-3f);
  cp = fmaf(z2, cp, 4.1666666667e-2f);
  cp = fmaf(z2, cp, -0.5f);
  cp = fmaf(z2, cp, 1.f);
  // Turn (cos z, sin z) by q quarter turns: 2 pi x = z + q pi / 2.
  const int quadrant = static_cast<int>(q) & 3;
  c = quadrant == 0 ? cp : quadrant == 1 ? -sp : quadrant == 2 ? -cp : sp;
  s = quadrant == 0 ? sp : quadrant == 1 ? cp : quadrant == 2 ? -sp : -cp;
}

/// One pair rotated in fp32: (a, b) -> (a c - b s, b c + a s), each product rounded once.
FLASHSTEP_HOST_DEVICE void rope_rotate_fp32(float& a, float& b, float c, float s) {
  const float bs = fmaf(b, s, -0.f), as = fmaf(a, s, -0.f);
  const float ra = fmaf(a, c, -bs), rb = fmaf(b, c, as);
  a = ra;
  b = rb;
}

/// f_i = theta_i / (2 pi) for i = 0 .. head_dim/2 - 1, theta_i as rope_frequencies(head_dim,
/// rope_scale, rope_theta): the turns per position a fused kernel is given.
/// \param head_dim even and >= 2 \param rope_scale, rope_theta positive, finite
std::vector<double> rope_llama_turns(int64_t head_dim, double rope_scale, double rope_theta);

/// ROPE_LLAMA as a fused kernel computes it: each head of row t of `x` (values that fp32
/// holds exactly) rotated by rope_cos_sin_fp32 and rope_rotate_fp32 at positions[t], pairs
/// (x[i], x[i + head_dim/2]); the results are fp32 values.
/// \param x (nnz, num_heads, head_dim), every value exactly an fp32 value
/// \param positions (nnz), -2^24 .. 2^24
/// \param turns (head_dim / 2), rope_llama_turns
Tensor rope_llama_fp32(const Tensor& x, const std::vector<int64_t>& positions, const std::vector<double>& turns);

}  // namespace flashstep::ref
