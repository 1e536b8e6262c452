// Exercise 10 (chapter 6, "Finding shared prefixes: the radix tree"): insert a request's
// tokens into a radix tree, splitting an edge where the request leaves it.
//
// Fill in radix_insert() below, on the small tree of radix_tree.hpp (one page per token).
// The grader inserts random requests over a tiny vocabulary, so that they share prefixes
// and split each other's edges, into your tree and into the reference's RadixCache, and
// compares the two trees (keys and pages, node by node) after every insert.
//
//     cmake --build build --target flashstep_exercise_cpu_10_radix_insert
//     flashstep exercise check 10         (or run build/bin/flashstep_exercise_cpu_10_radix_insert)
//
// Stuck? `flashstep exercise hint 10`. The solution is solution.cpp beside this file.
#include <cstdint>
#include <vector>

#include "radix_tree.hpp"

/// Caches `tokens` in the tree.
/// Walk from the root: at each node, follow the child whose edge starts with the next
/// token, as far as the edge and the tokens agree. If they part (or the tokens end)
/// inside an edge, split it there: a new node takes the matched head of the edge and its
/// pages, and becomes the parent of the old node, which keeps the rest. The tokens no
/// edge matches become one new leaf under the node where the walk stopped.
/// \param tokens (len >= 1) token ids
/// \param pages (len) the request's page ids, page i holding token i. Only the pages of
///        the part not cached yet go into the tree (the cached part keeps its own pages).
/// \return how many leading tokens were cached before this call
int64_t radix_insert(RadixTree& tree, const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
  // TODO(exercise): walk, split, add the new leaf.
  return 0;
}
