// Grader of exercise 11: a RadixCache grown by random inserts and lookups over a
// vocabulary of three tokens, with one or two running requests locking their prefixes;
// your radix_evict() on a copy of it against RadixCache::evict, for several page counts
// in a row (the last asking for more than may go).
#include <string>
#include <vector>

#include "grade.hpp"
#include "radix_from_reference.hpp"
#include "radix_tree.hpp"

using namespace flashstep;
using namespace flashstep::exercises;

// Yours: attempt.cpp (solution.cpp in the solution's program).
std::vector<int32_t> radix_evict(RadixTree& tree, int64_t num_pages);

int main(int argc, char** argv) {
  return run_exercise(argc, argv, "radix_evict", [](Grader& g, std::mt19937_64& rng) {
    auto random_tokens = [&] {
      std::vector<int32_t> t(static_cast<size_t>(random_int(rng, 1, 6)));
      for (auto& x : t) x = static_cast<int32_t>(random_int(rng, 0, 2));
      return t;
    };
    for (int c = 0; c < 20; ++c) {
      ref::PageAllocator allocator(512, 1);
      ref::RadixCache cache(allocator);
      for (int r = 0; r < 10; ++r) {
        const std::vector<int32_t> tokens = random_tokens();
        if (random_int(rng, 0, 2) == 0) cache.match_prefix(tokens);  // a lookup marks its path used
        else cache.insert(tokens, allocator.allocate(static_cast<int64_t>(tokens.size())));
      }
      for (int64_t locks = random_int(rng, 0, 2); locks > 0; --locks)
        cache.lock(cache.match_prefix(random_tokens()).last_node);
      RadixTree yours = radix_tree_of(cache);
      for (int round = 0; round < 3; ++round) {
        const int64_t n = round < 2 ? random_int(rng, 1, 5) : cache.cached_pages() + 1;
        std::string drawing = ref::draw_radix_tree(cache, nullptr, {false, true});
        drawing.pop_back();  // its last newline
        g.at("tree " + std::to_string(c + 1) + " of 20 (" + std::to_string(cache.cached_pages()) + " pages, " +
             std::to_string(cache.locked_pages()) + " locked), evict " + std::to_string(n) + "; before:\n" + drawing);
        const std::vector<int32_t> mine = radix_evict(yours, n);
        g.same("the freed pages", mine, cache.evict(n));
        g.same("the tree after the eviction", radix_lines(yours), radix_lines(radix_tree_of(cache)));
      }
      g.passed_case();
    }
  });
}
