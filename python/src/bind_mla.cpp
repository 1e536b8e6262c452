// Multi-head latent attention (reference/include/flashstep/reference/mla.hpp): the naive
// form, the absorbed form's three steps, and the batch calls over ragged or paged latents
// (FlashInfer's BatchMLAPagedAttentionWrapper takes the paged ones: ckv_cache, kpe_cache,
// kv_indptr, kv_indices, kv_len).
#include <optional>

#include "bindings.hpp"
#include "flashstep/reference/mla.hpp"

namespace flashstep::python {

namespace {

ref::MlaOptions mla_options(bool causal, std::optional<double> sm_scale) {
  ref::MlaOptions opt;
  opt.causal = causal;
  opt.sm_scale = sm_scale;
  return opt;
}

}  // namespace

void bind_mla(py::module_& m) {
  m.def(
      "mla_naive",
      [](const FloatArray& q_nope, const FloatArray& q_pe, const FloatArray& ckv, const FloatArray& kpe,
         const FloatArray& w_uk, const FloatArray& w_uv, bool causal, std::optional<double> sm_scale, bool return_lse) {
        const char* fn = "mla_naive";
        const ref::MlaWeights w{to_tensor(w_uk, fn, "w_uk"), to_tensor(w_uv, fn, "w_uv")};
        return to_python(ref::mla_naive(to_tensor(q_nope, fn, "q_nope"), to_tensor(q_pe, fn, "q_pe"),
                                        to_tensor(ckv, fn, "ckv"), to_tensor(kpe, fn, "kpe"), w,
                                        mla_options(causal, sm_scale)),
                         return_lse);
      },
      py::arg("q_nope"), py::arg("q_pe"), py::arg("ckv"), py::arg("kpe"), py::arg("w_uk"), py::arg("w_uv"),
      py::arg("causal") = false, py::arg("sm_scale") = py::none(), py::arg("return_lse") = false,
      R"doc(MLA over one request, naive form: every head's keys [W_UK[h] c ; k_pe] and values
W_UV[h] c built from the latents, then attention.

q_nope: (qo_len, num_heads, head_dim_nope); q_pe: (qo_len, num_heads, rope_dim);
ckv: (kv_len, kv_lora_rank); kpe: (kv_len, rope_dim); w_uk: (num_heads, head_dim_nope,
kv_lora_rank); w_uv: (num_heads, head_dim_vo, kv_lora_rank). Returns o (qo_len, num_heads,
head_dim_vo) [, lse (qo_len, num_heads), natural log]. sm_scale: None means
1/sqrt(head_dim_nope + rope_dim).)doc");

  m.def(
      "mla_absorb_query",
      [](const FloatArray& q_nope, const FloatArray& w_uk) {
        const char* fn = "mla_absorb_query";
        return to_numpy(ref::mla_absorb_query(to_tensor(q_nope, fn, "q_nope"), to_tensor(w_uk, fn, "w_uk")));
      },
      py::arg("q_nope"), py::arg("w_uk"),
      R"doc(q_lat[i, h] = W_UK[h]^T q_nope[i, h]: (n, num_heads, head_dim_nope) -> (n, num_heads, kv_lora_rank).)doc");

  m.def(
      "mla_project_output",
      [](const FloatArray& o_lat, const FloatArray& w_uv) {
        const char* fn = "mla_project_output";
        return to_numpy(ref::mla_project_output(to_tensor(o_lat, fn, "o_lat"), to_tensor(w_uv, fn, "w_uv")));
      },
      py::arg("o_lat"), py::arg("w_uv"),
      R"doc(o[i, h] = W_UV[h] o_lat[i, h]: (n, num_heads, kv_lora_rank) -> (n, num_heads, head_dim_vo).)doc");

  m.def(
      "mla_attention",
      [](const FloatArray& q_lat, const FloatArray& q_pe, const FloatArray& ckv, const FloatArray& kpe,
         std::optional<double> sm_scale, bool causal, bool return_lse) {
        const char* fn = "mla_attention";
        return to_python(ref::mla_attention(to_tensor(q_lat, fn, "q_lat"), to_tensor(q_pe, fn, "q_pe"),
                                            to_tensor(ckv, fn, "ckv"), to_tensor(kpe, fn, "kpe"),
                                            mla_options(causal, sm_scale)),
                         return_lse);
      },
      py::arg("q_lat"), py::arg("q_pe"), py::arg("ckv"), py::arg("kpe"), py::arg("sm_scale") = py::none(),
      py::arg("causal") = false, py::arg("return_lse") = false,
      R"doc(MLA over one request, absorbed form: every head attends to [ckv ; kpe] with ckv as the value.

q_lat: (qo_len, num_heads, kv_lora_rank) (FlashInfer's q_nope); q_pe: (qo_len, num_heads,
rope_dim); ckv: (kv_len, kv_lora_rank); kpe: (kv_len, rope_dim). Returns o_lat (qo_len,
num_heads, kv_lora_rank) [, lse]. sm_scale is required: 1/sqrt(head_dim_nope + rope_dim)
for a model, which the absorbed shapes do not tell (None raises ValueError).)doc");

  m.def(
      "batch_mla_paged_attention",
      [](const FloatArray& q_nope, const FloatArray& q_pe, const IntArray& qo_indptr, const FloatArray& ckv_cache,
         const FloatArray& kpe_cache, const IntArray& kv_indptr, const IntArray& kv_indices, const IntArray& kv_len,
         std::optional<double> sm_scale, bool causal, bool return_lse) {
        const char* fn = "batch_mla_paged_attention";
        ref::PagedLatentCache cache;
        cache.ckv_pages = to_tensor(ckv_cache, fn, "ckv_cache");
        cache.kpe_pages = to_tensor(kpe_cache, fn, "kpe_cache");
        cache.kv_indptr = to_int32_vector(kv_indptr, fn, "kv_indptr");
        cache.kv_indices = to_int32_vector(kv_indices, fn, "kv_indices");
        cache.kv_len = to_int32_vector(kv_len, fn, "kv_len");
        return to_python(ref::batch_mla_paged_attention(to_tensor(q_nope, fn, "q_nope"), to_tensor(q_pe, fn, "q_pe"),
                                                        to_int32_vector(qo_indptr, fn, "qo_indptr"), cache,
                                                        mla_options(causal, sm_scale)),
                         return_lse);
      },
      py::arg("q_nope"), py::arg("q_pe"), py::arg("qo_indptr"), py::arg("ckv_cache"), py::arg("kpe_cache"),
      py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_len"), py::arg("sm_scale") = py::none(),
      py::arg("causal") = false, py::arg("return_lse") = false,
      R"doc(Batch MLA, absorbed form, over a paged latent cache (FlashInfer's
BatchMLAPagedAttentionWrapper: plan(qo_indptr, kv_indptr, kv_indices, kv_len, ...) and
run(q_nope, q_pe, ckv_cache, kpe_cache)).

q_nope: (qo_indptr[-1], num_heads, kv_lora_rank), already absorbed; q_pe: (qo_indptr[-1],
num_heads, rope_dim); ckv_cache: (num_pages, page_size, kv_lora_rank); kpe_cache:
(num_pages, page_size, rope_dim); kv_len: the keys of each request. Decode (one query a
request) or causal append. Returns o (qo_indptr[-1], num_heads, kv_lora_rank) [, lse,
natural log]. sm_scale is required.)doc");
}

}  // namespace flashstep::python
