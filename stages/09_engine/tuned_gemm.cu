// Stage 09: the engine's projections through cuBLASLt, each shape's algorithm measured once
// (tuned_gemm.hpp).
#include "09_engine/tuned_gemm.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashstep/kernels/cuda_check.cuh"

namespace flashstep::stages::engine {

namespace {

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLAS: ") + what + " failed with status " +
                             std::to_string(static_cast<int>(s)));
}

constexpr int kCandidates = 6;  // Lt heuristic results timed per shape
constexpr int kWarmups = 1, kTimed = 5;

}  // namespace

// One shape's matmul as cuBLASLt runs it. Row-major C = A B is column-major C^T = B^T A^T:
// Lt's "A" is our B (n x k, ld n), its "B" our A (k x m, ld k), C and D (n x m, ld n).
struct TunedGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

TunedGemm::TunedGemm(cublasHandle_t cublas, cudaStream_t stream, void* workspace, size_t workspace_bytes,
                     int64_t max_tuned_rows)
    : cublas_(cublas),
      stream_(stream),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      max_tuned_rows_(max_tuned_rows) {
  check(cublasLtCreate(&lt_), "cublasLtCreate");
}

TunedGemm::~TunedGemm() {
  for (auto& [key, plan] : plans_) delete plan;
  if (scratch_) cudaFree(scratch_);
  if (lt_) cublasLtDestroy(lt_);
}

void TunedGemm::gemm_ex(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t ab_type,
                        cudaDataType_t c_type, bool accumulate) {
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  check(cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                     &alpha, b, ab_type, static_cast<int>(n), a, ab_type, static_cast<int>(k), &beta, c, c_type,
                     static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

TunedGemm::Plan* TunedGemm::tune(const Key& key, const void* a, const void* b) {
  const int64_t m = std::get<0>(key), n = std::get<1>(key), k = std::get<2>(key);
  const auto ab_type = static_cast<cudaDataType_t>(std::get<3>(key));
  const auto c_type = static_cast<cudaDataType_t>(std::get<4>(key));
  const bool accumulate = std::get<5>(key);
  const size_t c_bytes = static_cast<size_t>(m * n) * (c_type == CUDA_R_32F ? 4 : 2);
  if (c_bytes > scratch_bytes_) {
    FLASHSTEP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (scratch_) FLASHSTEP_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    FLASHSTEP_CUDA_CHECK(cudaMalloc(&scratch_, c_bytes));
    scratch_bytes_ = c_bytes;
  }
  FLASHSTEP_CUDA_CHECK(cudaMemsetAsync(scratch_, 0, c_bytes, stream_));

  auto* plan = new Plan;
  std::vector<cublasLtMatmulHeuristicResult_t> found(kCandidates);
  int returned = 0;
  try {
    check(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    check(cublasLtMatrixLayoutCreate(&plan->la, ab_type, static_cast<uint64_t>(n), static_cast<uint64_t>(k), n),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&plan->lb, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&plan->lc, c_type, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n),
          "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace_bytes_;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    // Lt's "A" is our B, its "B" our A; C and D are ours
    const uint32_t align_a = static_cast<uint32_t>(std::get<7>(key)), align_b = static_cast<uint32_t>(std::get<6>(key)),
                   align_c = static_cast<uint32_t>(std::get<8>(key));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c);
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt_, plan->op, plan->la, plan->lb, plan->lc, plan->lc,
                                                             pref, kCandidates, found.data(), &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    if (hs != CUBLAS_STATUS_SUCCESS) returned = 0;
  } catch (...) {
    delete plan;
    throw;
  }

  // Times `launch` (kTimed calls after kWarmups) in microseconds per call; -1 if it failed.
  cudaEvent_t start, stop;
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&start));
  FLASHSTEP_CUDA_CHECK(cudaEventCreate(&stop));
  auto time = [&](auto launch) {
    for (int i = 0; i < kWarmups; ++i)
      if (!launch()) return -1.0;
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int i = 0; i < kTimed; ++i)
      if (!launch()) return -1.0;
    FLASHSTEP_CUDA_CHECK(cudaEventRecord(stop, stream_));
    FLASHSTEP_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms) * 1e3 / kTimed;
  };
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  // the default (cublasGemmEx) is a candidate too: a tuned shape is never slower than it
  double best = time([&] {
    gemm_ex(m, n, k, a, b, scratch_, ab_type, c_type, accumulate);
    return true;
  });
  int best_i = -1;
  for (int i = 0; i < returned; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const double us = time([&] {
      return cublasLtMatmul(lt_, plan->op, &alpha, b, plan->la, a, plan->lb, &beta, scratch_, plan->lc, scratch_,
                            plan->lc, &found[i].algo, workspace_, workspace_bytes_, stream_) == CUBLAS_STATUS_SUCCESS;
    });
    if (us > 0 && us < best) best = us, best_i = i;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();  // a candidate that failed to launch leaves nothing behind
  if (best_i < 0) {
    delete plan;
    return nullptr;
  }
  plan->algo = found[best_i].algo;
  return plan;
}

int TunedGemm::alignment(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && u % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

void TunedGemm::run(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* c, cudaDataType_t ab_type,
                    cudaDataType_t c_type, bool accumulate) {
  if (m > max_tuned_rows_) return gemm_ex(m, n, k, a, b, c, ab_type, c_type, accumulate);
  const int align_a = alignment(a), align_b = alignment(b), align_c = alignment(c);
  const Key key{m, n, k, static_cast<int>(ab_type), static_cast<int>(c_type), accumulate, align_a, align_b, align_c};
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return gemm_ex(m, n, k, a, b, c, ab_type, c_type, accumulate);
    it = plans_.emplace(key, tune(key, a, b)).first;
  }
  Plan* plan = it->second;
  if (plan == nullptr) return gemm_ex(m, n, k, a, b, c, ab_type, c_type, accumulate);
  const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
  check(cublasLtMatmul(lt_, plan->op, &alpha, b, plan->la, a, plan->lb, &beta, c, plan->lc, c, plan->lc, &plan->algo,
                       workspace_, workspace_bytes_, stream_),
        "cublasLtMatmul");
}

}  // namespace flashstep::stages::engine
