/// \file mla.hpp
/// \brief MLA on the GPU, absorbed form (the lesson of stages/10_mla/README.md): every query
/// head of a request attends to one shared latent cache, so the heads pack into the rows of
/// a tensor-core tile. Decode (one query per request) and causal append (several), over a
/// paged latent cache as FlashInfer's BatchMLAPagedAttentionWrapper takes it.
///
/// The reference is flashstep/reference/mla.hpp (batch_mla_paged_attention); the kernel is
/// mla_decode.cuh; plan() and run() are MlaRunner below. MLA is not a StageRunner: its
/// inputs (q_nope and q_pe; two pools of latents) are not the BatchShape/DeviceBatch of
/// the attention stages, so it has its own small interface, as stage 06 does.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::mla {

/// The latent width the kernel is built for (DeepSeek-V2/V3's kv_lora_rank).
constexpr int kLatentDim = 512;
/// The rotary width the kernel is built for (DeepSeek-V2/V3's qk_rope_head_dim).
constexpr int kRopeDim = 64;
/// The most query heads a request may have (DeepSeek-V3: 128).
constexpr int kMaxHeads = 128;

/// One block's work: a tile of rows of one request, and one chunk of its keys.
struct MlaWorkItem {
  int32_t qo_start;    ///< the request's first query token (a row of q_nope, q_pe and o)
  int32_t qo_len;      ///< the request's query tokens
  int32_t row_begin;   ///< the tile's first packed row (token * num_heads + head), within the request
  int32_t kv_len;      ///< the request's keys
  int32_t kv_begin;    ///< the chunk's first key
  int32_t kv_end;      ///< one past the chunk's last key
  int32_t page_begin;  ///< kv_indptr[request]: where the request's page ids start in kv_indices
  int32_t slot_base;   ///< split: partial slot of the request's token 0, chunk 0; -1: write o directly
  int32_t chunk;       ///< this chunk's index
  int32_t num_chunks;  ///< the request's chunks
};

/// The host-side description of an MLA batch (FlashInfer's plan() arguments).
struct MlaShape {
  DType dtype = DType::bf16;      ///< q_nope, q_pe, the pools and o: f16 or bf16
  int batch_size = 0;             ///< requests
  int num_heads = 0;              ///< query heads, 1..kMaxHeads
  int head_dim_ckv = kLatentDim;  ///< latent width (kv_lora_rank): kLatentDim only
  int head_dim_kpe = kRopeDim;    ///< rotary width: kRopeDim only
  int page_size = 0;              ///< tokens per page, >= 1
  int64_t num_pages = 0;          ///< pages in each pool
  bool causal = false;            ///< bottom-right aligned: query i of a request sees keys 0 .. i + kv_len - qo_len
  /// Scale of the scores, required: 1/sqrt(head_dim_nope + rope_dim) of the model (the
  /// query/key head dim before absorption, which the latent shapes do not tell).
  float sm_scale = 0.f;
  std::vector<int32_t> qo_indptr;  ///< (batch_size + 1): request i's queries are rows qo_indptr[i] .. qo_indptr[i+1]
  std::vector<int32_t>
      kv_indptr;                ///< (batch_size + 1): request i's pages are kv_indices[kv_indptr[i] .. kv_indptr[i+1]]
  std::vector<int32_t> kv_len;  ///< (batch_size): keys of request i, within its pages
  /// Keys per chunk of a split request; 0 (the default): plan() decides. Tests force
  /// splits with it; a positive value must be a multiple of 32 (the key tile).
  int forced_chunk_keys = 0;
  /// Run the kernels of every sm_80+ GPU (mma.sync) even where the Hopper one (wgmma)
  /// could run: the tests check both forms on a Hopper GPU, and the chapter times both.
  bool portable_only = false;

  /// Query rows of the batch: qo_indptr[batch_size].
  int64_t nnz_qo() const { return qo_indptr.empty() ? 0 : qo_indptr.back(); }
};

/// Device pointers of one run. Every array is device memory.
struct MlaBatch {
  const void* q_nope = nullptr;         ///< (nnz_qo, num_heads, head_dim_ckv): the absorbed queries
  const void* q_pe = nullptr;           ///< (nnz_qo, num_heads, head_dim_kpe)
  const void* ckv_pages = nullptr;      ///< (num_pages, page_size, head_dim_ckv)
  const void* kpe_pages = nullptr;      ///< (num_pages, page_size, head_dim_kpe)
  const int32_t* kv_indices = nullptr;  ///< (kv_indptr[batch_size]): page ids in [0, num_pages)
  void* o = nullptr;                    ///< (nnz_qo, num_heads, head_dim_ckv): o_lat, in dtype
  float* lse = nullptr;                 ///< (nnz_qo, num_heads), natural log; null: not written
};

/// What plan() decided, for tests, the benchmark and `flashstep explain`.
struct MlaPlanInfo {
  /// The kernel: "mma_sync" (mla_decode.cuh, every sm_80+ GPU) or "wgmma" (mla_hopper.cuh, sm_90a)
  const char* kernel = "";
  int rows_per_tile = 0;            ///< packed (token, head) rows of a block's tile: 64 or 16
  int chunk_keys = 0;               ///< keys per chunk of a split request; 0: no split
  int64_t work_items = 0;           ///< blocks of the attention kernel
  int64_t partial_rows = 0;         ///< (token, chunk) rows of fp32 partial states the merge folds; 0: no merge
  bool programmatic_merge = false;  ///< the merge is a programmatic dependent launch (sm_90)
  /// wgmma: pages of a multiple of 64 tokens, so a whole 64-key tile inside one page goes
  /// by the TMA (mla_hopper.cuh); the others are gathered
  bool tma_pages = false;
  /// wgmma: blocks in clusters of this many (2: a chunk's two row tiles, blocks 2i and
  /// 2i + 1, share each TMA tile, multicast into both); 1: none
  int cluster_blocks = 1;
};

/// What plan() knows of a GPU, so that a plan is a function of the shape and these alone
/// (the host tests plan for GPUs they do not have).
struct MlaDevice {
  int major = 0, minor = 0;   ///< compute capability
  int num_sm = 0;             ///< multiprocessors
  size_t smem_optin = 0;      ///< the most dynamic shared memory a block may ask for
  size_t smem_per_sm = 0;     ///< a multiprocessor's shared memory, all its blocks together
  bool hopper_build = false;  ///< the build has sm_90a code (stage 07's rule: hopper_unavailable_reason)
};

/// The facts of CUDA device `device` (-1: the current one).
MlaDevice query_device(int device = -1);

/// A plan: its decisions, the work items in launch order (longest request first, a
/// request's row tiles of one chunk side by side) and, after a split, each query token's
/// first partial row (nnz_qo + 1 entries).
struct MlaSchedule {
  MlaPlanInfo info;
  std::vector<MlaWorkItem> items;
  std::vector<int32_t> o_indptr;
  size_t workspace_bytes = 0;  ///< the device workspace plan() and run() need
};

/// Why `shape` cannot run on `device`, "" when it can: sm_80 or later, enough shared
/// memory for the smaller tile, f16/bf16, the built widths (512 + 64), 1..128 heads, sane
/// index arrays.
std::string unsupported_reason(const MlaShape& shape, const MlaDevice& device);
/// The same for CUDA device `device` (-1: the current one).
std::string unsupported_reason(const MlaShape& shape, int device = -1);

/// plan()'s decisions for `shape` on `device`, on the host alone. Throws
/// ref::InvalidArgument naming `fn` for a shape the device cannot run.
MlaSchedule make_schedule(const MlaShape& shape, const MlaDevice& device, const char* fn = "make_schedule");

/// MLA's plan/run pair, the attention stages' discipline: plan() on the host once per
/// batch (work items, the KV split, the tile), run() per layer, launches only.
class MlaRunner {
 public:
  /// Device workspace bytes plan() and run() need for `shape` (the work items, the merge's
  /// row offsets, and the fp32 partial states of a split). Throws ref::InvalidArgument
  /// naming the field and "MlaRunner::workspace_bytes" for a shape it cannot run.
  size_t workspace_bytes(const MlaShape& shape) const;
  /// Plans `shape` into `workspace` (device, at least workspace_bytes(shape)); copies the
  /// schedule on `stream` from pinned memory, without waiting for the copy. Throws ref::InvalidArgument naming the field and "MlaRunner::plan".
  void plan(const MlaShape& shape, void* workspace, size_t workspace_size, cudaStream_t stream);
  /// Runs the planned batch: the attention kernel, then, when plan() split the keys, stage
  /// 03's merge. Throws ref::InvalidArgument ("MlaRunner::run") without a plan or with a
  /// null pointer.
  void run(const MlaBatch& batch, cudaStream_t stream) const;
  /// The last plan's decisions.
  const MlaPlanInfo& info() const { return info_; }

 private:
  MlaShape shape_;
  MlaPlanInfo info_;
  bool wgmma_ = false;  ///< info_.kernel is "wgmma": run() launches mla_hopper.cuh's kernel
  void* workspace_ = nullptr;
  bool planned_ = false;
  int device_ = -1;
  ScheduleStaging staging_;  ///< the pinned copy of the schedule plan() uploads
};

}  // namespace flashstep::stages::mla
