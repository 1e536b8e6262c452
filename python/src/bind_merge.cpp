// merge_state / merge_states under FlashInfer's names.
#include "bindings.hpp"
#include "flashstep/reference/merge.hpp"

namespace flashstep::python {

void bind_merge(py::module_& m) {
  m.def(
      "merge_state",
      [](const FloatArray& v_a, const FloatArray& s_a, const FloatArray& v_b, const FloatArray& s_b) {
        const char* fn = "merge_state";
        auto r = ref::merge_state(to_tensor(v_a, fn, "v_a"), to_tensor(s_a, fn, "s_a"), to_tensor(v_b, fn, "v_b"),
                                  to_tensor(s_b, fn, "s_b"));
        return py::make_tuple(to_numpy(r.v), to_numpy(r.s));
      },
      py::arg("v_a"), py::arg("s_a"), py::arg("v_b"), py::arg("s_b"),
      R"doc(Merge the attention states of two disjoint key sets.

v_a, v_b: (seq_len, num_heads, head_dim); s_a, s_b: (seq_len, num_heads), natural-log
LSE (-inf = empty set). Returns (v, s) of the union; exact, commutative, associative.)doc");
  m.def(
      "merge_states",
      [](const FloatArray& v, const FloatArray& s) {
        const char* fn = "merge_states";
        auto r = ref::merge_states(to_tensor(v, fn, "v"), to_tensor(s, fn, "s"));
        return py::make_tuple(to_numpy(r.v), to_numpy(r.s));
      },
      py::arg("v"), py::arg("s"),
      R"doc(Merge n attention states per position.

v: (seq_len, num_states, num_heads, head_dim); s: (seq_len, num_states, num_heads).
Returns (v (seq_len, num_heads, head_dim), s (seq_len, num_heads)).)doc");
}

}  // namespace flashstep::python
