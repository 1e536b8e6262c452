// The phases of each engine step, timed with CUDA events (phase_timer.hpp).
#include "phase_timer.hpp"

#include <stdexcept>
#include <string>

#include "flashstep/kernels/cuda_check.cuh"
#include "flashstep/reference/errors.hpp"

namespace flashstep::bench {

using stages::engine::StepPhase;

// The events, in stream order:
//   0            embed
//   1 + 3 l      projection of layer l
//   2 + 3 l      attention of layer l
//   3 + 3 l      output of layer l
//   1 + 3 L      logits
//   2 + 3 L      sampling
//   3 + 3 L      read_back
PhaseTimer::PhaseTimer(int64_t num_layers) : layers_(num_layers) {
  ref::require(num_layers >= 1, "PhaseTimer", "num_layers must be >= 1, got " + std::to_string(num_layers));
  events_.resize(static_cast<size_t>(4 + 3 * num_layers));
  for (cudaEvent_t& e : events_) FLASHSTEP_CUDA_CHECK(cudaEventCreate(&e));
}

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

size_t PhaseTimer::slot(StepPhase phase, int64_t layer) const {
  const int64_t L = layers_;
  switch (phase) {
    case StepPhase::embed: return 0;
    case StepPhase::projection: return static_cast<size_t>(1 + 3 * layer);
    case StepPhase::attention: return static_cast<size_t>(2 + 3 * layer);
    case StepPhase::output: return static_cast<size_t>(3 + 3 * layer);
    case StepPhase::logits: return static_cast<size_t>(1 + 3 * L);
    case StepPhase::sampling: return static_cast<size_t>(2 + 3 * L);
    case StepPhase::read_back: return static_cast<size_t>(3 + 3 * L);
    default: throw std::logic_error("PhaseTimer: no event for a host boundary");
  }
}

// An event never recorded, or recorded inside a capture that was never replayed, fails here.
double PhaseTimer::ms(size_t from, size_t to) const {
  float t = 0;
  FLASHSTEP_CUDA_CHECK(cudaEventElapsedTime(&t, events_[from], events_[to]));
  return static_cast<double>(t);
}

void PhaseTimer::on_phase(StepPhase phase, int64_t layer, cudaStream_t stream) {
  using Clock = std::chrono::steady_clock;
  if (phase == StepPhase::host) {
    host_start_ = Clock::now();
    return;
  }
  if (phase == StepPhase::model) {
    host_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - host_start_).count();
    return;
  }
  if (phase != StepPhase::done) {
    ref::require(layer < layers_, "PhaseTimer", "the engine has more layers than the timer was made for");
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FLASHSTEP_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    FLASHSTEP_CUDA_CHECK(cudaEventRecordWithFlags(
        events_[slot(phase, layer)], stream, capturing == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : 0));
    return;
  }
  // done: the stream has passed every event of the step
  StepTiming t;
  t.host_ms = host_ms_;
  t.embed_ms = ms(0, 1);
  for (int64_t l = 0; l < layers_; ++l) {
    const size_t projection = slot(StepPhase::projection, l), next = projection + 3;  // the next layer's, or logits
    t.projection_ms += ms(projection, projection + 1) + ms(projection + 2, next);
    t.attention_ms += ms(projection + 1, projection + 2);
  }
  const size_t logits = slot(StepPhase::logits, -1), sampling = slot(StepPhase::sampling, -1),
               read_back = slot(StepPhase::read_back, -1);
  t.logits_ms = ms(logits, sampling);
  t.sampling_ms = ms(sampling, read_back);
  t.total_ms = ms(0, read_back) + t.host_ms;
  steps_.push_back(t);
}

const StepTiming& PhaseTimer::last() const {
  if (steps_.empty()) throw std::logic_error("PhaseTimer::last: no step has finished");
  return steps_.back();
}

}  // namespace flashstep::bench
