// Sections "radix", "pages", "block-sparse" and "cascade": the host-side structures of
// the reference (issue 3). Until they land, each section says so.
#include "story.hpp"

namespace flashstep::cli {

namespace {
void not_yet(const char* what, std::ostream& os, Ledger& ledger) {
  os << "Not available yet: " << what << " has not landed in the reference (issue 3).\n";
  ledger.skipped(what);
}
}  // namespace

void show_radix(const Scenario&, std::ostream& os, Ledger& l) { not_yet("the radix prefix cache", os, l); }
void show_pages(const Scenario&, std::ostream& os, Ledger& l) { not_yet("the page allocator", os, l); }
void show_block_sparse(const Scenario&, std::ostream& os, Ledger& l) {
  not_yet("the block-sparse view", os, l);
}
void show_cascade(const Scenario&, std::ostream& os, Ledger& l) { not_yet("the cascade levels", os, l); }

}  // namespace flashstep::cli
