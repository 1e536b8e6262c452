// The launch floor: what one call costs when it moves no bytes. A CUDA graph of one (or
// two) kernels that do nothing, one block per SM, replayed and timed exactly as the stages
// are (bench/stages/timing.hpp: the L2 flushed before each call, events around the replay). The
// least time a decode of B bytes can take is then about floor + B / read ceiling: the chapters
// compare each shape's time with that.
#pragma once

#include <cuda_runtime_api.h>

namespace flashstep::bench {

/// A captured graph of `kernels` launches of an empty kernel, one after the other, each a
/// grid of one 256-thread block per SM of the current device. The benchmark times 1 and 2;
/// `flashstep serve --json` as many as a step of the engine launches.
class LaunchFloor {
 public:
  /// Captures the graph (on a stream of its own; not launched). \param kernels >= 1
  explicit LaunchFloor(int kernels);
  ~LaunchFloor();
  LaunchFloor(const LaunchFloor&) = delete;
  LaunchFloor& operator=(const LaunchFloor&) = delete;
  /// Replays the graph on `stream` (the timer's, as the stages' graphs are).
  void run(cudaStream_t stream) const;

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace flashstep::bench
