/// \file pod_attention.cuh
/// \brief POD attention (prefill-on-decode): one grid whose blocks each run either a
/// prefill tile of stage 04 or a decode work item of stage 03, so a mixed step's
/// attention is one launch in which both kinds of work share the multiprocessors.
///
/// ```
///   block b of P + D (P prefill blocks, D decode blocks), kinds interleaved in proportion:
///     before(b) = floor(b * D / (P + D))      decode blocks before b
///     b is a decode block iff before(b + 1) > before(b); it is decode block before(b),
///     else prefill block b - before(b)
///   prefill block i   stage 04's prefill_attention_block(i): work item i / Hkv (request,
///                     128-row query tile), kv head i % Hkv, tensor cores, no KV split
///   decode block j    stage 03's chunk steps for kv head j % Hkv of decode work item
///                     j / Hkv (one chunk of one decode row's keys); where a row has
///                     several chunks, the last of its blocks to finish merges them
///                     (fused_merge.cuh): no merge launch
/// ```
///
/// Both kinds run 256 threads under the same register cap (two blocks a multiprocessor
/// at head_dim <= 128), and every block gets the larger of the two shared-memory sizes,
/// so a multiprocessor holds two blocks of either kind. Interleaving puts both kinds in
/// every wave: a tensor-core tile and a bandwidth-bound decode item on one multiprocessor
/// use different units (Kamath et al., POD-Attention, ASPLOS 2025, arXiv 2410.18038; the
/// paper assigns blocks to multiprocessors at run time, this grid fixes the mix up front).
/// plan() splits the decode rows' KV only to fill the chip the prefill blocks leave free;
/// the prefill rows are never split (their merge would be a second launch).
#pragma once

#include <cstdint>

#include "04_tensor_core/prefill_attention.cuh"
#include "09_engine/fused_merge.cuh"
#include "09_engine/pod_attention.hpp"

namespace flashstep::stages::engine {

/// Arguments of pod_attention_kernel: the two kinds' own parameters and the grid's split.
template <typename T>
struct PodParams {
  tensor_core::PrefillParams<T> prefill;  ///< the prefill rows (stage 04's view, no split)
  FusedChunkDecodeParams<T> decode;       ///< the decode rows (stage 03's view, merged by the last block)
  int prefill_blocks = 0;                 ///< P: work items x kv heads
  int decode_blocks = 0;                  ///< D: decode work items x kv heads
  int num_kv_heads = 0;                   ///< Hkv
};

/// One launch over a mixed step. grid = P + D blocks, 256 threads, dynamic shared memory
/// max(PrefillTraits::smem_bytes(), chunk_decode_smem_bytes(num_stages, bdy, bdz)).
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(tensor_core::PrefillTraits<T, HEAD_DIM>::kThreads,
                                  tensor_core::PrefillTraits<T, HEAD_DIM>::kMinBlocksPerSM)
    pod_attention_kernel(const PodParams<T> p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  int index = 0;
  if (!pod_is_decode(blockIdx.x, int64_t{p.prefill_blocks} + p.decode_blocks, p.decode_blocks, index)) {
    tensor_core::prefill_attention_block<T, HEAD_DIM>(p.prefill, index, smem_raw);
    return;
  }
  // stage 03's chunk steps for (kv head, item), the last block of a row merging
  const int kv_head = index % p.num_kv_heads, item = index / p.num_kv_heads;
  chunk_decode_fused_block<T, HEAD_DIM>(p.decode, kv_head, item, p.num_kv_heads, smem_raw);
}

}  // namespace flashstep::stages::engine
