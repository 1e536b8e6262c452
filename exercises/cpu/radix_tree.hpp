// The small radix tree of exercises 10 and 11: token runs on the edges, one KV page per
// token (page_size 1), as the reference's RadixCache keeps them but without its allocator.
//
//     Root
//       └─[1 2 3]─→ pages [P0 P1 P2]            nodes[0] = root
//                     ├─[4 5]─→ [P3 P4]          children keyed by an edge's first token
//                     └─[6]─→ [P7]
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

/// One node: the edge from its parent and the pages holding that edge's tokens.
struct RadixNode {
  int32_t parent = -1;                  ///< parent's id; -1 for the root
  std::vector<int32_t> key;             ///< tokens on the edge from the parent (empty for the root)
  std::vector<int32_t> pages;           ///< one page id per token of key
  std::map<int32_t, int32_t> children;  ///< first token of a child's edge -> the child's id
  int32_t lock_ref = 0;                 ///< > 0: a running request reads this node or one below it
  int64_t last_access = 0;              ///< logical time this node was last used (larger = more recent)
};

/// The tree: nodes by id, the root is id 0 and never goes away.
struct RadixTree {
  std::map<int32_t, RadixNode> nodes{{0, RadixNode{}}};  ///< every node, by id
  int32_t next_id = 1;                                   ///< id of the next node to create
};

/// The tree in pre-order (root first, children by first token), one line per node:
/// "depth 2: key [4 5] pages [3 4]". Two trees with the same lines hold the same prefixes
/// in the same pages, whatever ids they gave their nodes.
inline std::vector<std::string> radix_lines(const RadixTree& tree) {
  auto list = [](const std::vector<int32_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? " " : "") + std::to_string(v[i]);
    return s + "]";
  };
  std::vector<std::string> lines;
  std::vector<std::pair<int32_t, int>> stack{{0, 0}};
  while (!stack.empty()) {
    const auto [id, depth] = stack.back();
    stack.pop_back();
    const RadixNode& n = tree.nodes.at(id);
    lines.push_back("depth " + std::to_string(depth) + ": key " + list(n.key) + " pages " + list(n.pages));
    for (auto it = n.children.rbegin(); it != n.children.rend(); ++it) stack.push_back({it->second, depth + 1});
  }
  return lines;
}
