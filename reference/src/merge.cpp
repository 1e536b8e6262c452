// The attention-state merge, in double. -inf LSE marks the empty set (the identity).
#include "flashstep/reference/merge.hpp"

#include <cmath>
#include <limits>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Checks that an LSE holds finite values or -inf (the empty state), nothing else.
void check_lse(const char* fn, const char* name, const Tensor& s) {
  for (size_t i = 0; i < s.data.size(); ++i)
    require_lazy(std::isfinite(s.data[i]) || s.data[i] == kNegInf, fn, [&] {
      return std::string(name) + " must be finite or -inf (empty set), but element " + std::to_string(i) +
             " (flat index) is " + std::to_string(s.data[i]);
    });
}

}  // namespace

MergedState merge_state(const Tensor& v_a, const Tensor& s_a, const Tensor& v_b, const Tensor& s_b) {
  const char* fn = "merge_state";
  check_rank(fn, "v_a", v_a, 3);
  check_rank(fn, "v_b", v_b, 3);
  check_rank(fn, "s_a", s_a, 2);
  check_rank(fn, "s_b", s_b, 2);
  require(v_a.shape == v_b.shape, fn,
          "v_a and v_b must have the same shape, got " + shape_string(v_a.shape) + " and " + shape_string(v_b.shape));
  const std::vector<int64_t> lse_shape{v_a.dim(0), v_a.dim(1)};
  require(s_a.shape == lse_shape, fn,
          "s_a must have shape " + shape_string(lse_shape) + ", got " + shape_string(s_a.shape));
  require(s_b.shape == lse_shape, fn,
          "s_b must have shape " + shape_string(lse_shape) + ", got " + shape_string(s_b.shape));
  check_finite(fn, "v_a", v_a);
  check_finite(fn, "v_b", v_b);
  check_lse(fn, "s_a", s_a);
  check_lse(fn, "s_b", s_b);

  // Stack the two states and reuse the n-way merge: one formula, one place.
  const int64_t n = v_a.dim(0), h = v_a.dim(1), d = v_a.dim(2);
  Tensor v({n, 2, h, d}), s({n, 2, h});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t hh = 0; hh < h; ++hh) {
      s({i, 0, hh}) = s_a({i, hh});
      s({i, 1, hh}) = s_b({i, hh});
      for (int64_t dd = 0; dd < d; ++dd) {
        v({i, 0, hh, dd}) = v_a({i, hh, dd});
        v({i, 1, hh, dd}) = v_b({i, hh, dd});
      }
    }
  return merge_states(v, s);
}

MergedState merge_states(const Tensor& v, const Tensor& s) {
  const char* fn = "merge_states";
  check_rank(fn, "v", v, 4);
  check_rank(fn, "s", s, 3);
  const std::vector<int64_t> lse_shape{v.dim(0), v.dim(1), v.dim(2)};
  require(s.shape == lse_shape, fn,
          "s must have shape " + shape_string(lse_shape) + " (seq_len, num_states, num_heads), got " +
              shape_string(s.shape));
  check_finite(fn, "v", v);
  check_lse(fn, "s", s);
  const int64_t n = v.dim(0), num_states = v.dim(1), h = v.dim(2), d = v.dim(3);
  MergedState out{Tensor({n, h, d}), Tensor({n, h})};
  for (int64_t i = 0; i < n; ++i)
    for (int64_t hh = 0; hh < h; ++hh) {
      // lse = m + log(sum_k exp(lse_k - m)), m the largest LSE; empty states weigh 0.
      double m = kNegInf;
      for (int64_t k = 0; k < num_states; ++k) m = std::max(m, s({i, k, hh}));
      if (m == kNegInf) {  // every state empty: the result is empty too
        out.s({i, hh}) = kNegInf;
        continue;  // out.v is already 0
      }
      double sum = 0;
      for (int64_t k = 0; k < num_states; ++k) sum += std::exp(s({i, k, hh}) - m);
      const double lse = m + std::log(sum);
      out.s({i, hh}) = lse;
      for (int64_t k = 0; k < num_states; ++k) {
        const double w = std::exp(s({i, k, hh}) - lse);
        for (int64_t dd = 0; dd < d; ++dd) out.v({i, hh, dd}) += w * v({i, k, hh, dd});
      }
    }
  return out;
}

}  // namespace flashstep::ref
