/// \file step_observer.hpp
/// \brief The phases of one engine step, and the hook through which a caller watches them
/// (EngineConfig::observer): the engine itself keeps no clock.
///
/// run_step reports each boundary as it reaches it, in this order:
///
/// ```
///   host        the step's checks, its route, the metadata upload, plan()   (host work)
///   model       the model's launches are queued: eagerly, or a CUDA graph
///   embed          |  on the stream, from the embedding
///   projection     |  layer l: rows rounded, Q|K|V GEMM, RoPE, the append    } every layer
///   attention      |  layer l: the attention call(s)                         }
///   output         |  layer l: X += O W_O                                    }
///   logits         |  the sampling rows' logits
///   sampling    argmax, or stage 06's softmax and sampler
///   read_back   the token ids (and recorded logits) queued back to the host
///   done        the stream has finished the step; its tokens are on the host
/// ```
///
/// The phases marked | run inside a decode step's CUDA graph. Their calls come while the
/// graph is captured (and in the eager pass before it), never at a replay: what an observer
/// queues on the stream during the capture (an event record) becomes a node of the graph and
/// runs again at every replay. bench/serve/phase_timer.hpp times the phases with CUDA events
/// that way. Without an observer each boundary costs the engine one null check.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashstep::stages::engine {

/// A boundary of run_step: the phase that begins there (the file comment's order).
enum class StepPhase {
  host,        ///< run_step begins: the checks, the route, the metadata upload, plan()
  model,       ///< the host's part is done; the model's launches are queued next
  embed,       ///< on the stream: the embedding
  projection,  ///< on the stream, layer `layer`: rows rounded, Q|K|V GEMM, RoPE, the append
  attention,   ///< on the stream, layer `layer`: the attention call(s)
  output,      ///< on the stream, layer `layer`: the output projection and the residual
  logits,      ///< on the stream: the logits of the rows that sample
  sampling,    ///< on the stream: argmax, or stage 06's softmax and sampler
  read_back,   ///< on the stream: the token ids (and recorded logits) back to the host
  done,        ///< the stream has finished the step
};

/// Watches the phases of every step an Engine runs (profiling, tracing). Not owned by the
/// engine; it must outlive it.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  /// Called as run_step reaches the boundary where `phase` begins, before that phase's work
  /// is queued on `stream` (the engine's). `layer` is the layer of projection, attention and
  /// output, -1 for the others. Inside a CUDA graph's capture the call comes while `stream`
  /// is being captured (cudaStreamIsCapturing says so).
  virtual void on_phase(StepPhase phase, int64_t layer, cudaStream_t stream) = 0;
};

}  // namespace flashstep::stages::engine
