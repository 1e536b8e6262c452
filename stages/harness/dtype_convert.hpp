/// \file dtype_convert.hpp
/// \brief Host conversions between the reference's doubles and a stage's element bytes.
///
/// The harness rounds every random input to the stage's dtype *before* the reference
/// sees it, so reference and stage compute on the very same numbers and the comparison
/// measures only the stage's arithmetic (fp32 accumulation, output rounding), not the
/// rounding of its inputs.
#pragma once

#include <cstdint>
#include <vector>

#include "stage.hpp"

namespace flashstep::stages::harness {

/// `x` rounded to the nearest value representable in `dtype` (ties to even).
double round_to(DType dtype, double x);

/// Rounds every element of `values` in place to `dtype`.
void round_all(DType dtype, std::vector<double>& values);

/// Packs `values` (already representable, or rounded now) as `dtype` bytes, 1, 2 or 4 per
/// element. A NaN becomes a NaN pattern in every dtype (FP8 included).
std::vector<uint8_t> encode(DType dtype, const std::vector<double>& values);

/// Unpacks `count` elements of `dtype` from `bytes` to doubles (NaN stays NaN).
std::vector<double> decode(DType dtype, const std::vector<uint8_t>& bytes, size_t count);

}  // namespace flashstep::stages::harness
