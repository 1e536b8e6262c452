// Building a validation case: draw lengths and a page table, draw inputs rounded to the
// dtype, lay them out as the stage expects, and ask the reference for the answer.
#include "harness/case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/fp8.hpp"
#include "flashstep/reference/rope_fp32.hpp"
#include "harness/dtype_convert.hpp"

namespace flashstep::stages::harness {

const char* to_string(LengthPolicy policy) {
  switch (policy) {
    case LengthPolicy::uniform: return "uniform";
    case LengthPolicy::ragged: return "ragged";
    case LengthPolicy::ragged_with_empty: return "ragged_with_empty";
    case LengthPolicy::spread: return "spread";
  }
  return "?";
}

const char* to_string(PageOrder order) { return order == PageOrder::sequential ? "sequential" : "shuffled"; }

std::string CaseSpec::describe() const {
  std::ostringstream s;
  s << to_string(mode) << ' ' << to_string(dtype);
  if (kv_dtype && *kv_dtype != dtype) s << " kv=" << to_string(*kv_dtype);
  if (k_scale != 1.0 || v_scale != 1.0) s << " k_scale=" << k_scale << " v_scale=" << v_scale;
  if (q_range != 1.0) s << " q_range=" << q_range;
  s << ' ' << ref::to_string(kv_layout) << " batch=" << batch_size << " kv_len=" << kv_len;
  if (mode == Mode::prefill) s << " qo_len=" << qo_len << (causal ? " causal" : " non-causal");
  if (window_left >= 0) s << " window_left=" << window_left;
  if (logits_soft_cap > 0) s << " soft_cap=" << logits_soft_cap;
  s << " heads=" << num_qo_heads << '/' << num_kv_heads << " head_dim=" << head_dim;
  if (head_dim_vo > 0 && head_dim_vo != head_dim) s << " head_dim_vo=" << head_dim_vo;
  s << " page=" << page_size << ' ' << to_string(lengths) << ' ' << to_string(page_order);
  if (shared_prefix > 0) s << " shared_prefix=" << shared_prefix;
  if (group_prefix > 0) s << " group_prefix=" << group_prefix << 'x' << prefix_groups;
  if (pos_encoding != PosEncoding::none)
    s << ' ' << to_string(pos_encoding) << " rope_scale=" << rope_scale << " rope_theta=" << rope_theta
      << (rope_rounded ? " rotated-rounded" : " rotated-fp32");
  if (sinks) s << " sinks";
  return s.str();
}

CaseSpec for_stage(CaseSpec spec, const StageInfo& stage) {
  spec.rope_rounded = spec.pos_encoding == PosEncoding::rope_llama && stage.rope_rounds_to_dtype;
  return spec;
}

uint64_t case_seed(uint64_t run_seed, const std::string& case_text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the text
  for (unsigned char c : case_text) h = (h ^ c) * 1099511628211ull;
  uint64_t z = run_seed ^ h;  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {

void check_spec(const CaseSpec& spec, KVStorage storage) {
  const char* fn = "build_case";
  ref::require(spec.batch_size >= 1, fn, "batch_size must be >= 1 (got " + std::to_string(spec.batch_size) + ")");
  ref::require(spec.kv_len >= 1, fn, "kv_len must be >= 1 (got " + std::to_string(spec.kv_len) + ")");
  ref::require(spec.qo_len >= 1, fn, "qo_len must be >= 1 (got " + std::to_string(spec.qo_len) + ")");
  ref::require(spec.head_dim >= 1, fn, "head_dim must be >= 1");
  ref::require(spec.head_dim_vo >= 0, fn, "head_dim_vo must be 0 (head_dim) or positive");
  if (spec.head_dim_vo != 0 && spec.head_dim_vo != spec.head_dim)
    ref::require((!spec.kv_dtype || *spec.kv_dtype == spec.dtype) && spec.k_scale == 1.0 && spec.v_scale == 1.0 &&
                     spec.pos_encoding == PosEncoding::none,
                 fn, "head_dim_vo != head_dim (MLA's prefill) is built with K/V in q's dtype, unscaled, without RoPE");
  ref::check_heads(fn, spec.num_qo_heads, spec.num_kv_heads);
  ref::require(storage != KVStorage::paged || spec.page_size >= 1, fn,
               "page_size must be >= 1 (got " + std::to_string(spec.page_size) + ")");
  ref::require(storage != KVStorage::ragged || spec.kv_layout == KVLayout::NHD, fn,
               "ragged KV is stored NHD; kv_layout HND applies to paged storage only");
  ref::require(spec.shared_prefix >= 0 && spec.group_prefix >= 0, fn, "shared_prefix and group_prefix must be >= 0");
  ref::require(spec.prefix_groups >= 1 && spec.prefix_groups <= spec.batch_size, fn,
               "prefix_groups must be in 1..batch_size (got " + std::to_string(spec.prefix_groups) + ")");
  ref::require(storage == KVStorage::paged || (spec.shared_prefix == 0 && spec.group_prefix == 0), fn,
               "a shared prefix needs paged storage (ragged requests cannot share rows)");
  ref::require(std::isfinite(spec.k_scale) && spec.k_scale > 0 && std::isfinite(spec.v_scale) && spec.v_scale > 0, fn,
               "k_scale and v_scale must be positive and finite");
  ref::require(std::isfinite(spec.q_range) && spec.q_range > 0, fn, "q_range must be positive and finite");
}

std::vector<int32_t> draw_lengths(int batch, int longest, LengthPolicy policy, std::mt19937_64& rng) {
  std::vector<int32_t> len(static_cast<size_t>(batch), longest);
  if (policy == LengthPolicy::uniform) return len;
  if (policy == LengthPolicy::spread) {
    for (int i = 0; i + 1 < batch; ++i)
      len[static_cast<size_t>(i)] = static_cast<int32_t>(
          std::lround(longest / 32.0 * std::pow(32.0, static_cast<double>(i) / (batch - 1))));
    return len;
  }
  const int lo = policy == LengthPolicy::ragged_with_empty ? 0 : 1;
  std::uniform_int_distribution<int> dist(lo, longest);
  for (int i = 1; i < batch; ++i) len[static_cast<size_t>(i)] = dist(rng);
  if (policy == LengthPolicy::ragged_with_empty && batch > 1) len[1] = 0;
  return len;
}

std::vector<int32_t> exclusive_scan(const std::vector<int32_t>& len) {
  std::vector<int32_t> indptr(len.size() + 1, 0);
  for (size_t i = 0; i < len.size(); ++i) indptr[i + 1] = indptr[i] + len[i];
  return indptr;
}

ref::Tensor random_rounded(std::mt19937_64& rng, std::vector<int64_t> shape, double lo, double hi, DType dtype,
                           double scale = 1.0) {
  ref::Tensor t(std::move(shape));
  std::uniform_real_distribution<double> dist(lo, hi);
  for (double& x : t.data) x = round_to(dtype, dist(rng) / scale);
  return t;
}

/// `t` times `scale`, in double.
ref::Tensor scaled(ref::Tensor t, double scale) {
  for (double& x : t.data) x *= scale;
  return t;
}

/// A tensor of values representable in FP8 `dtype` (or NaN) as the reference's FP8 tensor.
ref::FP8Tensor as_fp8(const ref::Tensor& t, DType dtype) {
  return ref::quantize(t, dtype == DType::e4m3 ? ref::FP8Format::e4m3 : ref::FP8Format::e5m2);
}

}  // namespace

CaseLayout make_layout(const CaseSpec& spec, KVStorage storage, std::mt19937_64& rng) {
  check_spec(spec, storage);
  CaseLayout out;
  BatchShape& s = out.shape;
  s.mode = spec.mode;
  s.storage = storage;
  s.dtype = spec.dtype;
  s.kv_layout = spec.kv_layout;
  s.batch_size = spec.batch_size;
  s.num_qo_heads = spec.num_qo_heads;
  s.num_kv_heads = spec.num_kv_heads;
  s.head_dim = spec.head_dim;
  s.head_dim_vo = spec.head_dim_vo == spec.head_dim ? 0 : spec.head_dim_vo;
  s.causal = spec.mode == Mode::prefill && spec.causal;
  s.window_left = spec.window_left;
  s.logits_soft_cap = static_cast<float>(spec.logits_soft_cap);
  s.kv_dtype = spec.kv_dtype;
  s.k_scale = static_cast<float>(spec.k_scale);
  s.v_scale = static_cast<float>(spec.v_scale);
  s.pos_encoding = spec.pos_encoding;
  s.rope_scale = static_cast<float>(spec.rope_scale);
  s.rope_theta = static_cast<float>(spec.rope_theta);
  // sm_scale stays unset: the stages and the reference both apply 1/sqrt(head_dim).

  const std::vector<int32_t> kv_lens = draw_lengths(spec.batch_size, spec.kv_len, spec.lengths, rng);
  std::vector<int32_t> qo_lens(static_cast<size_t>(spec.batch_size), 1);
  if (spec.mode == Mode::prefill) {
    const LengthPolicy qo_policy = spec.lengths == LengthPolicy::uniform || spec.lengths == LengthPolicy::spread
                                       ? spec.lengths
                                       : LengthPolicy::ragged;
    qo_lens = draw_lengths(spec.batch_size, spec.qo_len, qo_policy, rng);
  }
  s.qo_indptr = exclusive_scan(qo_lens);

  if (storage == KVStorage::ragged) {
    s.kv_indptr = exclusive_scan(kv_lens);
    return out;
  }
  s.page_size = spec.page_size;
  const int P = spec.page_size;
  // Request b: shared_prefix + group_prefix tokens it shares, then its own kv_lens[b].
  // Whole pages below shared_prefix are shared by all; whole pages below shared_prefix +
  // group_prefix (and not shared by all) by its group; the rest are its own.
  const int prefix = spec.shared_prefix + spec.group_prefix;
  const int all_pages = spec.shared_prefix / P, group_pages = prefix / P - all_pages;
  s.kv_indptr.push_back(0);
  for (int32_t own : kv_lens) {
    const int32_t len = prefix + own;
    const int32_t pages = (len + P - 1) / P;
    s.kv_indptr.push_back(s.kv_indptr.back() + pages);
    s.kv_last_page_len.push_back(pages == 0 ? 0 : len - (pages - 1) * P);
  }
  const int64_t entries = s.kv_indptr.back();
  const int64_t used = entries - int64_t{spec.batch_size - 1} * all_pages -
                       int64_t{spec.batch_size - spec.prefix_groups} * group_pages;
  s.num_pages = used + used / 4 + 1;  // spare pages nobody owns: reading one is a bug
  std::vector<int32_t> order(static_cast<size_t>(s.num_pages));
  std::iota(order.begin(), order.end(), 0);
  if (spec.page_order == PageOrder::shuffled) std::shuffle(order.begin(), order.end(), rng);
  size_t next = 0;
  const std::vector<int32_t> shared_ids(order.begin(), order.begin() + all_pages);
  next += static_cast<size_t>(all_pages);
  std::vector<std::vector<int32_t>> group_ids(static_cast<size_t>(spec.prefix_groups));
  for (auto& ids : group_ids) {
    ids.assign(order.begin() + static_cast<std::ptrdiff_t>(next),
               order.begin() + static_cast<std::ptrdiff_t>(next) + group_pages);
    next += static_cast<size_t>(group_pages);
  }
  for (int b = 0; b < spec.batch_size; ++b) {
    const int64_t pages = s.kv_indptr[b + 1] - s.kv_indptr[b];
    const auto& group = group_ids[static_cast<size_t>(int64_t{b} * spec.prefix_groups / spec.batch_size)];
    for (int64_t k = 0; k < pages; ++k) {
      if (k < all_pages) out.kv_indices.push_back(shared_ids[static_cast<size_t>(k)]);
      else if (k < all_pages + group_pages) out.kv_indices.push_back(group[static_cast<size_t>(k - all_pages)]);
      else out.kv_indices.push_back(order[next++]);
    }
  }
  s.kv_indices = out.kv_indices;
  return out;
}

HostCase build_case(const CaseSpec& spec, KVStorage storage, uint64_t seed) {
  const char* fn = "build_case";
  std::mt19937_64 rng(seed);
  HostCase c;
  c.spec = spec;
  c.seed = seed;
  c.layout = make_layout(spec, storage, rng);
  const BatchShape& s = c.layout.shape;
  const int64_t H = s.num_kv_heads, D = s.head_dim;

  c.q = random_rounded(rng, {s.nnz_qo(), s.num_qo_heads, D}, -3.0 * spec.q_range, 3.0 * spec.q_range, s.dtype);
  ref::AttentionOptions opt;
  opt.causal = s.causal;
  opt.window_left = s.window_left;
  opt.logits_soft_cap = s.logits_soft_cap;
  opt.sm_scale = s.sm_scale;
  opt.kv_layout = KVLayout::NHD;
  if (spec.sinks) {
    // From a stream of their own, so that the rest of the case is the same with or without
    // them: one logit per query head in [-2, 8], from negligible next to the keys' sum to
    // most of the denominator; fp32, as the stage reads them.
    std::mt19937_64 sink_rng(seed ^ 0x5eedf00dull);
    std::uniform_real_distribution<double> dist(-2.0, 8.0);
    for (int h = 0; h < s.num_qo_heads; ++h) c.sinks.push_back(static_cast<float>(dist(sink_rng)));
    opt.sinks.assign(c.sinks.begin(), c.sinks.end());
  }

  // Every request's K/V, contiguous (nnz_kv, H, D). The reference answers from these
  // with its ragged entry point whatever the storage: the arithmetic is the same as its
  // paged one (which gathers pages to exactly these rows first), and it does not walk
  // the page table element by element, which takes seconds on the larger cases.
  std::vector<int32_t> token_indptr(static_cast<size_t>(s.batch_size) + 1, 0);
  for (int b = 0; b < s.batch_size; ++b) token_indptr[b + 1] = token_indptr[b] + static_cast<int32_t>(s.kv_len(b));
  const int64_t nnz_kv = token_indptr.back();
  // K/V as stored: in the K/V dtype, divided by their scales (the float values the stage
  // gets, so the reference multiplies back exactly what the stage does).
  const DType kv_dtype = s.resolved_kv_dtype();
  const ref::KVScales scales{s.k_scale, s.v_scale};
  const bool unscaled = scales.k_scale == 1.0 && scales.v_scale == 1.0;
  ref::Tensor k = random_rounded(rng, {nnz_kv, H, D}, -1.0, 1.0, kv_dtype, scales.k_scale);
  ref::Tensor v = random_rounded(rng, {nnz_kv, H, s.resolved_head_dim_vo()}, -1.0, 1.0, kv_dtype, scales.v_scale);
  // A page held by several requests (a shared prefix) holds one set of rows: every
  // holder's rows of that page become a copy of its first holder's, before the answer.
  if (storage == KVStorage::paged) {
    const int64_t P = s.page_size;
    std::vector<int64_t> first_row(static_cast<size_t>(s.num_pages), -1);  // row of slot 0
    for (int b = 0; b < s.batch_size; ++b)
      for (int64_t t = 0; t < s.kv_len(b); t += P) {
        const int32_t page = c.layout.kv_indices[static_cast<size_t>(s.kv_indptr[b] + t / P)];
        const int64_t row = token_indptr[b] + t;
        int64_t& owner = first_row[static_cast<size_t>(page)];
        if (owner < 0) {
          owner = row;
          continue;
        }
        for (ref::Tensor* x : {&k, &v}) {
          const int64_t width = x->dim(2);  // head_dim, or v's head_dim_vo
          const int64_t n = std::min<int64_t>(P, s.kv_len(b) - t) * H * width;
          std::copy(x->data.begin() + owner * H * width, x->data.begin() + owner * H * width + n,
                    x->data.begin() + row * H * width);
        }
      }
  }
  // RoPE inside the stage: the pool keeps k as drawn; the reference attends with q and k
  // rotated as the stage rotates them (query row i of a request at kv_len - qo_len + i,
  // key j at j), in fp32 by ref::rope_llama_fp32, then rounded to the dtype where the
  // stage rounds them.
  const bool rope = s.pos_encoding == PosEncoding::rope_llama;
  if (rope) {
    ref::require(!is_fp8(kv_dtype) && unscaled, fn, "rope_llama cases keep K/V in q's dtype, unscaled");
    const std::vector<double> turns = ref::rope_llama_turns(D, s.rope_scale, s.rope_theta);
    std::vector<int64_t> q_pos, k_pos;
    for (int b = 0; b < s.batch_size; ++b) {
      const int64_t qo_len = s.qo_indptr[b + 1] - s.qo_indptr[b];
      for (int64_t i = 0; i < qo_len; ++i) q_pos.push_back(s.kv_len(b) - qo_len + i);
      for (int64_t j = 0; j < s.kv_len(b); ++j) k_pos.push_back(j);
    }
    ref::Tensor q_rot = ref::rope_llama_fp32(c.q, q_pos, turns);
    ref::Tensor k_rot = ref::rope_llama_fp32(k, k_pos, turns);
    if (spec.rope_rounded) {
      round_all(s.dtype, q_rot.data);
      round_all(s.dtype, k_rot.data);
    }
    c.expected = ref::batch_prefill_with_ragged_kv_cache(q_rot, s.qo_indptr, k_rot, v, token_indptr, opt);
  } else if (is_fp8(kv_dtype))
    c.expected = ref::batch_prefill_with_ragged_kv_cache(c.q, s.qo_indptr, as_fp8(k, kv_dtype), as_fp8(v, kv_dtype),
                                                         token_indptr, scales, opt);
  else if (unscaled) c.expected = ref::batch_prefill_with_ragged_kv_cache(c.q, s.qo_indptr, k, v, token_indptr, opt);
  else
    c.expected = ref::batch_prefill_with_ragged_kv_cache(c.q, s.qo_indptr, scaled(k, scales.k_scale),
                                                         scaled(v, scales.v_scale), token_indptr, opt);
  if (storage == KVStorage::ragged) {
    c.k = std::move(k);
    c.v = std::move(v);
    return c;
  }

  // Paged: start from a pool of NaN, so that a kernel reading a slot no request owns
  // (a spare page, or past last_page_len) poisons its output and fails the check; then
  // copy each token's rows to (page, slot) through the page table.
  // V of another width than K (MLA's prefill) keeps a pool of its own, and K's then holds
  // K alone: (num_pages, 1, ...) each (ref::PagedKVCache::v_pages).
  ref::PagedKVCache& p = c.paged;
  p.layout = s.kv_layout;
  const int64_t P = s.page_size, Dv = s.resolved_head_dim_vo();
  const bool own_v = Dv != D;
  const auto pool = [&](int64_t planes, int64_t width) {
    ref::Tensor t = s.kv_layout == KVLayout::NHD ? ref::Tensor({s.num_pages, planes, P, H, width})
                                                 : ref::Tensor({s.num_pages, planes, H, P, width});
    std::fill(t.data.begin(), t.data.end(), std::numeric_limits<double>::quiet_NaN());
    return t;
  };
  p.pages = pool(own_v ? 1 : 2, D);
  if (own_v) p.v_pages = pool(1, Dv);
  p.kv_indptr = s.kv_indptr;
  p.kv_indices = c.layout.kv_indices;
  p.kv_last_page_len = s.kv_last_page_len;
  const bool hnd = s.kv_layout == KVLayout::HND;
  for (int b = 0; b < s.batch_size; ++b)
    for (int64_t t = 0; t < s.kv_len(b); ++t) {
      const int64_t page = p.kv_indices[static_cast<size_t>(p.kv_indptr[b] + t / P)], slot = t % P;
      const int64_t row = token_indptr[b] + t;
      for (int kv = 0; kv < 2; ++kv)
        for (int64_t h = 0; h < H; ++h) {
          // (page, plane, slot, head) of K's pool, or of V's own: plane 0 of one of them
          const int64_t planes = own_v ? 1 : 2, plane = own_v ? 0 : kv, width = kv ? Dv : D;
          const int64_t dst = hnd ? (((page * planes + plane) * H + h) * P + slot) * width
                                  : (((page * planes + plane) * P + slot) * H + h) * width;
          const double* src = (kv ? v : k).data.data() + (row * H + h) * width;
          std::copy(src, src + width, (own_v && kv ? p.v_pages : p.pages).data.begin() + dst);
        }
    }
  // On small cases, the reference's own paged entry point must give the same answer from
  // this pool: that checks the scatter above against the reference's reading of pages.
  if (p.pages.numel() <= (int64_t{1} << 20) && !rope) {  // (a rope case's answer is of rotated keys)
    ref::FP8PagedKVCache p8;
    ref::PagedKVCache pool = p;  // a cache of another dtype, with its scales applied
    if (is_fp8(kv_dtype)) {
      p8.pages = as_fp8(p.pages, kv_dtype);
      p8.layout = p.layout;
      p8.kv_indptr = p.kv_indptr;
      p8.kv_indices = p.kv_indices;
      p8.kv_last_page_len = p.kv_last_page_len;
    } else if (!unscaled) {
      const int64_t half = p.pages.numel() / (s.num_pages * 2);  // K or V of one page
      for (int64_t page = 0; page < s.num_pages; ++page)
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t i = 0; i < half; ++i)
            pool.pages.data[static_cast<size_t>((page * 2 + kv) * half + i)] *= kv ? scales.v_scale : scales.k_scale;
    }
    const ref::AttentionResult paged_ref =
        is_fp8(kv_dtype)
            ? (s.mode == Mode::decode ? ref::batch_decode_with_paged_kv_cache(c.q, p8, scales, opt)
                                      : ref::batch_prefill_with_paged_kv_cache(c.q, s.qo_indptr, p8, scales, opt))
            : (s.mode == Mode::decode ? ref::batch_decode_with_paged_kv_cache(c.q, pool, opt)
                                      : ref::batch_prefill_with_paged_kv_cache(c.q, s.qo_indptr, pool, opt));
    for (size_t i = 0; i < paged_ref.o.data.size(); ++i)
      ref::require(paged_ref.o.data[i] == c.expected.o.data[i], "build_case",
                   "internal: the pool does not hold what the page table says (o differs at " + std::to_string(i) +
                       ")");
  }
  return c;
}

}  // namespace flashstep::stages::harness
