/// \file rope.cuh
/// \brief Rotary position encoding on q and k in one pass (the kernel FlashInfer calls
/// `apply_rope` / `apply_rope_pos_ids`), run before K is appended to the paged cache.
///
/// The math is the reference's (flashstep/reference/rope.hpp): pair i of every head of row
/// t is rotated by positions[t] * theta_i, the frequencies theta_i given in double. One
/// block per row (token). Its threads first compute the row's rotary_dim / 2 angles
/// p * theta_i in double, cos and sin of each (double: exact for any position a model
/// reaches; at position 131072 an fp32 angle would already be off by about 0.01 rad),
/// rounded to fp32 into shared memory; then they walk every (head, pair) of the row's q
/// heads and k heads, consecutive threads on consecutive pairs of a head (so the
/// rotate-half layout reads and writes whole 128-byte lines), rotating in fp32:
///
///     (a, b) -> (a cos - b sin, b cos + a sin)
///
/// and finally copy the elements past rotary_dim when the output is not the input. The
/// work is a copy with a little arithmetic: bandwidth-bound, like the append it precedes.
///
/// No stage owns it: stage 09's engine and capi/'s fs_apply_rope both launch it through
/// stages/rope/rope_gpu.hpp. The Params struct compiles with a plain C++ compiler too;
/// the kernel only under nvcc.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#endif

namespace flashstep::kernels {

/// Largest rotary_dim / 2 the kernel takes (head_dim up to 512).
constexpr int kMaxRopePairs = 256;

/// What the RoPE kernel reads; raw pointers and sizes only. \tparam T float, __half or
/// __nv_bfloat16: q, k and the outputs alike.
template <typename T>
struct RopeParams {
  const T* q;              ///< (nnz, num_q_heads, head_dim), rows q_stride apart
  const T* k;              ///< (nnz, num_k_heads, head_dim), rows k_stride apart
  T* q_out;                ///< like q; may equal q (in place)
  T* k_out;                ///< like k; may equal k (in place)
  const int32_t* pos_ids;  ///< (nnz), or null: positions from indptr and offsets
  const int32_t* indptr;   ///< (batch_size + 1)
  const int32_t* offsets;  ///< (batch_size)
  int batch_size;          ///< requests of indptr and offsets
  /// Elements from one row to the next of q, k, q_out and k_out.
  int64_t q_stride, k_stride, q_out_stride, k_out_stride;
  /// Heads of q and of k, elements per head, and pairs = rotary_dim / 2.
  int num_q_heads, num_k_heads, head_dim, pairs;
  bool interleave;              ///< pairs (x[2i], x[2i+1]); else (x[i], x[i + pairs])
  double theta[kMaxRopePairs];  ///< frequencies, radians per position
};

#if defined(__CUDACC__)

/// An element of q or k as fp32.
template <typename T>
__device__ __forceinline__ float rope_to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

/// fp32 rounded to the element type (to nearest even).
template <typename T>
__device__ __forceinline__ T rope_from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

/// The position of row t: pos_ids[t], or offsets[b] + t - indptr[b] with b the request
/// whose rows [indptr[b], indptr[b + 1]) hold t (a binary search; empty requests skipped).
template <typename T>
__device__ __forceinline__ int64_t rope_row_position(const RopeParams<T>& p, int64_t t) {
  if (p.pos_ids != nullptr) return p.pos_ids[t];
  int lo = 0, hi = p.batch_size - 1;  // the last b with indptr[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.indptr[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return int64_t{p.offsets[lo]} + (t - p.indptr[lo]);
}

/// Rotates row blockIdx.x of q and k (file comment); any block size.
template <typename T>
__global__ void rope_kernel(const __grid_constant__ RopeParams<T> p) {
  __shared__ float cos_s[kMaxRopePairs], sin_s[kMaxRopePairs];
  const int64_t t = blockIdx.x;
  const double pos = static_cast<double>(rope_row_position(p, t));
  for (int i = threadIdx.x; i < p.pairs; i += blockDim.x) {
    double s, c;
    sincos(pos * p.theta[i], &s, &c);
    cos_s[i] = static_cast<float>(c);
    sin_s[i] = static_cast<float>(s);
  }
  __syncthreads();
  const int heads = p.num_q_heads + p.num_k_heads;
  const int rotary_dim = 2 * p.pairs;
  // the rotated pairs of every head of the row, q heads first
  for (int w = threadIdx.x; w < heads * p.pairs; w += blockDim.x) {
    const int h = w / p.pairs, i = w % p.pairs;
    const bool is_q = h < p.num_q_heads;
    const int64_t head = static_cast<int64_t>(is_q ? h : h - p.num_q_heads) * p.head_dim;
    const T* in = (is_q ? p.q : p.k) + t * (is_q ? p.q_stride : p.k_stride) + head;
    T* out = (is_q ? p.q_out : p.k_out) + t * (is_q ? p.q_out_stride : p.k_out_stride) + head;
    const int ia = p.interleave ? 2 * i : i, ib = p.interleave ? 2 * i + 1 : i + p.pairs;
    const float a = rope_to_f32(in[ia]), b = rope_to_f32(in[ib]), c = cos_s[i], s = sin_s[i];
    out[ia] = rope_from_f32<T>(fmaf(a, c, -b * s));
    out[ib] = rope_from_f32<T>(fmaf(b, c, a * s));
  }
  // elements past rotary_dim, copied when the output is elsewhere
  const int rest = p.head_dim - rotary_dim;
  if (rest == 0) return;
  for (int w = threadIdx.x; w < heads * rest; w += blockDim.x) {
    const int h = w / rest, d = rotary_dim + w % rest;
    const bool is_q = h < p.num_q_heads;
    const int64_t head = static_cast<int64_t>(is_q ? h : h - p.num_q_heads) * p.head_dim;
    const T* in = (is_q ? p.q : p.k) + t * (is_q ? p.q_stride : p.k_stride) + head;
    T* out = (is_q ? p.q_out : p.k_out) + t * (is_q ? p.q_out_stride : p.k_out_stride) + head;
    if (in != out) out[d] = in[d];
  }
}

#endif  // __CUDACC__

}  // namespace flashstep::kernels
