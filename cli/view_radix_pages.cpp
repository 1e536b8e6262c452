// Sections "radix" and "pages": the prompts' token sequences in the radix prefix cache
// (RadixAttention), and their page tables from the page allocator (PagedAttention).
// Both follow what an engine does when requests arrive one after another: look up the
// longest cached prefix, reuse its pages, allocate pages for the rest, cache the result.
#include <algorithm>
#include <array>
#include <map>
#include <random>

#include <flashstep/reference/page_allocator.hpp>
#include <flashstep/reference/radix_cache.hpp>

#include "story.hpp"
#include "text_table.hpp"

namespace flashstep::cli {

namespace {

// Pages enough for every request even if nothing is shared.
int64_t pool_pages(const Scenario& s) {
  int64_t n = 0;
  for (const auto& t : s.tokens) n += (static_cast<int64_t>(t.size()) + s.page_size - 1) / s.page_size;
  return n + 1;
}

// Longest common prefix of `tokens` with any earlier request, rounded down to whole
// pages: what the radix cache must find (computed here without the cache).
int64_t expected_match(const Scenario& s, size_t r) {
  int64_t best = 0;
  for (size_t e = 0; e < r; ++e) {
    const auto& a = s.tokens[e];
    const auto& b = s.tokens[r];
    // A request's partly filled tail page is never cached, so only a's whole pages count.
    const size_t cached = a.size() / static_cast<size_t>(s.page_size) * static_cast<size_t>(s.page_size);
    size_t n = 0;
    while (n < cached && n < b.size() && a[n] == b[n]) ++n;
    best = std::max<int64_t>(best, static_cast<int64_t>(n));
  }
  return best / s.page_size * s.page_size;
}

std::string page_list(const std::vector<int32_t>& pages) {
  std::string out = "[";
  for (size_t i = 0; i < pages.size(); ++i) out += (i ? ", P" : "P") + std::to_string(pages[i]);
  return out + "]";
}

// Admits the requests in order through a radix cache and page tables, the way an engine
// does; `on_request` sees each request after it was admitted.
struct Admission {
  ref::PageAllocator allocator;
  ref::RadixCache cache;
  ref::PagedSequences seqs;
  std::vector<int32_t> ids;
  std::vector<int64_t> reused;
  explicit Admission(const Scenario& s) : allocator(pool_pages(s), s.page_size), cache(allocator), seqs(allocator) {}
};

template <typename OnRequest>
void admit(const Scenario& s, Admission& adm, OnRequest on_request) {
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const auto& toks = s.tokens[r];
    const ref::RadixMatch m = adm.cache.match_prefix(toks);
    const int32_t seq = adm.seqs.add_sequence(m.pages, m.length);
    adm.seqs.append_tokens(seq, static_cast<int64_t>(toks.size()) - m.length);
    adm.cache.insert(toks, adm.seqs.pages(seq));
    adm.ids.push_back(seq);
    adm.reused.push_back(m.length);
    on_request(r, m);
  }
}

}  // namespace

PagedBatch make_paged_batch(const Scenario& s, int page_size) {
  Scenario paged = s;
  paged.page_size = page_size;
  Admission adm(paged);
  admit(paged, adm, [](size_t, const ref::RadixMatch&) {});
  const ref::PageTable table = adm.seqs.page_table(adm.ids);

  PagedBatch b;
  b.opt.causal = true;
  b.opt.sm_scale = 1.0;
  b.cache.layout = ref::KVLayout::NHD;
  b.cache.kv_indptr = table.kv_indptr;
  b.cache.kv_indices = table.kv_indices;
  b.cache.kv_last_page_len = table.kv_last_page_len;
  b.cache.pages = ref::Tensor({adm.allocator.num_pages(), 2, page_size, 1, 2});
  b.page_labels.assign(static_cast<size_t>(adm.allocator.num_pages()), "");
  b.qo_indptr = {0};
  b.q = ref::Tensor({s.total_tokens(), 1, 2});

  // K/V of (word, position): the course's vectors where it has them, else seeded draws.
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::map<std::pair<int32_t, size_t>, std::array<double, 4>> drawn;
  std::vector<std::vector<std::string>> slot_text(static_cast<size_t>(adm.allocator.num_pages()),
                                                  std::vector<std::string>(static_cast<size_t>(page_size)));
  int64_t row = 0;
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const auto& pages = adm.seqs.pages(adm.ids[r]);
    for (size_t j = 0; j < s.tokens[r].size(); ++j, ++row) {
      const int32_t tok = s.tokens[r][j];
      std::array<double, 4> kv{};
      if (!example_kv(s.vocab[static_cast<size_t>(tok)], kv.data(), kv.data() + 2)) {
        auto it = drawn.find({tok, j});
        if (it == drawn.end()) {
          for (double& x : kv) x = uniform(rng);
          it = drawn.emplace(std::make_pair(tok, j), kv).first;
        }
        kv = it->second;
      }
      const int32_t page = pages[j / static_cast<size_t>(page_size)];
      const int64_t slot = static_cast<int64_t>(j % static_cast<size_t>(page_size));
      for (int d = 0; d < 2; ++d) {
        b.cache.at(page, 0, slot, 0, d) = kv[static_cast<size_t>(d)];
        b.cache.at(page, 1, slot, 0, d) = kv[static_cast<size_t>(2 + d)];
        b.q({row, 0, d}) = kv[static_cast<size_t>(d)];  // Q of a token = its K, as the course
      }
      slot_text[static_cast<size_t>(page)][static_cast<size_t>(slot)] = s.vocab[static_cast<size_t>(tok)];
    }
    b.qo_indptr.push_back(static_cast<int32_t>(row));
  }
  for (size_t p = 0; p < slot_text.size(); ++p)
    for (const auto& word : slot_text[p])
      if (!word.empty()) b.page_labels[p] += (b.page_labels[p].empty() ? "" : " ") + word;
  return b;
}

void show_radix(const Scenario& s, std::ostream& os, Ledger& ledger) {
  os << "Requests arrive one after another. Each looks up the longest prefix already in the\n"
        "tree, reuses its KV pages, and caches its own tokens (whole pages of "
     << s.page_size << " token" << (s.page_size > 1 ? "s" : "") << ").\n";
  Admission adm(s);
  admit(s, adm, [&](size_t r, const ref::RadixMatch& m) {
    // What insert() added: the request's whole pages beyond the match (a partly filled
    // last page is never cached).
    const int64_t len = static_cast<int64_t>(s.tokens[r].size());
    const int64_t whole = len / s.page_size * s.page_size;
    const int64_t added = std::max<int64_t>(0, whole - m.length);
    os << "\nAfter request " << s.names[r] << " (\"" << display_text(s.prompts[r], kMaxPromptColumns) << "\"): matched "
       << count_of(m.length, "token");
    if (m.length > 0) os << " on " << (m.pages.size() == 1 ? "page " : "pages ") << page_list(m.pages);
    if (added > 0) os << ", cached the next " << count_of(added, "token");
    else if (m.length == len) os << ", nothing left to cache";
    else
      os << ", cached nothing" << (m.length > 0 ? " more" : "") << " (the rest, " << count_of(len - m.length, "token")
         << ", fills no whole page of " << s.page_size << ")";
    os << ".\n";
    os << indent_lines(ref::draw_radix_tree(adm.cache, s.vocab), "  ");
    ledger.expect(m.length == expected_match(s, r), "request " + s.names[r] + " matches the longest cached prefix (" +
                                                        std::to_string(expected_match(s, r)) + " tokens)");
  });
  os << "\nThe tree holds " << count_of(adm.cache.cached_pages(), "page") << " in "
     << count_of(adm.cache.num_nodes(), "node") << " (root included).\n";
  adm.cache.check_invariants();

  if (s.prompts.size() == 2 && s.prompts[0] == "The cat sat") {
    // The course's edge split: [A,B,C,D,E] cached, then [A,B,C,F,G] arrives.
    os << "\nThe course's edge split: [A,B,C,D,E] is cached, then [A,B,C,F,G] arrives.\n";
    const std::vector<std::string> letters = {"A", "B", "C", "D", "E", "F", "G"};
    ref::PageAllocator alloc(16, 1);
    ref::RadixCache tree(alloc);
    ref::PagedSequences seqs(alloc);
    const std::vector<int32_t> first = {0, 1, 2, 3, 4}, second = {0, 1, 2, 5, 6};
    const int32_t a = seqs.add_sequence();
    seqs.append_tokens(a, 5);
    tree.insert(first, seqs.pages(a));
    os << indent_lines(ref::draw_radix_tree(tree, letters), "  ");
    const ref::RadixMatch m = tree.match_prefix(second);
    const int32_t b = seqs.add_sequence(m.pages, m.length);
    seqs.append_tokens(b, 5 - m.length);
    tree.insert(second, seqs.pages(b));
    os << "  then:\n" << indent_lines(ref::draw_radix_tree(tree, letters), "  ");
    ledger.expect(m.length == 3 && tree.num_nodes() == 4,
                  "worked example: [A,B,C,D,E] + [A,B,C,F,G] splits into [A,B,C] -> {[D,E], [F,G]}");
  }
}

void show_pages(const Scenario& s, std::ostream& os, Ledger& ledger) {
  Admission adm(s);
  admit(s, adm, [](size_t, const ref::RadixMatch&) {});
  os << "Each request's page table (vLLM's block table) lists its pages in order; pages of a\n"
        "shared prefix appear in several tables and carry a reference count.\n\n";
  TextTable t({"request", "tokens", "page table", "reused"});
  for (size_t r = 0; r < s.tokens.size(); ++r)
    t.add({s.names[r], std::to_string(s.tokens[r].size()), page_list(adm.seqs.pages(adm.ids[r])),
           count_of(adm.reused[r], "token")});
  t.print(os, "  ");

  os << "\nPhysical pages (page size " << s.page_size << "), with what they hold:\n";
  const int64_t used = adm.allocator.num_used_pages();
  for (int32_t p = 0; p < static_cast<int32_t>(adm.allocator.num_pages()); ++p) {
    const int32_t refs = adm.allocator.refcount(p);
    if (refs == 0) continue;
    std::string holders, text;
    int32_t requests = 0;
    for (size_t r = 0; r < s.tokens.size(); ++r) {
      const auto& pages = adm.seqs.pages(adm.ids[r]);
      const auto it = std::find(pages.begin(), pages.end(), p);
      if (it == pages.end()) continue;
      ++requests;
      holders += (holders.empty() ? "" : ",") + s.names[r];
      if (text.empty()) {
        const size_t first = static_cast<size_t>(it - pages.begin()) * static_cast<size_t>(s.page_size);
        const size_t end = std::min(first + static_cast<size_t>(s.page_size), s.tokens[r].size());
        for (size_t j = first; j < end; ++j)
          text += (text.empty() ? "" : " ") + s.vocab[static_cast<size_t>(s.tokens[r][j])];
      }
    }
    // Every holder owns one reference: each request whose table lists the page, and the
    // radix cache for every whole page it cached.
    os << "  P" << p << " \"" << text << "\": refcount " << refs << " = " << count_of(requests, "request") << " ("
       << holders << ")";
    if (refs > requests) os << " + " << refs - requests << " radix cache";
    os << "\n";
  }

  const ref::PageTable csr = adm.seqs.page_table(adm.ids);
  os << "\nThe same tables in FlashInfer's CSR form (what plan() and run() receive):\n"
     << "  kv_indptr        = " << format_list(csr.kv_indptr) << "\n"
     << "  kv_indices       = " << format_list(csr.kv_indices) << "\n"
     << "  kv_last_page_len = " << format_list(csr.kv_last_page_len) << "\n";
  bool lengths_ok = true;
  for (size_t r = 0; r < s.tokens.size(); ++r) {
    const int64_t pages = csr.kv_indptr[r + 1] - csr.kv_indptr[r];
    lengths_ok &= (pages - 1) * s.page_size + csr.kv_last_page_len[r] == static_cast<int64_t>(s.tokens[r].size());
  }
  ledger.expect(lengths_ok, "kv_len = (pages - 1) * page_size + last_page_len for every request");

  size_t longest = 0;
  for (const auto& toks : s.tokens) longest = std::max(longest, toks.size());
  const int64_t reserve = static_cast<int64_t>(std::max<size_t>(longest, 2048));
  const ref::MemoryReport mem = adm.seqs.memory_report(reserve);
  os << "\nMemory, in token slots of one layer's K (V is the same):\n"
     << "  paged:      " << count_of(mem.pages_in_use, "page") << " = " << count_of(mem.slots_allocated, "slot")
     << "; the requests' " << count_of(mem.tokens, "token") << " fill " << mem.slots_filled << " of them";
  if (mem.slots_filled < mem.tokens)
    os << " (a token on a\n              shared page counts for every request that reads it, but is stored once)";
  os << ";\n              " << count_of(mem.shared_pages, "page") << " shared by several requests, "
     << count_of(mem.slots_wasted, "slot") << " unfilled in last pages\n"
     << "  contiguous: " << mem.num_sequences << " x " << reserve
     << " reserved = " << count_of(mem.contiguous_slots, "slot") << " (" << mem.contiguous_slots_wasted
     << " never filled), no sharing possible\n";
  ledger.expect(mem.pages_in_use == used, "every page in use belongs to some request");
  if (s.prompts.size() != 2 || s.prompts[0] != "The cat sat") return;
  const ref::MemoryReport example = ref::account_memory({500}, 16, 2048);
  os << "  the course's case, one request of 500 tokens with room for 2048:\n"
     << "              contiguous wastes " << example.contiguous_slots_wasted << " slots, pages of 16 waste "
     << example.slots_wasted << "\n";
  ledger.expect(example.contiguous_slots_wasted == 1548, "worked example: 2048 reserved, 500 used -> 1548 wasted");
}

}  // namespace flashstep::cli
