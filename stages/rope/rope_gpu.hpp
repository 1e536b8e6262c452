/// \file rope_gpu.hpp
/// \brief Rotary position encoding on q and k on the GPU (the kernel FlashInfer calls
/// `apply_rope`), run before K is appended to the paged cache: the launch that stage 09's
/// engine and capi/'s fs_apply_rope share. The kernel is kernels/'s (rope.cuh).
///
/// The math is the reference's (flashstep/reference/rope.hpp): pair i of every head of
/// row t is rotated by positions[t] * theta_i. The host computes the frequencies theta_i in
/// double, exactly as the reference does (plain or Llama 3.1); the kernel computes each
/// row's angles in double too, once per (row, pair), and shares the cos/sin pair across
/// every q and k head of the row, so the rotation itself is two fp32 multiply-adds per
/// pair. Angles in double keep long positions exact: at position 131072 an fp32 angle
/// would already be off by about 0.01 rad.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "flashstep/kernels/rope.cuh"  // kMaxRopePairs (the Params struct compiles without nvcc)
#include "stage.hpp"                   // DType

namespace flashstep::stages {

/// Largest rotary_dim / 2 the kernel takes (head_dim up to 512).
constexpr int kMaxRopePairs = kernels::kMaxRopePairs;

/// One RoPE launch: device pointers, (nnz, heads, head_dim) q and k, each row's heads
/// contiguous, rows contiguous unless a row stride is given (rows of a fused Q|K|V buffer).
struct RopeLaunch {
  DType dtype = DType::bf16;  ///< f32, f16 or bf16, the same for q, k and the outputs
  const void* q = nullptr;    ///< (nnz, num_q_heads, head_dim)
  const void* k = nullptr;    ///< (nnz, num_k_heads, head_dim)
  void* q_out = nullptr;      ///< may equal q (in place)
  void* k_out = nullptr;      ///< may equal k (in place)
  /// Elements from one row to the next in q, k, q_out, k_out; 0: heads * head_dim
  /// (contiguous). A given stride must be at least heads * head_dim.
  int64_t q_stride = 0, k_stride = 0, q_out_stride = 0, k_out_stride = 0;
  int64_t nnz = 0;
  int num_q_heads = 0, num_k_heads = 0, head_dim = 0;
  int rotary_dim = 0;       ///< even, <= head_dim: the rest of a head is copied
  bool interleave = false;  ///< pairs (x[2i], x[2i+1]); else (x[i], x[i + rotary_dim / 2])
  /// Row positions: pos_ids (nnz), or, when it is null, offsets[b] + (t - indptr[b]) for
  /// row t of request b (indptr (batch_size + 1), offsets (batch_size)).
  const int32_t* pos_ids = nullptr;
  const int32_t* indptr = nullptr;
  const int32_t* offsets = nullptr;
  int batch_size = 0;
};

/// Checks `l` (every argument by name; InvalidArgument) and launches the kernel on
/// `stream` with `frequencies` (rotary_dim / 2 of them, in radians per position, as
/// ref::rope_frequencies or ref::llama31_rope_frequencies return). Launches only.
void launch_rope(const RopeLaunch& l, const std::vector<double>& frequencies, cudaStream_t stream);

}  // namespace flashstep::stages
