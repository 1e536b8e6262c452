// doctest's main for every CPU flashstep suite: prints the run seed first, so any failure
// can be reproduced with FLASHSTEP_SEED=<seed>.
#define DOCTEST_CONFIG_IMPLEMENT
#include "support/doctest_main.hpp"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (flashstep::test::listing_only(argc, argv)) return context.run();
  flashstep::test::print_seed("flashstep tests");
  return flashstep::test::run_selected(context);
}
