// `flashstep tour` and `flashstep explain`: the course's story, section by section, for
// its own example or for any prompts. Every number printed is computed by the reference
// in this run; the tour also checks the course's printed values.
#include <algorithm>
#include <functional>
#include <map>

#include "commands.hpp"
#include "story.hpp"

namespace flashstep::cli {

namespace {

struct Section {
  std::string name;
  std::string title;
  std::function<void(const Scenario&, std::ostream&, Ledger&)> show;
};

// The story in the course's order. "attention" uses the course's own K/V numbers, so it
// belongs to the tour only; "gpu" is handled apart (it may be skipped).
const std::vector<Section>& all_sections() {
  static const std::vector<Section> sections = {
      {"tokens", "Tokens and the ragged batch", show_tokens},
      {"radix", "The radix tree: finding shared prefixes (RadixAttention)", show_radix},
      {"pages", "Page tables: KV memory in fixed-size pages (PagedAttention)", show_pages},
      {"block-sparse", "The block-sparse view: one lookup table for both (FlashInfer)", show_block_sparse},
      {"cascade", "Cascade levels: the shared prefix read once, then an exact merge", show_cascade},
      {"attention", "Attention for row \"A, pos 2\", number by number",
       [](const Scenario&, std::ostream& os, Ledger& l) { show_worked_attention(os, l); }},
      {"decoder", "The tiny decoder: generating text with a KV cache and shared prefixes", show_decoder},
  };
  return sections;
}

bool wanted(const std::vector<std::string>& chosen, const std::string& name) {
  return chosen.empty() || std::find(chosen.begin(), chosen.end(), name) != chosen.end();
}

int finish(const Ledger& ledger, std::ostream& os, const std::string& what) {
  os << "\n";
  for (const auto& s : ledger.skips()) os << "skipped: " << s << "\n";
  // Only skipped parts were asked for (`--section gpu` without a GPU): nothing was
  // checked, so this is "nothing to run here", like validate and bench, not a pass.
  if (ledger.checks() == 0 && !ledger.skips().empty()) {
    os << "SKIPPED: nothing to check on this machine in the sections asked for\n";
    return kExitSkipped;
  }
  const bool pass = ledger.failures() == 0;
  os << (pass ? "PASS" : "FAIL") << ": " << what << " (" << ledger.checks() - ledger.failures() << " of "
     << ledger.checks() << " checks passed)\n";
  return pass ? 0 : 1;
}

}  // namespace

const std::vector<std::string>& tour_sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& s : all_sections()) n.push_back(s.name);
    n.push_back("gpu");
    return n;
  }();
  return names;
}

const std::vector<std::string>& explain_sections() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& s : all_sections())
      if (s.name != "attention") n.push_back(s.name);
    return n;
  }();
  return names;
}

int run_tour(const TourOptions& opt, std::ostream& os) {
  const Scenario s = example_scenario(opt.seed);
  Ledger ledger(os);
  const bool one_section = opt.sections.size() == 1;
  if (!one_section) {
    os << "flashstep tour: the course's story on its own example, \"The cat sat\" and \"The cat\n"
          "ran fast\", every number computed by the CPU reference (seed "
       << opt.seed << ").\n";
  }
  int number = 0;
  for (const auto& sec : all_sections()) {
    ++number;
    if (!wanted(opt.sections, sec.name)) continue;
    heading(os, number, sec.title);
    sec.show(s, os, ledger);
  }
  ++number;
  if (wanted(opt.sections, "gpu")) {
    heading(os, number, "GPU stages against the reference");
    if (opt.no_gpu) {
      os << "GPU part skipped: --no-gpu was given.\n";
      ledger.skipped("GPU part (--no-gpu)");
    } else {
      std::string why;
      const int rc = tour_gpu_part(/*quick=*/true, opt.seed, os, &why);
      if (rc == kExitSkipped) ledger.skipped("GPU part (" + why + ")");
      else ledger.expect(rc == 0, "every registered stage validates against the reference");
    }
  }
  return finish(ledger, os, "the reference reproduces the course's story");
}

int run_explain(const ExplainOptions& opt, std::ostream& os) {
  const Scenario s = make_scenario(opt.prompts, opt.page_size, opt.br, opt.seed);
  Ledger ledger(os);
  os << "flashstep explain: " << s.prompts.size() << " prompt" << (s.prompts.size() > 1 ? "s" : "") << ", page size "
     << s.page_size << ", Br " << s.br << " (seed " << opt.seed << ").\n";
  int number = 0;
  for (const auto& sec : all_sections()) {
    if (sec.name == "attention") continue;
    ++number;
    if (!wanted(opt.sections, sec.name)) continue;
    heading(os, number, sec.title);
    sec.show(s, os, ledger);
  }
  return finish(ledger, os, "every view agrees with the reference");
}

}  // namespace flashstep::cli
