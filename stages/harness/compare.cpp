// The tolerance table and the element-wise + norm-wise comparison.
#include "harness/compare.hpp"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "flashstep/reference/errors.hpp"

namespace flashstep::stages::harness {

const std::vector<DTypeTolerance>& tolerance_table() {
  // Inputs are exactly representable in the dtype and the reference uses the same
  // values, so the budget is fp32 accumulation (about 1e-6 relative after thousands of
  // keys, exp2f within 2 ulp) plus rounding the output to the dtype: half an ulp, i.e.
  // 2^-24 (f32), 2^-11 = 4.9e-4 (f16), 2^-8 = 3.9e-3 (bf16) relative at most, and about
  // a third of that in the root-mean-square that the norm measures. Each bound leaves
  // a margin of 2-4x over that budget and no more, so a real bug cannot hide in it.
  //
  // FP8 K/V rows are derived, not chosen: the harness hands the reference the very FP8
  // values of the pool (decoded exactly, times the scales in double), the stage widens
  // them exactly (every FP8 value is an fp16 value) and folds the scales into two fp32
  // factors (2^-24 each), so the error budget is that of the q/o dtype's row — fp32
  // accumulation and output rounding — plus one term: a tensor-core stage (04, and stage
  // 03's FP8 kernel) rounds each softmax weight to fp16 before P V while its row sum adds
  // the unrounded weights, so a weight carries up to 2^-11 of relative error and o moves
  // by at most 2^-11 times the weighted mean of |v|. The harness draws v * v_scale in
  // [-1, 1], stored to within 2^-3 relative (e5m2), so |v| <= 1.125: atol and norm grow by
  // 1.125 x 2^-11 and 2^-11.
  static const std::vector<DTypeTolerance> table = [] {
    std::vector<DTypeTolerance> rows = {
        {DType::f32,
         DType::f32,
         {2e-5, 2e-4, 2e-5},
         {2e-4, 2e-5, 2e-5},
         "fp32 accumulation only: output rounding is 2^-24"},
        {DType::f16,
         DType::f16,
         {2e-4, 2e-3, 1.5e-3},
         {2e-4, 2e-5, 2e-5},
         "fp16 output rounding, at most 2^-11 relative"},
        {DType::bf16,
         DType::bf16,
         {2e-3, 1.6e-2, 8e-3},
         {2e-4, 2e-5, 2e-5},
         "bf16 output rounding, at most 2^-8 relative"},
    };
    for (DType q : {DType::f16, DType::bf16})
      for (DType kv : {DType::e4m3, DType::e5m2}) {
        DTypeTolerance row = rows[q == DType::f16 ? 1 : 2];
        row.kv_dtype = kv;
        const double u16 = 1.0 / 2048;  // fp16's unit roundoff, 2^-11: the weights' rounding
        row.o.atol += 1.125 * u16;
        row.o.norm += u16;
        row.why = q == DType::f16
                      ? "FP8 K/V decoded exactly, as the reference reads them: fp16 output rounding, weights in fp16"
                      : "FP8 K/V decoded exactly, as the reference reads them: bf16 output rounding, weights in fp16";
        rows.push_back(row);
      }
    return rows;
  }();
  return table;
}

const DTypeTolerance& tolerance_for(DType dtype) { return tolerance_for(dtype, dtype); }

const DTypeTolerance& tolerance_for(DType dtype, DType kv_dtype) {
  for (const DTypeTolerance& row : tolerance_table())
    if (row.dtype == dtype && row.kv_dtype == kv_dtype) return row;
  throw ref::InvalidArgument(std::string("tolerance_for: no tolerance row for dtype ") + to_string(dtype) +
                             " with K/V in " + to_string(kv_dtype));
}

std::string Comparison::summary() const {
  std::ostringstream s;
  s << std::setprecision(3);
  s << what << ": " << (passed ? "PASS" : "FAIL") << " (" << mismatches << " of " << count << " elements outside atol "
    << tol.atol << " + rtol " << tol.rtol << " * |ref|; max |diff| " << max_abs_err << "; ||diff||/||ref|| "
    << norm_ratio << " vs " << tol.norm << ")";
  if (!first_mismatches.empty()) {
    s << "\n  first mismatches:";
    for (const std::string& m : first_mismatches) s << "\n    " << m;
  }
  return s.str();
}

Comparison compare(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
                   const Tolerance& tol, const ElementLabel& label) {
  ref::require(out.size() == ref.size(), "compare",
               what + ": out has " + std::to_string(out.size()) + " elements, ref has " + std::to_string(ref.size()));
  const double inf = std::numeric_limits<double>::infinity();
  Comparison c;
  c.what = what;
  c.tol = tol;
  c.count = static_cast<int64_t>(out.size());
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = out[i], r = ref[i];
    bool ok;
    double diff;
    if (std::isinf(r)) {
      // -inf (or +inf) is a value of its own: only the same infinity matches it.
      ok = o == r;
      diff = ok ? 0 : inf;
    } else {
      diff = std::abs(o - r);  // NaN when o is NaN
      ok = std::isfinite(o) && diff <= tol.atol + tol.rtol * std::abs(r);
      ref2 += r * r;
      diff2 += std::isfinite(diff) ? diff * diff : inf;
    }
    if (!std::isfinite(diff) || std::isnan(diff)) diff = inf;
    c.max_abs_err = std::max(c.max_abs_err, diff);
    if (!ok) {
      ++c.mismatches;
      if (c.first_mismatches.size() < 5) {
        std::ostringstream m;
        m << std::setprecision(6) << label(static_cast<int64_t>(i)) << ": got " << o << ", expected " << r
          << " (|diff| " << std::abs(o - r) << ", allowed " << tol.atol + tol.rtol * std::abs(r) << ")";
        c.first_mismatches.push_back(m.str());
      }
    }
  }
  // An all-zero (or all -inf) reference makes the relative norm meaningless: then the
  // element-wise test alone decides (diff2 must be 0 for the ratio to be 0).
  c.norm_ratio = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? inf : 0.0);
  c.passed = c.mismatches == 0 && c.norm_ratio <= tol.norm;
  return c;
}

namespace {
/// Request owning query row `row` and the row's position within it.
std::pair<int64_t, int64_t> request_of(const std::vector<int32_t>& qo_indptr, int64_t row) {
  const auto it = std::upper_bound(qo_indptr.begin(), qo_indptr.end(), row);
  const int64_t request = (it - qo_indptr.begin()) - 1;
  return {request, row - qo_indptr[static_cast<size_t>(request)]};
}
}  // namespace

ElementLabel output_label(const std::vector<int32_t>& qo_indptr, int num_heads, int head_dim) {
  return [qo_indptr, num_heads, head_dim](int64_t flat) {
    const int64_t row = flat / (int64_t{num_heads} * head_dim);
    const int64_t head = (flat / head_dim) % num_heads, dim = flat % head_dim;
    const auto [request, token] = request_of(qo_indptr, row);
    std::ostringstream s;
    s << "(request " << request << ", head " << head << ", token " << token << ", dim " << dim << ")";
    return s.str();
  };
}

ElementLabel lse_label(const std::vector<int32_t>& qo_indptr, int num_heads) {
  return [qo_indptr, num_heads](int64_t flat) {
    const int64_t row = flat / num_heads, head = flat % num_heads;
    const auto [request, token] = request_of(qo_indptr, row);
    std::ostringstream s;
    s << "(request " << request << ", head " << head << ", token " << token << ", dim -)";
    return s.str();
  };
}

}  // namespace flashstep::stages::harness
