/// \file tuned_gemm.hpp
/// \brief The engine's projections at decode sizes: cuBLASLt matmuls whose algorithm is
/// measured, not guessed, once per shape.
///
/// A decode step multiplies a few dozen rows by each weight matrix. At such a small M the
/// default algorithm (cublasGemmEx's first heuristic choice) can leave most of the chip
/// idle: a handful of output tiles, each walking the whole K. cuBLASLt's heuristic lists
/// other algorithms for the same problem (other tiles, split-K into the workspace); this
/// class times the first few of them on the device the first time it meets a shape and
/// keeps the fastest for every later call, the way engines autotune their GEMMs at start.
///
/// Every candidate computes the same product with fp32 accumulation; they differ in the
/// order of the fp32 additions only (split-K sums partial products), so the engine's
/// results stay within the rounding the token checks allow for.
///
/// Tuning runs candidates into a scratch output (never the caller's, so X += O W_O is not
/// applied twice) and synchronizes the stream: it must not happen inside a CUDA graph's
/// capture. A shape first met while the stream is being captured (the engine runs every
/// graph's step eagerly first, so it does not happen there) runs cublasGemmEx untimed.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace flashstep::stages::engine {

class TunedGemm {
 public:
  /// `cublas` (for the fallback) and `stream` are the engine's; `workspace` (device,
  /// `workspace_bytes`) is shared with them: the calls are ordered on one stream.
  /// `max_tuned_rows`: shapes of more rows (prefill) run cublasGemmEx as they are.
  TunedGemm(cublasHandle_t cublas, cudaStream_t stream, void* workspace, size_t workspace_bytes,
            int64_t max_tuned_rows = 256);
  ~TunedGemm();
  TunedGemm(const TunedGemm&) = delete;
  TunedGemm& operator=(const TunedGemm&) = delete;

  /// C (m x n, row-major) = A (m x k) B (k x n) [+ C]: A and B in `ab_type`, C in
  /// `c_type`, fp32 accumulation.
  void run(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t ab_type,
           cudaDataType_t c_type, bool accumulate);

  /// Shapes tuned so far (for a report).
  int64_t tuned_shapes() const { return static_cast<int64_t>(plans_.size()); }

 private:
  struct Plan;
  // m, n, k, A/B type, C type, accumulate, and the alignment (bytes, up to 256) of the
  // three pointers: an algorithm is chosen only among those that take such addresses
  using Key = std::tuple<int64_t, int64_t, int64_t, int, int, bool, int, int, int>;
  Plan* tune(const Key& key, const void* a, const void* b);
  static int alignment(const void* p);
  void gemm_ex(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t ab_type,
               cudaDataType_t c_type, bool accumulate);

  cublasHandle_t cublas_;
  cublasLtHandle_t lt_ = nullptr;
  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  int64_t max_tuned_rows_;
  std::map<Key, Plan*> plans_;  // null: run cublasGemmEx (no Lt algorithm beat it or none applied)
  void* scratch_ = nullptr;     // tuning output
  size_t scratch_bytes_ = 0;
};

}  // namespace flashstep::stages::engine
