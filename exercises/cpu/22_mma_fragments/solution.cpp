// Exercise 22, solved: the value at (key k, head h) sits, in the C fragment, in lane
// 4 (k % 8) + h / 2, register (h % 2) + 2 (k / 8); each B value is read from there.
#include <array>

using Fragments = std::array<std::array<float, 4>, 32>;  // [lane][register]

Fragments b_from_c(const Fragments& c) {
  auto at = [&](int key, int head) { return c[4 * (key % 8) + head / 2][head % 2 + 2 * (key / 8)]; };
  Fragments b{};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    b[lane] = {at(2 * t, g), at(2 * t + 1, g), at(2 * t + 8, g), at(2 * t + 9, g)};
  }
  return b;
}
