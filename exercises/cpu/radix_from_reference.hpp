// For the graders of exercises 10 and 11: the reference's RadixCache as a RadixTree (same
// ids, keys, pages, locks and access times), to compare with yours or to start yours from.
#pragma once

#include <unordered_map>

#include <flashstep/reference.hpp>

#include "radix_tree.hpp"

inline RadixTree radix_tree_of(const flashstep::ref::RadixCache& cache) {
  std::unordered_map<int32_t, flashstep::ref::RadixNodeInfo> by_id;
  for (const auto& info : cache.nodes()) by_id[info.id] = info;
  RadixTree tree;
  tree.nodes.clear();
  for (const auto& [id, info] : by_id) {
    RadixNode& n = tree.nodes[id];
    n.parent = info.parent;
    n.key = info.key;
    n.pages = info.pages;
    n.lock_ref = info.lock_ref;
    n.last_access = info.last_access;
    for (int32_t child : info.children) n.children[by_id.at(child).key.at(0)] = child;
    tree.next_id = std::max(tree.next_id, id + 1);
  }
  return tree;
}
