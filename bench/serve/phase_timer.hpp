/// \file phase_timer.hpp
/// \brief The phases of each engine step, timed: a StepObserver (stages/09_engine/
/// step_observer.hpp) that records a CUDA event at every boundary the engine reports on the
/// stream, and the host's clock around the host part.
///
/// An event recorded while a decode step's CUDA graph is captured becomes an event-record
/// node of the graph (cudaEventRecordExternal), so every replay records it again and a
/// graph step is timed like an eager one. Each boundary has its own event, created with the
/// timer (none is created inside a capture), so a replay re-records the events its graph
/// holds and the boundaries outside the graph record theirs. `flashstep serve --profile`
/// and `--json`, and the engine's timing cases, read the steps' times from here.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "09_engine/step_observer.hpp"

namespace flashstep::bench {

/// One step's times in milliseconds.
struct StepTiming {
  double host_ms = 0;        ///< host: the checks, route, metadata upload and plan() calls
  double embed_ms = 0;       ///< embedding
  double projection_ms = 0;  ///< casts, Q/K/V and W_O GEMMs, RoPE, append (every layer)
  double attention_ms = 0;   ///< the attention calls (every layer)
  double logits_ms = 0;      ///< gather and W_vocab GEMM
  double sampling_ms = 0;    ///< argmax, or softmax and the samplers
  double total_ms = 0;       ///< the embedding's event to the read-back's, plus host_ms
};

/// Times every step of an Engine whose EngineConfig::observer it is.
class PhaseTimer : public stages::engine::StepObserver {
 public:
  /// Creates the events of a model of `num_layers` layers (>= 1).
  explicit PhaseTimer(int64_t num_layers);
  ~PhaseTimer() override;
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  void on_phase(stages::engine::StepPhase phase, int64_t layer, cudaStream_t stream) override;

  /// Every step finished since the timer was made or cleared, in order.
  const std::vector<StepTiming>& steps() const { return steps_; }
  /// The last of them; throws std::logic_error when there is none.
  const StepTiming& last() const;
  /// Forgets the steps (a warm-up run's, say).
  void clear() { steps_.clear(); }

 private:
  size_t slot(stages::engine::StepPhase phase, int64_t layer) const;
  double ms(size_t from, size_t to) const;

  int64_t layers_;
  std::vector<cudaEvent_t> events_;  // one per boundary on the stream, slot() says which
  std::chrono::steady_clock::time_point host_start_;
  double host_ms_ = 0;
  std::vector<StepTiming> steps_;
};

}  // namespace flashstep::bench
