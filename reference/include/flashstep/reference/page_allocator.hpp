/// \file page_allocator.hpp
/// \brief PagedAttention's memory manager: a fixed pool of KV pages with reference counts,
/// per-sequence page tables (vLLM's block tables), fork, copy-on-write, and memory
/// accounting against contiguous max-length preallocation.
///
/// The pool is the one FlashInfer reads: `paged_kv_cache[num_pages, 2, page_size, H, D]`.
/// This file manages only *which* pages hold what; it never touches K/V values except in
/// copy_pages(), the host version of vLLM's copy_blocks.
///
/// Ownership is counted, not assumed: every holder of a page (a sequence's page table,
/// the radix prefix cache, a test) owns one reference; a page returns to the free list
/// exactly when its last reference is dropped. That is what lets a fork share prefix pages
/// and what lets RadixCache keep pages that a finished request no longer needs.
///
/// ```
///   seq A (len 3): [P0, P1, P2]         refcount: P0=2 P1=2 P2=1 P3=1
///   seq B (len 3): [P0, P1, P3]         (page_size 1: the course's "The cat sat/ran")
/// ```
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashstep/reference/tensor.hpp"

namespace flashstep::ref {

/// The "no page" result of PageAllocator::try_allocate when the pool is exhausted.
inline constexpr int32_t kNoPage = -1;

/// Thrown when an operation needs more free pages than the pool has. The operation that
/// throws has changed nothing (strong guarantee), so the caller may evict and retry.
class OutOfPages : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A fixed pool of `num_pages` pages of `page_size` token slots, with reference counts.
///
/// Free pages are handed out first-freed-first (a FIFO queue, like vLLM's free block
/// queue): a page freed long ago is reused before one freed just now. A fresh pool hands
/// out P0, P1, P2, ... in order, which is what makes the course's pictures reproducible.
class PageAllocator {
 public:
  /// \param num_pages pool size, 1 .. 2^31 - 1
  /// \param page_size token slots per page (FlashInfer's page_size, the course's Bc),
  ///        1 .. 2^31 - 1 (a last_page_len is int32)
  PageAllocator(int64_t num_pages, int64_t page_size);

  /// Pages in the pool.
  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  /// Token slots per page.
  int64_t page_size() const { return page_size_; }
  /// Pages with reference count 0.
  int64_t num_free_pages() const { return static_cast<int64_t>(free_.size()); }
  /// Pages with reference count >= 1.
  int64_t num_used_pages() const { return num_pages() - num_free_pages(); }

  /// One free page with reference count 1, or kNoPage when the pool is exhausted (the
  /// documented "no page" result: nothing changes, nothing throws).
  int32_t try_allocate();
  /// `n` free pages, each with reference count 1, in allocation order. All or nothing:
  /// throws OutOfPages (and allocates nothing) if fewer than `n` pages are free.
  /// \param n number of pages, >= 0
  std::vector<int32_t> allocate(int64_t n);
  /// Adds a reference to a page in use (a new holder shares it).
  /// \param page page id in [0, num_pages) with reference count >= 1
  void incref(int32_t page);
  /// Drops one reference; the page goes back to the free list when the count reaches 0.
  /// \param page page id in [0, num_pages) with reference count >= 1
  /// \return true if the page became free
  bool decref(int32_t page);
  /// Current reference count of `page` (0 = free).
  int32_t refcount(int32_t page) const;
  /// The free list in the order pages will be handed out.
  std::vector<int32_t> free_pages() const { return {free_.begin(), free_.end()}; }

  /// Checks the allocator's own invariants (every page is either free exactly once with
  /// count 0, or in use with count >= 1). Throws std::logic_error naming the broken rule.
  void check_invariants() const;

 private:
  void check_page(const char* fn, int32_t page) const;

  int64_t page_size_;
  std::vector<int32_t> refcount_;  ///< (num_pages) references held on each page
  std::deque<int32_t> free_;       ///< pages with count 0, next to hand out at the front
};

/// A page copy to perform on the pool before new tokens are written: the whole page
/// `src` is copied into `dst` (vLLM's copy_blocks entry). Produced by copy-on-write.
struct PageCopy {
  int32_t src;  ///< page to read
  int32_t dst;  ///< freshly allocated page to overwrite
};

/// What an append did to a sequence's page table.
struct AppendResult {
  std::vector<int32_t> new_pages;  ///< pages allocated by this append (a copy's dst included)
  std::vector<PageCopy> copies;    ///< copies to run (copy_pages) *before* writing the tokens
};

/// A batch's page table in FlashInfer's CSR form (see attention.hpp's PagedKVCache).
struct PageTable {
  std::vector<int32_t> kv_indptr;         ///< (batch + 1)
  std::vector<int32_t> kv_indices;        ///< (kv_indptr[batch]) page ids
  std::vector<int32_t> kv_last_page_len;  ///< (batch) 1..page_size, 0 for an empty sequence
};

/// Memory use of a workload, paged versus contiguous max-length preallocation (docs/concepts/05_paging.md;
/// the PagedAttention paper, arXiv 2309.06180). Counts are in token slots of one layer's K (or V).
struct MemoryReport {
  int64_t num_sequences = 0;            ///< sequences in the workload
  int64_t page_size = 0;                ///< tokens per page
  int64_t max_seq_len = 0;              ///< what contiguous preallocation reserves per sequence
  int64_t tokens = 0;                   ///< sum of sequence lengths (logical tokens)
  int64_t pages_in_use = 0;             ///< distinct pages referenced by the sequences
  int64_t shared_pages = 0;             ///< of those, pages referenced by more than one sequence
  int64_t slots_allocated = 0;          ///< pages_in_use * page_size
  int64_t slots_filled = 0;             ///< distinct physical slots holding a token (shared ones once)
  int64_t slots_wasted = 0;             ///< slots_allocated - slots_filled: unfilled tails of last pages
  int64_t contiguous_slots = 0;         ///< num_sequences * max_seq_len
  int64_t contiguous_slots_wasted = 0;  ///< contiguous_slots - tokens (internal fragmentation)
};

/// Memory accounting of independent sequences (no sharing): each sequence of length L
/// takes ceil(L / page_size) pages, or max_seq_len contiguous slots. The worked example
/// account_memory({500}, 16, 2048) gives contiguous_slots_wasted 1548 and slots_wasted 12.
/// \param seq_lens (num_sequences) lengths, each in [0, max_seq_len]
/// \param page_size >= 1
/// \param max_seq_len >= 0, the length contiguous preallocation must reserve
MemoryReport account_memory(const std::vector<int64_t>& seq_lens, int64_t page_size, int64_t max_seq_len);

/// Per-sequence page tables over a PageAllocator (vLLM's block manager).
///
/// - add_sequence() starts a sequence, optionally on prefix pages it shares (e.g. pages
///   returned by RadixCache::match_prefix).
/// - append_tokens() grows a sequence, allocating pages only when the last one is full.
/// - fork() makes a child that shares every page of its parent (one more reference each).
/// - Copy-on-write: appending to a sequence whose last page is partly filled *and* shared
///   first copies that page to a fresh one (returned as a PageCopy), so the other holder
///   never sees the new tokens. A full shared page needs no copy: the new tokens go to a
///   new page and the shared one is only read.
///
/// The allocator must outlive this object; the destructor releases every sequence.
class PagedSequences {
 public:
  /// Page tables drawing pages from `allocator` (which must outlive this object).
  explicit PagedSequences(PageAllocator& allocator);
  ~PagedSequences();
  PagedSequences(const PagedSequences&) = delete;
  PagedSequences& operator=(const PagedSequences&) = delete;

  /// Starts a sequence. With no arguments it is empty. Otherwise it begins with
  /// `prefix_len` tokens held in `prefix_pages`, each of which gains a reference.
  /// \param prefix_pages (ceil(prefix_len / page_size)) distinct pages in use
  /// \param prefix_len tokens already in those pages
  /// \return the new sequence id (ids are never reused)
  int32_t add_sequence(const std::vector<int32_t>& prefix_pages = {}, int64_t prefix_len = 0);
  /// A new sequence sharing every page of `parent` (its length and contents too).
  int32_t fork(int32_t parent);
  /// Appends `n` tokens' worth of slots to `seq` (the caller writes K/V afterwards, e.g.
  /// with append_paged_kv_cache). Throws OutOfPages, changing nothing, if the pool lacks
  /// the pages this needs (one per new page, plus one for a copy-on-write).
  /// \param seq a live sequence id (from add_sequence or fork)
  /// \param n tokens to append, >= 0
  AppendResult append_tokens(int32_t seq, int64_t n);
  /// Drops the sequence and its reference on each of its pages.
  void free_sequence(int32_t seq);

  /// Whether `seq` is a live sequence id.
  bool has_sequence(int32_t seq) const { return seqs_.count(seq) != 0; }
  /// Ids of the live sequences, ascending.
  std::vector<int32_t> sequence_ids() const;
  /// The sequence's page table (vLLM's block table), first page first.
  const std::vector<int32_t>& pages(int32_t seq) const;
  /// Tokens held by the sequence.
  int64_t seq_len(int32_t seq) const;
  /// Tokens in the sequence's last page: 1..page_size, or 0 for an empty sequence.
  int32_t last_page_len(int32_t seq) const;
  /// CSR page table of the given sequences, in that order (what FlashInfer's plan/run take).
  PageTable page_table(const std::vector<int32_t>& seqs) const;
  /// Memory accounting of the live sequences; shared pages count once.
  /// \param max_seq_len what contiguous preallocation would reserve per sequence; must be
  ///        >= every live sequence's length
  MemoryReport memory_report(int64_t max_seq_len) const;
  /// The pool the pages come from.
  const PageAllocator& allocator() const { return allocator_; }

 private:
  struct Sequence {
    std::vector<int32_t> pages;
    int64_t len = 0;
  };
  const Sequence& get(const char* fn, int32_t seq) const;

  PageAllocator& allocator_;
  std::map<int32_t, Sequence> seqs_;
  int32_t next_id_ = 0;
};

/// Performs page copies on a pool in place (vLLM's copy_blocks on the host): for each copy,
/// page `dst` becomes an exact copy of page `src` (K and V, every slot). Copies run in order.
/// \param paged_kv_cache pool of rank 5 with dimension 1 == 2, NHD or HND (a page is the
///        outermost axis, so the copy is the same for both layouts)
/// \param copies src/dst page ids in [0, num_pages)
void copy_pages(Tensor& paged_kv_cache, const std::vector<PageCopy>& copies);

}  // namespace flashstep::ref
