/// \file gpu_present.hpp
/// \brief Whether a CUDA GPU can be used here: the one answer for every GPU test program
/// and the CLI (header-only, so the sampling suites need not link the attention harness).
#pragma once

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <string>

namespace flashstep::stages::harness {

/// The oldest GPU the CUDA stages run on, as major * 10 + minor: sm_80 (A100) brought
/// what every stage uses, bf16 mma.sync, cp.async and the bf16 conversions.
constexpr int kMinComputeCapability = 80;

/// Whether code built for `arch`, one entry of CMAKE_CUDA_ARCHITECTURES ("80", "86-real",
/// "90a", "89-virtual"), runs on a GPU of compute capability `cc` (major * 10 + minor).
/// Machine code (sm_XY) runs on the same major at an equal or later minor, PTX (compute_XY)
/// on any later GPU, and "a"-suffixed code (sm_90a) on that GPU only. "native", "all" and
/// "all-major" count as running.
inline bool arch_runs_on(const std::string& arch, int cc) {
  size_t i = 0;
  int built = 0;
  while (i < arch.size() && std::isdigit(static_cast<unsigned char>(arch[i]))) built = built * 10 + (arch[i++] - '0');
  if (i == 0) return true;
  const char suffix = i < arch.size() && arch[i] != '-' ? arch[i++] : '\0';
  if (suffix == 'a') return cc == built;
  const bool same_family = cc / 10 == built / 10 && cc >= built;  // also the "f" (family) suffix
  if (suffix == 'f') return same_family;
  const std::string kind = arch.substr(i);
  return (kind != "-virtual" && same_family) || (kind != "-real" && cc >= built);
}

/// Empty when the stages can run on CUDA device `device`; otherwise why not: a GPU older
/// than sm_80, or one whose architecture this build has no code for (its
/// CMAKE_CUDA_ARCHITECTURES, which CMake passes as FLASHSTEP_CUDA_ARCHITECTURES). Asked
/// once per device.
inline std::string device_unsupported_reason(int device) {
  static std::mutex mutex;
  static std::map<int, std::string> known;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(device); it != known.end()) return it->second;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return "the compute capability of CUDA device " + std::to_string(device) + " could not be read";
  }
  const int cc = major * 10 + minor;
  const std::string sm = "sm_" + std::to_string(cc);
  auto gpu = [&] {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      cudaGetLastError();
      return sm;
    }
    return std::string(prop.name) + ", " + sm;
  };
  std::string reason;
  if (cc < kMinComputeCapability) {
    reason = "flashstep's CUDA stages need sm_80 or newer; this GPU (" + gpu() + ") is older";
  } else {
#ifdef FLASHSTEP_CUDA_ARCHITECTURES
    const std::string archs = FLASHSTEP_CUDA_ARCHITECTURES;  // "80,86,89,90a"
    bool runs = false;
    std::string built;  // "sm_80, sm_86, sm_89, sm_90a"
    for (size_t begin = 0; begin <= archs.size();) {
      const size_t end = std::min(archs.find(',', begin), archs.size());
      const std::string arch = archs.substr(begin, end - begin);
      runs = runs || arch_runs_on(arch, cc);
      built += (built.empty() ? "sm_" : ", sm_") + arch;
      begin = end + 1;
    }
    if (!runs)
      reason = "this build has CUDA code for " + built + " only (CMAKE_CUDA_ARCHITECTURES), which this GPU (" + gpu() +
               ") cannot run: rebuild with -DCMAKE_CUDA_ARCHITECTURES=native (or " + std::to_string(cc) + ")";
#endif
  }
  known.emplace(device, reason);
  return reason;
}

/// True when a CUDA device can be used; otherwise false and `why` says what the runtime
/// reported; "no CUDA GPU found" on a machine without an NVIDIA device (where the runtime
/// itself says cudaErrorInsufficientDriver); or, for a GPU the stages cannot run on, what
/// device_unsupported_reason says ("flashstep's CUDA stages need sm_80 or newer; ...").
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
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  const std::string reason = device_unsupported_reason(device);
  if (!reason.empty()) {
    if (why) *why = reason;
    return false;
  }
  return true;
}

}  // namespace flashstep::stages::harness
