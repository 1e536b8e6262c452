// Argument checks: every message names the function, the argument and the rule.
#include "flashstep/reference/errors.hpp"

#include <cmath>
#include <sstream>

namespace flashstep::ref {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  if (shape.size() == 1) os << ",";
  os << ")";
  return os.str();
}

void require(bool ok, const char* fn, const std::string& message) {
  if (!ok) throw InvalidArgument(std::string(fn) + ": " + message);
}

void check_storage(const char* fn, const char* name, const Tensor& t) {
  for (int64_t e : t.shape)
    require(e >= 0, fn, std::string(name) + " has a negative extent in shape " + shape_string(t.shape));
  require(static_cast<int64_t>(t.data.size()) == t.numel(), fn,
          std::string(name) + " holds " + std::to_string(t.data.size()) + " elements but its shape " +
              shape_string(t.shape) + " needs " + std::to_string(t.numel()));
}

void check_rank(const char* fn, const char* name, const Tensor& t, int expected_rank) {
  require(t.rank() == expected_rank, fn,
          std::string(name) + " must have rank " + std::to_string(expected_rank) + ", got shape " +
              shape_string(t.shape));
  check_storage(fn, name, t);
}

void check_dim(const char* fn, const char* name, const Tensor& t, int axis, int64_t expected, const char* what) {
  require(t.dim(axis) == expected, fn,
          std::string(name) + " dimension " + std::to_string(axis) + " (" + what + ") must be " +
              std::to_string(expected) + ", got " + std::to_string(t.dim(axis)) + " in shape " + shape_string(t.shape));
}

void check_finite(const char* fn, const char* name, const Tensor& t) {
  for (size_t i = 0; i < t.data.size(); ++i) {
    if (!std::isfinite(t.data[i])) {
      std::ostringstream os;
      os << name << " must be finite, but element " << i << " (flat index) is " << t.data[i];
      throw InvalidArgument(std::string(fn) + ": " + os.str());
    }
  }
}

void check_indptr(const char* fn, const char* name, const std::vector<int32_t>& indptr, int64_t expected_len,
                  int64_t expected_end) {
  const std::string n(name);
  require(!indptr.empty(), fn, n + " must have at least one element (indptr[0] == 0)");
  if (expected_len >= 0)
    require(static_cast<int64_t>(indptr.size()) == expected_len, fn,
            n + " must have length " + std::to_string(expected_len) + " (batch_size + 1), got " +
                std::to_string(indptr.size()));
  require(indptr[0] == 0, fn, n + "[0] must be 0 (got " + std::to_string(indptr[0]) + ")");
  for (size_t i = 1; i < indptr.size(); ++i)
    require_lazy(indptr[i] >= indptr[i - 1], fn, [&] {
      return n + " must be non-decreasing, but " + n + "[" + std::to_string(i) + "] = " + std::to_string(indptr[i]) +
             " < " + n + "[" + std::to_string(i - 1) + "] = " + std::to_string(indptr[i - 1]);
    });
  if (expected_end >= 0)
    require(indptr.back() == expected_end, fn,
            n + " must end at the data length " + std::to_string(expected_end) + ", but " + n + "[" +
                std::to_string(indptr.size() - 1) + "] = " + std::to_string(indptr.back()));
}

void check_heads(const char* fn, int64_t num_qo_heads, int64_t num_kv_heads) {
  require(num_qo_heads > 0 && num_kv_heads > 0, fn,
          "num_qo_heads and num_kv_heads must be positive (got " + std::to_string(num_qo_heads) + " and " +
              std::to_string(num_kv_heads) + ")");
  require(num_qo_heads % num_kv_heads == 0, fn,
          "num_qo_heads (" + std::to_string(num_qo_heads) + ") must be a multiple of num_kv_heads (" +
              std::to_string(num_kv_heads) + ")");
}

void check_head_dim(const char* fn, int64_t head_dim) {
  require(head_dim > 0, fn, "head_dim (q's last dimension) must be positive (got " + std::to_string(head_dim) + ")");
}

}  // namespace flashstep::ref
