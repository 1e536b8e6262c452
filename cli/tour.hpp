// The primer's story, printed step by step from reference computations.
#pragma once

#include <ostream>

namespace flashstep::cli {

/// Prints the worked example of the primer's FlashInfer section (d_model 2, pages
/// P0..P4, "A, pos 2" -> [0.63, 0.79], the Br=3 score table, the Bc=2 repacking),
/// every number computed by the reference. Returns 0 if the reference reproduces the
/// primer's printed values, 1 otherwise.
int print_worked_example(std::ostream& os);

}  // namespace flashstep::cli
