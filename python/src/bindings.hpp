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

/// A float32 or float64 numpy array (any rank) as a double tensor. Anything else
/// (ints, complex, objects) raises ValueError naming `fn` and `name`.
ref::Tensor to_tensor(const py::handle& array, const char* fn, const char* name);
/// A double tensor as a new float64 numpy array of the same shape.
py::array_t<double> to_numpy(const ref::Tensor& t);
/// A 1-D integer array (or sequence) as int32 values; ValueError if not integer or not 1-D.
std::vector<int32_t> to_int32_vector(const py::handle& array, const char* fn, const char* name);
/// int32 values as a new 1-D numpy array.
py::array_t<int32_t> to_numpy(const std::vector<int32_t>& v);

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

}  // namespace flashstep::python
