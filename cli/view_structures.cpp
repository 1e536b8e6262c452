// Section "cascade": the cascade levels of the reference (issue 3). Until they land, the
// section says so.
#include "story.hpp"

namespace flashstep::cli {

namespace {
void not_yet(const char* what, std::ostream& os, Ledger& ledger) {
  os << "Not available yet: " << what << " has not landed in the reference (issue 3).\n";
  ledger.skipped(what);
}
}  // namespace

void show_cascade(const Scenario&, std::ostream& os, Ledger& l) { not_yet("the cascade levels", os, l); }

}  // namespace flashstep::cli
