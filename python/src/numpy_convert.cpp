// numpy <-> reference tensor conversion with dtype checks that name the argument.
#include <cstring>

#include "bindings.hpp"
#include "flashstep/reference/errors.hpp"

namespace flashstep::python {

ref::Tensor to_tensor(const py::handle& obj, const char* fn, const char* name) {
  // Not an array at all (a list, None, a number): a TypeError, as numpy users expect;
  // an array of the wrong dtype is a ValueError below.
  if (!py::isinstance<py::array>(obj))
    throw py::type_error(std::string(fn) + ": " + name + " must be a numpy array of float32 or float64, got " +
                         std::string(Py_TYPE(obj.ptr())->tp_name));
  auto arr = py::reinterpret_borrow<py::array>(obj);
  const auto dt = arr.dtype();
  if (dt.kind() != 'f' || (dt.itemsize() != 4 && dt.itemsize() != 8))
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must be float32 or float64, got dtype " +
                               py::str(py::object(dt)).cast<std::string>());
  auto dbl = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(arr);
  std::vector<int64_t> shape(dbl.shape(), dbl.shape() + dbl.ndim());
  ref::Tensor t(shape);
  if (t.numel() > 0) std::memcpy(t.data.data(), dbl.data(), sizeof(double) * t.data.size());
  return t;
}

py::array_t<double> to_numpy(const ref::Tensor& t) {
  py::array_t<double> out(std::vector<py::ssize_t>(t.shape.begin(), t.shape.end()));
  if (t.numel() > 0) std::memcpy(out.mutable_data(), t.data.data(), sizeof(double) * t.data.size());
  return out;
}

py::object to_python(const ref::AttentionResult& r, bool return_lse) {
  if (return_lse) return py::make_tuple(to_numpy(r.o), to_numpy(r.lse));
  return to_numpy(r.o);
}

std::vector<int32_t> to_int32_vector(const py::handle& obj, const char* fn, const char* name) {
  py::array arr = py::array::ensure(obj);
  if (!arr) throw py::type_error(std::string(fn) + ": " + name + " must be a 1-D integer array or sequence");
  if (arr.size() > 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u')
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must hold integers, got dtype " +
                               py::str(py::object(arr.dtype())).cast<std::string>());
  if (arr.ndim() != 1)
    throw ref::InvalidArgument(std::string(fn) + ": " + name + " must be 1-D, got rank " + std::to_string(arr.ndim()));
  auto i64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(arr);
  std::vector<int32_t> v(static_cast<size_t>(i64.size()));
  for (py::ssize_t i = 0; i < i64.size(); ++i) {
    const int64_t x = i64.data()[i];
    if (x < INT32_MIN || x > INT32_MAX)
      throw ref::InvalidArgument(std::string(fn) + ": " + name + "[" + std::to_string(i) + "] = " + std::to_string(x) +
                                 " does not fit in int32");
    v[static_cast<size_t>(i)] = static_cast<int32_t>(x);
  }
  return v;
}

py::array_t<int32_t> to_numpy(const std::vector<int32_t>& v) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), sizeof(int32_t) * v.size());
  return out;
}

py::array_t<double> to_numpy(const std::vector<double>& v) {
  py::array_t<double> out(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(out.mutable_data(), v.data(), sizeof(double) * v.size());
  return out;
}

}  // namespace flashstep::python
