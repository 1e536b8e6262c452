// The launch floor (launch_floor.hpp): a graph of empty kernels, timed like a stage.
#include "launch_floor.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"

namespace flashstep::bench {

namespace {

/// Does nothing: a launch, its blocks scheduled and retired, no memory touched.
__global__ void empty_kernel() {}

}  // namespace

LaunchFloor::LaunchFloor(int kernels) {
  if (kernels < 1) throw std::invalid_argument("LaunchFloor: kernels must be >= 1, got " + std::to_string(kernels));
  int device = 0, sms = 0;
  FLASHSTEP_CUDA_CHECK(cudaGetDevice(&device));
  FLASHSTEP_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  // Captured on a stream of its own: the legacy default stream cannot be captured.
  cudaStream_t capture = nullptr;
  FLASHSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking));
  FLASHSTEP_CUDA_CHECK(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < kernels; ++k) empty_kernel<<<sms, 256, 0, capture>>>();
  FLASHSTEP_CUDA_CHECK(cudaStreamEndCapture(capture, &graph_));
  FLASHSTEP_CUDA_CHECK(cudaStreamDestroy(capture));
  FLASHSTEP_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

LaunchFloor::~LaunchFloor() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}

void LaunchFloor::run(cudaStream_t stream) const { FLASHSTEP_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

}  // namespace flashstep::bench
