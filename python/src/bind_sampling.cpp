// Sampling operators under FlashInfer's names (flashinfer.sampling), the exact oracle,
// chain speculative sampling, and the Philox stream they share.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/sampling.hpp"
#include "flashstep/reference/speculative.hpp"

#include <flashstep/kernels/philox.cuh>

namespace flashstep::python {

namespace {

// A scalar or a 1-D array of per-output values (FlashInfer's Union[Tensor, float]).
ref::RowParam<double> float_param(const py::handle& obj, const char* fn, const char* name) {
  if (py::isinstance<py::float_>(obj) || py::isinstance<py::int_>(obj)) return obj.cast<double>();
  py::array arr = py::array::ensure(obj);
  if (!arr || arr.ndim() > 1)
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must be a float or a 1-D array");
  // Before the scalar case: a string becomes a 0-d array of text, which has no __float__.
  if (arr.dtype().kind() != 'f' && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must be a float or a 1-D array of numbers, got " +
                               py::repr(obj).cast<std::string>().substr(0, 40));
  if (arr.ndim() == 0) return py::reinterpret_borrow<py::object>(obj).attr("__float__")().cast<double>();
  auto d = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
  return std::vector<double>(d.data(), d.data() + d.size());
}

ref::RowParam<int64_t> int_param(const py::handle& obj, const char* fn, const char* name) {
  if (py::isinstance<py::int_>(obj)) return obj.cast<int64_t>();
  py::array arr = py::array::ensure(obj);
  if (!arr || arr.ndim() > 1 || (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must be an int or a 1-D integer array");
  if (arr.ndim() == 0) return py::reinterpret_borrow<py::object>(obj).attr("__int__")().cast<int64_t>();
  auto v = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  return std::vector<int64_t>(v.data(), v.data() + v.size());
}

ref::SamplingOptions options(const py::handle& indices, uint64_t seed, uint64_t offset, const std::string& evaluation,
                             const char* fn) {
  ref::SamplingOptions o;
  if (!indices.is_none()) o.indices = to_int32_vector(indices, fn, "indices");
  o.seed = seed;
  o.offset = offset;
  if (evaluation == "automatic") {
    o.evaluation = ref::SamplerEvaluation::automatic;
  } else if (evaluation == "per_output") {
    o.evaluation = ref::SamplerEvaluation::per_output;
  } else if (evaluation == "batched") {
    o.evaluation = ref::SamplerEvaluation::batched;
  } else {
    throw ref::InvalidArgument(std::string(fn) +
                               ": evaluation must be \"automatic\", \"per_output\" or \"batched\", got \"" +
                               evaluation + "\"");
  }
  return o;
}

py::object result(const ref::SamplingResult& r, bool return_rounds) {
  if (return_rounds) return py::make_tuple(to_numpy(r.samples), to_numpy(r.rounds));
  return to_numpy(r.samples);
}

ref::FilterKind parse_filter_kind(const std::string& kind) {
  for (auto k : {ref::FilterKind::none, ref::FilterKind::top_k, ref::FilterKind::top_p, ref::FilterKind::min_p,
                 ref::FilterKind::top_k_top_p})
    if (kind == ref::to_string(k)) return k;
  throw ref::InvalidArgument(
      "sampling_target_probs: kind must be one of none, top_k, top_p, min_p, top_k_top_p, got \"" + kind + "\"");
}

const char* kCommonArgs = R"doc(
indices: optional (batch,) int array; output i draws from row indices[i] (default: row i).
seed, offset: Philox key and first stream word; output i's rejection round j uses the
  uniform philox_uniform(seed, i, offset + j), the same on CPU and GPU.
return_rounds: also return the (batch,) int32 rejection rounds of each output.
evaluation: "automatic", "per_output" (the loop as the GPU kernel runs it) or "batched"
  (many outputs of a row at once); all three return identical tokens.
Returns (batch,) int32 token ids (and rounds).)doc";

std::string doc(const char* head) { return std::string(head) + "\n" + kCommonArgs; }

}  // namespace

void bind_sampling(py::module_& m) {
  m.def(
      "softmax",
      [](const FloatArray& logits, const OptionalFloatOrArray& temperature) {
        const char* fn = "softmax";
        return to_numpy(ref::softmax(to_tensor(logits, fn, "logits"),
                                     temperature.is_none() ? ref::RowParam<double>(1.0)
                                                           : float_param(temperature, fn, "temperature")));
      },
      py::arg("logits"), py::arg("temperature") = py::none(),
      R"doc(Softmax of logits / temperature per row (float64).

logits: (batch, vocab), finite or -inf. temperature: float or (batch,), each > 0
(default 1). Temperature 0 is greedy decoding, an argmax, and is rejected here.)doc");

  m.def(
      "sampling_from_probs",
      [](const FloatArray& probs, const OptionalIntArray& indices, uint64_t seed, uint64_t offset, bool return_rounds,
         const std::string& evaluation) {
        const char* fn = "sampling_from_probs";
        return result(
            ref::sampling_from_probs(to_tensor(probs, fn, "probs"), options(indices, seed, offset, evaluation, fn)),
            return_rounds);
      },
      py::arg("probs"), py::arg("indices") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Draw one token per output in proportion to probs (rows, vocab), entries in [0, 1].").c_str());

  m.def(
      "sampling_from_logits",
      [](const FloatArray& logits, const OptionalIntArray& indices, uint64_t seed, uint64_t offset, bool return_rounds,
         const std::string& evaluation) {
        const char* fn = "sampling_from_logits";
        return result(
            ref::sampling_from_logits(to_tensor(logits, fn, "logits"), options(indices, seed, offset, evaluation, fn)),
            return_rounds);
      },
      py::arg("logits"), py::arg("indices") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("softmax(logits) then sampling_from_probs (FlashInfer's kernel uses Gumbel-max: same\n"
          "distribution, other draws).")
          .c_str());

  m.def(
      "top_k_sampling_from_probs",
      [](const FloatArray& probs, const IntOrArray& top_k, const OptionalIntArray& indices, uint64_t seed,
         uint64_t offset, bool return_rounds, const std::string& evaluation) {
        const char* fn = "top_k_sampling_from_probs";
        return result(ref::top_k_sampling_from_probs(to_tensor(probs, fn, "probs"), int_param(top_k, fn, "top_k"),
                                                     options(indices, seed, offset, evaluation, fn)),
                      return_rounds);
      },
      py::arg("probs"), py::arg("top_k"), py::arg("indices") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Top-k sampling by sorting-free rejection. top_k: int or (batch,), each >= 1; tokens tied\n"
          "with the k-th largest are kept.")
          .c_str());

  m.def(
      "top_p_sampling_from_probs",
      [](const FloatArray& probs, const FloatOrArray& top_p, const OptionalIntArray& indices, uint64_t seed,
         uint64_t offset, bool return_rounds, const std::string& evaluation) {
        const char* fn = "top_p_sampling_from_probs";
        return result(ref::top_p_sampling_from_probs(to_tensor(probs, fn, "probs"), float_param(top_p, fn, "top_p"),
                                                     options(indices, seed, offset, evaluation, fn)),
                      return_rounds);
      },
      py::arg("probs"), py::arg("top_p"), py::arg("indices") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Top-p (nucleus) sampling by rejection. top_p: float or (batch,), each in (0, 1]; token i\n"
          "is kept when the mass strictly above it is < top_p of the row's mass.")
          .c_str());

  m.def(
      "min_p_sampling_from_probs",
      [](const FloatArray& probs, const FloatOrArray& min_p, const OptionalIntArray& indices, uint64_t seed,
         uint64_t offset, bool return_rounds, const std::string& evaluation) {
        const char* fn = "min_p_sampling_from_probs";
        return result(ref::min_p_sampling_from_probs(to_tensor(probs, fn, "probs"), float_param(min_p, fn, "min_p"),
                                                     options(indices, seed, offset, evaluation, fn)),
                      return_rounds);
      },
      py::arg("probs"), py::arg("min_p"), py::arg("indices") = py::none(), py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Min-p sampling: one draw among p >= max_p * min_p. min_p: float or (batch,) in [0, 1].").c_str());

  m.def(
      "top_k_top_p_sampling_from_probs",
      [](const FloatArray& probs, const IntOrArray& top_k, const FloatOrArray& top_p, const OptionalIntArray& indices,
         const std::string& filter_apply_order, uint64_t seed, uint64_t offset, bool return_rounds,
         const std::string& evaluation) {
        const char* fn = "top_k_top_p_sampling_from_probs";
        return result(ref::top_k_top_p_sampling_from_probs(to_tensor(probs, fn, "probs"), int_param(top_k, fn, "top_k"),
                                                           float_param(top_p, fn, "top_p"),
                                                           ref::parse_filter_apply_order(filter_apply_order),
                                                           options(indices, seed, offset, evaluation, fn)),
                      return_rounds);
      },
      py::arg("probs"), py::arg("top_k"), py::arg("top_p"), py::arg("indices") = py::none(),
      py::arg("filter_apply_order") = "top_k_first", py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Top-k and top-p. filter_apply_order \"top_k_first\": top_k_renorm_probs then top-p\n"
          "sampling; \"joint\": one rejection loop testing both rules on the original row.")
          .c_str());

  m.def(
      "top_k_top_p_sampling_from_logits",
      [](const FloatArray& logits, const IntOrArray& top_k, const FloatOrArray& top_p, const OptionalIntArray& indices,
         const std::string& filter_apply_order, uint64_t seed, uint64_t offset, bool return_rounds,
         const std::string& evaluation) {
        const char* fn = "top_k_top_p_sampling_from_logits";
        return result(ref::top_k_top_p_sampling_from_logits(
                          to_tensor(logits, fn, "logits"), int_param(top_k, fn, "top_k"),
                          float_param(top_p, fn, "top_p"), ref::parse_filter_apply_order(filter_apply_order),
                          options(indices, seed, offset, evaluation, fn)),
                      return_rounds);
      },
      py::arg("logits"), py::arg("top_k"), py::arg("top_p"), py::arg("indices") = py::none(),
      py::arg("filter_apply_order") = "top_k_first", py::arg("seed") = 0, py::arg("offset") = 0,
      py::arg("return_rounds") = false, py::arg("evaluation") = "automatic",
      doc("Top-k and top-p from logits. \"top_k_first\": top_k_mask_logits, softmax, top-p\n"
          "sampling; \"joint\": softmax, then the joint rejection loop.")
          .c_str());

  m.def(
      "top_k_renorm_probs",
      [](const FloatArray& probs, const IntOrArray& top_k) {
        const char* fn = "top_k_renorm_probs";
        return to_numpy(ref::top_k_renorm_probs(to_tensor(probs, fn, "probs"), int_param(top_k, fn, "top_k")));
      },
      py::arg("probs"), py::arg("top_k"),
      R"doc(Keep the top-k of each row (ties with the k-th kept), zero the rest, renormalize.

probs: (batch, vocab); top_k: int or (batch,). Returns float64 (batch, vocab).)doc");

  m.def(
      "top_p_renorm_probs",
      [](const FloatArray& probs, const FloatOrArray& top_p) {
        const char* fn = "top_p_renorm_probs";
        return to_numpy(ref::top_p_renorm_probs(to_tensor(probs, fn, "probs"), float_param(top_p, fn, "top_p")));
      },
      py::arg("probs"), py::arg("top_p"),
      R"doc(Keep the top-p head of each row, zero the rest, renormalize.

probs: (batch, vocab); top_p: float or (batch,) in (0, 1]. Returns float64 (batch, vocab).)doc");

  m.def(
      "top_k_mask_logits",
      [](const FloatArray& logits, const IntOrArray& top_k) {
        const char* fn = "top_k_mask_logits";
        return to_numpy(ref::top_k_mask_logits(to_tensor(logits, fn, "logits"), int_param(top_k, fn, "top_k")));
      },
      py::arg("logits"), py::arg("top_k"),
      R"doc(Keep the top-k logits of each row (ties kept), set the rest to -inf.

logits: (batch, vocab); top_k: int or (batch,). Returns float64 (batch, vocab).)doc");

  m.def(
      "sampling_target_probs",
      [](const FloatArray& probs, const std::string& kind, int64_t top_k, double top_p, double min_p,
         const OptionalIntArray& indices) {
        const char* fn = "sampling_target_probs";
        ref::SamplingFilter f;
        f.kind = parse_filter_kind(kind);
        f.top_k = top_k;
        f.top_p = static_cast<float>(top_p);
        f.min_p = static_cast<float>(min_p);
        std::vector<int32_t> idx;
        if (!indices.is_none()) idx = to_int32_vector(indices, fn, "indices");
        return to_numpy(ref::sampling_target_probs(to_tensor(probs, fn, "probs"), {f}, idx));
      },
      py::arg("probs"), py::arg("kind"), py::arg("top_k") = 0, py::arg("top_p") = 1.0, py::arg("min_p") = 0.0,
      py::arg("indices") = py::none(),
      R"doc(The exact oracle: the distribution each sampler must draw from.

probs: (rows, vocab); kind: "none", "top_k", "top_p", "min_p" or "top_k_top_p" (joint);
sort, truncate by the keep rule, renormalize (probabilities read as float32, masses
exact). Returns float64 (batch, vocab).)doc");

  m.def(
      "chain_speculative_sampling",
      [](const FloatArray& draft_probs, const IntArray& draft_token_ids, const FloatArray& target_probs, uint64_t seed,
         uint64_t offset) {
        const char* fn = "chain_speculative_sampling";
        py::array ids = py::array::ensure(draft_token_ids);
        if (!ids || (ids.ndim() != 2 && !(ids.ndim() == 1 && ids.size() == 0)))
          throw ref::InvalidArgument(
              std::string(fn) + ": draft_token_ids must be a 2-D (batch_size, num_speculate_tokens) integer array");
        auto flat = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(ids);
        const auto r = ref::chain_speculative_sampling(to_tensor(draft_probs, fn, "draft_probs"),
                                                       to_int32_vector(flat.attr("reshape")(-1), fn, "draft_token_ids"),
                                                       to_tensor(target_probs, fn, "target_probs"), seed, offset);
        py::array_t<int32_t> out = to_numpy(r.output_token_ids);
        return py::make_tuple(out.attr("reshape")(r.batch_size, r.num_speculate_tokens + 1),
                              to_numpy(r.output_accepted_token_num), to_numpy(r.output_emitted_draft_token_num));
      },
      py::arg("draft_probs"), py::arg("draft_token_ids"), py::arg("target_probs"), py::arg("seed") = 0,
      py::arg("offset") = 0,
      R"doc(Verify draft tokens against the target model (FlashInfer's conventions).

draft_probs: (batch, n, vocab); draft_token_ids: (batch, n) ints; target_probs:
(batch, n + 1, vocab). Returns (output_token_ids (batch, n + 1) int32 padded with -1,
output_accepted_token_num (batch,), output_emitted_draft_token_num (batch,)). Request b
tests draft j with philox_uniform(seed, b, offset + j) and draws its last token with
word offset + n.)doc");

  m.def(
      "philox_uniform",
      [](uint64_t seed, uint64_t subsequence, const IntArray& n) {
        const auto positions = to_int32_vector(n, "philox_uniform", "n");
        py::array_t<double> out(static_cast<py::ssize_t>(positions.size()));
        for (size_t i = 0; i < positions.size(); ++i) {
          if (positions[i] < 0) throw ref::InvalidArgument("philox_uniform: n must be >= 0");
          out.mutable_data()[i] = kernels::philox_uniform(seed, subsequence, static_cast<uint64_t>(positions[i]));
        }
        return out;
      },
      py::arg("seed"), py::arg("subsequence"), py::arg("n"),
      R"doc(Uniforms in [0, 1) of the Philox4x32-10 stream (seed, subsequence) at positions n.

The top 24 bits of word n, over 2^24 (exact in float32). The samplers' output i, round j
reads philox_uniform(seed, i, offset + j).)doc");
}

}  // namespace flashstep::python
