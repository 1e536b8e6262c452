// Stage 09 — the RoPE kernel: q and k rotated in one pass, before K goes to the cache.
//
// One block per row (token). Its threads first compute the row's rotary_dim / 2 angles
// p * theta_i in double, cos and sin of each (double: exact for any position a model
// reaches), rounded to fp32 into shared memory; then they walk every (head, pair) of the
// row's q heads and k heads, consecutive threads on consecutive pairs of a head (so the
// rotate-half layout reads and writes whole 128-byte lines), rotating in fp32:
//
//     (a, b) -> (a cos - b sin, b cos + a sin)
//
// and finally copy the elements past rotary_dim when the output is not the input. The
// work is a copy with a little arithmetic: bandwidth-bound, like the append it precedes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "09_engine/rope_gpu.hpp"

namespace flashstep::stages::engine {

/// What the kernel reads; raw pointers and sizes only.
template <typename T>
struct RopeParams {
  const T* q;
  const T* k;
  T* q_out;
  T* k_out;
  const int32_t* pos_ids;  ///< (nnz), or null: positions from indptr and offsets
  const int32_t* indptr;   ///< (batch_size + 1)
  const int32_t* offsets;  ///< (batch_size)
  int batch_size;
  int64_t q_stride, k_stride, q_out_stride, k_out_stride;  ///< elements from row to row
  int num_q_heads, num_k_heads, head_dim, pairs;           ///< pairs = rotary_dim / 2
  bool interleave;
  double theta[kMaxRopePairs];  ///< frequencies, radians per position
};

template <typename T>
__device__ __forceinline__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(x);
  else return __float2bfloat16_rn(x);
}

/// The position of row t: pos_ids[t], or offsets[b] + t - indptr[b] with b the request
/// whose rows [indptr[b], indptr[b + 1]) hold t (a binary search; empty requests skipped).
template <typename T>
__device__ __forceinline__ int64_t row_position(const RopeParams<T>& p, int64_t t) {
  if (p.pos_ids != nullptr) return p.pos_ids[t];
  int lo = 0, hi = p.batch_size - 1;  // the last b with indptr[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.indptr[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return int64_t{p.offsets[lo]} + (t - p.indptr[lo]);
}

template <typename T>
__global__ void rope_kernel(const __grid_constant__ RopeParams<T> p) {
  __shared__ float cos_s[kMaxRopePairs], sin_s[kMaxRopePairs];
  const int64_t t = blockIdx.x;
  const double pos = static_cast<double>(row_position(p, t));
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
    const float a = to_f32(in[ia]), b = to_f32(in[ib]), c = cos_s[i], s = sin_s[i];
    out[ia] = from_f32<T>(fmaf(a, c, -b * s));
    out[ib] = from_f32<T>(fmaf(b, c, a * s));
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

}  // namespace flashstep::stages::engine
