/// \file compare.hpp
/// \brief The one comparison every stage check uses: the per-dtype tolerance table,
/// element-wise AND norm-wise tests, and the first five mismatches named by position.
///
/// Pass means, for every element,  |out - ref| <= atol + rtol * |ref|,  and for the
/// tensor as a whole,  ||out - ref||_2 <= norm * ||ref||_2.  Both must hold: the
/// element-wise test catches one wrong row that a norm would average away, the norm-wise
/// test catches a small bias on every element that each element-wise bound would allow.
/// NaN never passes. A reference of -inf (the lse of a row that sees no key) is matched
/// only by -inf and is left out of the norms. There is no fraction-of-elements rule.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::harness {

/// Tolerances of one comparison.
struct Tolerance {
  double atol;  ///< absolute part of the element-wise bound
  double rtol;  ///< relative part of the element-wise bound
  double norm;  ///< bound on ||out - ref|| / ||ref||
};

/// One row of the tolerance table: how close a stage of this dtype must come to the
/// double-precision reference computed on the same (already rounded) inputs.
struct DTypeTolerance {
  DType dtype;      ///< element type of the stage's q and o (and of k and v unless kv_dtype says otherwise)
  DType kv_dtype;   ///< element type of its K/V: dtype, or an FP8 format
  Tolerance o;      ///< output, stored in `dtype`
  Tolerance lse;    ///< lse, always stored in fp32
  const char* why;  ///< where the error budget comes from
};

/// The table, one row per (dtype, kv_dtype) a stage may run.
const std::vector<DTypeTolerance>& tolerance_table();
/// The row for `dtype` with K/V in `dtype`.
const DTypeTolerance& tolerance_for(DType dtype);
/// The row for q/o in `dtype` and K/V in `kv_dtype` (throws ref::InvalidArgument if none).
const DTypeTolerance& tolerance_for(DType dtype, DType kv_dtype);

/// Names element `flat` of a tensor for a message, e.g. "(request 3, head 7, token 0, dim 12)".
using ElementLabel = std::function<std::string(int64_t flat)>;

/// Result of comparing one tensor.
struct Comparison {
  std::string what;                           ///< which tensor ("o", "lse", "probabilities", ...)
  Tolerance tol{};                            ///< the tolerances applied
  int64_t count = 0;                          ///< elements compared
  int64_t mismatches = 0;                     ///< elements outside the element-wise bound (NaN included)
  double max_abs_err = 0;                     ///< largest |out - ref| over finite pairs (inf if any NaN/inf mismatch)
  double norm_ratio = 0;                      ///< ||out - ref|| / ||ref|| (inf if any NaN)
  bool passed = false;                        ///< mismatches == 0 and norm_ratio <= tol.norm
  std::vector<std::string> first_mismatches;  ///< up to 5, each naming its position

  /// Multi-line text: verdict, errors against tolerances, the first mismatches.
  std::string summary() const;
};

/// Compares `out` to `ref` (equal sizes) under `tol`; `label` names positions.
Comparison compare(const std::string& what, const std::vector<double>& out, const std::vector<double>& ref,
                   const Tolerance& tol, const ElementLabel& label);

/// Labels for a (nnz_qo, num_heads, head_dim) output, rows grouped into requests by qo_indptr.
ElementLabel output_label(const std::vector<int32_t>& qo_indptr, int num_heads, int head_dim);
/// Labels for a (nnz_qo, num_heads) lse.
ElementLabel lse_label(const std::vector<int32_t>& qo_indptr, int num_heads);

}  // namespace flashstep::stages::harness
