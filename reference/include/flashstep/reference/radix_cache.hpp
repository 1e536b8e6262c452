/// \file radix_cache.hpp
/// \brief RadixAttention's prefix cache: a radix tree from token sequences to KV pages.
///
/// Each edge is labelled with a run of tokens and holds the pages that store their K/V;
/// the path from the root to a node spells a cached prefix. Edges with no branching are
/// one edge, so inserting [A,B,C,D,E] and then [A,B,C,F,G] splits the first edge:
///
/// ```
///   Root                                  Root
///     └─"A B C D E"─→ [P0 P1 P2 P3 P4]      └─"A B C"─→ [P0 P1 P2]
///                                                       ├─"D E"─→ [P3 P4]
///                                                       └─"F G"─→ [P5 P6]
/// ```
///
/// **Page granularity.** Only whole pages are cached and matched: every edge holds a
/// multiple of page_size tokens, match_prefix returns a multiple of page_size tokens, and
/// insert caches the first floor(len / page_size) pages of a sequence. A partly filled
/// tail page is never cached, because its owner's next decode step writes into the free
/// slots of that page; sharing it would need copy-on-write at every step. The caller keeps
/// (and later drops) its own reference to the tail page. With page_size 1 nothing is lost.
///
/// **Ownership.** The cache holds one reference (PageAllocator::incref) on each page it
/// stores and drops it when it evicts the page; a page returns to the free list only when
/// nobody else holds it either. A request that finishes calls insert() and then drops its
/// own references: pages the cache adopted stay, duplicates of already cached pages free.
///
/// **Locks and LRU.** lock(node) pins the path from `node` to the root (a running request
/// reads those pages); evict() only removes unlocked leaves, least recently used first,
/// where match_prefix and insert "use" every node on their path. Time is a counter bumped
/// by each match_prefix/insert call. match_prefix splits an edge where a match ends inside
/// it (as SGLang does), so that the node it returns covers exactly the matched pages and
/// lock() pins nothing more.
///
/// **Eviction is page-exact.** evict(n) releases exactly min(n, evictable) pages: when the
/// least recently used leaf holds more pages than still needed, only its last pages are
/// released and the leaf's edge gets shorter.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "flashstep/reference/page_allocator.hpp"

namespace flashstep::ref {

/// Result of RadixCache::match_prefix.
struct RadixMatch {
  int64_t length = 0;          ///< matched tokens, a multiple of page_size
  std::vector<int32_t> pages;  ///< (length / page_size) page ids holding them, first first
  int32_t last_node = 0;       ///< node where the match ends (the root, id 0, if none)
};

/// A read-only view of one tree node (for printers, tests and the Python module).
struct RadixNodeInfo {
  int32_t id = 0;                 ///< stable id; the root is 0; ids are never reused
  int32_t parent = -1;            ///< parent's id, -1 for the root
  std::vector<int32_t> key;       ///< tokens on the edge from the parent (empty for the root)
  std::vector<int32_t> pages;     ///< (key.size() / page_size) pages holding those tokens
  int32_t lock_ref = 0;           ///< locks held on this node or any descendant
  int32_t own_locks = 0;          ///< lock() calls on exactly this node not yet unlocked
  int64_t last_access = 0;        ///< logical time of the last match/insert through it
  int64_t depth_tokens = 0;       ///< tokens from the root to the end of this node
  std::vector<int32_t> children;  ///< child ids, ordered by their first page's tokens
};

/// The radix prefix cache over a PageAllocator (whose page_size it uses). The allocator
/// must outlive the cache; the destructor drops the cache's references.
class RadixCache {
 public:
  /// An empty cache (just the root) over `allocator`, whose page_size it uses.
  explicit RadixCache(PageAllocator& allocator);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  /// Tokens per page: the granularity of every match and insert.
  int64_t page_size() const { return page_size_; }

  /// Longest cached prefix of `tokens` (whole pages only). Marks the path as used now and
  /// splits an edge if the match ends inside it.
  /// \param tokens (len) token ids; tokens past floor(len / page_size) pages never match
  RadixMatch match_prefix(const std::vector<int32_t>& tokens);

  /// Caches the whole pages of `tokens`. The part already cached keeps its pages (the
  /// caller's duplicates are not adopted); every new page gains one reference held by the
  /// cache. Marks the path as used now.
  /// \param tokens (len) token ids
  /// \param pages the request's page table for `tokens`: floor(len / page_size) or
  ///        ceil(len / page_size) page ids (a partial tail page is not cached). Pages the
  ///        cache adopts must be in use in the allocator, distinct, and not cached already.
  /// \return tokens of `tokens` that were already cached before this call
  int64_t insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages);

  /// Pins the path from `node` to the root against eviction (a running request reads it).
  /// Locking the root is allowed and pins nothing.
  void lock(int32_t node);
  /// Releases one lock() on exactly `node`.
  void unlock(int32_t node);

  /// Evicts up to `num_pages` pages from unlocked leaves, least recently used first,
  /// dropping the cache's reference on each (a page nobody else holds becomes free).
  /// \param num_pages >= 0
  /// \return the evicted pages in eviction order (deepest page of a leaf first); fewer than
  ///         num_pages only if nothing else is evictable
  std::vector<int32_t> evict(int64_t num_pages);

  /// Pages held by the cache.
  int64_t cached_pages() const { return static_cast<int64_t>(cached_.size()); }
  /// Pages on some locked path (not evictable).
  int64_t locked_pages() const;
  /// Pages evict() could release now: cached_pages() - locked_pages().
  int64_t evictable_pages() const { return cached_pages() - locked_pages(); }
  /// Number of nodes, the root included.
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  /// Current logical time (bumped by every match_prefix and insert).
  int64_t now() const { return clock_; }

  /// Every node in pre-order (root first, children in key order).
  std::vector<RadixNodeInfo> nodes() const;
  /// One node by id (InvalidArgument if it does not exist, e.g. it was evicted).
  RadixNodeInfo node(int32_t id) const;

  /// Checks the tree's invariants and its agreement with the allocator; throws
  /// std::logic_error naming the broken rule. Used after every step by the tests.
  void check_invariants() const;

 private:
  struct Node {
    int32_t parent = -1;
    std::vector<int32_t> key;
    std::vector<int32_t> pages;
    int32_t lock_ref = 0;
    int32_t own_locks = 0;
    int64_t last_access = 0;
    std::map<std::vector<int32_t>, int32_t> children;  // first page's tokens -> child id
  };

  std::vector<int32_t> first_page(const std::vector<int32_t>& tokens, int64_t offset) const;
  int64_t matched_pages(const Node& child, const std::vector<int32_t>& tokens, int64_t offset) const;
  int32_t split(int32_t child, int64_t keep_pages);
  RadixNodeInfo info(int32_t id) const;
  const Node& get(const char* fn, int32_t id) const;

  PageAllocator& allocator_;
  int64_t page_size_;
  std::unordered_map<int32_t, Node> nodes_;
  std::unordered_set<int32_t> cached_;  // every page held by some node
  int32_t next_id_ = 1;
  int64_t clock_ = 0;
};

/// How draw_radix_tree writes a token: the token's text for the edge label.
using TokenText = std::function<std::string(int32_t)>;

/// Options of draw_radix_tree.
struct RadixDrawOptions {
  /// Draw one line per page instead of one per edge, like the course's per-token diagram.
  bool one_line_per_page = false;
  /// Append each node's lock_ref and last access time.
  bool show_locks = false;
};

/// Draws the tree like the course's diagram:
/// ```
///   Root
///     └─"The cat"─→ [P0 P1]
///                     ├─"sat"─→ [P2]
///                     └─"ran fast"─→ [P3 P4]
/// ```
/// (vocabulary The, cat, sat, ran, fast = tokens 0..4; siblings are ordered by token id).
/// Tokens of one edge are joined by spaces, with " | " between pages when page_size > 1.
/// \param cache the tree to draw (read only)
/// \param token_text maps a token id to its text; nullptr writes the id in decimal
/// \param options one line per edge or per page; lock counts and access times or not
std::string draw_radix_tree(const RadixCache& cache, const TokenText& token_text = nullptr,
                            const RadixDrawOptions& options = {});
/// Same, with a vocabulary: token t is written as vocabulary[t] (its id if out of range).
std::string draw_radix_tree(const RadixCache& cache, const std::vector<std::string>& vocabulary,
                            const RadixDrawOptions& options = {});

}  // namespace flashstep::ref
