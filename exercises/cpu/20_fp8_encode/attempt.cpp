// Exercise 20 (the FP8 lesson, stages/fp8/README.md): store a value in an 8-bit float.
//
// Fill in to_e4m3() below: the e4m3 bit pattern (1 sign bit, 4 exponent bits with bias 7,
// 3 fraction bits; float8_e4m3fn, which has no infinity) nearest to x, ties to the even
// pattern, a magnitude above the largest finite value (448) saturating to +-448, NaN to
// 0x7f. Values below the smallest normal (2^-6) become subnormals (exponent bits 0, value
// fraction * 2^-9), down to zero. The grader compares your pattern with the reference's
// fp8_from_double on ties, subnormals, overflow and random values, bit for bit.
//
//     cmake --build build --target flashstep_exercise_cpu_20_fp8_encode
//     flashstep exercise check 20         (or run build/bin/flashstep_exercise_cpu_20_fp8_encode)
//
// Stuck? `flashstep exercise hint 20`. The solution is solution.cpp beside this file.
#include <cstdint>

/// The e4m3 pattern nearest to x (sign in bit 7).
uint8_t to_e4m3(double x) {
  // TODO(exercise): return the pattern.
  return 0;
}
