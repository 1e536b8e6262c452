/// \file gpu_present.hpp
/// \brief Whether a CUDA GPU can be used here: the one answer for every GPU test program
/// and the CLI (header-only, so the sampling suites need not link the attention harness).
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <string>

namespace flashstep::stages::harness {

/// True when a CUDA device can be used; otherwise false and `why` says what the runtime
/// reported; "no CUDA GPU found" on a machine without an NVIDIA device (where the runtime
/// itself says cudaErrorInsufficientDriver).
inline bool gpu_available(std::string* why = nullptr) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    // A machine with no NVIDIA GPU has no driver either, and the runtime then reports
    // cudaErrorInsufficientDriver ("CUDA driver version is insufficient"), which reads as
    // "upgrade the driver". With no NVIDIA device node at all, say what is true.
    const bool no_device_node = access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0;
    const bool no_gpu = err == cudaSuccess || err == cudaErrorNoDevice ||
                        (err == cudaErrorInsufficientDriver && no_device_node);
    if (why) {
      *why = no_gpu ? std::string("no CUDA GPU found")
                    : std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")";
    }
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return true;
}

}  // namespace flashstep::stages::harness
