// libFuzzer target: the bytes choose the operations of RadixDifferential (the same driver
// as the randomized doctest), so any input that makes the radix cache disagree with the
// naive model, break an invariant, or touch memory it should not (ASan/UBSan) is a crash.
//
// Build and run by hand (the CTest "fuzz: radix_cache" does the same for a few seconds):
//   cmake --build <build> --target flashstep_fuzz_radix_cache
//   <build>/tests/fuzz/fuzz_radix_cache -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "fuzz/radix_cache_differential.hpp"

namespace {

// Choices read from the input; when the bytes run out every choice is 0 and the run ends.
struct ByteSource {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  bool exhausted() const { return pos >= size; }
  uint32_t pick(uint32_t n) {
    if (n <= 1) return 0;
    uint32_t v = 0;
    for (uint32_t range = 1; range < n && pos < size; range <<= 8) v = (v << 8) | data[pos++];
    return v % n;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSource src{data, size};
  flashstep::fuzz::RadixDifferential::Config cfg;
  cfg.page_size = 1 + src.pick(3);
  cfg.num_pages = 2 + src.pick(30);
  cfg.alphabet = static_cast<int32_t>(2 + src.pick(3));
  cfg.max_tokens = 1 + src.pick(static_cast<uint32_t>(5 * cfg.page_size));
  try {
    flashstep::fuzz::RadixDifferential diff(cfg);
    for (int i = 0; i < 400 && !src.exhausted(); ++i) diff.step(src);
    diff.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "radix cache fuzz failure (page_size %lld, num_pages %lld): %s\n",
                 static_cast<long long>(cfg.page_size), static_cast<long long>(cfg.num_pages), e.what());
    std::abort();
  }
  return 0;
}
