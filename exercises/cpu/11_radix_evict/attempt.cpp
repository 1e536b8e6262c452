// Exercise 11 (chapter 6, "When memory runs short, eviction"): free pages from a radix
// tree, least recently used leaves first, never a locked one.
//
// Fill in radix_evict() below, on the small tree of radix_tree.hpp. The grader builds a
// tree in the reference's RadixCache by random inserts, lookups (which mark nodes used)
// and locks, gives you a copy, and compares the pages you free and the tree you leave
// with what RadixCache::evict frees and leaves.
//
//     cmake --build build --target flashstep_exercise_cpu_11_radix_evict
//     flashstep exercise check 11         (or run build/bin/flashstep_exercise_cpu_11_radix_evict)
//
// Stuck? `flashstep exercise hint 11`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include "radix_tree.hpp"

/// Frees up to `num_pages` pages, and fewer only if nothing else may go:
/// - only a leaf (a node other than the root, with no children) with lock_ref 0 may lose
///   pages, and among those the one with the smallest last_access goes first;
/// - a leaf gives up its pages from the end of its edge (its deepest token) backwards,
///   its key and pages getting shorter, until enough pages are freed;
/// - a leaf left with no pages is removed (its parent forgets it); its parent, if it is
///   now childless, unlocked and not the root, is a leaf like any other.
/// \return the freed pages, in the order they were freed
std::vector<int32_t> radix_evict(RadixTree& tree, int64_t num_pages) {
  std::vector<int32_t> freed;
  // TODO(exercise): pick leaves and free their pages.
  return freed;
}
