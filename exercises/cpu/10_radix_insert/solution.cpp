// Exercise 10's solution: walk, split where the match ends inside an edge, add a leaf.
#include <cstdint>
#include <vector>

#include "radix_tree.hpp"

namespace {

// Splits node `child`'s edge after `keep` tokens; returns the new node above it.
int32_t split_edge(RadixTree& tree, int32_t child, int64_t keep) {
  const int32_t top = tree.next_id++;
  RadixNode& c = tree.nodes.at(child);
  RadixNode head;
  head.parent = c.parent;
  head.key.assign(c.key.begin(), c.key.begin() + keep);
  head.pages.assign(c.pages.begin(), c.pages.begin() + keep);
  c.key.erase(c.key.begin(), c.key.begin() + keep);
  c.pages.erase(c.pages.begin(), c.pages.begin() + keep);
  head.children[c.key.front()] = child;
  tree.nodes.at(c.parent).children[head.key.front()] = top;  // same first token as before
  c.parent = top;
  tree.nodes[top] = head;
  return top;
}

}  // namespace

int64_t radix_insert(RadixTree& tree, const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  int32_t node = 0;
  int64_t pos = 0;
  while (pos < len) {
    auto it = tree.nodes.at(node).children.find(tokens[static_cast<size_t>(pos)]);
    if (it == tree.nodes.at(node).children.end()) {
      // nothing cached continues here: the rest of the tokens is one new leaf
      const int32_t leaf = tree.next_id++;
      RadixNode n;
      n.parent = node;
      n.key.assign(tokens.begin() + pos, tokens.end());
      n.pages.assign(pages.begin() + pos, pages.end());
      tree.nodes.at(node).children[n.key.front()] = leaf;
      tree.nodes[leaf] = n;
      return pos;
    }
    int32_t child = it->second;
    const std::vector<int32_t>& key = tree.nodes.at(child).key;
    int64_t k = 0;  // tokens of the edge that match, at least 1 (the first token did)
    while (k < static_cast<int64_t>(key.size()) && pos + k < len &&
           key[static_cast<size_t>(k)] == tokens[static_cast<size_t>(pos + k)])
      ++k;
    if (k < static_cast<int64_t>(key.size())) child = split_edge(tree, child, k);
    pos += k;
    node = child;
  }
  return pos;  // every token was cached already
}
