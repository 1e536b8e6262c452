// The correctness grids of the GPU suite, as data. Modeled on FlashInfer's own decode
// test grid (batch {1, 12, 17, 128} x kv_len {1, 15, 16, 17, 54, 97, 512, 2048, 16384}
// x page {1, 8, 16} x heads {(32, 8), (8, 8), (28, 4), (7, 1)} x head_dim {64, 128, 256}
// x dtype), trimmed so the suite takes minutes, not hours: the full product of the small
// sizes, with dtype and layout rotating through the grid so each appears with every
// other value; long kv_len and batch 128 only where they add something (pipeline wrap,
// many blocks), because the double-precision reference costs O(batch * kv_len * heads).
// Benchmark shapes live elsewhere (bench/shapes.csv): these cases check, they never time.
// They sit in the harness, not in tests/, because `flashstep validate` runs the same grids
// and the CLI uses nothing of tests/.
#pragma once

#include <algorithm>
#include <vector>

#include "harness/case.hpp"

namespace flashstep::stages::harness::grids {

using stages::DType;
using stages::KVLayout;
using stages::Mode;
using stages::harness::CaseSpec;
using stages::harness::LengthPolicy;
using stages::harness::PageOrder;

struct Heads {
  int qo, kv;
};
inline const Heads kHeadConfigs[] = {{32, 8}, {8, 8}, {28, 4}, {7, 1}};
inline const DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
inline const KVLayout kLayouts[] = {KVLayout::NHD, KVLayout::HND};

/// Small sizes, full product: every edge of the page table (kv_len 1, a partial last
/// page, last_page_len == page_size, one past it) with every head configuration.
inline std::vector<CaseSpec> decode_edge_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int batch : {1, 12, 17})
    for (int kv_len : {1, 15, 16, 17, 54, 97})
      for (int page : {1, 8, 16})
        for (Heads h : kHeadConfigs)
          for (int head_dim : {64, 128, 256}) {
            CaseSpec c;
            c.mode = Mode::decode;
            c.batch_size = batch;
            c.kv_len = kv_len;
            c.page_size = page;
            c.num_qo_heads = h.qo;
            c.num_kv_heads = h.kv;
            c.head_dim = head_dim;
            c.dtype = kDTypes[n % 3];
            c.kv_layout = kLayouts[(n / 3) % 2];
            c.lengths = LengthPolicy::ragged;
            ++n;
            cases.push_back(c);
          }
  return cases;
}

/// Long sequences: many pipeline wraps, several tiles per token group, page sizes at
/// both ends. Batches shrink as kv_len grows, and kv_len 16384 runs at batch 1 and
/// head_dim 128 only: the reference holds K/V in double (8 bytes per element).
inline std::vector<CaseSpec> decode_long_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int kv_len : {512, 2048, 16384})
    for (int page : {1, 16, 64})
      for (Heads h : {Heads{32, 8}, Heads{7, 1}})
        for (int head_dim : {64, 128, 256}) {
          if (kv_len == 16384 && head_dim != 128) continue;
          CaseSpec c;
          c.batch_size = kv_len == 16384 ? 1 : (kv_len == 2048 ? 4 : 12);
          c.kv_len = kv_len;
          c.page_size = page;
          c.num_qo_heads = h.qo;
          c.num_kv_heads = h.kv;
          c.head_dim = head_dim;
          c.dtype = kDTypes[n % 3];
          c.kv_layout = kLayouts[(n / 3) % 2];
          ++n;
          cases.push_back(c);
        }
  return cases;
}

/// Batch 128: more blocks than the chip holds at once, so blocks run in waves.
inline std::vector<CaseSpec> decode_batch128_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int kv_len : {17, 97, 256})
    for (int page : {1, 16})
      for (Heads h : {Heads{32, 8}, Heads{28, 4}}) {
        CaseSpec c;
        c.batch_size = 128;
        c.kv_len = kv_len;
        c.page_size = page;
        c.num_qo_heads = h.qo;
        c.num_kv_heads = h.kv;
        c.head_dim = 128;
        c.dtype = kDTypes[n % 3];
        c.kv_layout = kLayouts[(n / 3) % 2];
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// Every GQA group size 1..8 (7: a group that fills no power of two), each dtype.
inline std::vector<CaseSpec> decode_group_grid() {
  std::vector<CaseSpec> cases;
  for (int group = 1; group <= 8; ++group)
    for (DType dtype : kDTypes) {
      CaseSpec c;
      c.batch_size = 5;
      c.kv_len = 97;
      c.page_size = 8;
      c.num_kv_heads = 2;
      c.num_qo_heads = 2 * group;
      c.head_dim = 128;
      c.dtype = dtype;
      c.kv_layout = group % 2 ? KVLayout::HND : KVLayout::NHD;
      cases.push_back(c);
    }
  return cases;
}

/// Ragged-length edges: requests with no KV at all, page_size 64 (> any kv_len here
/// for some requests), sequential pages, uniform lengths.
inline std::vector<CaseSpec> decode_ragged_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (LengthPolicy lengths : {LengthPolicy::ragged_with_empty, LengthPolicy::uniform})
    for (int page : {1, 16, 64})
      for (PageOrder order : {PageOrder::shuffled, PageOrder::sequential}) {
        CaseSpec c;
        c.batch_size = 9;
        c.kv_len = 70;
        c.page_size = page;
        c.lengths = lengths;
        c.page_order = order;
        c.dtype = kDTypes[n % 3];
        c.kv_layout = kLayouts[n % 2];
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// The small set run under compute-sanitizer (memcheck, racecheck): every dtype,
/// layout and head_dim, page sizes 1/16/64, group 7, partial tiles, an empty request,
/// several pipeline wraps. Tiny sizes, because the sanitizer slows kernels 10-100x.
inline std::vector<CaseSpec> decode_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int head_dim : {64, 128, 256})
    for (DType dtype : kDTypes) {
      CaseSpec c;
      c.batch_size = 3;
      c.kv_len = n % 2 ? 300 : 37;
      c.page_size = n % 3 == 0 ? 1 : (n % 3 == 1 ? 16 : 64);
      c.num_qo_heads = n % 2 ? 7 : 32;
      c.num_kv_heads = n % 2 ? 1 : 8;
      c.head_dim = head_dim;
      c.dtype = dtype;
      c.kv_layout = kLayouts[n % 2];
      c.lengths = n == 4 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
      ++n;
      cases.push_back(c);
    }
  return cases;
}

/// Prefill over ragged queries and ragged KV: qo_len above and below kv_len (causal
/// rows that see nothing), causal on and off, GQA, each head_dim. fp32 (stage 01's dtype).
inline std::vector<CaseSpec> prefill_grid() {
  std::vector<CaseSpec> cases;
  for (int batch : {1, 5})
    for (int qo_len : {1, 7, 17})
      for (int kv_len : {1, 17, 97})
        for (bool causal : {false, true})
          for (Heads h : {Heads{8, 8}, Heads{32, 8}, Heads{7, 1}})
            for (int head_dim : {64, 128, 256}) {
              CaseSpec c;
              c.mode = Mode::prefill;
              c.dtype = DType::f32;
              c.batch_size = batch;
              c.qo_len = qo_len;
              c.kv_len = kv_len;
              c.causal = causal;
              c.num_qo_heads = h.qo;
              c.num_kv_heads = h.kv;
              c.head_dim = head_dim;
              c.lengths = batch > 1 && kv_len > 1 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
              cases.push_back(c);
            }
  return cases;
}

/// Prefill cases small enough for compute-sanitizer.
inline std::vector<CaseSpec> prefill_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  for (bool causal : {false, true}) {
    CaseSpec c;
    c.mode = Mode::prefill;
    c.dtype = DType::f32;
    c.batch_size = 3;
    c.qo_len = 9;
    c.kv_len = 40;
    c.causal = causal;
    c.num_qo_heads = 7;
    c.num_kv_heads = 1;
    c.head_dim = 64;
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  return cases;
}

/// Decode on ragged contiguous KV (stage 01): the decode edges without page sizes.
inline std::vector<CaseSpec> decode_contiguous_grid() {
  std::vector<CaseSpec> cases;
  for (int batch : {1, 12, 17})
    for (int kv_len : {1, 16, 97, 2048})
      for (Heads h : kHeadConfigs)
        for (int head_dim : {64, 128, 256}) {
          CaseSpec c;
          c.dtype = DType::f32;
          c.batch_size = batch;
          c.kv_len = kv_len;
          c.num_qo_heads = h.qo;
          c.num_kv_heads = h.kv;
          c.head_dim = head_dim;
          c.lengths = batch == 12 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
          cases.push_back(c);
        }
  return cases;
}

/// Stage 04's prefill grid (fp16/bf16, the tensor-core dtypes). qo_len around the tile
/// sizes (16 rows of an m16 tile, 64/128 rows of a block) and a long 1000; kv_len from
/// qo_len (a causal square) to qo_len + a long prefix (append); the other values rotate
/// through the grid: GQA group 1/4/7/8/16/32 (packed into tile rows), head_dim, dtype,
/// layout, page 1/16/64, ragged batches (other requests may have fewer keys than queries:
/// causal rows that see nothing), window and soft cap. Heads shrink as lengths grow, so
/// the double reference stays within a minute or two.
inline std::vector<CaseSpec> tensor_core_prefill_grid() {
  std::vector<CaseSpec> cases;
  const int groups[] = {1, 4, 7, 8, 16, 32};
  const int pages[] = {1, 16, 64};
  const int head_dims[] = {64, 128, 256};
  int n = 0;
  for (int qo_len : {1, 15, 16, 17, 127, 128, 129, 1000})
    for (int extra : {0, 17, 300, 4096})
      for (bool causal : {false, true}) {
        if (qo_len == 1000 && extra == 4096) continue;  // the long append runs at qo_len 128
        CaseSpec c;
        c.mode = Mode::prefill;
        c.qo_len = qo_len;
        c.kv_len = qo_len + extra;
        c.causal = causal;
        const int64_t work = int64_t{qo_len} * c.kv_len;
        c.batch_size = work > 200000 ? 1 : 3;
        const int group = work > 200000 ? ((n / 7) % 2 ? 4 : 1) : groups[n % 6];
        c.num_kv_heads = work > 200000 || group >= 16 ? 1 : 2;
        c.num_qo_heads = group * c.num_kv_heads;
        c.head_dim = work > 200000 ? 128 : head_dims[(n / 2) % 3];
        c.dtype = n % 2 ? DType::bf16 : DType::f16;
        c.kv_layout = kLayouts[(n / 3) % 2];
        c.page_size = pages[(n / 5) % 3];
        c.lengths = n % 4 == 3 ? LengthPolicy::uniform : LengthPolicy::ragged;
        if (n % 5 == 2) c.window_left = (n % 3 == 0) ? 0 : 37 + n;
        if (n % 7 == 4) c.logits_soft_cap = 30.0;
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// Stage 04's decode grid: groups 16 and 32 (MQA 32/1 and 64/4 included), which the
/// CUDA-core stages refuse, packed as rows of one query tile; lengths from one key to
/// several tiles, a batch wider than the chip, window and soft cap once each.
inline std::vector<CaseSpec> tensor_core_decode_grid() {
  std::vector<CaseSpec> cases;
  const Heads heads[] = {{32, 1}, {16, 1}, {64, 4}, {32, 2}};
  const int pages[] = {1, 16, 64};
  const int head_dims[] = {64, 128, 256};
  int n = 0;
  for (int batch : {1, 7, 150})
    for (int kv_len : {1, 17, 300, 2048})
      for (Heads h : heads) {
        if (batch == 150 && kv_len == 2048) continue;
        CaseSpec c;
        c.mode = Mode::decode;
        c.batch_size = batch;
        c.kv_len = kv_len;
        c.num_qo_heads = h.qo;
        c.num_kv_heads = h.kv;
        c.head_dim = head_dims[n % 3];
        c.dtype = n % 2 ? DType::bf16 : DType::f16;
        c.kv_layout = kLayouts[(n / 2) % 2];
        c.page_size = pages[(n / 4) % 3];
        c.lengths = batch == 7 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        if (n == 5) c.window_left = 100;
        if (n == 9) c.logits_soft_cap = 50.0;
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// Stage 04 under compute-sanitizer: both dtypes, every head_dim, both layouts, causal
/// with partial tiles and rows that see nothing, a window, group 32 decode. Tiny sizes.
inline std::vector<CaseSpec> tensor_core_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int head_dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      CaseSpec c;
      c.mode = Mode::prefill;
      c.batch_size = 3;
      c.qo_len = causal ? 70 : 9;
      c.kv_len = causal ? 90 : 140;
      c.causal = causal;
      c.num_qo_heads = n % 2 ? 8 : 4;
      c.num_kv_heads = n % 2 ? 2 : 4;
      c.head_dim = head_dim;
      c.dtype = n % 2 ? DType::bf16 : DType::f16;
      c.kv_layout = kLayouts[n % 2];
      c.page_size = n % 3 == 0 ? 1 : 16;
      c.lengths = LengthPolicy::ragged_with_empty;
      if (n == 3) c.window_left = 20;
      ++n;
      cases.push_back(c);
    }
  CaseSpec d;
  d.mode = Mode::decode;
  d.batch_size = 3;
  d.kv_len = 200;
  d.num_qo_heads = 32;
  d.num_kv_heads = 1;
  d.head_dim = 128;
  cases.push_back(d);
  return cases;
}

/// Stage 05 (cascade): batches whose requests share prefix pages. Shared prefixes of 0
/// (nothing shared), 1, 15, 16, 17 (page 16: one whole page shared, the rest each
/// request's own), 1000 and 32768 tokens; three-level cases (a prefix all share, then a
/// group prefix per half of the batch); own suffixes 0..300 (ragged_with_empty gives
/// request 1 none); batch 1..128; groups 1, 4, 7, 8, 16, 32; fp16/bf16; pages of 1 and
/// 16, shuffled; decode and append (causal and not). Kept to what the double reference
/// answers in seconds: the long prefixes run with few heads and requests.
inline std::vector<CaseSpec> cascade_grid() {
  struct Row {
    Mode mode;
    int batch, prefix, group_prefix, groups, suffix, qo_len, hq, hkv, head_dim, page;
    bool causal;
  };
  const Row rows[] = {
      // mode           batch prefix group x  suffix qo  hq hkv  D  page causal
      {Mode::decode, 1, 0, 0, 1, 300, 1, 8, 2, 128, 16, false},
      {Mode::decode, 5, 1, 0, 1, 64, 1, 4, 4, 128, 16, false},
      {Mode::decode, 33, 15, 0, 1, 200, 1, 7, 1, 64, 16, false},
      {Mode::decode, 128, 16, 0, 1, 40, 1, 32, 1, 128, 16, false},
      {Mode::decode, 6, 17, 0, 1, 1, 1, 16, 1, 256, 1, false},
      {Mode::decode, 33, 1000, 0, 1, 300, 1, 8, 1, 128, 16, false},
      {Mode::decode, 128, 1000, 0, 1, 17, 1, 8, 2, 64, 16, false},
      {Mode::decode, 3, 32768, 0, 1, 100, 1, 4, 1, 128, 16, false},
      {Mode::decode, 8, 100, 60, 2, 50, 1, 32, 4, 128, 16, false},
      {Mode::decode, 9, 16, 300, 3, 20, 1, 4, 1, 64, 1, false},
      {Mode::prefill, 4, 1000, 0, 1, 300, 17, 8, 2, 128, 16, true},
      {Mode::prefill, 3, 17, 0, 1, 64, 64, 32, 4, 128, 16, false},
      {Mode::prefill, 5, 16, 33, 2, 100, 40, 7, 1, 64, 1, true},
      {Mode::prefill, 2, 32768, 0, 1, 256, 256, 4, 1, 64, 16, true},
      {Mode::prefill, 6, 0, 0, 1, 90, 15, 16, 2, 256, 16, false},
      {Mode::prefill, 4, 600, 0, 1, 10, 30, 8, 8, 128, 16, true},  // qo_len > some suffixes
  };
  std::vector<CaseSpec> cases;
  int n = 0;
  for (const Row& r : rows) {
    CaseSpec c;
    c.mode = r.mode;
    c.batch_size = r.batch;
    c.shared_prefix = r.prefix;
    c.group_prefix = r.group_prefix;
    c.prefix_groups = r.groups;
    c.kv_len = std::max(1, r.suffix);
    c.qo_len = r.qo_len;
    c.num_qo_heads = r.hq;
    c.num_kv_heads = r.hkv;
    c.head_dim = r.head_dim;
    c.page_size = r.page;
    c.causal = r.causal;
    c.dtype = n % 2 ? DType::f16 : DType::bf16;
    c.kv_layout = kLayouts[(n / 2) % 2];
    c.lengths = r.batch > 1 && n % 3 != 2 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
    if (n % 5 == 4) c.logits_soft_cap = 30.0;
    ++n;
    cases.push_back(c);
  }
  return cases;
}

/// Stage 05 under compute-sanitizer: small cascades that reach every kernel (two and three
/// levels, split and unsplit levels, an empty shared level for some requests).
inline std::vector<CaseSpec> cascade_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  for (int i = 0; i < 3; ++i) {
    CaseSpec c;
    c.mode = i == 2 ? Mode::prefill : Mode::decode;
    c.batch_size = 4;
    c.shared_prefix = 300;  // longer than the shortest chunk (128 keys): the shared level splits
    c.group_prefix = i == 1 ? 32 : 0;
    c.prefix_groups = i == 1 ? 2 : 1;
    c.kv_len = 40;
    c.qo_len = 8;
    c.causal = i == 2;
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = i == 1 ? 64 : 128;
    c.dtype = i == 1 ? DType::f16 : DType::bf16;
    c.kv_layout = kLayouts[i % 2];
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  return cases;
}

/// The cache scales an FP8 grid cycles through (k_scale, v_scale): stored values near the
/// top of e4m3's range (keys up to 200, values up to 81), values below 1 where e4m3's
/// subnormals start to matter (a scale above 1), e5m2's wider range (keys up to 4096), and
/// scales that are no power of two, so the fp32 product sm_scale * k_scale rounds.
struct Scales {
  double k, v;
};
inline const Scales kFP8Scales[] = {{1.0 / 200, 0.0123}, {3.7, 1.0 / 64}, {1.0 / 4096, 3.7}, {0.011, 1.0 / 1024}};

/// `c`'s k_scale and v_scale from kFP8Scales: pair `which` (0 or 1) of the two for format `kv`
/// (e4m3's are the first two, e5m2's the last two).
inline void set_fp8_scales(CaseSpec& c, DType kv, int which) {
  const Scales& sc = kFP8Scales[(kv == DType::e4m3 ? 0 : 2) + which];
  c.k_scale = sc.k;
  c.v_scale = sc.v;
}

/// Decode over an FP8 cache (stages that declare kv_dtypes: 02 and 03): both formats, both
/// layouts, pages of 1 and 16, shuffled (and now and then sequential) pages, GQA groups
/// 1/4/8, head_dim 64/128/256, without scales and with each of kFP8Scales; q and o in
/// fp16 or bf16 by turns, ragged lengths from 1 key to several FP8 tiles (128 keys at
/// head_dim 128), now and then a request with none.
inline std::vector<CaseSpec> decode_fp8_grid() {
  std::vector<CaseSpec> cases;
  const int batches[] = {1, 5, 17};
  const int kv_lens[] = {1, 17, 97, 300};
  int n = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (KVLayout layout : kLayouts)
      for (int page : {1, 16})
        for (int group : {1, 4, 8})
          for (int head_dim : {64, 128, 256})
            for (bool scaled : {false, true}) {
              CaseSpec c;
              c.mode = Mode::decode;
              c.dtype = n % 2 ? DType::bf16 : DType::f16;
              c.kv_dtype = kv;
              c.kv_layout = layout;
              c.page_size = page;
              c.num_kv_heads = 2;
              c.num_qo_heads = 2 * group;
              c.head_dim = head_dim;
              c.batch_size = batches[(n / 2) % 3];
              c.kv_len = kv_lens[(n / 3) % 4];
              c.lengths = n % 7 == 3 && c.batch_size > 1 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
              c.page_order = n % 5 == 4 ? PageOrder::sequential : PageOrder::shuffled;
              if (scaled) {
                set_fp8_scales(c, kv, (n / 4) % 2);
              }
              ++n;
              cases.push_back(c);
            }
  return cases;
}

/// FP8 decode on the benchmark's head configuration (32/8 heads, head_dim 128) at lengths
/// that split (stage 03) and wrap the pipeline many times, and at batch 128 (blocks in
/// waves, 256-thread blocks); both formats, pages of 1 and 16, with and without scales.
inline std::vector<CaseSpec> decode_fp8_long_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (int kv_len : {2048, 16384, 256})
      for (int page : {1, 16}) {
        CaseSpec c;
        c.dtype = n % 2 ? DType::f16 : DType::bf16;
        c.kv_dtype = kv;
        c.kv_len = kv_len;
        c.batch_size = kv_len == 16384 ? 1 : kv_len == 2048 ? 4 : 128;
        c.page_size = page;
        c.kv_layout = kLayouts[(n / 2) % 2];
        if (n % 2) {
          set_fp8_scales(c, kv, (n / 4) % 2);
        }
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// FP8 decode cases small enough for compute-sanitizer: each format, layout and
/// head_dim, pages 1/16, group 7, an empty request, scales on half of them.
inline std::vector<CaseSpec> decode_fp8_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (DType kv : {DType::e4m3, DType::e5m2})
    for (int head_dim : {64, 128, 256}) {
      CaseSpec c;
      c.batch_size = 3;
      c.kv_len = n % 2 ? 300 : 37;
      c.page_size = n % 3 == 0 ? 1 : 16;
      c.num_qo_heads = n % 2 ? 7 : 32;
      c.num_kv_heads = n % 2 ? 1 : 8;
      c.head_dim = head_dim;
      c.dtype = n % 2 ? DType::f16 : DType::bf16;
      c.kv_dtype = kv;
      c.kv_layout = kLayouts[n % 2];
      c.lengths = n == 4 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
      if (n % 2 == 0) {
        set_fp8_scales(c, kv, (n / 2) % 2);
      }
      ++n;
      cases.push_back(c);
    }
  return cases;
}

/// Stage 04 over an FP8 cache: every third case of its prefill grid (append up to 4096
/// keys of prefix, causal and not, groups, head_dims, layouts, pages, window, soft cap)
/// and every other case of its decode grid (groups 16 and 32), on e4m3 and e5m2 pools by
/// turns, without scales and with kFP8Scales (also no power of two). The 16-bit-cache
/// grids of stages 02 and 03 (decode_fp8_*) reach it too, for the groups it takes.
inline std::vector<CaseSpec> tensor_core_fp8_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  auto add = [&](CaseSpec c) {
    const DType kv = n % 2 ? DType::e5m2 : DType::e4m3;
    c.kv_dtype = kv;
    if (n % 4 >= 2) {
      set_fp8_scales(c, kv, (n / 4) % 2);
    }
    ++n;
    cases.push_back(c);
  };
  const auto prefill = tensor_core_prefill_grid();
  for (size_t i = 0; i < prefill.size(); i += 3) add(prefill[i]);
  const auto decode = tensor_core_decode_grid();
  for (size_t i = 1; i < decode.size(); i += 2) add(decode[i]);
  return cases;
}

/// Stage 04 over an FP8 cache under compute-sanitizer: its sanitizer grid with e4m3 and
/// e5m2 pools by turns, scales on half.
inline std::vector<CaseSpec> tensor_core_fp8_sanitizer_grid() {
  std::vector<CaseSpec> cases = tensor_core_sanitizer_grid();
  for (size_t i = 0; i < cases.size(); ++i) {
    const DType kv = i % 2 ? DType::e5m2 : DType::e4m3;
    cases[i].kv_dtype = kv;
    if (i % 4 >= 2) {
      set_fp8_scales(cases[i], kv, 1);
    }
  }
  return cases;
}

/// Tails of the Hopper stage's tiles (128 packed query rows, 192 at head_dim 64; 128 keys,
/// 64 at head_dim 256): qo_len and kv_len one below, at and above each multiple, ragged
/// batches with an empty request, GQA groups that divide the tile (1, 4, 8, 32; at head_dim
/// 64 also 3, 6, 12 and 24), head_dim 64, 128 and 256, both 16-bit dtypes, causal and not.
/// Over ragged (contiguous) K/V the TMA reads tiles across request boundaries; over pages
/// the producer gathers them, pages of 1, 3, 16 and 64 tokens, NHD and HND.
inline std::vector<CaseSpec> hopper_tail_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  const Heads heads[] = {{32, 8}, {8, 8}, {32, 4}, {32, 1}};
  const int pages[] = {16, 1, 3, 64};
  const int head_dims[] = {128, 64, 256};  // head_dim 256 tiles 64 keys
  for (int qo_len : {1, 63, 65, 127, 129, 300})
    for (int kv_extra : {0, 1, 64, 190})
      for (bool causal : {false, true}) {
        CaseSpec c;
        c.mode = Mode::prefill;
        c.batch_size = n % 3 == 0 ? 1 : 5;
        c.qo_len = qo_len;
        c.kv_len = qo_len + kv_extra;
        c.num_qo_heads = heads[n % 4].qo;
        c.num_kv_heads = heads[n % 4].kv;
        c.head_dim = head_dims[(n / 2) % 3];
        c.dtype = (n / 3) % 2 ? DType::f16 : DType::bf16;
        c.causal = causal;
        c.lengths = n % 5 == 0 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        // the paged entry's gather: pages of 1, 3, 16 and 64 tokens, shuffled; a third of
        // the cases HND (those run on the paged stages only: ragged K/V is NHD)
        c.page_size = pages[n % 4];
        c.kv_layout = n % 3 == 2 ? KVLayout::HND : KVLayout::NHD;
        ++n;
        cases.push_back(c);
      }
  // head_dim 64's tiles of 192 rows take GQA groups that divide 192 and not 128 (3, 6, 12,
  // 24): rows of a third consumer warp group, and outputs written from registers (a
  // group that does not divide 64 has no output box)
  for (int group : {3, 6, 12, 24}) {
    CaseSpec c;
    c.mode = Mode::prefill;
    c.batch_size = 3;
    c.qo_len = group % 2 ? 65 : 129;
    c.kv_len = c.qo_len + 64;
    c.num_qo_heads = 2 * group;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.dtype = group > 6 ? DType::f16 : DType::bf16;
    c.causal = group % 12 != 0;
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  return cases;
}

/// MLA's prefill shape (DeepSeek-V3's naive form: q and k 192 wide, 128 + 64 rotary; v
/// and o 128), ragged: causal and not, the 128-row query tile's tails, keys past the
/// queries, an empty request; MHA as DeepSeek runs it, and a GQA group of 4.
inline std::vector<CaseSpec> mla_prefill_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  const Heads heads[] = {{16, 16}, {8, 8}, {16, 4}};
  for (int qo_len : {1, 65, 129, 300})
    for (int kv_extra : {0, 190})
      for (bool causal : {false, true}) {
        CaseSpec c;
        c.mode = Mode::prefill;
        c.batch_size = n % 3 == 0 ? 1 : 4;
        c.qo_len = qo_len;
        c.kv_len = qo_len + kv_extra;
        c.num_qo_heads = heads[n % 3].qo;
        c.num_kv_heads = heads[n % 3].kv;
        c.head_dim = 192;
        c.head_dim_vo = 128;
        c.dtype = n % 2 ? DType::f16 : DType::bf16;
        c.causal = causal;
        c.lengths = n % 4 == 0 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// MLA's prefill shape over pages: K's pool and V's own (DeviceBatch::v_pool). Pages of 1
/// (every tile gathered), 16 and 64 (a tile by the TMA page by page, a request's last tile
/// gathered), NHD and HND, shuffled pages, causal and not, an empty request, and a shared
/// prefix (pages held by several requests).
inline std::vector<CaseSpec> mla_paged_prefill_grid() {
  std::vector<CaseSpec> cases;
  int n = 0;
  for (int page_size : {1, 16, 64})
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
      for (bool causal : {false, true}) {
        CaseSpec c;
        c.mode = Mode::prefill;
        c.kv_layout = layout;
        c.page_size = page_size;
        c.batch_size = n % 3 == 0 ? 1 : 3;
        c.qo_len = n % 2 ? 129 : 65;
        c.kv_len = c.qo_len + (n % 4 < 2 ? 300 : 0);
        c.num_qo_heads = n % 3 == 2 ? 16 : 8;
        c.num_kv_heads = n % 3 == 2 ? 4 : 8;
        c.head_dim = 192;
        c.head_dim_vo = 128;
        c.dtype = n % 2 ? DType::f16 : DType::bf16;
        c.causal = causal;
        c.lengths = n % 4 == 1 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        if (n % 5 == 4) c.shared_prefix = 2 * page_size + 3;
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// One long request (4096 causal and not, 16384 and 32768 causal): many K/V ring wraps
/// and query tiles; and a batch of more units than multiprocessors.
inline std::vector<CaseSpec> hopper_long_grid() {
  std::vector<CaseSpec> cases;
  // few heads: the double-precision reference costs O(len^2 * heads)
  for (int len : {4096, 16384, 32768})
    for (bool causal : {true, false}) {
      if (len > 4096 && !causal) continue;
      CaseSpec c;
      c.mode = Mode::prefill;
      c.batch_size = 1;
      c.qo_len = len;
      c.kv_len = len;
      c.num_qo_heads = len > 4096 ? 1 : 4;
      c.num_kv_heads = 1;
      c.head_dim = 128;
      c.causal = causal;
      c.lengths = LengthPolicy::uniform;
      cases.push_back(c);
    }
  // more (work item, kv head) units than multiprocessors: more than one wave of blocks
  for (bool causal : {true, false}) {
    CaseSpec c;
    c.mode = Mode::prefill;
    c.batch_size = 4;
    c.qo_len = 256;
    c.kv_len = 512;
    c.causal = causal;
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  return cases;
}

/// RoPE in the loads (pos_encoding rope_llama): stage 03's decode (head_dim 64 and 128,
/// fp16/bf16) and stage 04's prefill and large-group decode. kv_len from one key to long
/// enough that stage 03 splits (so chunks start at positions past 0); both layouts, page
/// sizes 1 and 16, GQA groups 1 to 8, two (rope_scale, rope_theta) pairs: FlashInfer's
/// defaults (1, 1e4) and Llama 3's (8, 5e5).
struct RopeParams {
  double scale, theta;
};
inline const RopeParams kRopeParams[] = {{1.0, 1e4}, {8.0, 5e5}};

inline std::vector<CaseSpec> rope_decode_grid() {
  std::vector<CaseSpec> cases;
  const Heads heads[] = {{32, 8}, {8, 8}, {28, 4}, {7, 1}, {8, 2}};
  int n = 0;
  for (int batch : {1, 5, 9})
    for (int kv_len : {1, 17, 300, 2048})
      for (Heads h : heads) {
        if (kv_len == 2048 && batch * h.kv > 10) continue;  // the double reference's cost
        CaseSpec c;
        c.mode = Mode::decode;
        c.pos_encoding = stages::PosEncoding::rope_llama;
        c.rope_scale = kRopeParams[n % 2].scale;
        c.rope_theta = kRopeParams[n % 2].theta;
        c.batch_size = batch;
        c.kv_len = kv_len;
        c.num_qo_heads = h.qo;
        c.num_kv_heads = h.kv;
        c.head_dim = (n / 2) % 2 ? 64 : 128;
        c.dtype = (n / 3) % 2 ? DType::bf16 : DType::f16;
        c.kv_layout = kLayouts[(n / 5) % 2];
        c.page_size = n % 3 == 0 ? 1 : 16;
        c.lengths = batch == 5 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        ++n;
        cases.push_back(c);
      }
  return cases;
}

/// The prefill and append cases of a feature of stages/ (stage 04's tiles): appends
/// (qo_len < kv_len) and prompts (qo_len == kv_len), causal or not, groups 1 to 32 (group
/// 32 is its large-group decode), every head_dim; `feature(c, n)` turns case n into the
/// feature's.
template <typename Feature>
std::vector<CaseSpec> feature_prefill_grid(Feature feature) {
  std::vector<CaseSpec> cases;
  const int groups[] = {1, 4, 7, 32};
  const int head_dims[] = {64, 128, 256};
  int n = 0;
  for (int qo_len : {1, 17, 128, 200})
    for (int extra : {0, 45, 700})
      for (bool causal : {false, true}) {
        CaseSpec c;
        c.mode = Mode::prefill;
        c.qo_len = qo_len;
        c.kv_len = qo_len + extra;
        c.causal = causal;
        c.batch_size = qo_len * c.kv_len > 100000 ? 1 : 3;
        const int group = groups[(n / 2) % 4];
        c.num_kv_heads = group == 32 ? 1 : 2;
        c.num_qo_heads = group * c.num_kv_heads;
        c.head_dim = head_dims[n % 3];
        c.dtype = (n / 3) % 2 ? DType::bf16 : DType::f16;
        c.kv_layout = kLayouts[(n / 4) % 2];
        c.page_size = n % 5 == 0 ? 1 : 16;
        c.lengths = n % 4 == 1 ? LengthPolicy::uniform : LengthPolicy::ragged;
        feature(c, n++);
        cases.push_back(c);
      }
  return cases;
}

/// RoPE in the loads (stages/rope/) in stage 04's prefill and appends.
inline std::vector<CaseSpec> rope_prefill_grid() {
  return feature_prefill_grid([](CaseSpec& c, int n) {
    c.pos_encoding = stages::PosEncoding::rope_llama;
    c.rope_scale = kRopeParams[n % 2].scale;
    c.rope_theta = kRopeParams[n % 2].theta;
  });
}

/// Attention sinks (stages/sinks/) in the prefill and appends of stages 04 and 07, a third
/// of the cases with a sliding window too.
inline std::vector<CaseSpec> sinks_prefill_grid() {
  return feature_prefill_grid([](CaseSpec& c, int n) {
    c.sinks = true;
    if (n % 3 == 2) c.window_left = 40;  // gpt-oss's layers slide a window beside their sinks
  });
}

/// The decode cases of a feature of stages/ (a policy of kernels/attention_policy.cuh):
/// every head_dim, GQA groups 1 to 8, both layouts, pages of 1 and 16, lengths from 1 to
/// 2048 with an empty request in the batch of 5, fp16 and bf16; `feature(c, n)` turns case
/// n into the feature's.
template <typename Feature>
std::vector<CaseSpec> feature_decode_grid(Feature feature) {
  std::vector<CaseSpec> cases;
  const Heads heads[] = {{32, 8}, {8, 8}, {28, 4}, {7, 1}};
  int n = 0;
  for (int batch : {1, 5, 9})
    for (int kv_len : {1, 17, 300, 2048})
      for (Heads h : heads) {
        if (kv_len == 2048 && batch * h.kv > 10) continue;  // the double reference's cost
        CaseSpec c;
        c.mode = Mode::decode;
        c.batch_size = batch;
        c.kv_len = kv_len;
        c.num_qo_heads = h.qo;
        c.num_kv_heads = h.kv;
        c.head_dim = n % 3 == 0 ? 64 : n % 3 == 1 ? 128 : 256;
        c.dtype = (n / 2) % 2 ? DType::bf16 : DType::f16;
        c.kv_layout = kLayouts[(n / 5) % 2];
        c.page_size = n % 4 == 0 ? 1 : 16;
        c.lengths = batch == 5 ? LengthPolicy::ragged_with_empty : LengthPolicy::ragged;
        feature(c, n++);
        cases.push_back(c);
      }
  return cases;
}

/// Attention sinks in decode (stages/sinks/): the empty request's o must be 0 and its lse
/// the sink.
inline std::vector<CaseSpec> sinks_decode_grid() {
  return feature_decode_grid([](CaseSpec& c, int) { c.sinks = true; });
}

/// The logits soft cap in decode (stages/soft_cap/): caps from far below the scores (5) to
/// Gemma 2's 50; q drawn wider on some cases, so that scores pass the cap many times over.
inline std::vector<CaseSpec> soft_cap_decode_grid() {
  return feature_decode_grid([](CaseSpec& c, int n) {
    const double caps[] = {5.0, 30.0, 50.0};
    c.logits_soft_cap = caps[(n / 3) % 3];
    c.q_range = n % 4 == 3 ? 8.0 : 1.0;
  });
}

/// RoPE in the loads under compute-sanitizer: a few small cases of each stage.
inline std::vector<CaseSpec> rope_sanitizer_grid() {
  std::vector<CaseSpec> cases;
  for (int n = 0; n < 4; ++n) {
    CaseSpec c;
    c.pos_encoding = stages::PosEncoding::rope_llama;
    c.mode = n < 2 ? Mode::decode : Mode::prefill;
    c.batch_size = 3;
    c.kv_len = n % 2 ? 700 : 40;
    c.qo_len = n == 2 ? 40 : 9;
    c.causal = n == 2;
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim = n == 1 ? 64 : 128;
    c.dtype = n % 2 ? DType::bf16 : DType::f16;
    c.kv_layout = kLayouts[n % 2];
    c.page_size = n == 0 ? 1 : 16;
    c.lengths = LengthPolicy::ragged_with_empty;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace flashstep::stages::harness::grids
