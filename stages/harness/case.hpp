/// \file case.hpp
/// \brief A validation case: a spec (pure data, written in the test grids) and the host
/// case built from it with a seed (inputs, page table, storage, reference answer).
///
/// Correctness grids (stages/harness/cases.hpp) and benchmark shapes (bench/shapes.csv)
/// are both lists of CaseSpec-like data, kept apart: small ragged edge cases here,
/// large uniform shapes there.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "stage.hpp"

namespace flashstep::stages::harness {

/// How the kv_len (and prefill qo_len) of the requests of a batch are drawn.
enum class LengthPolicy {
  uniform,            ///< every request has exactly kv_len keys (and qo_len queries)
  ragged,             ///< request 0 has kv_len, the others a uniform draw from 1..kv_len
  ragged_with_empty,  ///< like ragged, but draws from 0..kv_len and request 1 gets 0 keys
  spread,             ///< no draw: request i of n gets kv_len / 32 * 32^(i / (n - 1)) (rounded), the last kv_len
};
/// "uniform", "ragged", "ragged_with_empty" or "spread".
const char* to_string(LengthPolicy policy);

/// Order in which the pages of the pool are handed to the requests.
enum class PageOrder {
  sequential,  ///< request 0 gets pages 0, 1, ...; then request 1; ... (a fresh server)
  shuffled,    ///< a random permutation of the pool (a server after many evictions)
};
/// "sequential" or "shuffled".
const char* to_string(PageOrder order);

/// One case of a grid: sizes and options, no data. Written as data in the test grids.
struct CaseSpec {
  Mode mode = Mode::decode;            ///< decode (one query per request) or prefill
  DType dtype = DType::bf16;           ///< element type the stage reads and writes
  KVLayout kv_layout = KVLayout::NHD;  ///< page layout; ragged storage requires NHD
  int batch_size = 1;                  ///< requests in the batch
  int kv_len = 1;                      ///< request 0 has exactly this many keys; others follow `lengths`
  int qo_len = 1;                      ///< prefill: request 0's queries, others drawn from 1..qo_len; decode: 1
  LengthPolicy lengths = LengthPolicy::ragged;  ///< how the other requests' lengths are drawn
  int num_qo_heads = 32;                        ///< query heads, Hq
  int num_kv_heads = 8;                         ///< kv heads, Hkv; Hq / Hkv is the GQA group size
  int head_dim = 128;                           ///< elements per head of q and k, D
  int head_dim_vo = 0;                          ///< of v and o when they differ; 0: head_dim
  int page_size = 16;                           ///< paged storage only
  bool causal = false;                          ///< prefill only
  int window_left = -1;                         ///< keep the last window_left + 1 keys of each query's range; -1 = off
  double logits_soft_cap = 0.0;                 ///< c > 0: scores s -> c * tanh(s / c); 0 = off
  PageOrder page_order = PageOrder::shuffled;   ///< which pool pages each request gets
  /// Paged only: tokens that every request holds before its own kv_len (a system prompt).
  /// Its whole pages are the same page ids in every request's table (shared, as a radix
  /// cache hands them out); a partly filled last page is each request's own copy.
  int shared_prefix = 0;
  /// Paged only: tokens after shared_prefix that the requests of one group share (a
  /// document a few requests ask about): the batch is cut into prefix_groups contiguous
  /// groups; whole pages of shared_prefix + group_prefix not already shared are shared
  /// within the group. Each request's kv_len own keys follow.
  int group_prefix = 0;
  int prefix_groups = 1;  ///< groups of group_prefix (1: the whole batch)

  // (the FP8 fields come last, so the positional initialisers of the fields above
  // still read as they did before them)
  /// Element type of the K/V when it differs from dtype: e4m3 or e5m2 for an FP8 cache.
  std::optional<DType> kv_dtype;
  /// The cache's scales (FlashInfer's run() arguments): keys and values are drawn as
  /// before, stored as round(k / k_scale) and round(v / v_scale) in the K/V dtype, and
  /// read back as stored * scale, so scores and outputs keep their usual size.
  double k_scale = 1.0;
  double v_scale = 1.0;  ///< as k_scale, for the values
  /// q is drawn in [-3 q_range, 3 q_range] (then rounded to dtype): far from 1 it checks
  /// that a kernel which rescales q internally (stage 03's tensor-core FP8 kernel) keeps
  /// every size of q.
  double q_range = 1.0;

  // (RoPE inside the stage, after the FP8 fields for the same reason)
  /// rope_llama: the pool holds un-rotated keys and the stage rotates q and each key
  /// (BatchShape::pos_encoding). The reference then attends with ref::rope_llama_fp32's
  /// rotated q and keys: the fp32 values a fused kernel computes, bit for bit.
  PosEncoding pos_encoding = PosEncoding::none;
  double rope_scale = 1.0;  ///< rope_llama: divides every frequency
  double rope_theta = 1e4;  ///< rope_llama: base of the frequencies
  /// rope_llama: the reference rounds the rotated q and keys to dtype, as a stage whose
  /// StageInfo::rope_rounds_to_dtype is set does (for_stage() sets it from the stage).
  bool rope_rounded = false;
  /// Attention sinks (stages/sinks/): the case draws one logit per query head (HostCase::
  /// sinks), the reference adds them to each head's denominator, and the stage's run gets
  /// them (DeviceBatch::sinks). Only stages whose StageInfo::sinks is set run such a case.
  bool sinks = false;

  /// One line with every field, e.g. for a failure message or a test name.
  std::string describe() const;
};

/// `spec` as `stage` computes it: rope_rounded set from StageInfo::rope_rounds_to_dtype
/// when spec.pos_encoding is rope_llama (the reference must round where the stage does).
CaseSpec for_stage(CaseSpec spec, const StageInfo& stage);

/// A batch's layout drawn from a spec: the host shape plus the page ids (paged storage).
struct CaseLayout {
  BatchShape shape;  ///< sizes and host index arrays: qo_indptr, kv_indptr, kv_last_page_len
  std::vector<int32_t>
      kv_indices;  ///< paged: (kv_indptr[batch_size]) page ids; distinct unless the spec shares a prefix
};

/// Draws lengths and the page table of `spec` for `storage` (shape.kv_indices holds the
/// page ids too). Paged pools get 25% spare pages that no request owns.
CaseLayout make_layout(const CaseSpec& spec, KVStorage storage, std::mt19937_64& rng);

/// The host side of a validation case.
struct HostCase {
  CaseSpec spec;      ///< the grid entry this case was built from
  uint64_t seed = 0;  ///< everything random in the case derives from it
  CaseLayout layout;  ///< shape and page table
  ref::Tensor q;      ///< (nnz_qo, num_qo_heads, head_dim), values representable in dtype
  /// paged storage: the pool, holding the stored K/V values (representable in the K/V
  /// dtype, before the scales); every slot no request owns is NaN
  ref::PagedKVCache paged;
  /// \var k
  /// ragged storage: the keys, (nnz_kv, num_kv_heads, head_dim), NHD, stored values as in `paged`
  ref::Tensor k, v;               ///< ragged storage: the values, (nnz_kv, num_kv_heads, head_dim[_vo]), NHD
  ref::AttentionResult expected;  ///< the reference's o (nnz_qo, Hq, D) and lse (nnz_qo, Hq)
  std::vector<float> sinks;       ///< spec.sinks: (num_qo_heads) natural-log sink logits; else empty
};

/// Builds a case: lengths, page table and inputs from `seed` (q uniform in [-3, 3] x q_range, so
/// that softmax is peaked and not nearly uniform; k, v uniform in [-1, 1], divided by
/// their scales; all rounded to the dtype, K/V to the K/V dtype), then the reference's
/// answer in double (for an FP8 cache, its FP8 entry point with the spec's scales).
HostCase build_case(const CaseSpec& spec, KVStorage storage, uint64_t seed);

/// A case's seed from the run's seed and the case's text (splitmix64 of both), so each
/// case has its own stream whatever order cases run in.
uint64_t case_seed(uint64_t run_seed, const std::string& case_text);

}  // namespace flashstep::stages::harness
