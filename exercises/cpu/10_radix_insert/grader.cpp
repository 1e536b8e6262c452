// Grader of exercise 10: random requests over a vocabulary of three tokens, inserted into
// your tree and into the reference's RadixCache (page size 1, fresh pages from a
// PageAllocator for each request, as a finished request would hand them over); after every
// insert, the cached length it returns and the whole tree must agree.
#include <string>
#include <vector>

#include "grade.hpp"
#include "radix_from_reference.hpp"
#include "radix_tree.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
int64_t radix_insert(RadixTree& tree, const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "radix_insert", [](Grader& g, std::mt19937_64& rng) {
    for (int c = 0; c < 20; ++c) {
      ref::PageAllocator allocator(512, 1);
      ref::RadixCache cache(allocator);
      RadixTree yours;
      std::vector<std::vector<int32_t>> inserted;
      for (int r = 0; r < 10; ++r) {
        // Often a known prefix with a new ending: that is what splits edges.
        std::vector<int32_t> tokens;
        if (!inserted.empty() && random_int(rng, 0, 3) > 0) {
          const auto& old =
              inserted[static_cast<size_t>(random_int(rng, 0, static_cast<int64_t>(inserted.size()) - 1))];
          tokens.assign(old.begin(), old.begin() + random_int(rng, 1, static_cast<int64_t>(old.size())));
        }
        for (int64_t n = random_int(rng, tokens.empty() ? 1 : 0, 4); n > 0; --n)
          tokens.push_back(static_cast<int32_t>(random_int(rng, 0, 2)));
        inserted.push_back(tokens);
        const std::vector<int32_t> pages = allocator.allocate(static_cast<int64_t>(tokens.size()));
        g.at("tree " + std::to_string(c + 1) + " of 20, insert " + std::to_string(r + 1) + " of 10: tokens " +
             list_text(tokens) + ", pages " + list_text(pages));
        const int64_t expected_cached = cache.insert(tokens, pages);
        g.same("tokens already cached (the return value)", radix_insert(yours, tokens, pages), expected_cached);
        g.same("the tree", radix_lines(yours), radix_lines(radix_tree_of(cache)));
      }
      g.passed_case();
    }
  });
}
