// Rotary position encoding under FlashInfer's names and arguments (flashinfer.rope).
#include "bindings.hpp"
#include "flashstep/reference/rope.hpp"

namespace flashstep::python {

namespace {

py::tuple to_tuple(const ref::RopeResult& r) { return py::make_tuple(to_numpy(r.q_rope), to_numpy(r.k_rope)); }

ref::RopeOptions rope_options(std::optional<int64_t> rotary_dim, bool interleave, double rope_scale,
                              double rope_theta) {
  ref::RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  return o;
}

ref::Llama31RopeOptions llama31_options(std::optional<int64_t> rotary_dim, bool interleave, double rope_scale,
                                        double rope_theta, double low_freq_factor, double high_freq_factor,
                                        double old_context_len) {
  ref::Llama31RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  o.low_freq_factor = low_freq_factor;
  o.high_freq_factor = high_freq_factor;
  o.old_context_len = old_context_len;
  return o;
}

const char* const kRopeDoc = R"doc(

q: (nnz, num_q_heads, head_dim); k: (nnz, num_k_heads, head_dim). The first rotary_dim
(None: head_dim; even) elements of each head are rotated in pairs, pair i of a row at
position p by p * theta_i with theta_i = rope_theta^(-2i/rotary_dim) / rope_scale; the rest
are copied. interleave=False pairs (x[i], x[i + rotary_dim/2]) (GPT-NeoX, Hugging Face
Llama); interleave=True pairs (x[2i], x[2i+1]) (GPT-J, Meta's Llama). Returns (q_rope, k_rope), float64.)doc";

const char* const kLlama31Doc = R"doc(

As apply_rope, with Llama 3.1's frequencies: with w_i = 2 pi / theta_i (theta_i without
rope_scale) and smooth_i = clamp((old_context_len / w_i - low_freq_factor) /
(high_freq_factor - low_freq_factor), 0, 1), the frequency is
(1 - smooth_i) * theta_i / rope_scale + smooth_i * theta_i. Returns (q_rope, k_rope).)doc";

}  // namespace

void bind_rope(py::module_& m) {
  m.def(
      "apply_rope",
      [](const FloatArray& q, const FloatArray& k, const IntArray& indptr, const IntArray& offsets,
         std::optional<int64_t> rotary_dim, bool interleave, double rope_scale, double rope_theta) {
        const char* fn = "apply_rope";
        return to_tuple(ref::apply_rope(to_tensor(q, fn, "q"), to_tensor(k, fn, "k"),
                                        to_int32_vector(indptr, fn, "indptr"), to_int32_vector(offsets, fn, "offsets"),
                                        rope_options(rotary_dim, interleave, rope_scale, rope_theta)));
      },
      py::arg("q"), py::arg("k"), py::arg("indptr"), py::arg("offsets"), py::arg("rotary_dim") = py::none(),
      py::arg("interleave") = false, py::arg("rope_scale") = 1.0, py::arg("rope_theta") = 1e4,
      (std::string("RoPE on a ragged batch: row t of request b (indptr[b] <= t < indptr[b+1]) is at\n"
                   "position offsets[b] + (t - indptr[b]).") +
       kRopeDoc)
          .c_str());

  m.def(
      "apply_rope_pos_ids",
      [](const FloatArray& q, const FloatArray& k, const IntArray& pos_ids, std::optional<int64_t> rotary_dim,
         bool interleave, double rope_scale, double rope_theta) {
        const char* fn = "apply_rope_pos_ids";
        return to_tuple(ref::apply_rope_pos_ids(to_tensor(q, fn, "q"), to_tensor(k, fn, "k"),
                                                to_int32_vector(pos_ids, fn, "pos_ids"),
                                                rope_options(rotary_dim, interleave, rope_scale, rope_theta)));
      },
      py::arg("q"), py::arg("k"), py::arg("pos_ids"), py::arg("rotary_dim") = py::none(), py::arg("interleave") = false,
      py::arg("rope_scale") = 1.0, py::arg("rope_theta") = 1e4,
      (std::string("RoPE with each row's position given: pos_ids (nnz,), >= 0.") + kRopeDoc).c_str());

  m.def(
      "apply_llama31_rope",
      [](const FloatArray& q, const FloatArray& k, const IntArray& indptr, const IntArray& offsets,
         std::optional<int64_t> rotary_dim, bool interleave, double rope_scale, double rope_theta,
         double low_freq_factor, double high_freq_factor, double old_context_len) {
        const char* fn = "apply_llama31_rope";
        return to_tuple(ref::apply_llama31_rope(to_tensor(q, fn, "q"), to_tensor(k, fn, "k"),
                                                to_int32_vector(indptr, fn, "indptr"),
                                                to_int32_vector(offsets, fn, "offsets"),
                                                llama31_options(rotary_dim, interleave, rope_scale, rope_theta,
                                                                low_freq_factor, high_freq_factor, old_context_len)));
      },
      py::arg("q"), py::arg("k"), py::arg("indptr"), py::arg("offsets"), py::arg("rotary_dim") = py::none(),
      py::arg("interleave") = false, py::arg("rope_scale") = 8.0, py::arg("rope_theta") = 5e5,
      py::arg("low_freq_factor") = 1.0, py::arg("high_freq_factor") = 4.0, py::arg("old_context_len") = 8192.0,
      (std::string("Llama 3.1 RoPE on a ragged batch (positions as apply_rope).") + kLlama31Doc).c_str());

  m.def(
      "apply_llama31_rope_pos_ids",
      [](const FloatArray& q, const FloatArray& k, const IntArray& pos_ids, std::optional<int64_t> rotary_dim,
         bool interleave, double rope_scale, double rope_theta, double low_freq_factor, double high_freq_factor,
         double old_context_len) {
        const char* fn = "apply_llama31_rope_pos_ids";
        return to_tuple(ref::apply_llama31_rope_pos_ids(
            to_tensor(q, fn, "q"), to_tensor(k, fn, "k"), to_int32_vector(pos_ids, fn, "pos_ids"),
            llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                            old_context_len)));
      },
      py::arg("q"), py::arg("k"), py::arg("pos_ids"), py::arg("rotary_dim") = py::none(), py::arg("interleave") = false,
      py::arg("rope_scale") = 8.0, py::arg("rope_theta") = 5e5, py::arg("low_freq_factor") = 1.0,
      py::arg("high_freq_factor") = 4.0, py::arg("old_context_len") = 8192.0,
      (std::string("Llama 3.1 RoPE with each row's position given (as apply_rope_pos_ids).") + kLlama31Doc).c_str());
}

}  // namespace flashstep::python
