// The RoPE launcher (rope_gpu.hpp): argument checks, the frequencies into the kernel's
// parameters (kernels/flashstep/kernels/rope.cuh), one block per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/kernels/rope.cuh"
#include "flashstep/reference/errors.hpp"
#include "rope/rope_gpu.hpp"

namespace flashstep::stages {

namespace {

template <typename T>
void launch_typed(const RopeLaunch& l, const std::vector<double>& frequencies, cudaStream_t stream) {
  kernels::RopeParams<T> p{};
  p.q = static_cast<const T*>(l.q);
  p.k = static_cast<const T*>(l.k);
  p.q_out = static_cast<T*>(l.q_out);
  p.k_out = static_cast<T*>(l.k_out);
  p.pos_ids = l.pos_ids;
  p.indptr = l.indptr;
  p.offsets = l.offsets;
  p.batch_size = l.batch_size;
  const int64_t qw = int64_t{l.num_q_heads} * l.head_dim, kw = int64_t{l.num_k_heads} * l.head_dim;
  p.q_stride = l.q_stride > 0 ? l.q_stride : qw;
  p.k_stride = l.k_stride > 0 ? l.k_stride : kw;
  p.q_out_stride = l.q_out_stride > 0 ? l.q_out_stride : qw;
  p.k_out_stride = l.k_out_stride > 0 ? l.k_out_stride : kw;
  p.num_q_heads = l.num_q_heads;
  p.num_k_heads = l.num_k_heads;
  p.head_dim = l.head_dim;
  p.pairs = l.rotary_dim / 2;
  p.interleave = l.interleave;
  for (size_t i = 0; i < frequencies.size(); ++i) p.theta[i] = frequencies[i];
  kernels::rope_kernel<T><<<static_cast<unsigned>(l.nnz), 128, 0, stream>>>(p);
  kernels::check_launch("rope_kernel");
}

}  // namespace

void launch_rope(const RopeLaunch& l, const std::vector<double>& frequencies, cudaStream_t stream) {
  const char* fn = "apply_rope";
  ref::require(l.nnz >= 0 && l.nnz < (int64_t{1} << 31), fn,
               "nnz must be in 0 .. 2^31 - 1 (got " + std::to_string(l.nnz) + ")");
  ref::require(l.num_q_heads >= 1 && l.num_k_heads >= 1, fn, "num_q_heads and num_k_heads must be >= 1");
  ref::require(l.head_dim >= 2 && l.head_dim <= 2 * kMaxRopePairs, fn,
               "head_dim must be in 2.." + std::to_string(2 * kMaxRopePairs) + " (got " + std::to_string(l.head_dim) +
                   ")");
  ref::require(l.rotary_dim >= 2 && l.rotary_dim % 2 == 0 && l.rotary_dim <= l.head_dim, fn,
               "rotary_dim must be even, >= 2 and <= head_dim " + std::to_string(l.head_dim) + " (got " +
                   std::to_string(l.rotary_dim) + ")");
  ref::require(static_cast<int>(frequencies.size()) * 2 == l.rotary_dim, fn,
               "frequencies must hold rotary_dim / 2 values (got " + std::to_string(frequencies.size()) + ")");
  ref::require(l.pos_ids != nullptr || (l.batch_size >= 1 && l.indptr != nullptr && l.offsets != nullptr) || l.nnz == 0,
               fn, "positions: pos_ids, or indptr and offsets with batch_size >= 1");
  const int64_t qw = int64_t{l.num_q_heads} * l.head_dim, kw = int64_t{l.num_k_heads} * l.head_dim;
  ref::require((l.q_stride == 0 || l.q_stride >= qw) && (l.q_out_stride == 0 || l.q_out_stride >= qw) &&
                   (l.k_stride == 0 || l.k_stride >= kw) && (l.k_out_stride == 0 || l.k_out_stride >= kw),
               fn,
               "row strides (q_stride, q_out_stride, k_stride, k_out_stride) must be 0 (contiguous) or at least "
               "heads * head_dim (" +
                   std::to_string(qw) + " for q, " + std::to_string(kw) + " for k)");
  ref::require(l.dtype == DType::f32 || l.dtype == DType::f16 || l.dtype == DType::bf16, fn,
               std::string("dtype must be f32, f16 or bf16 (got ") + to_string(l.dtype) + ")");
  if (l.nnz == 0) return;
  ref::require(l.q != nullptr && l.k != nullptr && l.q_out != nullptr && l.k_out != nullptr, fn,
               "q, k, q_out and k_out are required");
  if (l.dtype == DType::f32) launch_typed<float>(l, frequencies, stream);
  else if (l.dtype == DType::f16) launch_typed<__half>(l, frequencies, stream);
  else launch_typed<__nv_bfloat16>(l, frequencies, stream);
}

}  // namespace flashstep::stages
