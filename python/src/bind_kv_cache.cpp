// KV-cache helpers: append into a paged pool (in place), batch indices/positions, gather.
#include <cstring>

#include "bindings.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/kv_cache.hpp"

namespace flashstep::python {

void bind_kv_cache(py::module_& m) {
  m.def(
      "get_batch_indices_positions",
      [](const IntArray& append_indptr, const IntArray& seq_lens, int64_t nnz) {
        const char* fn = "get_batch_indices_positions";
        auto [b, p] = ref::get_batch_indices_positions(to_int32_vector(append_indptr, fn, "append_indptr"),
                                                       to_int32_vector(seq_lens, fn, "seq_lens"), nnz);
        return py::make_tuple(to_numpy(b), to_numpy(p));
      },
      py::arg("append_indptr"), py::arg("seq_lens"), py::arg("nnz"),
      R"doc(Request index and KV position of every appended token.

append_indptr (batch_size + 1); seq_lens (batch_size), lengths after the append.
Returns (batch_indices, positions), int32 arrays of length nnz.)doc");

  m.def(
      "append_paged_kv_cache",
      [](const FloatArray& append_key, const FloatArray& append_value, const IntArray& batch_indices,
         const IntArray& positions, py::array paged_kv_cache, const IntArray& kv_indices, const IntArray& kv_indptr,
         const IntArray& kv_last_page_len, const std::string& kv_layout) {
        const char* fn = "append_paged_kv_cache";
        auto cache = to_paged_cache(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, fn);
        ref::append_paged_kv_cache(to_tensor(append_key, fn, "append_key"), to_tensor(append_value, fn, "append_value"),
                                   to_int32_vector(batch_indices, fn, "batch_indices"),
                                   to_int32_vector(positions, fn, "positions"), cache);
        // Write back in place, in the caller's dtype (float32 or float64).
        if (!paged_kv_cache.writeable() || !(paged_kv_cache.flags() & py::array::c_style))
          throw ref::InvalidArgument(std::string(fn) + ": paged_kv_cache must be a writeable, C-contiguous array");
        if (paged_kv_cache.dtype().itemsize() == 8) {
          std::memcpy(paged_kv_cache.mutable_data(), cache.pages.data.data(), sizeof(double) * cache.pages.data.size());
        } else {
          auto* out = static_cast<float*>(paged_kv_cache.mutable_data());
          for (size_t i = 0; i < cache.pages.data.size(); ++i) out[i] = static_cast<float>(cache.pages.data[i]);
        }
      },
      py::arg("append_key"), py::arg("append_value"), py::arg("batch_indices"), py::arg("positions"),
      py::arg("paged_kv_cache"), py::arg("kv_indices"), py::arg("kv_indptr"), py::arg("kv_last_page_len"),
      py::arg("kv_layout") = "NHD",
      R"doc(Write appended K/V into the page pool, in place.

append_key, append_value: (nnz, num_kv_heads, head_dim); batch_indices, positions (nnz)
as from get_batch_indices_positions; paged_kv_cache: the 5-D pool (modified in place);
the page table must already describe the lengths after the append.)doc");

  m.def(
      "gather_paged_kv",
      [](const KVCacheArg& paged_kv_cache, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, int64_t request, const std::string& kv_layout) {
        const char* fn = "gather_paged_kv";
        auto cache = to_paged_cache(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, fn);
        ref::check_paged_kv_cache(fn, cache);
        auto [k, v] = ref::gather_paged_kv(cache, request);
        return py::make_tuple(to_numpy(k), to_numpy(v));
      },
      py::arg("paged_kv_cache"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("request"), py::arg("kv_layout") = "NHD",
      R"doc(A request's K and V gathered from its pages: (kv_len, num_kv_heads, head_dim) each.)doc");
}

}  // namespace flashstep::python
