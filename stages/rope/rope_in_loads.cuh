/// \file rope_in_loads.cuh
/// \brief RoPE in the attention's loads (FlashInfer's pos_encoding_mode="ROPE_LLAMA") as a
/// policy of kernels/attention_policy.cuh: the page pool holds keys as projected,
/// un-rotated, and the attention kernel rotates q and each key as it loads them. Stage 03's
/// chunk kernel and stage 04's prefill kernel take it at their hooks; neither lesson
/// (02_paged/decode_loop.cuh, 04_tensor_core/prefill_attention.cuh) carries RoPE code. The chapter (README.md) says why here, and what it costs.
///
/// Two hooks, both rotate-half pairs (x[i], x[i + head_dim / 2]) in fp32 with the
/// reference's own rotation (flashstep/reference/rope_fp32.hpp: the same angle and the same
/// fused multiply-adds on host and device), rounded back to T, as a RoPE kernel's output is
/// before it is appended:
/// - on_q (decode): the thread's slice of q holds eight whole pairs (RowSlice pair0 =
///   tx * 8), so q is rotated in the registers that loaded it, once per block;
/// - on_q_tile, on_k_tile: once a tile has landed, all the block's threads rotate it in
///   place, each row once (the threads that only copy help too), in the kernel's layout
///   (stage 02's row-major tiles, stage 04's swizzled ones); the kernel waits for every
///   thread (kTouchesTiles) before it reads the tile.
///
/// The experiment that lost, rotating each key in the registers that read it instead of in
/// the tile (no barrier, no rounding, but every thread of a GQA group's token group rotates
/// the same key): 0.1175 ms against 0.0928 ms at decode b64 x kv 2048 on an H100 (1.27x
/// slower; docs/results/09_engine/h100_rope_timing_2026-11-27_5d8b233.txt), 0.1151 against
/// 0.0889 on an H200 (1.29x; docs/results/03_split_kv/h200_policies_ab_2026-11-29_2d91f71.txt).
/// The angles are the cost, not the multiply-adds, and that way computes each one
/// group-size times.
#pragma once

#include <cuda_runtime.h>

#include "flashstep/kernels/attention_policy.cuh"
#include "flashstep/kernels/vec.cuh"
#include "flashstep/reference/rope_fp32.hpp"

namespace flashstep::stages::rope {

/// Rotates the 16 values x (x[e] and x[8 + e] form pair pair0 + e) to `position`, in fp32,
/// exactly as ref::rope_llama_fp32 does.
/// \param x a row's 16 values, rotated in place \param position the row's position
/// \param turns f_i of the eight pairs, device memory (read through L1 at each use: eight
///        doubles held in registers would spill at 128 registers a thread)
__device__ __forceinline__ void rotate_half_pairs(float (&x)[16], int position, const double* turns) {
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float c, s;
    ref::rope_cos_sin_fp32(position, __ldg(turns + e), c, s);
    ref::rope_rotate_fp32(x[e], x[8 + e], c, s);
  }
}

/// Rotates `num_rows` rows of a 16-bit tile in shared memory, row r to position
/// position(r), each rotate-half pair once: the pair (x[i], x[i + HEAD_DIM / 2]) is element e
/// of chunks c and c + HEAD_DIM / 16 of a row, so thread tid takes chunk pair
/// c = tid % (HEAD_DIM / 16) of rows tid / (HEAD_DIM / 16), + THREADS / (HEAD_DIM / 16), ...,
/// in fp32 (ref::rope_llama_fp32's arithmetic), rounded back to T. Rows the kernel zero-filled
/// stay zero. Collective; the kernel puts a barrier after it.
template <typename Layout, typename T, int HEAD_DIM, int THREADS, typename Position>
__device__ __forceinline__ void rotate_tile(T* tile, int num_rows, int tid, const double* all_turns,
                                            const Position& position) {
  constexpr int kHalf = HEAD_DIM / 16;  // 16-byte chunks in half a row
  static_assert(kernels::Vec16<T>::kSize == 8 && THREADS % kHalf == 0,
                "16-bit rows: a chunk is 8 elements, a thread keeps one chunk pair (its eight turns)");
  const int c = tid % kHalf;
  const double* turns = all_turns + c * 8;
  for (int r = tid / kHalf; r < num_rows; r += THREADS / kHalf) {
    T* lo = tile + Layout::template offset<HEAD_DIM>(r, c);
    T* hi = tile + Layout::template offset<HEAD_DIM>(r, c + kHalf);
    kernels::Vec16<T> a16, b16;
    a16.load(lo);
    b16.load(hi);
    float x[16];
    a16.to_float(x);
    b16.to_float(x + 8);
    rotate_half_pairs(x, position(r), turns);
    a16.from_float(x);
    b16.from_float(x + 8);
    a16.store(lo);
    b16.store(hi);
  }
}

/// The policy (16-bit q and K/V: fp16 or bf16): the identity's logit and state hooks, its
/// own q and tile hooks.
struct RopeInLoads : kernels::IdentityPolicy {
  /// What the hooks read at run time.
  struct Params {
    const double* turns = nullptr;  ///< (head_dim / 2) turns per position f_i, device memory
    /// The turns of the runner's plan.
    static Params from(const kernels::PolicyInputs& in) { return {in.rope_turns}; }
  };
  static constexpr bool kTouchesTiles = true;  ///< the tile hooks rotate the tiles in place

  /// A decode thread's slice of q rotated to its position in registers, then rounded to T
  /// (q's type), as a key in the tile is.
  template <typename T, int N>
  __device__ __forceinline__ static void on_q(const Params& p, float (&q)[N], kernels::RowSlice slice) {
    static_assert(N == 16, "RoPE in the loads: a thread's slice of q is eight rotate-half pairs (16-bit K/V)");
    rotate_half_pairs(q, slice.position, p.turns + slice.pair0);
    kernels::Vec16<T> lo, hi;
    lo.from_float(q);
    hi.from_float(q + 8);
    lo.to_float(q);
    hi.to_float(q + 8);
  }

  /// A prefill Q tile: packed row r at rows.position(r).
  template <typename Layout, typename T, int HEAD_DIM, int THREADS>
  __device__ __forceinline__ static void on_q_tile(const Params& p, T* tile, int num_rows, int tid,
                                                   kernels::PackedRows rows) {
    rotate_tile<Layout, T, HEAD_DIM, THREADS>(tile, num_rows, tid, p.turns, [&](int r) { return rows.position(r); });
  }

  /// A K tile: key `row` at first_position + row.
  template <typename Layout, typename KV, int HEAD_DIM, int ROWS, int THREADS>
  __device__ __forceinline__ static void on_k_tile(const Params& p, KV* tile, int tid, int first_position) {
    rotate_tile<Layout, KV, HEAD_DIM, THREADS>(tile, ROWS, tid, p.turns, [&](int r) { return first_position + r; });
  }
};

}  // namespace flashstep::stages::rope
