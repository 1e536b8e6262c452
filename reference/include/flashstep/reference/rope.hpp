/// \file rope.hpp
/// \brief Rotary position encoding (RoPE; Su et al., *RoFormer*, arXiv 2104.09864) as Llama
/// uses it and as FlashInfer's `flashinfer.rope` module defines it.
///
/// RoPE turns the first `rotary_dim` elements of every query and key head into rotary_dim / 2
/// pairs and rotates pair i of a token at position p by the angle p * theta_i:
///
///     (a, b)  ->  (a cos(p theta_i) - b sin(p theta_i),  b cos(p theta_i) + a sin(p theta_i))
///
/// Elements past rotary_dim are copied unchanged. The frequencies are FlashInfer's
/// (`apply_rope`, `apply_rope_pos_ids`):
///
///     theta_i = rope_theta^(-2 i / rotary_dim) / rope_scale,   i = 0 .. rotary_dim/2 - 1
///
/// so rope_scale > 1 divides every frequency, which is linear position interpolation
/// (position p is read as p / rope_scale). Which elements form pair i is the layout:
///
///     rotate-half (interleave = false; GPT-NeoX, Hugging Face Llama):  (x[i], x[i + rotary_dim/2])
///     interleaved (interleave = true; GPT-J, RoFormer, Meta's Llama):  (x[2i], x[2i + 1])
///
/// Llama 3.1 (`apply_llama31_rope`) rescales the frequencies instead of all of them alike.
/// With wavelength w_i = 2 pi / theta_i (theta_i here without rope_scale) and
///
///     smooth_i = clamp((old_context_len / w_i - low_freq_factor)
///                      / (high_freq_factor - low_freq_factor), 0, 1)
///
/// the frequency used is (1 - smooth_i) * theta_i / rope_scale + smooth_i * theta_i: high
/// frequencies (w_i < old_context_len / high_freq_factor, smooth 1) are kept, low ones
/// (w_i > old_context_len / low_freq_factor, smooth 0) are divided by rope_scale, and those
/// between are interpolated.
///
/// Positions: `apply_rope` takes a ragged batch (request b owns rows indptr[b] ..
/// indptr[b+1]) and a per-request offset, so row t of request b sits at position
/// offsets[b] + (t - indptr[b]); `apply_rope_pos_ids` takes each row's position directly.
/// Every function reads float-valued inputs and computes in double (angles, sin, cos).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// FlashInfer's arguments of `apply_rope` / `apply_rope_pos_ids`.
struct RopeOptions {
  std::optional<int64_t> rotary_dim;  ///< rotated leading elements of a head; not given: head_dim. Even, <= head_dim
  bool interleave = false;            ///< pairs (x[2i], x[2i+1]) if true, else (x[i], x[i + rotary_dim/2])
  double rope_scale = 1.0;            ///< divides every frequency (linear interpolation); positive, finite
  double rope_theta = 1e4;            ///< base of the frequencies; positive, finite
};

/// FlashInfer's arguments of `apply_llama31_rope` / `apply_llama31_rope_pos_ids`, with its
/// defaults (Llama 3.1's published values).
struct Llama31RopeOptions {
  std::optional<int64_t> rotary_dim;  ///< as in RopeOptions
  bool interleave = false;            ///< as in RopeOptions
  double rope_scale = 8.0;            ///< divides the low frequencies; positive, finite
  double rope_theta = 5e5;            ///< base of the frequencies; positive, finite
  double low_freq_factor = 1.0;       ///< wavelengths above old_context_len / low_freq_factor are scaled; > 0
  double high_freq_factor = 4.0;  ///< wavelengths below old_context_len / high_freq_factor are kept; > low_freq_factor
  double old_context_len = 8192.0;  ///< context length the model was trained at; positive, finite
};

/// q and k after RoPE, same shapes as given.
struct RopeResult {
  Tensor q_rope;  ///< (nnz, num_q_heads, head_dim)
  Tensor k_rope;  ///< (nnz, num_k_heads, head_dim)
};

/// theta_i = rope_theta^(-2i / rotary_dim) / rope_scale for i = 0 .. rotary_dim/2 - 1.
/// \param rotary_dim even and >= 2
/// \param rope_scale positive, finite
/// \param rope_theta positive, finite
/// \return (rotary_dim / 2) frequencies in radians per position
std::vector<double> rope_frequencies(int64_t rotary_dim, double rope_scale, double rope_theta);

/// Llama 3.1's frequencies (file comment): the plain ones (rope_scale 1) rescaled by
/// wavelength.
/// \param rotary_dim even and >= 2
/// \param opt rope_scale, rope_theta, low/high_freq_factor, old_context_len (rotary_dim and
///        interleave ignored)
/// \return (rotary_dim / 2) frequencies
std::vector<double> llama31_rope_frequencies(int64_t rotary_dim, const Llama31RopeOptions& opt);

/// The primitive every entry point reduces to: rotates pair i of every head of row t by
/// positions[t] * frequencies[i]; rotary_dim = 2 * frequencies.size(), the rest is copied.
/// Any integer position is allowed here (rotating by -p undoes rotating by p).
/// \param x (nnz, num_heads, head_dim), finite
/// \param positions (nnz) position of each row
/// \param frequencies (rotary_dim / 2), finite; 2 * size() <= head_dim
/// \param interleave the layout of the pairs
/// \return (nnz, num_heads, head_dim)
Tensor apply_rotary_embedding(const Tensor& x, const std::vector<int64_t>& positions,
                              const std::vector<double>& frequencies, bool interleave);

/// The position of every row of a ragged batch: offsets[b] + (t - indptr[b]) for row t
/// of request b.
/// \param indptr (batch_size + 1), starts at 0, never decreases
/// \param offsets (batch_size), >= 0
/// \return (indptr[batch_size]) positions
std::vector<int64_t> rope_positions(const std::vector<int32_t>& indptr, const std::vector<int32_t>& offsets);

/// FlashInfer's `apply_rope`: RoPE on a ragged batch whose request b starts at position offsets[b].
/// \param q (nnz, num_q_heads, head_dim), nnz = indptr[batch_size]
/// \param k (nnz, num_k_heads, head_dim)
/// \param indptr (batch_size + 1)
/// \param offsets (batch_size), >= 0
/// \param opt rotary_dim, interleave, rope_scale, rope_theta
RopeResult apply_rope(const Tensor& q, const Tensor& k, const std::vector<int32_t>& indptr,
                      const std::vector<int32_t>& offsets, const RopeOptions& opt = {});

/// FlashInfer's `apply_rope_pos_ids`: RoPE with each row's position given.
/// \param q (nnz, num_q_heads, head_dim)
/// \param k (nnz, num_k_heads, head_dim)
/// \param pos_ids (nnz), >= 0
/// \param opt rotary_dim, interleave, rope_scale, rope_theta
RopeResult apply_rope_pos_ids(const Tensor& q, const Tensor& k, const std::vector<int32_t>& pos_ids,
                              const RopeOptions& opt = {});

/// FlashInfer's `apply_llama31_rope`: apply_rope with Llama 3.1's frequencies.
/// \param q (nnz, num_q_heads, head_dim) \param k (nnz, num_k_heads, head_dim)
/// \param indptr (batch_size + 1) \param offsets (batch_size), >= 0
/// \param opt rotary_dim, interleave, and the Llama 3.1 scaling
RopeResult apply_llama31_rope(const Tensor& q, const Tensor& k, const std::vector<int32_t>& indptr,
                              const std::vector<int32_t>& offsets, const Llama31RopeOptions& opt = {});

/// FlashInfer's `apply_llama31_rope_pos_ids`: apply_rope_pos_ids with Llama 3.1's frequencies.
/// \param q (nnz, num_q_heads, head_dim) \param k (nnz, num_k_heads, head_dim)
/// \param pos_ids (nnz), >= 0 \param opt rotary_dim, interleave, and the Llama 3.1 scaling
RopeResult apply_llama31_rope_pos_ids(const Tensor& q, const Tensor& k, const std::vector<int32_t>& pos_ids,
                                      const Llama31RopeOptions& opt = {});

}  // namespace flashstep::ref
