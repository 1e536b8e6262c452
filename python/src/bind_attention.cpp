// Attention entry points under FlashInfer's names and keyword arguments.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "bindings.hpp"
#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/errors.hpp"

namespace flashstep::python {

namespace {

// kv_layout, or an error that names the function and says what each layout holds.
ref::KVLayout parse_layout(const std::string& kv_layout, const char* fn) {
  if (kv_layout == "NHD") return ref::KVLayout::NHD;
  if (kv_layout == "HND") return ref::KVLayout::HND;
  throw ref::InvalidArgument(std::string(fn) +
                             ": kv_layout must be \"NHD\" (pages of (page_size, num_kv_heads, head_dim), K/V of "
                             "(kv_len, num_kv_heads, head_dim)) or \"HND\" (num_kv_heads first); got \"" +
                             kv_layout + "\"");
}

ref::AttentionOptions make_options(const char* fn, bool causal, const std::string& kv_layout,
                                   std::optional<double> sm_scale, int window_left,
                                   std::optional<double> logits_soft_cap) {
  ref::AttentionOptions opt;
  opt.causal = causal;
  opt.kv_layout = parse_layout(kv_layout, fn);
  opt.sm_scale = sm_scale;
  opt.window_left = window_left;
  opt.logits_soft_cap = logits_soft_cap.value_or(0.0);
  return opt;
}

// A pool built in one layout and passed under the other reads its page size off the
// wrong axis, and the reference would then report a kv_last_page_len that does not fit it.
// Where every last page fits the other layout's page size and one does not fit this
// layout's, say what happened instead.
void check_pool_layout(const ref::PagedKVCache& c, const char* fn) {
  if (c.pages.shape.size() != 5 || c.kv_last_page_len.empty()) return;
  const bool nhd = c.layout == ref::KVLayout::NHD;
  const int64_t page_size = c.pages.dim(nhd ? 2 : 3), other_page_size = c.pages.dim(nhd ? 3 : 2);
  const int32_t longest = *std::max_element(c.kv_last_page_len.begin(), c.kv_last_page_len.end());
  const int32_t shortest = *std::min_element(c.kv_last_page_len.begin(), c.kv_last_page_len.end());
  if (longest <= page_size || longest > other_page_size || shortest < 1) return;
  const char* shown = nhd ? "NHD" : "HND";
  const char* other = nhd ? "HND" : "NHD";
  throw ref::InvalidArgument(std::string(fn) + ": paged_kv_cache looks like " + other + ", kv_layout says " + shown +
                             ": its shape " + ref::shape_string(c.pages.shape) + " read as " + shown +
                             " has page_size " + std::to_string(page_size) + ", which a kv_last_page_len of " +
                             std::to_string(longest) + " does not fit; read as " + other + " it has page_size " +
                             std::to_string(other_page_size) + ". Pass kv_layout=\"" + other +
                             "\", or lay the pool out as " + shown);
}

}  // namespace

ref::PagedKVCache to_paged_cache(const py::handle& paged_kv_cache, const py::handle& kv_indptr,
                                 const py::handle& kv_indices, const py::handle& kv_last_page_len,
                                 const std::string& kv_layout, const char* fn) {
  ref::PagedKVCache c;
  c.layout = parse_layout(kv_layout, fn);
  if (py::isinstance<py::tuple>(paged_kv_cache) || py::isinstance<py::list>(paged_kv_cache)) {
    auto seq = py::reinterpret_borrow<py::sequence>(paged_kv_cache);
    if (seq.size() != 2)
      throw ref::InvalidArgument(std::string(fn) + ": paged_kv_cache as a tuple must be (k_cache, v_cache)");
    ref::Tensor k = to_tensor(seq[0], fn, "paged_kv_cache[0] (k_cache)");
    ref::Tensor v = to_tensor(seq[1], fn, "paged_kv_cache[1] (v_cache)");
    ref::check_rank(fn, "k_cache", k, 4);
    ref::check_rank(fn, "v_cache", v, 4);
    ref::require(k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1) && k.dim(2) == v.dim(2), fn,
                 "k_cache and v_cache must have the same shape but for the last dimension (head_dim_vo), got " +
                     ref::shape_string(k.shape) + " and " + ref::shape_string(v.shape));
    if (k.shape != v.shape) {  // V of its own width: two pools (PagedKVCache::v_pages)
      c.pages = ref::Tensor({k.dim(0), 1, k.dim(1), k.dim(2), k.dim(3)}, std::move(k.data));
      c.v_pages = ref::Tensor({v.dim(0), 1, v.dim(1), v.dim(2), v.dim(3)}, std::move(v.data));
    } else {  // one pool, K and V interleaved page by page
      const int64_t per_page = k.numel() / std::max<int64_t>(k.dim(0), 1);
      c.pages = ref::Tensor({k.dim(0), 2, k.dim(1), k.dim(2), k.dim(3)});
      for (int64_t p = 0; p < k.dim(0); ++p)
        for (int64_t e = 0; e < per_page; ++e) {
          c.pages.data[static_cast<size_t>((2 * p) * per_page + e)] = k.data[static_cast<size_t>(p * per_page + e)];
          c.pages.data[static_cast<size_t>((2 * p + 1) * per_page + e)] = v.data[static_cast<size_t>(p * per_page + e)];
        }
    }
  } else {
    c.pages = to_tensor(paged_kv_cache, fn, "paged_kv_cache");
  }
  c.kv_indptr = to_int32_vector(kv_indptr, fn, "kv_indptr");
  c.kv_indices = to_int32_vector(kv_indices, fn, "kv_indices");
  c.kv_last_page_len = to_int32_vector(kv_last_page_len, fn, "kv_last_page_len");
  check_pool_layout(c, fn);
  return c;
}

void bind_attention(py::module_& m) {
  m.def(
      "single_decode_with_kv_cache",
      [](const FloatArray& q, const FloatArray& k, const FloatArray& v, const std::string& kv_layout,
         std::optional<double> sm_scale, int window_left, std::optional<double> logits_soft_cap, bool return_lse) {
        const char* fn = "single_decode_with_kv_cache";
        auto opt = make_options(fn, false, kv_layout, sm_scale, window_left, logits_soft_cap);
        return to_python(
            ref::single_decode_with_kv_cache(to_tensor(q, fn, "q"), to_tensor(k, fn, "k"), to_tensor(v, fn, "v"), opt),
            return_lse);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("kv_layout") = "NHD", py::arg("sm_scale") = py::none(),
      py::arg("window_left") = -1, py::arg("logits_soft_cap") = py::none(), py::arg("return_lse") = false,
      R"doc(Decode attention for one request.

q: (num_qo_heads, head_dim); k: (kv_len, num_kv_heads, head_dim) for NHD or
(num_kv_heads, kv_len, head_dim) for HND; v: k's shape but for its last dimension,
head_dim_vo (which may differ from head_dim). Returns o (num_qo_heads, head_dim_vo), and
with return_lse=True also lse (num_qo_heads,), natural log. float64 results.

sm_scale: None (the default) means 1/sqrt(head_dim); otherwise a finite number
(NaN or an infinity raises ValueError).)doc");

  m.def(
      "single_prefill_with_kv_cache",
      [](const FloatArray& q, const FloatArray& k, const FloatArray& v, bool causal, const std::string& kv_layout,
         std::optional<double> sm_scale, int window_left, std::optional<double> logits_soft_cap, bool return_lse) {
        const char* fn = "single_prefill_with_kv_cache";
        auto opt = make_options(fn, causal, kv_layout, sm_scale, window_left, logits_soft_cap);
        return to_python(
            ref::single_prefill_with_kv_cache(to_tensor(q, fn, "q"), to_tensor(k, fn, "k"), to_tensor(v, fn, "v"), opt),
            return_lse);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("causal") = false, py::arg("kv_layout") = "NHD",
      py::arg("sm_scale") = py::none(), py::arg("window_left") = -1, py::arg("logits_soft_cap") = py::none(),
      py::arg("return_lse") = false,
      R"doc(Prefill/append attention for one request.

q: (qo_len, num_qo_heads, head_dim); k: (kv_len, num_kv_heads, head_dim) (NHD) or
(num_kv_heads, kv_len, head_dim) (HND); v: k's shape but for its last dimension,
head_dim_vo (DeepSeek's MLA prefill: head_dim 192, head_dim_vo 128). causal is
bottom-right aligned. Returns o (qo_len, num_qo_heads, head_dim_vo) [, lse (qo_len,
num_qo_heads)].

sm_scale: None (the default) means 1/sqrt(head_dim); otherwise a finite number
(NaN or an infinity raises ValueError).)doc");

  m.def(
      "batch_decode_with_paged_kv_cache",
      [](const FloatArray& q, const KVCacheArg& paged_kv_cache, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, const std::string& kv_layout, std::optional<double> sm_scale,
         int window_left, std::optional<double> logits_soft_cap, bool return_lse) {
        const char* fn = "batch_decode_with_paged_kv_cache";
        auto opt = make_options(fn, false, kv_layout, sm_scale, window_left, logits_soft_cap);
        auto cache = to_paged_cache(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, fn);
        return to_python(ref::batch_decode_with_paged_kv_cache(to_tensor(q, fn, "q"), cache, opt), return_lse);
      },
      py::arg("q"), py::arg("paged_kv_cache"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("kv_layout") = "NHD", py::arg("sm_scale") = py::none(), py::arg("window_left") = -1,
      py::arg("logits_soft_cap") = py::none(), py::arg("return_lse") = false,
      R"doc(Batch decode through a paged KV cache (one query token per request).

q: (batch_size, num_qo_heads, head_dim). paged_kv_cache: (num_pages, 2, page_size,
num_kv_heads, head_dim) for NHD, (num_pages, 2, num_kv_heads, page_size, head_dim) for
HND, or a tuple (k_cache, v_cache) of the 4-D halves (v_cache may be narrower: head_dim_vo,
MLA's prefill shape; o then takes its width). kv_indptr (batch_size + 1),
kv_indices (kv_indptr[-1]), kv_last_page_len (batch_size) in 1..page_size.

sm_scale: None (the default) means 1/sqrt(head_dim); otherwise a finite number
(NaN or an infinity raises ValueError).)doc");

  m.def(
      "batch_prefill_with_paged_kv_cache",
      [](const FloatArray& q, const IntArray& qo_indptr, const KVCacheArg& paged_kv_cache, const IntArray& kv_indptr,
         const IntArray& kv_indices, const IntArray& kv_last_page_len, bool causal, const std::string& kv_layout,
         std::optional<double> sm_scale, int window_left, std::optional<double> logits_soft_cap, bool return_lse) {
        const char* fn = "batch_prefill_with_paged_kv_cache";
        auto opt = make_options(fn, causal, kv_layout, sm_scale, window_left, logits_soft_cap);
        auto cache = to_paged_cache(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, fn);
        return to_python(ref::batch_prefill_with_paged_kv_cache(
                             to_tensor(q, fn, "q"), to_int32_vector(qo_indptr, fn, "qo_indptr"), cache, opt),
                         return_lse);
      },
      py::arg("q"), py::arg("qo_indptr"), py::arg("paged_kv_cache"), py::arg("kv_indptr"), py::arg("kv_indices"),
      py::arg("kv_last_page_len"), py::arg("causal") = false, py::arg("kv_layout") = "NHD",
      py::arg("sm_scale") = py::none(), py::arg("window_left") = -1, py::arg("logits_soft_cap") = py::none(),
      py::arg("return_lse") = false,
      R"doc(Batch prefill/append over ragged queries and a paged KV cache.

q: (qo_indptr[-1], num_qo_heads, head_dim); qo_indptr (batch_size + 1); the cache as in
batch_decode_with_paged_kv_cache. Returns o [, lse] with q's leading shape.

sm_scale: None (the default) means 1/sqrt(head_dim); otherwise a finite number
(NaN or an infinity raises ValueError).)doc");

  m.def(
      "batch_prefill_with_ragged_kv_cache",
      [](const FloatArray& q, const IntArray& qo_indptr, const FloatArray& k, const FloatArray& v,
         const IntArray& kv_indptr, bool causal, const std::string& kv_layout, std::optional<double> sm_scale,
         int window_left, std::optional<double> logits_soft_cap, bool return_lse) {
        const char* fn = "batch_prefill_with_ragged_kv_cache";
        auto opt = make_options(fn, causal, kv_layout, sm_scale, window_left, logits_soft_cap);
        return to_python(ref::batch_prefill_with_ragged_kv_cache(
                             to_tensor(q, fn, "q"), to_int32_vector(qo_indptr, fn, "qo_indptr"), to_tensor(k, fn, "k"),
                             to_tensor(v, fn, "v"), to_int32_vector(kv_indptr, fn, "kv_indptr"), opt),
                         return_lse);
      },
      py::arg("q"), py::arg("qo_indptr"), py::arg("k"), py::arg("v"), py::arg("kv_indptr"), py::arg("causal") = false,
      py::arg("kv_layout") = "NHD", py::arg("sm_scale") = py::none(), py::arg("window_left") = -1,
      py::arg("logits_soft_cap") = py::none(), py::arg("return_lse") = false,
      R"doc(Batch prefill over ragged queries and ragged contiguous KV.

q: (qo_indptr[-1], num_qo_heads, head_dim); k: (kv_indptr[-1], num_kv_heads, head_dim)
(NHD) or (num_kv_heads, kv_indptr[-1], head_dim) (HND); v: k's shape but for its last
dimension, head_dim_vo. Returns o (qo_indptr[-1], num_qo_heads, head_dim_vo) [, lse].

sm_scale: None (the default) means 1/sqrt(head_dim); otherwise a finite number
(NaN or an infinity raises ValueError).)doc");
}

}  // namespace flashstep::python
