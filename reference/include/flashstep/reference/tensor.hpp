/// \file tensor.hpp
/// \brief The one host tensor type of the reference: a shape and a row-major vector.
///
/// The reference is written for reading, not speed, so a tensor is just a shape and a
/// flat `std::vector` in row-major (C) order, the same order numpy and FlashInfer use.
/// Index arrays (indptr, page indices) are plain `std::vector<int32_t>`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace flashstep::ref {

/// A dense row-major tensor of `T` (double for the reference's inputs and outputs).
template <typename T>
struct BasicTensor {
  std::vector<int64_t> shape;  ///< extent of each dimension, outermost first
  std::vector<T> data;         ///< row-major elements, `numel()` of them

  BasicTensor() = default;
  /// A tensor of the given shape filled with `fill`.
  explicit BasicTensor(std::vector<int64_t> shape_, T fill = T(0))
      : shape(std::move(shape_)), data(static_cast<size_t>(count(shape)), fill) {}
  /// A tensor of the given shape holding `values` (row-major; sizes must agree).
  BasicTensor(std::vector<int64_t> shape_, std::vector<T> values) : shape(std::move(shape_)), data(std::move(values)) {}

  /// Number of dimensions.
  int rank() const { return static_cast<int>(shape.size()); }
  /// Extent of dimension `i` (negative counts from the end).
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i < 0 ? i + rank() : i)); }
  /// Number of elements.
  int64_t numel() const { return count(shape); }

  /// Row-major offset of a multi-index (no bounds checks: callers validate shapes first).
  int64_t offset(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    size_t d = 0;
    for (int64_t i : idx) off = off * shape[d++] + i;
    return off;
  }
  /// Element at a multi-index, e.g. `t({i, h, d})` (no bounds checks, as offset()).
  /// \param idx one index per dimension, outermost first
  T& operator()(std::initializer_list<int64_t> idx) { return data[static_cast<size_t>(offset(idx))]; }
  /// Read-only element at a multi-index (no bounds checks, as offset()).
  /// \param idx one index per dimension, outermost first
  const T& operator()(std::initializer_list<int64_t> idx) const { return data[static_cast<size_t>(offset(idx))]; }

  /// Number of elements of a tensor of shape `s` (1 for rank 0).
  /// \param s extent of each dimension
  static int64_t count(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t e : s) n *= e;
    return n;
  }
};

/// The reference's tensor: inputs are widened to double, outputs are double.
using Tensor = BasicTensor<double>;

/// Shape as text, e.g. "(3, 8, 128)", for error messages.
std::string shape_string(const std::vector<int64_t>& shape);

/// max |a - b| over all elements, the one comparison the tests and the tour share.
/// Different shapes, or a NaN anywhere, give +inf; equal infinities (two empty
/// states' lse = -inf) agree.
/// \param a any tensor
/// \param b a tensor of the same shape as `a`
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace flashstep::ref
