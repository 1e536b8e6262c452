// Exercise 11's solution: repeatedly take the least recently used unlocked leaf.
#include <cstdint>
#include <vector>

#include "radix_tree.hpp"

std::vector<int32_t> radix_evict(RadixTree& tree, int64_t num_pages) {
  std::vector<int32_t> freed;
  while (static_cast<int64_t>(freed.size()) < num_pages) {
    // the least recently used evictable leaf (two leaves are never used at the same time)
    int32_t lru = -1;
    for (const auto& [id, n] : tree.nodes)
      if (id != 0 && n.children.empty() && n.lock_ref == 0 &&
          (lru < 0 || n.last_access < tree.nodes.at(lru).last_access))
        lru = id;
    if (lru < 0) break;  // everything left is locked (or only the root is left)
    RadixNode& leaf = tree.nodes.at(lru);
    const int32_t first_token = leaf.key.front();
    while (static_cast<int64_t>(freed.size()) < num_pages && !leaf.pages.empty()) {
      freed.push_back(leaf.pages.back());  // the deepest page first
      leaf.pages.pop_back();
      leaf.key.pop_back();
    }
    if (!leaf.pages.empty()) break;  // shortened, not removed: enough pages are free
    tree.nodes.at(leaf.parent).children.erase(first_token);
    tree.nodes.erase(lru);
  }
  return freed;
}
