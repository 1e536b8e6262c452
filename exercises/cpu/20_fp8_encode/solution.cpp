// Exercise 20's solution: scale the magnitude so that the representable values around it
// are whole numbers, round to nearest even there, and read off exponent and fraction.
#include <cmath>
#include <cstdint>

uint8_t to_e4m3(double x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7e;  // saturate: 1.75 * 2^8, the largest finite pattern
  // The spacing of e4m3 values near a: 2^(e - 3) for a in [2^e, 2^(e+1)), e >= -6;
  // 2^-9 everywhere below 2^-6 (the subnormals share the smallest normal's spacing).
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : -6;
  if (e < -6) e = -6;
  const double step = std::ldexp(1.0, e - 3);
  double q = std::nearbyint(a / step);  // the default rounding mode: ties to even
  if (q >= 16 && e >= -6) {             // rounded up to the next binade
    q /= 2;
    e += 1;
  }
  if (e > 8 || (e == 8 && q > 14)) return sign | 0x7e;  // (448 is 1.75 * 2^8; above it saturates)
  if (q < 8) return sign | static_cast<uint8_t>(q);     // a subnormal (or zero): exponent bits 0
  return sign | static_cast<uint8_t>(((e + 7) << 3) | (static_cast<int>(q) - 8));
}
