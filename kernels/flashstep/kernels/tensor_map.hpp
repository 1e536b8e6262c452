/// \file tensor_map.hpp
/// \brief The driver's tensor-map encoder (cuTensorMapEncodeTiled), found through the
/// runtime, so that no target links against libcuda: the TMA copies of stages 07 and 10
/// describe their tensors with it.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::kernels {

/// cuTensorMapEncodeTiled, looked up once per process. \param caller named in the error
/// when the driver has none
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(const char* caller) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    FLASHSTEP_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found == cudaDriverEntryPointSuccess) encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  ref::require(encode != nullptr, caller, "the driver has no cuTensorMapEncodeTiled");
  return encode;
}

}  // namespace flashstep::kernels
