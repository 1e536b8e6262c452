/// \file flashstep_capi.h
/// \brief A C interface to the CUDA stages, for callers that cannot link C++: the Python
/// layer `flashstep.cuda` loads it with ctypes, so it runs in any Python and PyTorch
/// without being built against either.
///
/// Every function returns a status: 0 on success, FS_BAD_ARGUMENT when an argument is
/// refused (the C++ ref::InvalidArgument text), FS_FAILED for anything else (a CUDA
/// error), with a message that fs_last_error() returns on the same thread. Nothing throws across this interface and nothing aborts.
///
/// Pointers named "host" are read on the host during the call; every other array is
/// device memory. A `stream` is a cudaStream_t passed as void* (null: the legacy
/// default stream). Functions that only launch kernels (fs_runner_run, fs_mla_run,
/// fs_merge_state, fs_merge_states, fs_append_paged_kv_cache, the samplers) can be
/// captured in a CUDA graph.
#ifndef FLASHSTEP_CAPI_H
#define FLASHSTEP_CAPI_H

#include <stddef.h>
#include <stdint.h>

/// Marks the exported functions (the library hides everything else).
#define FS_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/// Bumped whenever a signature or a struct below changes.
#define FLASHSTEP_CAPI_VERSION 11

/// Statuses returned by every function.
enum { FS_OK = 0, FS_BAD_ARGUMENT = 1, FS_FAILED = 2 };
/// Element types: FS_F32, FS_F16, FS_BF16 (q, k, v, o and merge/append inputs);
/// FS_E4M3 and FS_E5M2 (FP8, PyTorch's float8_e4m3fn and float8_e5m2) for K/V only
/// (fs_shape.kv_dtype, and the rows and cache of fs_append_paged_kv_cache).
enum { FS_F32 = 0, FS_F16 = 1, FS_BF16 = 2, FS_E4M3 = 3, FS_E5M2 = 4 };
/// Attention modes.
enum { FS_DECODE = 0, FS_PREFILL = 1 };
/// KV storage.
enum { FS_RAGGED = 0, FS_PAGED = 1 };
/// Page layouts.
enum { FS_NHD = 0, FS_HND = 1 };

/// The host-side description of a batch (flashstep::stages::BatchShape as plain data).
typedef struct fs_shape {
  int32_t mode;                     ///< FS_DECODE or FS_PREFILL
  int32_t storage;                  ///< FS_RAGGED or FS_PAGED
  int32_t dtype;                    ///< FS_F32, FS_F16 or FS_BF16
  int32_t kv_layout;                ///< FS_NHD or FS_HND (ragged: FS_NHD)
  int32_t batch_size;               ///< requests
  int32_t num_qo_heads;             ///< query heads
  int32_t num_kv_heads;             ///< key/value heads
  int32_t head_dim;                 ///< elements per head
  int32_t page_size;                ///< paged: tokens per page
  int32_t causal;                   ///< prefill: 1 for the bottom-right aligned causal mask
  int64_t num_pages;                ///< paged: pages in the pool
  int32_t window_left;              ///< -1: off
  int32_t has_sm_scale;             ///< 0: sm_scale = 1/sqrt(head_dim)
  double sm_scale;                  ///< used when has_sm_scale
  double logits_soft_cap;           ///< 0: off
  const int32_t* qo_indptr;         ///< host, (batch_size + 1)
  const int32_t* kv_indptr;         ///< host, (batch_size + 1); paged: pages, ragged: tokens
  const int32_t* kv_last_page_len;  ///< host, (batch_size); paged only (else null)
  /// 1: plan for a captured CUDA graph (the launch depends on batch_size and nnz_qo only;
  /// stages that cannot are refused, see fs_stage_unsupported_reason)
  int32_t cuda_graph;
  /// Element type of the K/V pool when it differs from dtype: FS_E4M3 or FS_E5M2 (an FP8
  /// cache, read by the stages that list it in their capabilities; q and o stay in
  /// dtype). 0 or dtype: K/V in dtype.
  int32_t kv_dtype;
  /// Elements per head of v and o when they differ from head_dim (MLA's prefill: head_dim
  /// 192, head_dim_vo 128; FlashInfer's head_dim_vo). 0: head_dim.
  int32_t head_dim_vo;
} fs_shape;

/// Device pointers of one run (flashstep::stages::DeviceBatch).
typedef struct fs_batch {
  const void* q;              ///< (nnz_qo, num_qo_heads, head_dim)
  const int32_t* qo_indptr;   ///< (batch_size + 1)
  const int32_t* kv_indptr;   ///< (batch_size + 1)
  const void* kv_pool;        ///< paged: (num_pages, 2, page_size, Hkv, D) NHD or (num_pages, 2, Hkv, page_size, D) HND
  const int32_t* kv_indices;  ///< paged: (kv_indptr[batch_size])
  const int32_t* kv_last_page_len;  ///< paged: (batch_size)
  const void* k;                    ///< ragged: (nnz_kv, Hkv, D)
  const void* v;                    ///< ragged: (nnz_kv, Hkv, head_dim_vo)
  void* o;                          ///< (nnz_qo, num_qo_heads, head_dim_vo)
  float* lse;                       ///< (nnz_qo, num_qo_heads), natural log
  /// Attention reads k * k_scale and v * v_scale (FlashInfer's run() arguments for an FP8
  /// cache); 0 means 1. They are arguments of this run's launch (DeviceBatch's scales):
  /// scales that change from run to run need no new plan, also while a CUDA graph is
  /// being captured (the graph keeps the captured run's values); a stage that reads no
  /// FP8 refuses scales other than 1.
  double k_scale;
  double v_scale;
  /// Attention sinks of this run (FlashInfer's run(sinks=)): (num_qo_heads) fp32
  /// natural-log logits, each joining its head's softmax denominator; null: none. Only a
  /// stage whose capabilities list "sinks" takes them (stages/sinks/).
  const float* sinks;
  /// Paged K/V with head_dim_vo != head_dim (MLA's prefill): V's own pool, (num_pages, 1,
  /// page_size, Hkv, head_dim_vo) NHD or (num_pages, 1, Hkv, page_size, head_dim_vo) HND,
  /// and kv_pool then holds K alone, (num_pages, 1, ...) (FlashInfer's separate k_cache and
  /// v_cache). Null otherwise.
  const void* v_pool;
} fs_batch;

/// The message of the last failing call on this thread ("" when none).
FS_API const char* fs_last_error(void);
/// FLASHSTEP_CAPI_VERSION of the library.
FS_API int fs_version(void);

// ---- the registry -----------------------------------------------------------------

/// Flags of fs_stage_caps: what a stage implements beyond its lists.
enum {
  FS_CAP_CAUSAL = 1 << 0,           ///< the causal mask (prefill)
  FS_CAP_WINDOW_LEFT = 1 << 1,      ///< window_left >= 0
  FS_CAP_LOGITS_SOFT_CAP = 1 << 2,  ///< logits_soft_cap > 0
  FS_CAP_HOST_PAGE_TABLE = 1 << 3,  ///< plans from the page ids (05_cascade: fs_cascade_plan)
  FS_CAP_CUDA_GRAPH = 1 << 4,       ///< plans for a captured CUDA graph (fs_shape.cuda_graph)
  FS_CAP_ROPE_LLAMA = 1 << 5,       ///< rotates q and k itself (ROPE_LLAMA)
  FS_CAP_SINKS = 1 << 6,            ///< takes attention sinks in a run (fs_batch.sinks)
};

/// What a stage declares about itself (its registry entry as plain data). A list is a
/// bit mask over the enum above it: bit (1 << FS_DECODE) of `modes`, (1 << FS_BF16) of
/// `dtypes`, and so on.
typedef struct fs_stage_caps {
  uint32_t modes;          ///< bits 1 << FS_DECODE, 1 << FS_PREFILL
  int32_t storage;         ///< FS_RAGGED or FS_PAGED
  uint32_t dtypes;         ///< bits 1 << FS_F32, FS_F16, FS_BF16: q, o (and K/V in the same type)
  uint32_t kv_dtypes;      ///< bits 1 << FS_E4M3, FS_E5M2: FP8 K/V it reads (with k_scale, v_scale)
  uint32_t kv_layouts;     ///< bits 1 << FS_NHD, FS_HND
  int32_t max_page_size;   ///< paged: the largest page_size
  int32_t max_group_size;  ///< the largest num_qo_heads / num_kv_heads
  uint32_t flags;          ///< FS_CAP_*
  int32_t num_head_dims;   ///< entries of head_dims in use
  int32_t head_dims[8];    ///< the head_dim values it is built for
} fs_stage_caps;

/// Number of attention stages in the registry.
FS_API int fs_stage_count(void);
/// Name (e.g. "02_paged"), one-line summary and capabilities in words of stage `index`,
/// in teaching order; the strings live as long as the library.
FS_API int fs_stage_info(int index, const char** name, const char** summary, const char** capabilities);
/// The capabilities of stage `index` as data (the words of fs_stage_info are for people).
FS_API int fs_stage_capabilities(int index, fs_stage_caps* caps);
/// Why stage `name` cannot run `shape` ("" when it can); the string is valid until the
/// next call on this thread. Fails for an unknown name or an inconsistent shape.
FS_API int fs_stage_unsupported_reason(const char* name, const fs_shape* shape, const char** reason);
/// The stage that runs `shape` on CUDA device `device` (-1: the current one) when the
/// caller names none: the registry's default_stage (stages/registry.hpp), which stage 09's
/// engine uses too. *name (the registry's string, alive as long as the library) is a stage
/// that supports `shape`; FS_BAD_ARGUMENT, listing every stage's reason, when none does.
/// Stages that plan from the page ids (FS_CAP_HOST_PAGE_TABLE) are not chosen.
FS_API int fs_default_stage(const fs_shape* shape, int device, const char** name);
/// The same rule over the `count` registry names of `names` (teaching order), taken as
/// the stages that support a batch of `mode` and GQA group `group_size`: *index is the
/// chosen one's position in `names`, or -1 when count is 0.
FS_API int fs_default_stage_among(const char* const* names, int count, int mode, int group_size, int* index);
/// The harness's tolerances for q/o in `dtype` and K/V in `kv_dtype` (0 or dtype: the
/// same; FS_E4M3 or FS_E5M2 for an FP8 cache): which = 0 for o, 1 for lse.
FS_API int fs_tolerance(int dtype, int kv_dtype, int which, double* atol, double* rtol, double* norm);

// ---- plan / run -------------------------------------------------------------------

/// A fresh runner of stage `name` (the number alone, "02", works too).
FS_API int fs_runner_create(const char* name, void** runner);
/// Frees a runner (null is allowed).
FS_API int fs_runner_destroy(void* runner);
/// Device workspace bytes that plan() and run() need for `shape`. Checks `shape` as
/// fs_runner_plan does, so whichever comes first refuses a shape the stage cannot run.
FS_API int fs_runner_workspace_bytes(void* runner, const fs_shape* shape, size_t* bytes);
/// Checks `shape` (its consistency, each argument named, then the stage's
/// unsupported_reason) and plans it (the scales are fs_batch's, given to each run).
FS_API int fs_runner_plan(void* runner, const fs_shape* shape, void* workspace, size_t workspace_bytes, void* stream);
/// Launches the planned attention on `stream`; fails when no plan was made. `device` is
/// the CUDA device the arrays and the stream live on, made current for the launch and
/// the previous one restored after (-1: the current device, as it is). One call per
/// layer, so the device switch is made here rather than by two more calls.
FS_API int fs_runner_run(void* runner, const fs_batch* batch, int device, void* stream);
/// Plans a stage 05 runner (fs_runner_create("05_cascade")) on FlashInfer's multi-level
/// form instead of deriving the levels: level l has num_groups[l] groups, host arrays
/// qo_indptr[l] (num_groups[l] + 1), kv_indptr[l] (num_groups[l] + 1), kv_indices[l]
/// (kv_indptr[l][num_groups[l]]) and kv_last_page_len[l] (num_groups[l]); the last level
/// holds one group per request. `shape` is the batch as its last level sees it (paged;
/// its qo_indptr, kv_indptr and kv_last_page_len are the last level's; causal masks the
/// last level only). With workspace null, only sets *bytes_needed (the workspace plan()
/// needs); otherwise plans, copying every level's arrays into the workspace, and sets
/// *bytes_needed when it is not null, also when the workspace is too small and the plan
/// is refused (so one call both sizes and plans). run() with
/// fs_runner_run reads q, kv_pool, o and lse of the batch (its index pointers may be null).
FS_API int fs_cascade_plan(void* runner, const fs_shape* shape, int num_levels, const int32_t* num_groups,
                           const int32_t* const* qo_indptr, const int32_t* const* kv_indptr,
                           const int32_t* const* kv_indices, const int32_t* const* kv_last_page_len, void* workspace,
                           size_t workspace_bytes, size_t* bytes_needed, void* stream);

// ---- MLA, the absorbed form over a paged latent cache (stages/10_mla/) -----------------

/// The host-side description of an MLA batch (flashstep::stages::mla::MlaShape as plain
/// data; FlashInfer's BatchMLAPagedAttentionWrapper.plan() arguments). Every query head
/// of a request attends to the request's latents c (head_dim_ckv) and rotary keys k_pe
/// (head_dim_kpe): s = sm_scale (q_nope . c + q_pe . k_pe), o = softmax(s) c.
typedef struct fs_mla_shape {
  int32_t dtype;         ///< FS_F16 or FS_BF16: q_nope, q_pe, both pools and o
  int32_t batch_size;    ///< requests, >= 1
  int32_t num_heads;     ///< query heads of every request
  int32_t head_dim_ckv;  ///< latent width (kv_lora_rank); the kernel is built for 512
  int32_t head_dim_kpe;  ///< rotary width; the kernel is built for 64
  int32_t page_size;     ///< tokens per page of both pools, >= 1
  int64_t num_pages;     ///< pages in each pool
  int32_t causal;        ///< 1: query i of a request sees keys 0 .. i + kv_len - qo_len (bottom-right)
  /// Required (> 0): 1/sqrt of the query/key head dim before absorption (1/sqrt(192) for
  /// DeepSeek-V3), which the latent widths do not tell.
  double sm_scale;
  /// host, (batch_size + 1): request i's queries are rows qo_indptr[i] .. qo_indptr[i+1]
  const int32_t* qo_indptr;
  /// host, (batch_size + 1): request i's pages are kv_indices[kv_indptr[i] .. kv_indptr[i+1]]
  const int32_t* kv_indptr;
  /// host, (batch_size): keys of request i, within its pages (0: its rows get o = 0, lse = -inf)
  const int32_t* kv_len;
} fs_mla_shape;

/// Device pointers of one MLA run (flashstep::stages::mla::MlaBatch). Every array is
/// contiguous device memory of the planned device.
typedef struct fs_mla_batch {
  const void* q_nope;         ///< (nnz_qo, num_heads, head_dim_ckv): the absorbed queries, in dtype
  const void* q_pe;           ///< (nnz_qo, num_heads, head_dim_kpe), in dtype
  const void* ckv_pages;      ///< (num_pages, page_size, head_dim_ckv): the latent pool, in dtype
  const void* kpe_pages;      ///< (num_pages, page_size, head_dim_kpe): the rotary-key pool, in dtype
  const int32_t* kv_indices;  ///< (kv_indptr[batch_size]): page ids in [0, num_pages)
  void* o;                    ///< (nnz_qo, num_heads, head_dim_ckv): o_lat, in dtype
  float* lse;                 ///< (nnz_qo, num_heads), natural log; null: not written
} fs_mla_batch;

/// Why `shape` cannot run on CUDA device `device` (-1: the current one), "" when it can:
/// sm_80 or later with enough shared memory, f16/bf16, the built widths (512 + 64), 1..128
/// heads, index arrays that agree with each other. The string is valid until the next call
/// on this thread. Fails, rather than answers, for a shape that cannot be read: null, a
/// null index array, batch_size < 1, an unknown dtype, sm_scale not a positive finite float.
FS_API int fs_mla_unsupported_reason(const fs_mla_shape* shape, int device, const char** reason);
/// A fresh MLA runner (flashstep::stages::mla::MlaRunner).
FS_API int fs_mla_runner_create(void** runner);
/// Frees an MLA runner (null is allowed).
FS_API int fs_mla_runner_destroy(void* runner);
/// Device workspace bytes that fs_mla_plan and fs_mla_run need for `shape` (the work items,
/// the merge's row offsets, the fp32 partial states of a split); refuses, naming the field,
/// a shape the kernel cannot run.
FS_API int fs_mla_workspace_bytes(void* runner, const fs_mla_shape* shape, size_t* bytes);
/// Plans `shape` on the current device into `workspace` (device, at least
/// fs_mla_workspace_bytes): the work items and the key split are decided on the host and
/// copied on `stream`. The host arrays may be reused when it returns.
FS_API int fs_mla_plan(void* runner, const fs_mla_shape* shape, void* workspace, size_t workspace_bytes, void* stream);
/// Launches the planned MLA on `stream` (the attention kernel, then the merge of split
/// requests), with the planned device current for the launch and the previous one restored
/// after. Only launches: capturable in a CUDA graph, which replays this plan's schedule (a
/// later fs_mla_plan on the same runner and workspace may change the launch). Fails when no
/// plan was made or a pointer is null (lse may be null).
FS_API int fs_mla_run(void* runner, const fs_mla_batch* batch, void* stream);

// ---- the merge of attention states (natural-log lse) --------------------------------

/// (v, s) of two index sets merged into (v_out, s_out). v_a, v_b, v_out: (seq_len,
/// num_heads, head_dim) of `dtype`, contiguous; s_a, s_b, s_out: (seq_len, num_heads) fp32.
FS_API int fs_merge_state(int dtype, const void* v_a, const float* s_a, const void* v_b, const float* s_b,
                          int64_t seq_len, int64_t num_heads, int64_t head_dim, void* v_out, float* s_out,
                          void* stream);
/// num_states states per row merged: v (seq_len, num_states, num_heads, head_dim), s
/// (seq_len, num_states, num_heads) -> v_out (seq_len, num_heads, head_dim), s_out
/// (seq_len, num_heads). num_states 0 gives o = 0 and lse = -inf.
FS_API int fs_merge_states(int dtype, const void* v, const float* s, int64_t seq_len, int64_t num_states,
                           int64_t num_heads, int64_t head_dim, void* v_out, float* s_out, void* stream);

// ---- appending to the paged KV cache ------------------------------------------------

/// Row r of append_key/append_value (nnz, Hkv, D), with row strides key_row_stride and
/// value_row_stride (elements; heads and dims contiguous), goes to position
/// positions[r] of request batch_indices[r]: page kv_indices[kv_indptr[b] + p /
/// page_size], slot p % page_size. k_cache and v_cache point at page 0 of the key and
/// value halves; page_stride is the distance between pages in elements (2 * page_size *
/// Hkv * D for one 5-D pool, page_size * Hkv * D for separate k and v caches). A row
/// whose request, position or page is out of range is not written and, when `status` is
/// given, gets status 1 there (0 for written rows).
///
/// dtype is the rows' type (FS_F32, FS_F16, FS_BF16, or FS_E4M3 / FS_E5M2 for rows
/// quantized beforehand), kv_dtype the cache's (0: dtype). Rows of the cache's type are
/// copied (k_scale and v_scale must be 0 or 1). FS_F16/FS_BF16 rows into an FS_E4M3 /
/// FS_E5M2 cache are quantized on write: element x is stored as the FP8 value nearest to
/// x / k_scale (keys) or x / v_scale (values), the quotient in double, ties to even,
/// saturating at the format's largest finite value (the __nv_fp8_e4m3 / __nv_fp8_e5m2
/// constructors); the scales are those attention then reads (fs_batch.k_scale/v_scale),
/// positive and finite (0: 1).
FS_API int fs_append_paged_kv_cache(int dtype, int kv_dtype, const void* append_key, const void* append_value,
                                    int64_t key_row_stride, int64_t value_row_stride, int64_t nnz,
                                    const int32_t* batch_indices, const int32_t* positions, void* k_cache,
                                    void* v_cache, int64_t page_stride, int kv_layout, int num_kv_heads, int head_dim,
                                    int page_size, int64_t num_pages, const int32_t* kv_indices,
                                    const int32_t* kv_indptr, int batch_size, double k_scale, double v_scale,
                                    int32_t* status, void* stream);

// ---- stage 09: rotary position encoding (FlashInfer's apply_rope family) ---------------

/// RoPE on q (nnz, num_q_heads, head_dim) and k (nnz, num_k_heads, head_dim), contiguous,
/// of `dtype` (FS_F32, FS_F16 or FS_BF16), into q_out and k_out (which may be q and k).
/// Row positions: pos_ids (nnz) when not null, else offsets[b] + (t - indptr[b]) for row t
/// of request b (indptr (batch_size + 1), offsets (batch_size)); all device pointers.
/// Frequencies as FlashInfer's: rope_theta^(-2i / rotary_dim) / rope_scale, or, with
/// llama31 != 0, Llama 3.1's (low_freq_factor, high_freq_factor, old_context_len).
FS_API int fs_apply_rope(int dtype, const void* q, const void* k, void* q_out, void* k_out, int64_t nnz,
                         int num_q_heads, int num_k_heads, int head_dim, int rotary_dim, int interleave,
                         const int32_t* pos_ids, const int32_t* indptr, const int32_t* offsets, int batch_size,
                         double rope_scale, double rope_theta, int llama31, double low_freq_factor,
                         double high_freq_factor, double old_context_len, void* stream);

// ---- stage 06: sampling ---------------------------------------------------------------

/// Filter orders of the top_k_top_p samplers.
enum { FS_TOP_K_FIRST = 0, FS_JOINT = 1 };

/// The per-output parameters of a sampler: a scalar for every output, or one device
/// value per output (when the pointer is not null).
typedef struct fs_sampling_params {
  int64_t top_k;                 ///< top_k scalar
  const int32_t* top_k_arr;      ///< (batch) device, or null
  double top_p;                  ///< top_p scalar
  const float* top_p_arr;        ///< (batch) device, or null
  double min_p;                  ///< min_p scalar
  const float* min_p_arr;        ///< (batch) device, or null
  double temperature;            ///< softmax: temperature scalar
  const float* temperature_arr;  ///< softmax: (rows) device, or null
  int32_t filter_apply_order;    ///< FS_TOP_K_FIRST or FS_JOINT
  int32_t input_dtype;           ///< element type of `data`: FS_F32, or FS_BF16 for the operators that take logits
} fs_sampling_params;

/// Workspace bytes of sampling operator `name` (stage 06's workspace_bytes).
FS_API int fs_sampling_workspace_bytes(const char* name, int64_t rows, int64_t batch, int64_t vocab,
                                       int filter_apply_order, size_t* bytes);
/// Sampler `name` ("sampling_from_probs", "sampling_from_logits", "top_k_sampling_from_probs",
/// "top_p_sampling_from_probs", "min_p_sampling_from_probs",
/// "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits") on fp32 rows
/// (rows, vocab). indices: (batch) device or null (then batch == rows). samples, rounds,
/// status: (batch) device; rounds and status may be null.
FS_API int fs_sample(const char* name, const void* data, int64_t rows, int64_t vocab, const fs_sampling_params* params,
                     const int32_t* indices, int64_t batch, uint64_t seed, uint64_t offset, int32_t* samples,
                     int32_t* rounds, int32_t* status, void* workspace, size_t workspace_bytes, void* stream);
/// Row transform `name` ("softmax", "top_k_renorm_probs", "top_p_renorm_probs",
/// "top_k_mask_logits") from (rows, vocab) fp32 `data` into `out` (rows, vocab); status
/// (rows) may be null.
FS_API int fs_row_transform(const char* name, const void* data, int64_t rows, int64_t vocab,
                            const fs_sampling_params* params, float* out, int32_t* status, void* stream);
/// Chain speculative sampling (stage 06). draft_probs (batch, n, vocab), draft_token_ids
/// (batch, n), target_probs (batch, n + 1, vocab); outputs (batch, n + 1), (batch), (batch).
FS_API int fs_chain_speculative_sampling(const float* draft_probs, const int32_t* draft_token_ids,
                                         const float* target_probs, int64_t batch, int64_t n, int64_t vocab,
                                         int32_t* output_token_ids, int32_t* accepted, int32_t* emitted,
                                         int32_t* status, uint64_t seed, uint64_t offset, void* stream);

/// The name of a stage 06 Status code ("ok", "bad_index", ...).
FS_API int fs_sampling_status_name(int status, const char** name);

// ---- the device ---------------------------------------------------------------------

/// The CUDA device that `ptr` lives on, and its memory type (cudaMemoryType: 0
/// unregistered host, 1 host, 2 device, 3 managed).
FS_API int fs_pointer_device(const void* ptr, int* device, int* memory_type);
/// Makes `device` current on this thread; `previous` (may be null) gets the one before.
/// Fails, saying why, on a GPU the stages cannot run on: older than sm_80, or one whose
/// architecture the library was not built for (flashstep.cuda's available() calls it).
FS_API int fs_set_device(int device, int* previous);
/// Copies `bytes` between any two pointers (host or device, found by unified addressing)
/// on `stream`; waits for it when `synchronize` is non-zero.
FS_API int fs_memcpy(void* dst, const void* src, size_t bytes, void* stream, int synchronize);
/// Waits for `stream` (tests and notebooks only).
FS_API int fs_stream_synchronize(void* stream);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FLASHSTEP_CAPI_H
