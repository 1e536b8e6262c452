// PagedAttention's memory manager: reference-counted pages, block tables, copy-on-write.
#include "flashstep/reference/page_allocator.hpp"

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include "flashstep/reference/errors.hpp"

namespace flashstep::ref {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string page_name(int32_t page) { return "page " + std::to_string(page); }

}  // namespace

// ---- PageAllocator -------------------------------------------------------------------

PageAllocator::PageAllocator(int64_t num_pages, int64_t page_size) : page_size_(page_size) {
  const char* fn = "PageAllocator";
  require(num_pages >= 1 && num_pages <= std::numeric_limits<int32_t>::max(), fn,
          "num_pages must be in 1..2^31-1 (page ids are int32), got " + std::to_string(num_pages));
  require(page_size >= 1 && page_size <= std::numeric_limits<int32_t>::max(), fn,
          "page_size must be in 1..2^31-1 (kv_last_page_len is int32), got " + std::to_string(page_size));
  refcount_.assign(static_cast<size_t>(num_pages), 0);
  for (int64_t p = 0; p < num_pages; ++p) free_.push_back(static_cast<int32_t>(p));
}

void PageAllocator::check_page(const char* fn, int32_t page) const {
  require(page >= 0 && page < num_pages(), fn,
          "page must be in [0, " + std::to_string(num_pages()) + "), got " + std::to_string(page));
}

int32_t PageAllocator::try_allocate() {
  if (free_.empty()) return kNoPage;
  const int32_t page = free_.front();
  free_.pop_front();
  refcount_[static_cast<size_t>(page)] = 1;
  return page;
}

std::vector<int32_t> PageAllocator::allocate(int64_t n) {
  const char* fn = "PageAllocator::allocate";
  require(n >= 0, fn, "n must be >= 0, got " + std::to_string(n));
  if (n > num_free_pages())
    throw OutOfPages(std::string(fn) + ": need " + std::to_string(n) + " pages but only " +
                     std::to_string(num_free_pages()) + " of " + std::to_string(num_pages()) + " are free");
  std::vector<int32_t> pages;
  pages.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pages.push_back(try_allocate());
  return pages;
}

void PageAllocator::incref(int32_t page) {
  const char* fn = "PageAllocator::incref";
  check_page(fn, page);
  require(refcount_[static_cast<size_t>(page)] >= 1, fn,
          page_name(page) + " is free; only a page in use can gain a holder");
  ++refcount_[static_cast<size_t>(page)];
}

bool PageAllocator::decref(int32_t page) {
  const char* fn = "PageAllocator::decref";
  check_page(fn, page);
  int32_t& count = refcount_[static_cast<size_t>(page)];
  require(count >= 1, fn, page_name(page) + " is already free (double free)");
  if (--count > 0) return false;
  free_.push_back(page);
  return true;
}

int32_t PageAllocator::refcount(int32_t page) const {
  check_page("PageAllocator::refcount", page);
  return refcount_[static_cast<size_t>(page)];
}

void PageAllocator::check_invariants() const {
  std::vector<int> on_free_list(refcount_.size(), 0);
  for (int32_t p : free_) {
    if (p < 0 || p >= num_pages()) throw std::logic_error("PageAllocator: free list holds a bad id");
    if (++on_free_list[static_cast<size_t>(p)] > 1)
      throw std::logic_error("PageAllocator: " + page_name(p) + " is on the free list twice");
  }
  for (size_t p = 0; p < refcount_.size(); ++p) {
    const bool free = refcount_[p] == 0;
    if (refcount_[p] < 0) throw std::logic_error("PageAllocator: negative reference count");
    if (free != (on_free_list[p] == 1))
      throw std::logic_error(
          "PageAllocator: " + page_name(static_cast<int32_t>(p)) +
          (free ? " has count 0 but is not on the free list" : " is in use but is on the free list"));
  }
}

// ---- account_memory ------------------------------------------------------------------

MemoryReport account_memory(const std::vector<int64_t>& seq_lens, int64_t page_size, int64_t max_seq_len) {
  const char* fn = "account_memory";
  require(page_size >= 1, fn, "page_size must be >= 1, got " + std::to_string(page_size));
  require(max_seq_len >= 0, fn, "max_seq_len must be >= 0, got " + std::to_string(max_seq_len));
  MemoryReport r;
  r.num_sequences = static_cast<int64_t>(seq_lens.size());
  r.page_size = page_size;
  r.max_seq_len = max_seq_len;
  for (size_t i = 0; i < seq_lens.size(); ++i) {
    const int64_t len = seq_lens[i];
    require(len >= 0 && len <= max_seq_len, fn,
            "seq_lens[" + std::to_string(i) + "] = " + std::to_string(len) +
                " must be in [0, max_seq_len = " + std::to_string(max_seq_len) + "]");
    r.tokens += len;
    r.pages_in_use += ceil_div(len, page_size);
  }
  r.slots_allocated = r.pages_in_use * page_size;
  r.slots_filled = r.tokens;  // nothing shared: every token has its own slot
  r.slots_wasted = r.slots_allocated - r.slots_filled;
  r.contiguous_slots = r.num_sequences * max_seq_len;
  r.contiguous_slots_wasted = r.contiguous_slots - r.tokens;
  return r;
}

// ---- PagedSequences ------------------------------------------------------------------

PagedSequences::PagedSequences(PageAllocator& allocator) : allocator_(allocator) {}

PagedSequences::~PagedSequences() {
  for (auto& [id, s] : seqs_)
    for (int32_t p : s.pages) allocator_.decref(p);
}

const PagedSequences::Sequence& PagedSequences::get(const char* fn, int32_t seq) const {
  auto it = seqs_.find(seq);
  require(it != seqs_.end(), fn, "no live sequence with id " + std::to_string(seq));
  return it->second;
}

int32_t PagedSequences::add_sequence(const std::vector<int32_t>& prefix_pages, int64_t prefix_len) {
  const char* fn = "PagedSequences::add_sequence";
  const int64_t ps = allocator_.page_size();
  require(prefix_len >= 0, fn, "prefix_len must be >= 0, got " + std::to_string(prefix_len));
  require(static_cast<int64_t>(prefix_pages.size()) == ceil_div(prefix_len, ps), fn,
          "prefix_pages must hold ceil(prefix_len / page_size) = " + std::to_string(ceil_div(prefix_len, ps)) +
              " pages, got " + std::to_string(prefix_pages.size()));
  std::set<int32_t> seen;
  for (size_t i = 0; i < prefix_pages.size(); ++i) {
    const int32_t p = prefix_pages[i];
    require(p >= 0 && p < allocator_.num_pages() && allocator_.refcount(p) >= 1, fn,
            "prefix_pages[" + std::to_string(i) + "] = " + std::to_string(p) +
                " must be a page in use (someone must already hold it)");
    require(seen.insert(p).second, fn,
            "prefix_pages[" + std::to_string(i) + "] = " + std::to_string(p) + " appears twice");
  }
  for (int32_t p : prefix_pages) allocator_.incref(p);
  const int32_t id = next_id_++;
  seqs_[id] = Sequence{prefix_pages, prefix_len};
  return id;
}

int32_t PagedSequences::fork(int32_t parent) {
  const Sequence& s = get("PagedSequences::fork", parent);
  for (int32_t p : s.pages) allocator_.incref(p);
  const int32_t id = next_id_++;
  seqs_[id] = Sequence{s.pages, s.len};
  return id;
}

AppendResult PagedSequences::append_tokens(int32_t seq, int64_t n) {
  const char* fn = "PagedSequences::append_tokens";
  get(fn, seq);
  require(n >= 0, fn, "n must be >= 0, got " + std::to_string(n));
  Sequence& s = seqs_[seq];
  const int64_t ps = allocator_.page_size();
  AppendResult result;
  if (n == 0) return result;

  // The last page takes new tokens only if it has room; if it is also shared, the other
  // holders must keep seeing it unchanged, so the writer gets its own copy first.
  const bool last_partial = s.len % ps != 0;
  const bool needs_copy = last_partial && allocator_.refcount(s.pages.back()) > 1;
  const int64_t grow = ceil_div(s.len + n, ps) - static_cast<int64_t>(s.pages.size());
  const int64_t needed = grow + (needs_copy ? 1 : 0);
  if (needed > allocator_.num_free_pages())
    throw OutOfPages(std::string(fn) + ": sequence " + std::to_string(seq) + " needs " + std::to_string(needed) +
                     " new pages (" + std::to_string(grow) + " to grow" + (needs_copy ? ", 1 for copy-on-write" : "") +
                     ") but only " + std::to_string(allocator_.num_free_pages()) + " are free");

  if (needs_copy) {
    const int32_t src = s.pages.back();
    const int32_t dst = allocator_.try_allocate();
    result.copies.push_back({src, dst});
    result.new_pages.push_back(dst);
    allocator_.decref(src);  // still held by the others (count was > 1)
    s.pages.back() = dst;
  }
  for (int64_t i = 0; i < grow; ++i) {
    const int32_t p = allocator_.try_allocate();
    s.pages.push_back(p);
    result.new_pages.push_back(p);
  }
  s.len += n;
  return result;
}

void PagedSequences::free_sequence(int32_t seq) {
  const Sequence& s = get("PagedSequences::free_sequence", seq);
  for (int32_t p : s.pages) allocator_.decref(p);
  seqs_.erase(seq);
}

std::vector<int32_t> PagedSequences::sequence_ids() const {
  std::vector<int32_t> ids;
  for (const auto& kv : seqs_) ids.push_back(kv.first);
  return ids;
}

const std::vector<int32_t>& PagedSequences::pages(int32_t seq) const { return get("PagedSequences::pages", seq).pages; }

int64_t PagedSequences::seq_len(int32_t seq) const { return get("PagedSequences::seq_len", seq).len; }

int32_t PagedSequences::last_page_len(int32_t seq) const {
  const Sequence& s = get("PagedSequences::last_page_len", seq);
  if (s.len == 0) return 0;
  return static_cast<int32_t>(s.len - (static_cast<int64_t>(s.pages.size()) - 1) * allocator_.page_size());
}

PageTable PagedSequences::page_table(const std::vector<int32_t>& seqs) const {
  PageTable t;
  t.kv_indptr.push_back(0);
  for (int32_t id : seqs) {
    const Sequence& s = get("PagedSequences::page_table", id);
    t.kv_indices.insert(t.kv_indices.end(), s.pages.begin(), s.pages.end());
    t.kv_indptr.push_back(static_cast<int32_t>(t.kv_indices.size()));
    t.kv_last_page_len.push_back(last_page_len(id));
  }
  return t;
}

MemoryReport PagedSequences::memory_report(int64_t max_seq_len) const {
  const char* fn = "PagedSequences::memory_report";
  const int64_t ps = allocator_.page_size();
  MemoryReport r;
  r.num_sequences = static_cast<int64_t>(seqs_.size());
  r.page_size = ps;
  r.max_seq_len = max_seq_len;
  // Slots filled in each distinct page, and how many sequences hold it. Holders agree on
  // a page's fill (copy-on-write guarantees a shared page is never written past its fill),
  // so the max is only a guard.
  std::unordered_map<int32_t, std::pair<int64_t, int64_t>> fill_and_holders;
  for (const auto& [id, s] : seqs_) {
    require(s.len <= max_seq_len, fn,
            "sequence " + std::to_string(id) + " holds " + std::to_string(s.len) +
                " tokens, more than max_seq_len = " + std::to_string(max_seq_len));
    r.tokens += s.len;
    for (size_t k = 0; k < s.pages.size(); ++k) {
      const int64_t fill = std::min<int64_t>(ps, s.len - static_cast<int64_t>(k) * ps);
      auto& e = fill_and_holders[s.pages[k]];
      e.first = std::max(e.first, fill);
      ++e.second;
    }
  }
  r.pages_in_use = static_cast<int64_t>(fill_and_holders.size());
  for (const auto& kv : fill_and_holders) {
    r.slots_filled += kv.second.first;
    if (kv.second.second > 1) ++r.shared_pages;
  }
  r.slots_allocated = r.pages_in_use * ps;
  r.slots_wasted = r.slots_allocated - r.slots_filled;
  r.contiguous_slots = r.num_sequences * max_seq_len;
  r.contiguous_slots_wasted = r.contiguous_slots - r.tokens;
  return r;
}

// ---- copy_pages ----------------------------------------------------------------------

void copy_pages(Tensor& paged_kv_cache, const std::vector<PageCopy>& copies) {
  const char* fn = "copy_pages";
  check_rank(fn, "paged_kv_cache", paged_kv_cache, 5);
  require(paged_kv_cache.dim(1) == 2, fn,
          "paged_kv_cache dimension 1 must be 2 (K and V), got shape " + shape_string(paged_kv_cache.shape));
  const int64_t num_pages = paged_kv_cache.dim(0);
  for (size_t i = 0; i < copies.size(); ++i)
    require(copies[i].src >= 0 && copies[i].src < num_pages && copies[i].dst >= 0 && copies[i].dst < num_pages, fn,
            "copies[" + std::to_string(i) + "] = (" + std::to_string(copies[i].src) + " -> " +
                std::to_string(copies[i].dst) + ") is out of range for a pool of " + std::to_string(num_pages) +
                " pages");
  const int64_t per_page = num_pages == 0 ? 0 : paged_kv_cache.numel() / num_pages;
  for (const PageCopy& c : copies) {
    if (c.src == c.dst) continue;  // a self-copy is a no-op (and std::copy_n must not overlap)
    std::copy_n(paged_kv_cache.data.begin() + c.src * per_page, per_page,
                paged_kv_cache.data.begin() + c.dst * per_page);
  }
}

}  // namespace flashstep::ref
