// RadixAttention's prefix cache: a page-granular radix tree with locks and LRU eviction.
#include "flashstep/reference/radix_cache.hpp"

#include <algorithm>
#include <queue>
#include <set>
#include <sstream>
#include <tuple>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

RadixCache::RadixCache(PageAllocator& allocator) : allocator_(allocator), page_size_(allocator.page_size()) {
  nodes_[0] = Node{};  // the root: empty key, no pages, never evicted
}

RadixCache::~RadixCache() {
  for (int32_t p : cached_) allocator_.decref(p);
}

const RadixCache::Node& RadixCache::get(const char* fn, int32_t id) const {
  auto it = nodes_.find(id);
  require(it != nodes_.end(), fn, "no node with id " + std::to_string(id) + " (never created, or evicted)");
  return it->second;
}

std::vector<int32_t> RadixCache::first_page(const std::vector<int32_t>& tokens, int64_t offset) const {
  return {tokens.begin() + offset, tokens.begin() + offset + page_size_};
}

// Whole pages of `child`'s edge that equal tokens[offset:], never past the last whole page.
int64_t RadixCache::matched_pages(const Node& child, const std::vector<int32_t>& tokens, int64_t offset) const {
  const int64_t avail = (static_cast<int64_t>(tokens.size()) - offset) / page_size_;
  const int64_t limit = std::min<int64_t>(avail, static_cast<int64_t>(child.pages.size()));
  int64_t k = 0;
  while (k < limit && std::equal(child.key.begin() + k * page_size_, child.key.begin() + (k + 1) * page_size_,
                                 tokens.begin() + offset + k * page_size_))
    ++k;
  return k;
}

// Splits `child`'s edge after `keep_pages` pages. The new node becomes the *parent* and
// `child` keeps its id (and its own locks) for the remainder, so that a node id a caller
// locked still names the same pages; the new parent inherits lock_ref and last_access
// because every path through it so far went through `child`.
int32_t RadixCache::split(int32_t child_id, int64_t keep_pages) {
  const int32_t id = next_id_++;
  Node& child = nodes_.at(child_id);
  const int64_t keep_tokens = keep_pages * page_size_;
  Node top;
  top.parent = child.parent;
  top.key.assign(child.key.begin(), child.key.begin() + keep_tokens);
  top.pages.assign(child.pages.begin(), child.pages.begin() + keep_pages);
  top.lock_ref = child.lock_ref;
  top.last_access = child.last_access;
  child.key.erase(child.key.begin(), child.key.begin() + keep_tokens);
  child.pages.erase(child.pages.begin(), child.pages.begin() + keep_pages);
  top.children[first_page(child.key, 0)] = child_id;
  child.parent = id;
  nodes_.at(top.parent).children[first_page(top.key, 0)] = id;  // same first page as before
  nodes_[id] = std::move(top);
  return id;
}

RadixMatch RadixCache::match_prefix(const std::vector<int32_t>& tokens) {
  const int64_t now = ++clock_;
  const int64_t aligned = static_cast<int64_t>(tokens.size()) / page_size_ * page_size_;
  RadixMatch m;
  int32_t node = 0;
  int64_t pos = 0;
  while (pos < aligned) {
    const Node& n = nodes_.at(node);
    auto it = n.children.find(first_page(tokens, pos));
    if (it == n.children.end()) break;
    int32_t child = it->second;
    const int64_t k = matched_pages(nodes_.at(child), tokens, pos);  // >= 1: first page equal
    if (k < static_cast<int64_t>(nodes_.at(child).pages.size())) child = split(child, k);
    Node& c = nodes_.at(child);
    c.last_access = now;
    m.pages.insert(m.pages.end(), c.pages.begin(), c.pages.end());
    pos += k * page_size_;
    node = child;
  }
  m.length = pos;
  m.last_node = node;
  return m;
}

int64_t RadixCache::insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
  const char* fn = "RadixCache::insert";
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int64_t full_pages = len / page_size_;
  const int64_t all_pages = (len + page_size_ - 1) / page_size_;
  require(static_cast<int64_t>(pages.size()) == full_pages || static_cast<int64_t>(pages.size()) == all_pages, fn,
          "pages must hold floor(len / page_size) = " + std::to_string(full_pages) +
              " or ceil(len / page_size) = " + std::to_string(all_pages) + " page ids for " + std::to_string(len) +
              " tokens, got " + std::to_string(pages.size()));

  // Dry run: how much is cached already? Only the pages after that are adopted, and they
  // are validated before anything changes, so a bad call leaves the tree untouched.
  int64_t cached_len = 0;
  {
    int32_t node = 0;
    while (cached_len < full_pages * page_size_) {
      const Node& n = nodes_.at(node);
      auto it = n.children.find(first_page(tokens, cached_len));
      if (it == n.children.end()) break;
      const Node& child = nodes_.at(it->second);
      const int64_t k = matched_pages(child, tokens, cached_len);
      cached_len += k * page_size_;
      if (k < static_cast<int64_t>(child.pages.size())) break;
      node = it->second;
    }
  }
  std::set<int32_t> adopted;
  for (int64_t i = cached_len / page_size_; i < full_pages; ++i) {
    const int32_t p = pages[static_cast<size_t>(i)];
    const std::string where = "pages[" + std::to_string(i) + "] = " + std::to_string(p);
    require(p >= 0 && p < allocator_.num_pages(), fn,
            where + " is out of range for a pool of " + std::to_string(allocator_.num_pages()) + " pages");
    require(allocator_.refcount(p) >= 1, fn, where + " is free; the caller must hold the pages it inserts");
    require(cached_.count(p) == 0, fn,
            where + " is already cached under another prefix (one page holds one prefix's K/V)");
    require(adopted.insert(p).second, fn, where + " appears twice");
  }

  const int64_t now = ++clock_;
  int32_t node = 0;
  int64_t pos = 0;
  while (pos < full_pages * page_size_) {
    auto it = nodes_.at(node).children.find(first_page(tokens, pos));
    if (it == nodes_.at(node).children.end()) {
      // New leaf for the rest: the cache takes one reference on each of its pages.
      const int32_t id = next_id_++;
      Node leaf;
      leaf.parent = node;
      leaf.key.assign(tokens.begin() + pos, tokens.begin() + full_pages * page_size_);
      leaf.pages.assign(pages.begin() + pos / page_size_, pages.begin() + full_pages);
      leaf.last_access = now;
      for (int32_t p : leaf.pages) {
        allocator_.incref(p);
        cached_.insert(p);
      }
      nodes_.at(node).children[first_page(leaf.key, 0)] = id;
      nodes_[id] = std::move(leaf);
      break;
    }
    int32_t child = it->second;
    const int64_t k = matched_pages(nodes_.at(child), tokens, pos);
    if (k < static_cast<int64_t>(nodes_.at(child).pages.size())) child = split(child, k);
    nodes_.at(child).last_access = now;
    pos += k * page_size_;
    node = child;
  }
  return cached_len;
}

void RadixCache::lock(int32_t node) {
  get("RadixCache::lock", node);
  ++nodes_.at(node).own_locks;
  for (int32_t n = node; n != -1; n = nodes_.at(n).parent) ++nodes_.at(n).lock_ref;
}

void RadixCache::unlock(int32_t node) {
  const Node& n = get("RadixCache::unlock", node);
  require(n.own_locks > 0, "RadixCache::unlock",
          "node " + std::to_string(node) + " has no lock to release (unlock without a matching lock)");
  --nodes_.at(node).own_locks;
  for (int32_t x = node; x != -1; x = nodes_.at(x).parent) --nodes_.at(x).lock_ref;
}

int64_t RadixCache::locked_pages() const {
  int64_t n = 0;
  for (const auto& kv : nodes_)
    if (kv.second.lock_ref > 0) n += static_cast<int64_t>(kv.second.pages.size());
  return n;
}

std::vector<int32_t> RadixCache::evict(int64_t num_pages) {
  require(num_pages >= 0, "RadixCache::evict", "num_pages must be >= 0, got " + std::to_string(num_pages));
  // Min-heap of unlocked leaves by last use. Times of two leaves never tie (one call
  // touches one root path, which holds one leaf), the id only makes that explicit.
  using Entry = std::pair<int64_t, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> lru;
  for (const auto& [id, n] : nodes_)
    if (id != 0 && n.children.empty() && n.lock_ref == 0) lru.push({n.last_access, id});

  std::vector<int32_t> evicted;
  while (static_cast<int64_t>(evicted.size()) < num_pages && !lru.empty()) {
    const int32_t id = lru.top().second;
    lru.pop();
    Node& leaf = nodes_.at(id);
    const std::vector<int32_t> first = first_page(leaf.key, 0);
    // Deepest pages first, and only as many as still needed.
    while (static_cast<int64_t>(evicted.size()) < num_pages && !leaf.pages.empty()) {
      const int32_t p = leaf.pages.back();
      leaf.pages.pop_back();
      leaf.key.resize(leaf.key.size() - static_cast<size_t>(page_size_));
      cached_.erase(p);
      allocator_.decref(p);
      evicted.push_back(p);
    }
    if (!leaf.pages.empty()) break;  // trimmed, not removed: the quota is met
    const int32_t parent = leaf.parent;
    nodes_.at(parent).children.erase(first);
    nodes_.erase(id);
    const Node& up = nodes_.at(parent);
    if (parent != 0 && up.children.empty() && up.lock_ref == 0) lru.push({up.last_access, parent});
  }
  return evicted;
}

RadixNodeInfo RadixCache::info(int32_t id) const {
  const Node& n = nodes_.at(id);
  RadixNodeInfo r;
  r.id = id;
  r.parent = n.parent;
  r.key = n.key;
  r.pages = n.pages;
  r.lock_ref = n.lock_ref;
  r.own_locks = n.own_locks;
  r.last_access = n.last_access;
  for (int32_t x = id; x != -1; x = nodes_.at(x).parent)
    r.depth_tokens += static_cast<int64_t>(nodes_.at(x).key.size());
  for (const auto& kv : n.children) r.children.push_back(kv.second);
  return r;
}

RadixNodeInfo RadixCache::node(int32_t id) const {
  get("RadixCache::node", id);
  return info(id);
}

std::vector<RadixNodeInfo> RadixCache::nodes() const {
  std::vector<RadixNodeInfo> out;
  std::vector<int32_t> stack{0};
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    out.push_back(info(id));
    const auto& children = nodes_.at(id).children;
    for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(it->second);
  }
  return out;
}

void RadixCache::check_invariants() const {
  auto fail = [](const std::string& what) { throw std::logic_error("RadixCache: " + what); };
  auto root = nodes_.find(0);
  if (root == nodes_.end() || root->second.parent != -1 || !root->second.key.empty() || !root->second.pages.empty())
    fail("the root (id 0) must exist with no parent, key or pages");
  std::unordered_map<int32_t, int> page_count;
  size_t reached = 0;
  std::vector<int32_t> stack{0};
  while (!stack.empty()) {
    const int32_t id = stack.back();
    stack.pop_back();
    ++reached;
    const Node& n = nodes_.at(id);
    const std::string name = "node " + std::to_string(id);
    if (id != 0) {
      if (n.key.empty()) fail(name + " has an empty edge");
      if (n.key.size() != n.pages.size() * static_cast<size_t>(page_size_))
        fail(name + " holds " + std::to_string(n.key.size()) + " tokens but " + std::to_string(n.pages.size()) +
             " pages of " + std::to_string(page_size_));
    }
    int32_t lock_sum = n.own_locks;
    if (n.own_locks < 0) fail(name + " has negative own_locks");
    for (const auto& [first, child_id] : n.children) {
      auto it = nodes_.find(child_id);
      if (it == nodes_.end()) fail(name + " lists a missing child " + std::to_string(child_id));
      const Node& c = it->second;
      if (c.parent != id) fail("node " + std::to_string(child_id) + " has the wrong parent");
      if (c.key.size() < first.size() || !std::equal(first.begin(), first.end(), c.key.begin()))
        fail("node " + std::to_string(child_id) + " is filed under a first page that is not its own");
      if (id != 0 && c.last_access > n.last_access)
        fail("node " + std::to_string(child_id) + " was used after its parent " + name);
      lock_sum += c.lock_ref;
      stack.push_back(child_id);
    }
    if (n.lock_ref != lock_sum)
      fail(name + " has lock_ref " + std::to_string(n.lock_ref) + " but its own locks plus its children's are " +
           std::to_string(lock_sum));
    for (int32_t p : n.pages) ++page_count[p];
  }
  if (reached != nodes_.size()) fail("some nodes are not reachable from the root");
  if (page_count.size() != cached_.size()) fail("the set of cached pages disagrees with the nodes");
  for (const auto& [p, count] : page_count) {
    if (count != 1) fail("page " + std::to_string(p) + " is held by " + std::to_string(count) + " nodes");
    if (!cached_.count(p)) fail("page " + std::to_string(p) + " is missing from the cached set");
    if (allocator_.refcount(p) < 1) fail("cached page " + std::to_string(p) + " is free in the allocator");
  }
}

// ---- drawing ---------------------------------------------------------------------------

namespace {

struct DrawNode {
  std::string label;  // edge text, without quotes
  std::string value;  // e.g. "[P0 P1]"
  std::vector<DrawNode> children;
};

// Display columns of UTF-8 text (box-drawing characters are one column, three bytes).
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A child's connector sits two columns right of its parent's "[" (the course's layout).
void draw_children(const DrawNode& node, const std::string& prefix, std::ostringstream& os) {
  for (size_t i = 0; i < node.children.size(); ++i) {
    const DrawNode& c = node.children[i];
    const bool last = i + 1 == node.children.size();
    const std::string head = prefix + (last ? "└─" : "├─") + "\"" + c.label + "\"─→ ";
    os << head << c.value << "\n";
    const size_t bracket = columns(head);
    std::string next = prefix + (last ? " " : "│");
    next += std::string(bracket + 2 - columns(next), ' ');
    draw_children(c, next, os);
  }
}

std::string page_list(const std::vector<int32_t>& pages) {
  std::string s = "[";
  for (size_t i = 0; i < pages.size(); ++i) s += (i ? " P" : "P") + std::to_string(pages[i]);
  return s + "]";
}

}  // namespace

std::string draw_radix_tree(const RadixCache& cache, const TokenText& token_text, const RadixDrawOptions& options) {
  const int64_t ps = cache.page_size();
  auto text = [&](int32_t t) { return token_text ? token_text(t) : std::to_string(t); };
  std::unordered_map<int32_t, RadixNodeInfo> by_id;
  for (auto& n : cache.nodes()) by_id[n.id] = n;

  // Build the picture's tree: one node per edge, or a chain of one node per page.
  std::function<void(int32_t, DrawNode&)> build = [&](int32_t id, DrawNode& out) {
    for (int32_t child_id : by_id.at(id).children) {
      const RadixNodeInfo& c = by_id.at(child_id);
      const std::string locks = options.show_locks ? "  (lock_ref " + std::to_string(c.lock_ref) + ", last used " +
                                                         std::to_string(c.last_access) + ")"
                                                   : "";
      auto page_text = [&](size_t k) {
        std::string s;
        for (int64_t j = 0; j < ps; ++j)
          s += (j ? " " : "") + text(c.key[k * static_cast<size_t>(ps) + static_cast<size_t>(j)]);
        return s;
      };
      DrawNode* attach = &out;
      if (options.one_line_per_page) {
        for (size_t k = 0; k < c.pages.size(); ++k) {
          attach->children.push_back({page_text(k), page_list({c.pages[k]}) + locks, {}});
          attach = &attach->children.back();
        }
      } else {
        std::string label;
        for (size_t k = 0; k < c.pages.size(); ++k) label += (k ? (ps > 1 ? " | " : " ") : "") + page_text(k);
        attach->children.push_back({label, page_list(c.pages) + locks, {}});
        attach = &attach->children.back();
      }
      build(child_id, *attach);
    }
  };
  DrawNode root{"", "", {}};
  build(0, root);
  std::ostringstream os;
  os << "Root\n";
  draw_children(root, "  ", os);
  return os.str();
}

std::string draw_radix_tree(const RadixCache& cache, const std::vector<std::string>& vocabulary,
                            const RadixDrawOptions& options) {
  return draw_radix_tree(
      cache,
      [&](int32_t t) {
        return t >= 0 && static_cast<size_t>(t) < vocabulary.size() ? vocabulary[static_cast<size_t>(t)]
                                                                    : std::to_string(t);
      },
      options);
}

}  // namespace flashstep::ref
