// The C interface's own kernels: the merge of attention states over whole tensors, and
// the dispatch of the append of key/value rows into the paged pool, whose kernel is
// flashstep/kernels/append_paged.cuh. The merge is a plain element-wise loop: it moves a
// few bytes per element, so any head_dim works and nothing is tiled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "capi_kernels.hpp"
#include "flashstep/kernels/append_paged.cuh"
#include "flashstep/kernels/dispatch.cuh"
#include "flashstep/kernels/state.cuh"

namespace flashstep::capi {
namespace {

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  return static_cast<float>(x);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

constexpr int kThreads = 128;

// One block per (row, head); its threads stride over head_dim. The states of a row are
// normalized (v_k, s_k): an output and its natural-log lse. Each thread finds the largest
// m = s_k log2(e) first, then sums the states' weighted terms, independent of one another
// (SoftmaxState::init(m), absorb: the second half of the one merge of kernels/state.cuh,
// as stage 02's two-halves kernel sums its token groups). A row whose states all have
// lse = -inf (no key at all) gets o = 0 and lse = -inf.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    merge_states_kernel(const T* v, const float* s, int64_t num_states, int64_t num_heads, int64_t head_dim,
                        int64_t row_stride_v, int64_t row_stride_s, const T* v_b, const float* s_b, T* v_out,
                        float* s_out) {
  const int64_t row = blockIdx.x / num_heads;
  const int64_t head = blockIdx.x % num_heads;
  // v_b / s_b set: exactly two states, from two tensors (merge_state).
  auto lse_of = [&](int64_t k) {
    if (v_b != nullptr && k == 1) return s_b[row * num_heads + head];
    return s[row * row_stride_s + k * num_heads + head];
  };
  auto v_of = [&](int64_t k, int64_t d) {
    if (v_b != nullptr && k == 1) return to_float(v_b[(row * num_heads + head) * head_dim + d]);
    return to_float(v[row * row_stride_v + (k * num_heads + head) * head_dim + d]);
  };
  float m = -INFINITY;  // base 2
  for (int64_t k = 0; k < num_states; ++k) m = fmaxf(m, lse_of(k) * kernels::kLog2e);
  float lse = -INFINITY;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    kernels::SoftmaxState<1> merged;
    merged.init(m);
    for (int64_t k = 0; k < num_states; ++k) {
      const float lse_k = lse_of(k), v_k = v_of(k, d);
      merged.absorb(lse_k * kernels::kLog2e, lse_k == -INFINITY ? 0.f : 1.f, &v_k);
    }
    float out;
    merged.output(&out);
    v_out[(row * num_heads + head) * head_dim + d] = from_float<T>(out);
    lse = merged.lse();
  }
  __syncthreads();  // in place (s_out == s), every thread has read the lse before it is written
  if (threadIdx.x == 0) s_out[row * num_heads + head] = lse;
}

}  // namespace

void launch_append_paged_kv_cache(stages::DType dtype, stages::DType kv_dtype, const AppendParams& p,
                                  cudaStream_t stream) {
  // FP8 rows into a cache of their own format: a byte copy, FlashInfer's append of rows
  // quantized beforehand.
  if (dtype == stages::DType::e4m3 && kv_dtype == dtype)
    return kernels::launch_append_paged_kv_cache<__nv_fp8_e4m3>(p, stream);
  if (dtype == stages::DType::e5m2 && kv_dtype == dtype)
    return kernels::launch_append_paged_kv_cache<__nv_fp8_e5m2>(p, stream);
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, {
    kernels::dispatch_kv_dtype<T>(
        dtype, kv_dtype, [&](auto kv_tag) { kernels::launch_append_paged_kv_cache<T, decltype(kv_tag)>(p, stream); });
  })
}

void launch_merge_state(stages::DType dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                        int64_t seq_len, int64_t num_heads, int64_t head_dim, void* v_out, float* s_out,
                        cudaStream_t stream) {
  if (seq_len == 0) return;
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, {
    // Two states: state 0 is row `row` of (v_a, s_a), state 1 is read from (v_b, s_b).
    merge_states_kernel<T><<<static_cast<unsigned>(seq_len * num_heads), kThreads, 0, stream>>>(
        static_cast<const T*>(v_a), s_a, 2, num_heads, head_dim, num_heads * head_dim, num_heads,
        static_cast<const T*>(v_b), s_b, static_cast<T*>(v_out), s_out);
  })
}

void launch_merge_states(stages::DType dtype, const void* v, const float* s, int64_t seq_len, int64_t num_states,
                         int64_t num_heads, int64_t head_dim, void* v_out, float* s_out, cudaStream_t stream) {
  if (seq_len == 0) return;
  FLASHSTEP_DISPATCH_DTYPE(dtype, T, {
    merge_states_kernel<T><<<static_cast<unsigned>(seq_len * num_heads), kThreads, 0, stream>>>(
        static_cast<const T*>(v), s, num_states, num_heads, head_dim, num_states * num_heads * head_dim,
        num_states * num_heads, nullptr, nullptr, static_cast<T*>(v_out), s_out);
  })
}

}  // namespace flashstep::capi
