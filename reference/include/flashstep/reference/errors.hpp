/// \file errors.hpp
/// \brief Argument checks shared by every reference entry point.
///
/// Every public function validates its inputs before it reads them. A failed check
/// throws flashstep::ref::InvalidArgument whose message names the function, the
/// argument and the rule it broke, e.g.
/// `batch_decode_with_paged_kv_cache: kv_indptr[0] must be 0 (got 3)`.
/// The Python module turns it into ValueError with the same text.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// Thrown for any invalid argument; `what()` names the function and argument.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Throws InvalidArgument("<fn>: <message>") unless `ok`.
void require(bool ok, const char* fn, const std::string& message);

/// The form for checks inside per-element loops: `make_message()` (returning a
/// std::string) runs only when the check fails, so a passing check costs one comparison.
template <typename MakeMessage>
void require_lazy(bool ok, const char* fn, MakeMessage&& make_message) {
  if (!ok) require(false, fn, make_message());
}

/// `t` must have `expected_rank` dimensions.
void check_rank(const char* fn, const char* name, const Tensor& t, int expected_rank);
/// `t.dim(axis)` must equal `expected` (`what` says what the extent means, e.g. "head_dim").
void check_dim(const char* fn, const char* name, const Tensor& t, int axis, int64_t expected, const char* what);
/// Every element of `t` must be finite (no NaN or Inf).
void check_finite(const char* fn, const char* name, const Tensor& t);
/// `data.size()` must equal `t.numel()` (guards hand-built tensors).
void check_storage(const char* fn, const char* name, const Tensor& t);

/// A CSR offsets array: length `expected_len` (if >= 0), starts at 0, never decreases,
/// and ends at `expected_end` (if >= 0).
void check_indptr(const char* fn, const char* name, const std::vector<int32_t>& indptr, int64_t expected_len,
                  int64_t expected_end);

/// Query/KV heads must divide (GQA) and be positive.
void check_heads(const char* fn, int64_t num_qo_heads, int64_t num_kv_heads);
/// Throws InvalidArgument from `fn` unless head_dim (q's last dimension) is positive: a
/// head of no elements has no dot product, and the reference would return empty rows.
void check_head_dim(const char* fn, int64_t head_dim);

}  // namespace flashstep::ref
