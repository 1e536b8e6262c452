// Shared helpers of the pybind11 module: numpy <-> reference tensors, and the
// declaration of each topic's binder (one function per topic, one file per binder).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "flashstep/reference/attention.hpp"
#include "flashstep/reference/tensor.hpp"

namespace flashstep::python {

namespace py = pybind11;

// Arguments that a binding converts itself (checking dtype and shape, and naming the
// argument in the error): any Python object reaches the binding, and the signature
// (help(), __doc__) shows the type the argument must have instead of "handle".
//   FloatArray          numpy.ndarray of float32 or float64 (to_tensor)
//   IntArray            1-D integers: a numpy array or a sequence (to_int32_vector)
//   OptionalIntArray    the same, or None
//   KVCacheArg          one 5-D pool, or a (k_cache, v_cache) tuple (to_paged_cache)
//   IntOrArray          an int, or one per row (FlashInfer's Union[Tensor, int])
//   FloatOrArray        a float, or one per row; OptionalFloatOrArray: or None
inline int any_object(PyObject*) { return 1; }
#define FLASHSTEP_PY_ARGUMENT(Name)                       \
  class Name : public py::object {                        \
   public:                                                \
    PYBIND11_OBJECT_DEFAULT(Name, py::object, any_object) \
  };
FLASHSTEP_PY_ARGUMENT(FloatArray)
FLASHSTEP_PY_ARGUMENT(IntArray)
FLASHSTEP_PY_ARGUMENT(OptionalIntArray)
FLASHSTEP_PY_ARGUMENT(KVCacheArg)
FLASHSTEP_PY_ARGUMENT(IntOrArray)
FLASHSTEP_PY_ARGUMENT(FloatOrArray)
FLASHSTEP_PY_ARGUMENT(OptionalFloatOrArray)
#undef FLASHSTEP_PY_ARGUMENT

/// A float32 or float64 numpy array (any rank) as a double tensor. Not an array (a list,
/// None) raises TypeError, an array of another dtype ValueError, naming `fn` and `name`.
ref::Tensor to_tensor(const py::handle& array, const char* fn, const char* name);
/// A double tensor as a new float64 numpy array of the same shape.
py::array_t<double> to_numpy(const ref::Tensor& t);
/// A 1-D integer array (or sequence) as int32 values; ValueError if not integer or not 1-D.
std::vector<int32_t> to_int32_vector(const py::handle& array, const char* fn, const char* name);
/// int32 values as a new 1-D numpy array.
py::array_t<int32_t> to_numpy(const std::vector<int32_t>& v);
/// double values as a new 1-D float64 numpy array.
py::array_t<double> to_numpy(const std::vector<double>& v);
/// An attention call's result as FlashInfer returns it: o, or (o, lse) with return_lse.
py::object to_python(const ref::AttentionResult& r, bool return_lse);

/// `paged_kv_cache` as FlashInfer accepts it (one 5-D pool, or a (k_cache, v_cache)
/// tuple of 4-D halves) plus its CSR page table, as a reference paged cache.
ref::PagedKVCache to_paged_cache(const py::handle& paged_kv_cache, const py::handle& kv_indptr,
                                 const py::handle& kv_indices, const py::handle& kv_last_page_len,
                                 const std::string& kv_layout, const char* fn);

// One binder per topic; module.cpp calls each.
void bind_attention(py::module_& m);
void bind_merge(py::module_& m);
void bind_kv_cache(py::module_& m);
void bind_structures(py::module_& m);
void bind_sampling(py::module_& m);
void bind_decoder(py::module_& m);
void bind_rope(py::module_& m);
void bind_mla(py::module_& m);
/// The harness's tolerance table (empty where the build has no harness).
void bind_tolerances(py::module_& m);

}  // namespace flashstep::python

namespace pybind11::detail {
#define FLASHSTEP_PY_ARGUMENT_NAME(Name, shown)      \
  template <>                                        \
  struct handle_type_name<flashstep::python::Name> { \
    static constexpr auto name = const_name(shown);  \
  };
FLASHSTEP_PY_ARGUMENT_NAME(FloatArray, "numpy.ndarray")
FLASHSTEP_PY_ARGUMENT_NAME(IntArray, "numpy.typing.ArrayLike")
FLASHSTEP_PY_ARGUMENT_NAME(OptionalIntArray, "Optional[numpy.typing.ArrayLike]")
FLASHSTEP_PY_ARGUMENT_NAME(KVCacheArg, "Union[numpy.ndarray, Tuple[numpy.ndarray, numpy.ndarray]]")
FLASHSTEP_PY_ARGUMENT_NAME(IntOrArray, "Union[int, numpy.ndarray]")
FLASHSTEP_PY_ARGUMENT_NAME(FloatOrArray, "Union[float, numpy.ndarray]")
FLASHSTEP_PY_ARGUMENT_NAME(OptionalFloatOrArray, "Optional[Union[float, numpy.ndarray]]")
#undef FLASHSTEP_PY_ARGUMENT_NAME
}  // namespace pybind11::detail
