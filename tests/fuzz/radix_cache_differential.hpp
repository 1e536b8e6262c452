// Differential testing of RadixCache against a deliberately naive model.
//
// The model is a flat list with one entry per cached page: (the whole token prefix that
// ends with that page, the page id, when it was last used, how many locks pin it). Every
// query is a linear scan, so it is obviously right and obviously slow:
//   - match: the longest k such that the prefix of k pages is in the list;
//   - insert: add the prefixes that are missing;
//   - evict: repeatedly drop the least recently used entry that no other entry extends
//     by one page (a leaf) and that no lock pins.
// The radix tree must agree with it on every result and on its full contents after every
// step. One driver, RadixDifferential, runs the same operations for the randomized doctest
// (choices from a seeded RNG) and for the libFuzzer target (choices from the input bytes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/page_allocator.hpp"
#include "flashstep/reference/radix_cache.hpp"

namespace flashstep::fuzz {

/// The naive page-level model of a prefix cache (see the file comment).
class NaivePrefixCache {
 public:
  struct Entry {
    std::vector<int32_t> prefix;  // tokens from the start through the end of this page
    int32_t page;
    int64_t last_access;
    int32_t locks;
  };

  explicit NaivePrefixCache(int64_t page_size, bool evict_most_recent = false)
      : page_size_(page_size), evict_most_recent_(evict_most_recent) {}

  struct Match {
    int64_t length = 0;
    std::vector<int32_t> pages;
  };

  Match match(const std::vector<int32_t>& tokens) {
    const int64_t now = ++clock_;
    Match m;
    for (int64_t k = 1; k * page_size_ <= static_cast<int64_t>(tokens.size()); ++k) {
      Entry* e = find(std::vector<int32_t>(tokens.begin(), tokens.begin() + k * page_size_));
      if (!e) break;
      e->last_access = now;
      m.length = k * page_size_;
      m.pages.push_back(e->page);
    }
    return m;
  }

  // Returns the tokens already cached; `pages` has at least floor(len / page_size) ids.
  int64_t insert(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages) {
    const int64_t now = ++clock_;
    int64_t cached = 0;
    bool missing = false;
    for (int64_t k = 1; k * page_size_ <= static_cast<int64_t>(tokens.size()); ++k) {
      std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + k * page_size_);
      if (Entry* e = find(prefix)) {
        e->last_access = now;
        if (!missing) cached = k * page_size_;
      } else {
        missing = true;
        entries_.push_back({prefix, pages[static_cast<size_t>(k - 1)], now, 0});
      }
    }
    return cached;
  }

  void add_lock(const std::vector<int32_t>& tokens, int64_t length, int32_t delta) {
    for (int64_t k = 1; k * page_size_ <= length; ++k)
      find(std::vector<int32_t>(tokens.begin(), tokens.begin() + k * page_size_))->locks += delta;
  }

  std::vector<int32_t> evict(int64_t num_pages) {
    std::vector<int32_t> out;
    while (static_cast<int64_t>(out.size()) < num_pages) {
      int best = -1;
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].locks > 0 || extended(entries_[i].prefix)) continue;
        const bool better = best < 0 || (evict_most_recent_ ? entries_[i].last_access > entries_[best].last_access
                                                            : entries_[i].last_access < entries_[best].last_access);
        if (better) best = static_cast<int>(i);
      }
      if (best < 0) break;
      out.push_back(entries_[static_cast<size_t>(best)].page);
      entries_.erase(entries_.begin() + best);
    }
    return out;
  }

  const std::vector<Entry>& entries() const { return entries_; }

 private:
  Entry* find(const std::vector<int32_t>& prefix) {
    for (Entry& e : entries_)
      if (e.prefix == prefix) return &e;
    return nullptr;
  }
  bool extended(const std::vector<int32_t>& prefix) const {
    for (const Entry& e : entries_)
      if (e.prefix.size() == prefix.size() + static_cast<size_t>(page_size_) &&
          std::equal(prefix.begin(), prefix.end(), e.prefix.begin()))
        return true;
    return false;
  }

  int64_t page_size_;
  bool evict_most_recent_;  // a planted bug, so that a test can show the harness catches it
  std::vector<Entry> entries_;
  int64_t clock_ = 0;
};

/// Thrown when the tree and the model disagree, or an invariant breaks.
class Mismatch : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// Runs random operations on a RadixCache and the naive model side by side.
/// `Source` provides `uint32_t pick(uint32_t n)`: a choice in [0, n).
class RadixDifferential {
 public:
  struct Config {
    int64_t page_size = 1;
    int64_t num_pages = 24;
    int32_t alphabet = 3;     // small, so that prefixes collide often
    int64_t max_tokens = 10;  // per sequence
    bool plant_mru_bug = false;
  };

  explicit RadixDifferential(const Config& config)
      : config_(config),
        allocator_(config.num_pages, config.page_size),
        cache_(allocator_),
        model_(config.page_size, config.plant_mru_bug) {}

  int64_t steps() const { return steps_; }
  int64_t evictions() const { return evicted_pages_; }
  int64_t max_cached() const { return max_cached_; }
  int64_t splits_seen() const { return max_nodes_; }
  const ref::RadixCache& cache() const { return cache_; }

  template <typename Source>
  void step(Source& src) {
    ++steps_;
    const uint32_t op = src.pick(10);
    std::ostringstream what;
    if (op <= 3) {
      request(src, /*reuse_match=*/op != 3, what);
    } else if (op == 4 && locks_.size() < 3) {  // few long-lived locks, or nothing is evictable
      lock_random(src, what);
    } else if (op <= 6 && !locks_.empty()) {
      const size_t i = src.pick(static_cast<uint32_t>(locks_.size()));
      what << "unlock node " << locks_[i].node;
      cache_.unlock(locks_[i].node);
      model_.add_lock(locks_[i].tokens, locks_[i].length, -1);
      locks_.erase(locks_.begin() + static_cast<long>(i));
    } else if (op == 7) {
      const int64_t n = src.pick(6);
      what << "evict " << n;
      evict_both(n, what.str());
    } else if (op == 8) {
      const auto tokens = random_tokens(src);
      what << "match " << show(tokens);
      compare_match(cache_.match_prefix(tokens), model_.match(tokens), what.str());
    } else if (op == 9) {
      bad_call(src, what);
    }
    check_all(what.str());
  }

  /// Releases every lock and evicts everything: the pool must come back whole.
  void finish() {
    for (const auto& l : locks_) {
      cache_.unlock(l.node);
      model_.add_lock(l.tokens, l.length, -1);
    }
    locks_.clear();
    evict_both(config_.num_pages, "final evict");
    check_all("finish");
    if (cache_.cached_pages() != 0 || allocator_.num_free_pages() != config_.num_pages)
      throw Mismatch("after unlocking and evicting everything, " + std::to_string(cache_.cached_pages()) +
                     " pages are still cached and " + std::to_string(allocator_.num_free_pages()) + " of " +
                     std::to_string(config_.num_pages) + " are free");
  }

 private:
  struct Lock {
    int32_t node;
    std::vector<int32_t> tokens;
    int64_t length;
    std::vector<int32_t> pages;  // what the locked path held when it was locked
  };

  template <typename Source>
  std::vector<int32_t> random_tokens(Source& src) {
    // Often extend a prefix of an earlier sequence, so that matches and splits happen.
    std::vector<int32_t> t;
    if (!history_.empty() && src.pick(4) != 0) {
      const auto& base = history_[src.pick(static_cast<uint32_t>(history_.size()))];
      t.assign(base.begin(), base.begin() + src.pick(static_cast<uint32_t>(base.size()) + 1));
    }
    const int64_t extra = src.pick(static_cast<uint32_t>(config_.max_tokens + 1));
    for (int64_t i = 0; i < extra && static_cast<int64_t>(t.size()) < config_.max_tokens; ++i)
      t.push_back(static_cast<int32_t>(src.pick(static_cast<uint32_t>(config_.alphabet))));
    if (history_.size() < 64) history_.push_back(t);
    else history_[src.pick(64)] = t;
    return t;
  }

  // A request: match, maybe lock, allocate the rest (evicting if needed), insert, release.
  template <typename Source>
  void request(Source& src, bool reuse_match, std::ostringstream& what) {
    const auto tokens = random_tokens(src);
    what << "request " << show(tokens) << (reuse_match ? "" : " (recomputes its prefix)");
    const auto m = cache_.match_prefix(tokens);
    compare_match(m, model_.match(tokens), what.str());
    // The request pins what it matched while it allocates, so that eviction for room
    // cannot take the very pages it is about to reuse (SGLang locks here too).
    cache_.lock(m.last_node);
    model_.add_lock(tokens, m.length, +1);
    locks_.push_back({m.last_node, tokens, m.length, m.pages});
    const bool keep_lock = locks_.size() < 4 && src.pick(4) == 0;  // else: the request finishes within this step
    const auto release = [&] {
      if (keep_lock) return;
      locks_.pop_back();
      cache_.unlock(m.last_node);
      model_.add_lock(tokens, m.length, -1);
    };
    const int64_t ps = config_.page_size;
    const int64_t total = (static_cast<int64_t>(tokens.size()) + ps - 1) / ps;
    const int64_t reused = reuse_match ? static_cast<int64_t>(m.pages.size()) : 0;
    const int64_t need = total - reused;
    if (need > allocator_.num_free_pages())
      evict_both(need - allocator_.num_free_pages(), what.str() + ": evict for room");
    if (need > allocator_.num_free_pages()) {
      what << ": no room (everything left is locked)";
      release();
      return;
    }
    std::vector<int32_t> pages(m.pages.begin(), m.pages.begin() + reused);
    const auto fresh = allocator_.allocate(need);
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    const int64_t a = cache_.insert(tokens, pages);
    const int64_t b = model_.insert(tokens, pages);
    if (a != b)
      throw Mismatch(what.str() + ": insert says " + std::to_string(a) + " tokens were cached, model says " +
                     std::to_string(b));
    // The request finishes: its own references go; adopted pages stay with the cache.
    for (int32_t p : fresh) allocator_.decref(p);
    release();
  }

  template <typename Source>
  void lock_random(Source& src, std::ostringstream& what) {
    const auto tokens = random_tokens(src);
    const auto m = cache_.match_prefix(tokens);
    what << "lock match of " << show(tokens);
    compare_match(m, model_.match(tokens), what.str());
    cache_.lock(m.last_node);
    model_.add_lock(tokens, m.length, +1);
    locks_.push_back({m.last_node, tokens, m.length, m.pages});
  }

  // Invalid calls must throw InvalidArgument and change nothing.
  template <typename Source>
  void bad_call(Source& src, std::ostringstream& what) {
    const uint32_t kind = src.pick(4);
    bool threw = false;
    try {
      if (kind == 0) {
        what << "bad: unlock a node with no lock";
        int32_t id = 0;
        for (const auto& n : cache_.nodes())
          if (n.own_locks == 0) {
            id = n.id;
            break;
          }
        if (cache_.node(id).own_locks != 0) return;  // every node locked: nothing to try
        cache_.unlock(id);
      } else if (kind == 1) {
        what << "bad: lock a node that does not exist";
        cache_.lock(1 << 30);
      } else if (kind == 2) {
        what << "bad: insert with a free page";
        std::vector<int32_t> tokens(static_cast<size_t>(config_.page_size), config_.alphabet + 7);
        const auto free = allocator_.free_pages();
        if (free.empty()) return;
        cache_.insert(tokens, {free.front()});
      } else {
        what << "bad: insert with the wrong number of pages";
        cache_.insert(std::vector<int32_t>(static_cast<size_t>(3 * config_.page_size), 1), {});
      }
    } catch (const ref::InvalidArgument&) {
      threw = true;
    }
    if (!threw) throw Mismatch(what.str() + ": did not throw InvalidArgument");
  }

  void evict_both(int64_t n, const std::string& what) {
    const auto a = cache_.evict(n);
    const auto b = model_.evict(n);
    if (a != b) throw Mismatch(what + ": tree evicted " + show(a) + ", model evicted " + show(b));
    for (int32_t p : a)
      for (const auto& l : locks_)
        for (int32_t q : l.pages)
          if (p == q) throw Mismatch(what + ": evicted page " + std::to_string(p) + " of a locked path");
    evicted_pages_ += static_cast<int64_t>(a.size());
  }

  void compare_match(const ref::RadixMatch& a, const NaivePrefixCache::Match& b, const std::string& what) {
    if (a.length != b.length || a.pages != b.pages)
      throw Mismatch(what + ": tree matched " + std::to_string(a.length) + " tokens " + show(a.pages) + ", model " +
                     std::to_string(b.length) + " tokens " + show(b.pages));
    const auto n = cache_.node(a.last_node);
    if (n.depth_tokens != a.length)
      throw Mismatch(what + ": last_node ends at " + std::to_string(n.depth_tokens) + " tokens, not " +
                     std::to_string(a.length));
  }

  // Full state comparison plus the tree's and the allocator's own invariants.
  void check_all(const std::string& what) {
    try {
      cache_.check_invariants();
      allocator_.check_invariants();
    } catch (const std::logic_error& e) {
      throw Mismatch(what + ": " + e.what());
    }
    using Row = std::tuple<std::vector<int32_t>, int32_t, int64_t, int32_t>;
    std::vector<Row> tree, model;
    std::map<int32_t, std::vector<int32_t>> prefix_of;  // node id -> tokens from the root
    for (const auto& n : cache_.nodes()) {
      std::vector<int32_t> prefix = n.parent < 0 ? std::vector<int32_t>{} : prefix_of.at(n.parent);
      for (size_t k = 0; k < n.pages.size(); ++k) {
        prefix.insert(prefix.end(), n.key.begin() + static_cast<long>(k * config_.page_size),
                      n.key.begin() + static_cast<long>((k + 1) * config_.page_size));
        tree.emplace_back(prefix, n.pages[k], n.last_access, n.lock_ref);
      }
      prefix_of[n.id] = prefix;
    }
    for (const auto& e : model_.entries()) model.emplace_back(e.prefix, e.page, e.last_access, e.locks);
    std::sort(tree.begin(), tree.end());
    std::sort(model.begin(), model.end());
    if (tree != model)
      throw Mismatch(what + ": tree and model differ (" + std::to_string(tree.size()) + " vs " +
                     std::to_string(model.size()) + " cached pages, or their pages/times/locks)");
    // Pages conserved: every page is free, or held once by the cache (the driver holds
    // nothing between steps).
    std::set<int32_t> cached;
    for (const auto& r : tree) cached.insert(std::get<1>(r));
    for (int32_t p = 0; p < config_.num_pages; ++p) {
      const int32_t expected = cached.count(p) ? 1 : 0;
      if (allocator_.refcount(p) != expected)
        throw Mismatch(what + ": page " + std::to_string(p) + " has refcount " +
                       std::to_string(allocator_.refcount(p)) + ", expected " + std::to_string(expected));
    }
    int64_t locked = 0;
    for (const auto& r : tree) locked += std::get<3>(r) > 0;
    if (cache_.locked_pages() != locked || cache_.cached_pages() != static_cast<int64_t>(tree.size()))
      throw Mismatch(what + ": page counters disagree with the contents");
    max_cached_ = std::max(max_cached_, cache_.cached_pages());
    max_nodes_ = std::max(max_nodes_, cache_.num_nodes());
  }

  template <typename V>
  static std::string show(const V& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  }

  Config config_;
  ref::PageAllocator allocator_;
  ref::RadixCache cache_;
  NaivePrefixCache model_;
  std::vector<Lock> locks_;
  std::vector<std::vector<int32_t>> history_;
  int64_t steps_ = 0, evicted_pages_ = 0, max_cached_ = 0, max_nodes_ = 0;
};

}  // namespace flashstep::fuzz
