// The tiny decoder of the course: model, generate() three ways, and the tour's demo.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/tiny_decoder.hpp"

namespace flashstep::python {

namespace {

py::array_t<double> step_logits(const ref::GeneratedRequest& r) {
  const py::ssize_t steps = static_cast<py::ssize_t>(r.step_logits.size());
  const py::ssize_t vocab = steps > 0 ? static_cast<py::ssize_t>(r.step_logits[0].size()) : 0;
  py::array_t<double> out({steps, vocab});
  for (py::ssize_t t = 0; t < steps; ++t)
    std::copy(r.step_logits[static_cast<size_t>(t)].begin(), r.step_logits[static_cast<size_t>(t)].end(),
              out.mutable_data() + t * vocab);
  return out;
}

}  // namespace

void bind_decoder(py::module_& m) {
  py::class_<ref::GenerationMemory>(m, "GenerationMemory",
                                    "What a generate() run kept and computed (K/V counted at fp16 over all layers).")
      .def_readonly("tokens", &ref::GenerationMemory::tokens, "tokens whose K/V is held at the end")
      .def_readonly("kv_bytes_per_token", &ref::GenerationMemory::kv_bytes_per_token)
      .def_readonly("kv_bytes_kept", &ref::GenerationMemory::kv_bytes_kept,
                    "recompute: 0; contiguous: tokens * per token; paged: allocated page slots * per token")
      .def_readonly("contiguous_preallocated_bytes", &ref::GenerationMemory::contiguous_preallocated_bytes,
                    "requests * (prompt + max_new_tokens) * per token")
      .def_readonly("page_size", &ref::GenerationMemory::page_size)
      .def_readonly("pages_used", &ref::GenerationMemory::pages_used)
      .def_readonly("shared_pages", &ref::GenerationMemory::shared_pages)
      .def_readonly("contiguous_pages_equivalent", &ref::GenerationMemory::contiguous_pages_equivalent)
      .def_readonly("prefix_tokens_reused", &ref::GenerationMemory::prefix_tokens_reused)
      .def_readonly("query_rows_computed", &ref::GenerationMemory::query_rows_computed,
                    "(token, layer) rows pushed through attention")
      .def("__repr__", [](const ref::GenerationMemory& g) {
        return "GenerationMemory(tokens=" + std::to_string(g.tokens) +
               ", kv_bytes_kept=" + std::to_string(g.kv_bytes_kept) +
               ", contiguous_preallocated_bytes=" + std::to_string(g.contiguous_preallocated_bytes) +
               ", pages_used=" + std::to_string(g.pages_used) + ", shared_pages=" + std::to_string(g.shared_pages) +
               ", prefix_tokens_reused=" + std::to_string(g.prefix_tokens_reused) + ")";
      });

  py::class_<ref::GeneratedRequest>(m, "GeneratedRequest", "One request's prompt and generated tokens.")
      .def_readonly("prompt", &ref::GeneratedRequest::prompt)
      .def_property_readonly("prompt_tokens", [](const ref::GeneratedRequest& r) { return to_numpy(r.prompt_tokens); })
      .def_property_readonly("generated_tokens",
                             [](const ref::GeneratedRequest& r) { return to_numpy(r.generated_tokens); })
      .def_property_readonly(
          "generated_bytes", [](const ref::GeneratedRequest& r) { return py::bytes(r.generated_text); },
          "the generated tokens as bytes (byte tokens)")
      .def_readonly("prefix_tokens_reused", &ref::GeneratedRequest::prefix_tokens_reused)
      .def_property_readonly("step_logits", &step_logits, "(steps, vocab) if record_logits, else (0, 0)");

  py::class_<ref::GenerationResult>(m, "GenerationResult", "The result of TinyDecoder.generate().")
      .def_property_readonly("mode", [](const ref::GenerationResult& r) { return std::string(ref::to_string(r.mode)); })
      .def_readonly("requests", &ref::GenerationResult::requests)
      .def_readonly("memory", &ref::GenerationResult::memory);

  py::class_<ref::TinyDecoder>(m, "TinyDecoder", R"doc(The course's decoder with random weights from a fixed seed.

Byte tokens, token embedding plus sinusoidal positions, num_layers attention layers
(W_Q, W_K, W_V, optional W_O, residual), then W_vocab. position_encoding="rope" adds no
sinusoid and rotates Q and K of each layer by RoPE instead (rope_theta; rope_interleave
pairs (x[2i], x[2i+1]) rather than (x[i], x[i + head_dim/2])). Weight entry i of matrix m is
(2 u - 1) * sqrt(3 / fan_in) with u = philox_uniform(weight_seed, m, i).)doc")
      .def(py::init([](int64_t vocab_size, int64_t d_model, int64_t num_layers, int64_t num_qo_heads,
                       int64_t num_kv_heads, bool output_projection, uint64_t weight_seed,
                       const std::string& position_encoding, double rope_theta, bool rope_interleave) {
             ref::TinyDecoderConfig c;
             c.vocab_size = vocab_size;
             c.d_model = d_model;
             c.num_layers = num_layers;
             c.num_qo_heads = num_qo_heads;
             c.num_kv_heads = num_kv_heads;
             c.output_projection = output_projection;
             c.weight_seed = weight_seed;
             c.position_encoding = ref::parse_position_encoding(position_encoding);
             c.rope_theta = rope_theta;
             c.rope_interleave = rope_interleave;
             return ref::TinyDecoder(c);
           }),
           py::arg("vocab_size") = 256, py::arg("d_model") = 32, py::arg("num_layers") = 2, py::arg("num_qo_heads") = 4,
           py::arg("num_kv_heads") = 2, py::arg("output_projection") = true,
           py::arg("weight_seed") = ref::TinyDecoderConfig{}.weight_seed, py::arg("position_encoding") = "sinusoidal",
           py::arg("rope_theta") = 1e4, py::arg("rope_interleave") = false)
      .def_property_readonly("head_dim", &ref::TinyDecoder::head_dim)
      .def_property_readonly(
          "embedding", [](const ref::TinyDecoder& d) { return to_numpy(d.embedding()); }, "(vocab_size, d_model)")
      .def_property_readonly(
          "w_vocab", [](const ref::TinyDecoder& d) { return to_numpy(d.w_vocab()); }, "(d_model, vocab_size)")
      .def(
          "layer_weights",
          [](const ref::TinyDecoder& d, int64_t layer) {
            if (layer < 0 || layer >= static_cast<int64_t>(d.layers().size()))
              throw ref::InvalidArgument("TinyDecoder.layer_weights: layer " + std::to_string(layer) +
                                         " is not in [0, " + std::to_string(d.layers().size()) + ")");
            const auto& l = d.layers()[static_cast<size_t>(layer)];
            py::dict out;
            out["w_q"] = to_numpy(l.w_q);
            out["w_k"] = to_numpy(l.w_k);
            out["w_v"] = to_numpy(l.w_v);
            out["w_o"] = l.w_o.data.empty() ? py::object(py::none()) : py::object(to_numpy(l.w_o));
            return out;
          },
          py::arg("layer"), "Dict of w_q (d_model, Hq*D), w_k, w_v (d_model, Hkv*D), w_o (Hq*D, d_model) or None.")
      .def(
          "next_token_logits",
          [](const ref::TinyDecoder& d, const IntArray& tokens) {
            return to_numpy(d.next_token_logits(to_int32_vector(tokens, "next_token_logits", "tokens")));
          },
          py::arg("tokens"), "Logits (vocab_size,) of the next token, recomputing every layer (no cache).")
      .def(
          "generate",
          [](const ref::TinyDecoder& d, const std::vector<std::string>& prompts, const std::string& mode,
             int64_t max_new_tokens, double temperature, int64_t top_k, double top_p, uint64_t seed, int64_t page_size,
             bool share_prefixes, int64_t num_pages, bool record_logits) {
            ref::GenerationOptions o;
            o.max_new_tokens = max_new_tokens;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
            o.seed = seed;
            o.page_size = page_size;
            o.share_prefixes = share_prefixes;
            o.num_pages = num_pages;
            o.record_logits = record_logits;
            return ref::generate(d, prompts, ref::parse_generation_mode(mode), o);
          },
          py::arg("prompts"), py::arg("mode") = "paged_kv_cache", py::arg("max_new_tokens") = 8,
          py::arg("temperature") = 0.0, py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("seed") = 0,
          py::arg("page_size") = 4, py::arg("share_prefixes") = true, py::arg("num_pages") = 0,
          py::arg("record_logits") = false,
          R"doc(Generate max_new_tokens byte tokens after each prompt.

mode: "recompute" (no cache), "contiguous_kv_cache" (query optimization + KV cache) or
"paged_kv_cache" (batched, paged pool, prompt prefixes shared through a radix cache when
share_prefixes). temperature 0 is greedy; > 0 samples softmax(logits / T) (optionally
top_k / top_p) with Philox key seed + request index, offset step * 64: reproducible.
All modes give the same greedy tokens. Returns a GenerationResult.)doc");

  py::class_<ref::TinyDecoderDemo>(m, "TinyDecoderDemo", "The tour's demo: the same prompts generated three ways.")
      .def_readonly("runs", &ref::TinyDecoderDemo::runs)
      .def_readonly("tokens_agree", &ref::TinyDecoderDemo::tokens_agree);

  m.def("tiny_decoder_demo", &ref::tiny_decoder_demo,
        py::arg("prompts") = std::vector<std::string>{"The cat sat", "The cat ran fast"}, py::arg("max_new_tokens") = 8,
        py::arg("page_size") = 4,
        "Greedy generation from the course's prompts by recompute, contiguous KV cache and paged KV cache\n"
        "(with radix prefix sharing); tokens_agree says the three runs produced the same tokens.");
}

}  // namespace flashstep::python
