// Stage 06's kernels as the operators chain them (top_k_first): each
// launcher reads an optional `prior_status` (the status of its input row, written by the
// kernel before it) and passes a bad status on instead of reading the row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "06_sampling/sampling.hpp"

namespace flashstep::stages::sampling::detail {

/// Which rows a row kernel reads: output o reads row indices[o] (or o) of the input.
struct Gather {
  const int32_t* indices = nullptr;       ///< (outputs) device, or null for the identity
  int64_t outputs = 0;                    ///< output rows
  const int32_t* prior_status = nullptr;  ///< (input rows) device, or null
  int32_t* status = nullptr;              ///< (outputs) device, or null
};

/// The rejection sampler for one filter kind (the Status contract of sampling.hpp).
/// logits: `probs` holds logits (f32 or bf16) and the kernel fuses their softmax (kinds
/// none, top_p and top_k_top_p), writing it to out.probs when that is set.
void launch_sampler(FilterKind kind, DeviceRows probs, TopK top_k, Fraction top_p, Fraction min_p, SamplingOutputs out,
                    const SamplingOptions& opt, const int32_t* prior_status, cudaStream_t stream, bool logits = false);

/// softmax(logits / temperature) of the gathered rows into probs_out (outputs, vocab).
void launch_softmax(DeviceRows logits, RowParam<double, float> temperature, float* probs_out, Gather gather,
                    cudaStream_t stream);

/// top_k_renorm_probs (top_p unused) or top_p_renorm_probs (top_k unused) of the
/// gathered rows into probs_out (outputs, vocab).
void launch_renorm(FilterKind kind, DeviceRows probs, TopK top_k, Fraction top_p, float* probs_out, Gather gather,
                   cudaStream_t stream);

/// top_k_mask_logits of the gathered rows into logits_out (outputs, vocab).
void launch_mask_logits(DeviceRows logits, TopK top_k, float* logits_out, Gather gather, cudaStream_t stream);

/// Lets `kernel` take up to `bytes` of dynamic shared memory, or, where the current GPU
/// gives a block less beside the kernel's static shared memory, all it gives (a block may
/// opt into 227 KB on an H100, 163 KB on an A100, 99 KB on sm_86 and sm_89). Returns the
/// bytes allowed. Once per kernel: the callers keep the answer in a static.
size_t allow_dynamic_smem(const void* kernel, size_t bytes);

/// What one launch may use of the GPU: `p` as given where the dynamic shared memory it
/// asks, ring(p), fits in `allowed` bytes (always on an H100); otherwise without
/// stream_tiles' ring (p.stream), then, if that is not enough, without the candidate list
/// (p.compact). Neither changes a token or an output, only the time.
template <typename Params, typename Ring>
Params fit_shared_memory(Params p, size_t allowed, Ring ring) {
  if (ring(p) > allowed) p.stream = false;
  if (ring(p) > allowed) p.compact = false;
  return p;
}

/// Throws ref::InvalidArgument naming `fn` and the argument for bad host-side arguments
/// (bf16 rows only where `bf16_allowed`: the operators that take logits).
void check_rows(const char* fn, const char* name, DeviceRows rows, bool bf16_allowed = false);
/// Checks scalar parameters as the reference does (top_k >= 1, top_p in (0, 1], min_p in [0, 1]).
void check_top_k(const char* fn, TopK top_k);
void check_top_p(const char* fn, Fraction top_p);
void check_min_p(const char* fn, Fraction min_p);
/// The outputs of a call: opt.batch, or rows when it is -1 (then indices must be null).
int64_t output_count(const char* fn, DeviceRows rows, const SamplingOptions& opt);

}  // namespace flashstep::stages::sampling::detail
