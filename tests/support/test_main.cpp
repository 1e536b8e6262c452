// doctest's main for every flashstep suite: prints the run seed first, so any failure
// can be reproduced with FLASHSTEP_SEED=<seed>.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "support/random.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind("--list", 0) == 0 || std::string(argv[i]).rfind("-ltc", 0) == 0)
      listing = true;
  if (!listing)
    std::printf("flashstep tests: random seed %llu (reproduce with FLASHSTEP_SEED=%llu)\n",
                static_cast<unsigned long long>(flashstep::test::run_seed()),
                static_cast<unsigned long long>(flashstep::test::run_seed()));
  return context.run();
}
