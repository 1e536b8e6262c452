/// \file step_floor.hpp
/// \brief The floor stage 09's engine is measured against: the least time a decode step
/// can take on a device, from the bytes it must read and the launches it must pay for.
///
/// A decode step of the tiny decoder reads every weight once (W_Q, W_K, W_V and W_O of
/// every layer, W_vocab, and the embedding rows of its tokens) and the K/V of every token
/// its decode rows attend to, in every layer. At batch 64 its arithmetic is small against
/// those bytes, so no step can be faster than
///
///     floor = (weight bytes + KV bytes) / read ceiling + launch floor
///
/// where the read ceiling is the rate at which the device streams a buffer far larger
/// than its L2 into registers, and the launch floor the time of a CUDA graph of as many
/// empty kernels as the step's graph launches (both measured in the same process as the
/// step, by `flashstep serve --json`). The KV bytes count each page a step reads once:
/// where decode rows share a cached prefix, its pages are read once by a cascade, so the
/// floor of a shared step is lower than that of the same step without sharing.
/// The weights may stay in the 50 MB L2 of an H100 from one step to the next; the floor
/// counts them at the read ceiling all the same (a floor higher than the least possible).
#pragma once

#include <cstdint>

#include "09_engine/scheduler.hpp"
#include "flashstep/reference/tiny_decoder.hpp"

namespace flashstep::bench {

/// Bytes of K and V that one token occupies in the page pools of all layers:
/// 2 (K and V) x num_kv_heads x head_dim x num_layers x `elem_bytes`.
int64_t kv_slot_bytes(const ref::TinyDecoderConfig& model, int64_t elem_bytes);

/// Bytes of weights a step of `tokens` tokens reads: per layer W_Q (d x Hq*D), W_K and
/// W_V (d x Hkv*D each) and, with output_projection, W_O (Hq*D x d); then W_vocab
/// (d x vocab) and the embedding rows of the tokens (tokens x d), all in `elem_bytes`.
int64_t step_weight_bytes(const ref::TinyDecoderConfig& model, int64_t elem_bytes, int64_t tokens);

/// The token slots of K/V a step's decode rows (rows 0 .. num_decodes-1) attend to.
struct KvSlots {
  int64_t flat = 0;    ///< the sum of the decode rows' kv_lens: a page shared by n rows counted n times
  int64_t unique = 0;  ///< every page once: its slots in use (a shared page is full)
};

/// KvSlots of `batch`'s decode rows over pages of `page_size` tokens.
KvSlots decode_kv_slots(const stages::engine::StepBatch& batch, int64_t page_size);

/// (bytes) / (read ceiling in GB/s) + launch floor, in microseconds. Throws
/// ref::InvalidArgument naming `read_gbps` (not > 0) or `launch_floor_us` (< 0).
double floor_us(int64_t bytes, double read_gbps, double launch_floor_us);

}  // namespace flashstep::bench
