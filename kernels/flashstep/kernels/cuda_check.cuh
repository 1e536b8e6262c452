/// \file cuda_check.cuh
/// \brief CUDA error checking: every runtime call and every launch is checked.
///
/// A CUDA program that ignores return codes can exit with status 0 after a kernel that
/// never ran (bad launch configuration) or that faulted (the error surfaces at the next
/// synchronizing call, far from its cause). So every runtime call goes through
/// FLASHSTEP_CUDA_CHECK, and every launch is followed by check_launch(), which names the
/// kernel. Failures throw CudaError (host code only; kernels cannot throw).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace flashstep::kernels {

/// Thrown when a CUDA runtime call or a kernel launch fails; `what()` says which call,
/// where, and the runtime's error string.
class CudaError : public std::runtime_error {
 public:
  /// \param code the runtime's error code, kept for code()
  /// \param message the full text what() returns: the call, its file and line, the
  ///        runtime's error name and string
  CudaError(cudaError_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The runtime's error code.
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

/// Throws CudaError unless `code == cudaSuccess`.
/// \param code the value a runtime call returned
/// \param what the call as written (the macro passes its text)
/// \param file, line where the call is
inline void cuda_check(cudaError_t code, const char* what, const char* file, int line) {
  if (code == cudaSuccess) return;
  throw CudaError(code, std::string(file) + ":" + std::to_string(line) + ": " + what +
                            " failed: " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")");
}

/// Checks the launch that just happened (bad grid, too much shared memory, ...).
/// Asynchronous faults inside the kernel surface at the next synchronizing call, which
/// is itself checked. \param kernel_name named in the message
inline void check_launch(const char* kernel_name) {
  const cudaError_t code = cudaGetLastError();
  if (code == cudaSuccess) return;
  throw CudaError(code, std::string("launch of ") + kernel_name + " failed: " + cudaGetErrorName(code) + " (" +
                            cudaGetErrorString(code) + ")");
}

}  // namespace flashstep::kernels

/// Checks a CUDA runtime call; throws flashstep::kernels::CudaError naming the call,
/// file and line. A macro only because it must capture the call's text and location.
#define FLASHSTEP_CUDA_CHECK(call) ::flashstep::kernels::cuda_check((call), #call, __FILE__, __LINE__)
