// The host-side structures of an attention engine: page allocator and per-sequence page
// tables, radix prefix cache, block-sparse view, cascade levels, split-KV planner.
#include <cstring>
#include <limits>
#include <optional>

#include "bindings.hpp"
#include "flashstep/reference/block_sparse.hpp"
#include "flashstep/reference/cascade.hpp"
#include "flashstep/reference/errors.hpp"
#include "flashstep/reference/page_allocator.hpp"
#include "flashstep/reference/radix_cache.hpp"
#include "flashstep/reference/split_plan.hpp"

namespace flashstep::python {

namespace {

using namespace pybind11::literals;

py::dict memory_report_dict(const ref::MemoryReport& r) {
  return py::dict("num_sequences"_a = r.num_sequences, "page_size"_a = r.page_size, "max_seq_len"_a = r.max_seq_len,
                  "tokens"_a = r.tokens, "pages_in_use"_a = r.pages_in_use, "shared_pages"_a = r.shared_pages,
                  "slots_allocated"_a = r.slots_allocated, "slots_filled"_a = r.slots_filled,
                  "slots_wasted"_a = r.slots_wasted, "contiguous_slots"_a = r.contiguous_slots,
                  "contiguous_slots_wasted"_a = r.contiguous_slots_wasted);
}

py::array_t<int32_t> copies_array(const std::vector<ref::PageCopy>& copies) {
  py::array_t<int32_t> out({static_cast<py::ssize_t>(copies.size()), static_cast<py::ssize_t>(2)});
  auto w = out.mutable_unchecked<2>();
  for (size_t i = 0; i < copies.size(); ++i) {
    w(static_cast<py::ssize_t>(i), 0) = copies[i].src;
    w(static_cast<py::ssize_t>(i), 1) = copies[i].dst;
  }
  return out;
}

py::dict node_dict(const ref::RadixNodeInfo& n) {
  return py::dict("id"_a = n.id, "parent"_a = n.parent, "key"_a = to_numpy(n.key), "pages"_a = to_numpy(n.pages),
                  "lock_ref"_a = n.lock_ref, "own_locks"_a = n.own_locks, "last_access"_a = n.last_access,
                  "depth_tokens"_a = n.depth_tokens, "children"_a = n.children);
}

std::vector<std::string> optional_strings(const std::optional<std::vector<std::string>>& v) {
  return v.value_or(std::vector<std::string>{});
}

ref::BlockSparseDrawOptions draw_options(const std::optional<std::vector<std::string>>& request_names,
                                         const std::optional<std::vector<std::string>>& page_labels, bool show_sharing,
                                         bool one_line_per_query, bool skip_empty_rows,
                                         const std::optional<std::vector<std::string>>& row_names) {
  ref::BlockSparseDrawOptions o;
  o.request_names = optional_strings(request_names);
  o.page_labels = optional_strings(page_labels);
  o.show_sharing = show_sharing;
  o.one_line_per_query = one_line_per_query;
  o.skip_empty_rows = skip_empty_rows;
  o.row_names = optional_strings(row_names);
  return o;
}

ref::AttentionOptions attention_options(bool causal, std::optional<double> sm_scale, int window_left,
                                        std::optional<double> logits_soft_cap) {
  ref::AttentionOptions opt;
  opt.causal = causal;
  opt.sm_scale = sm_scale;
  opt.window_left = window_left;
  opt.logits_soft_cap = logits_soft_cap.value_or(0.0);
  return opt;
}

// The pool alone (5-D, or a (k_cache, v_cache) tuple), for functions that do not read a
// page table from the caller.
ref::PagedKVCache pool_only(const py::handle& paged_kv_cache, const std::string& kv_layout, const char* fn) {
  return to_paged_cache(paged_kv_cache, py::list(), py::list(), py::list(), kv_layout, fn);
}

std::string plan_repr(const ref::SplitKVPlan& p) {
  return "SplitKVPlan(split_kv=" + std::string(p.split_kv ? "True" : "False") +
         ", kv_chunk_size_in_pages=" + std::to_string(p.kv_chunk_size_in_pages) +
         ", num_work_items=" + std::to_string(p.num_work_items) +
         ", padded_batch_size=" + std::to_string(p.padded_batch_size) + ")";
}

void bind_pages(py::module_& m) {
  py::register_exception<ref::OutOfPages>(m, "OutOfPages", PyExc_RuntimeError);
  m.attr("NO_PAGE") = ref::kNoPage;

  py::class_<ref::PageAllocator>(m, "PageAllocator", R"doc(A fixed pool of KV pages with reference counts.

PageAllocator(num_pages, page_size). A fresh pool hands out pages 0, 1, 2, ... in order;
freed pages are reused first-freed-first. Every holder of a page owns one reference; a
page is free again when its last reference is dropped.)doc")
      .def(py::init<int64_t, int64_t>(), py::arg("num_pages"), py::arg("page_size"))
      .def_property_readonly("num_pages", &ref::PageAllocator::num_pages)
      .def_property_readonly("page_size", &ref::PageAllocator::page_size)
      .def_property_readonly("num_free_pages", &ref::PageAllocator::num_free_pages)
      .def_property_readonly("num_used_pages", &ref::PageAllocator::num_used_pages)
      .def("try_allocate", &ref::PageAllocator::try_allocate,
           "One page with reference count 1, or NO_PAGE (-1) when the pool is exhausted.")
      .def(
          "allocate", [](ref::PageAllocator& a, int64_t n) { return to_numpy(a.allocate(n)); }, py::arg("n"),
          "n pages (int32 array), all or nothing: raises OutOfPages and takes nothing if fewer are free.")
      .def("incref", &ref::PageAllocator::incref, py::arg("page"), "Add a holder to a page in use.")
      .def("decref", &ref::PageAllocator::decref, py::arg("page"),
           "Drop one reference; returns True if the page became free.")
      .def("refcount", &ref::PageAllocator::refcount, py::arg("page"), "Reference count of a page (0 = free).")
      .def(
          "free_pages", [](const ref::PageAllocator& a) { return to_numpy(a.free_pages()); },
          "The free list in hand-out order (int32 array).")
      .def("check_invariants", &ref::PageAllocator::check_invariants,
           "Raise RuntimeError if the free list and the counts disagree.");

  py::class_<ref::AppendResult>(m, "AppendResult", "What PagedSequences.append_tokens did.")
      .def_property_readonly(
          "new_pages", [](const ref::AppendResult& r) { return to_numpy(r.new_pages); },
          "Pages allocated by the append (a copy-on-write destination included).")
      .def_property_readonly(
          "copies", [](const ref::AppendResult& r) { return copies_array(r.copies); },
          "(n, 2) int32 array of (src, dst) page copies to run before writing "
          "(copy_pages), as vLLM's copy_blocks.");

  py::class_<ref::PagedSequences>(m, "PagedSequences",
                                  R"doc(Per-sequence page tables (vLLM's block tables) over a PageAllocator.

PagedSequences(allocator). fork() shares every page of a sequence; appending to a
sequence whose last page is partly filled and shared first copies that page
(copy-on-write, returned in AppendResult.copies). Raises OutOfPages, changing nothing,
when the pool cannot hold an append.)doc")
      .def(py::init<ref::PageAllocator&>(), py::arg("allocator"), py::keep_alive<1, 2>())
      .def(
          "add_sequence",
          [](ref::PagedSequences& s, const IntArray& prefix_pages, int64_t prefix_len) {
            return s.add_sequence(to_int32_vector(prefix_pages, "PagedSequences.add_sequence", "prefix_pages"),
                                  prefix_len);
          },
          py::arg("prefix_pages") = py::list(), py::arg("prefix_len") = 0,
          "Start a sequence, empty or on prefix_len tokens already held in prefix_pages "
          "(ceil(prefix_len / page_size) pages in use, e.g. from RadixCache.match_prefix). Returns its id.")
      .def("fork", &ref::PagedSequences::fork, py::arg("seq"), "A new sequence sharing every page of seq.")
      .def("append_tokens", &ref::PagedSequences::append_tokens, py::arg("seq"), py::arg("n"),
           "Grow seq by n tokens' slots; returns AppendResult (new pages, copies to run first).")
      .def("free_sequence", &ref::PagedSequences::free_sequence, py::arg("seq"))
      .def("has_sequence", &ref::PagedSequences::has_sequence, py::arg("seq"))
      .def("sequence_ids", &ref::PagedSequences::sequence_ids)
      .def(
          "pages", [](const ref::PagedSequences& s, int32_t seq) { return to_numpy(s.pages(seq)); }, py::arg("seq"),
          "The sequence's page table (int32 array).")
      .def("seq_len", &ref::PagedSequences::seq_len, py::arg("seq"))
      .def("last_page_len", &ref::PagedSequences::last_page_len, py::arg("seq"))
      .def(
          "page_table",
          [](const ref::PagedSequences& s, const std::vector<int32_t>& seqs) {
            auto t = s.page_table(seqs);
            return py::make_tuple(to_numpy(t.kv_indptr), to_numpy(t.kv_indices), to_numpy(t.kv_last_page_len));
          },
          py::arg("seqs"), "(kv_indptr, kv_indices, kv_last_page_len) of the given sequences, in order.")
      .def(
          "memory_report",
          [](const ref::PagedSequences& s, int64_t max_seq_len) {
            return memory_report_dict(s.memory_report(max_seq_len));
          },
          py::arg("max_seq_len"),
          "Dict of slot counts, paged (shared pages once) versus contiguous max_seq_len preallocation.");

  m.def(
      "account_memory",
      [](const std::vector<int64_t>& seq_lens, int64_t page_size, int64_t max_seq_len) {
        return memory_report_dict(ref::account_memory(seq_lens, page_size, max_seq_len));
      },
      py::arg("seq_lens"), py::arg("page_size"), py::arg("max_seq_len"),
      R"doc(Memory of independent sequences, paged versus contiguous max-length preallocation.

account_memory([500], 16, 2048) gives contiguous_slots_wasted 1548 (the worked example)
and slots_wasted 12 (only the last page's tail). Returns a dict.)doc");

  m.def(
      "copy_pages",
      [](py::array paged_kv_cache, const IntArray& copies) {
        const char* fn = "copy_pages";
        if (!paged_kv_cache.writeable() || !(paged_kv_cache.flags() & py::array::c_style))
          throw ref::InvalidArgument(std::string(fn) + ": paged_kv_cache must be a writeable, C-contiguous array");
        py::array_t<int64_t, py::array::c_style | py::array::forcecast> c = py::array::ensure(copies);
        if (!c || c.ndim() != 2 || c.shape(1) != 2)
          throw ref::InvalidArgument(std::string(fn) + ": copies must be an (n, 2) integer array of (src, dst)");
        std::vector<ref::PageCopy> list;
        for (py::ssize_t i = 0; i < c.shape(0); ++i)
          list.push_back({static_cast<int32_t>(c.at(i, 0)), static_cast<int32_t>(c.at(i, 1))});
        ref::Tensor pool = to_tensor(paged_kv_cache, fn, "paged_kv_cache");
        ref::copy_pages(pool, list);
        // Write back in the caller's dtype.
        if (paged_kv_cache.dtype().itemsize() == 8) {
          std::memcpy(paged_kv_cache.mutable_data(), pool.data.data(), sizeof(double) * pool.data.size());
        } else {
          auto* out = static_cast<float*>(paged_kv_cache.mutable_data());
          for (size_t i = 0; i < pool.data.size(); ++i) out[i] = static_cast<float>(pool.data[i]);
        }
      },
      py::arg("paged_kv_cache"), py::arg("copies"),
      R"doc(Run page copies on a 5-D pool in place (vLLM's copy_blocks): page dst becomes page src.

paged_kv_cache: (num_pages, 2, ...) float32/float64, modified in place; copies: (n, 2)
(src, dst) as in AppendResult.copies.)doc");
}

void bind_radix(py::module_& m) {
  py::class_<ref::RadixMatch>(m, "RadixMatch", "Result of RadixCache.match_prefix.")
      .def_readonly("length", &ref::RadixMatch::length, "Matched tokens, a multiple of page_size.")
      .def_property_readonly(
          "pages", [](const ref::RadixMatch& r) { return to_numpy(r.pages); },
          "Pages holding the matched tokens (int32 array).")
      .def_readonly("last_node", &ref::RadixMatch::last_node, "Node where the match ends (0 = root).")
      .def("__repr__", [](const ref::RadixMatch& r) {
        return "RadixMatch(length=" + std::to_string(r.length) + ", pages=" + std::to_string(r.pages.size()) +
               " pages, last_node=" + std::to_string(r.last_node) + ")";
      });

  auto draw = [](const ref::RadixCache& c, const std::optional<std::vector<std::string>>& vocabulary,
                 bool one_line_per_page, bool show_locks) {
    ref::RadixDrawOptions o;
    o.one_line_per_page = one_line_per_page;
    o.show_locks = show_locks;
    return vocabulary ? ref::draw_radix_tree(c, *vocabulary, o) : ref::draw_radix_tree(c, ref::TokenText{}, o);
  };
  const char* draw_doc = R"doc(The tree as text, like the course's diagram.

vocabulary: token id -> text (ids are printed when None); one_line_per_page: one line
per page instead of per edge (the course's per-token picture); show_locks: append each
node's lock_ref and last use.)doc";

  py::class_<ref::RadixCache>(m, "RadixCache",
                              R"doc(RadixAttention's prefix cache: a page-granular radix tree over a PageAllocator.

RadixCache(allocator). Only whole pages are cached or matched (a partly filled tail page
stays its owner's). The cache holds one reference on each page it stores. match_prefix
and insert mark their path as used; evict removes unlocked leaves, least recently used
first, deepest pages first, page-exact.)doc")
      .def(py::init<ref::PageAllocator&>(), py::arg("allocator"), py::keep_alive<1, 2>())
      .def_property_readonly("page_size", &ref::RadixCache::page_size)
      .def(
          "match_prefix",
          [](ref::RadixCache& c, const IntArray& tokens) {
            return c.match_prefix(to_int32_vector(tokens, "RadixCache.match_prefix", "tokens"));
          },
          py::arg("tokens"), "Longest cached prefix (RadixMatch); splits an edge where the match ends inside it.")
      .def(
          "insert",
          [](ref::RadixCache& c, const IntArray& tokens, const IntArray& pages) {
            const char* fn = "RadixCache.insert";
            return c.insert(to_int32_vector(tokens, fn, "tokens"), to_int32_vector(pages, fn, "pages"));
          },
          py::arg("tokens"), py::arg("pages"),
          "Cache the whole pages of tokens; pages: floor or ceil(len / page_size) ids. Returns the "
          "tokens that were already cached (their pages are not adopted).")
      .def("lock", &ref::RadixCache::lock, py::arg("node"), "Pin the path from node to the root against eviction.")
      .def("unlock", &ref::RadixCache::unlock, py::arg("node"), "Release one lock() on exactly node.")
      .def(
          "evict", [](ref::RadixCache& c, int64_t n) { return to_numpy(c.evict(n)); }, py::arg("num_pages"),
          "Evict up to num_pages pages (LRU unlocked leaves); returns them in eviction order.")
      .def_property_readonly("cached_pages", &ref::RadixCache::cached_pages)
      .def_property_readonly("locked_pages", &ref::RadixCache::locked_pages)
      .def_property_readonly("evictable_pages", &ref::RadixCache::evictable_pages)
      .def_property_readonly("num_nodes", &ref::RadixCache::num_nodes)
      .def_property_readonly("now", &ref::RadixCache::now, "Logical time (bumped by match_prefix and insert).")
      .def(
          "nodes",
          [](const ref::RadixCache& c) {
            py::list out;
            for (const auto& n : c.nodes()) out.append(node_dict(n));
            return out;
          },
          "Every node as a dict (id, parent, key, pages, lock_ref, own_locks, last_access, depth_tokens, "
          "children), root first, pre-order.")
      .def(
          "node", [](const ref::RadixCache& c, int32_t id) { return node_dict(c.node(id)); }, py::arg("id"))
      .def("check_invariants", &ref::RadixCache::check_invariants,
           "Raise RuntimeError if the tree or its agreement with the allocator is broken.")
      .def("draw", draw, py::arg("vocabulary") = py::none(), py::arg("one_line_per_page") = false,
           py::arg("show_locks") = false, draw_doc);
  m.def("draw_radix_tree", draw, py::arg("cache"), py::arg("vocabulary") = py::none(),
        py::arg("one_line_per_page") = false, py::arg("show_locks") = false, draw_doc);
}

void bind_block_sparse(py::module_& m) {
  using V = ref::BlockSparseView;
  py::class_<V>(m, "BlockSparseView", R"doc(A paged batch as a block-sparse (BSR) matrix of (Br, Bc) blocks.

Row blocks hold up to Br queries of one request; column block c is page c (Bc =
page_size). Block b's non-zero pages are indices[indptr[b]:indptr[b+1]], in KV order.)doc")
      .def_readonly("Br", &V::Br)
      .def_readonly("Bc", &V::Bc)
      .def_readonly("num_pages", &V::num_pages)
      .def_readonly("causal", &V::causal)
      .def_readonly("window_left", &V::window_left)
      .def_property_readonly("qo_indptr", [](const V& v) { return to_numpy(v.qo_indptr); })
      .def_property_readonly("kv_len", [](const V& v) { return to_numpy(v.kv_len); })
      .def_property_readonly(
          "row_indptr", [](const V& v) { return to_numpy(v.row_indptr); },
          "(num_row_blocks + 1) packed query rows of each row block")
      .def_property_readonly("row_request", [](const V& v) { return to_numpy(v.row_request); })
      .def_property_readonly("indptr", [](const V& v) { return to_numpy(v.indptr); })
      .def_property_readonly("indices", [](const V& v) { return to_numpy(v.indices); })
      .def_property_readonly("block_kv_start", [](const V& v) { return to_numpy(v.block_kv_start); })
      .def_property_readonly("block_kv_len", [](const V& v) { return to_numpy(v.block_kv_len); })
      .def_property_readonly("num_row_blocks", &V::num_row_blocks)
      .def_property_readonly("nnz_blocks", &V::nnz_blocks);

  m.def(
      "build_block_sparse",
      [](const IntArray& qo_indptr, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, int64_t page_size, int64_t num_pages, int64_t Br, bool causal,
         int window_left) {
        const char* fn = "build_block_sparse";
        return ref::build_block_sparse(
            to_int32_vector(qo_indptr, fn, "qo_indptr"), to_int32_vector(kv_indptr, fn, "kv_indptr"),
            to_int32_vector(kv_indices, fn, "kv_indices"), to_int32_vector(kv_last_page_len, fn, "kv_last_page_len"),
            page_size, num_pages, Br, causal, window_left);
      },
      py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("page_size"), py::arg("num_pages"), py::arg("Br"), py::arg("causal") = false, py::arg("window_left") = -1,
      R"doc(The block-sparse view of a paged batch for (Br, Bc = page_size).

A block (row block, page) is present iff some query of the row block may see some key of
the page under the mask (causal, window_left). Returns BlockSparseView.)doc");

  m.def(
      "block_sparse_attention",
      [](const FloatArray& q, const KVCacheArg& paged_kv_cache, const V& view, const std::string& kv_layout,
         bool causal, std::optional<double> sm_scale, int window_left, std::optional<double> logits_soft_cap,
         bool return_lse) {
        const char* fn = "block_sparse_attention";
        auto r = ref::block_sparse_attention(to_tensor(q, fn, "q"), pool_only(paged_kv_cache, kv_layout, fn), view,
                                             attention_options(causal, sm_scale, window_left, logits_soft_cap));
        return to_python(r, return_lse);
      },
      py::arg("q"), py::arg("paged_kv_cache"), py::arg("view"), py::arg("kv_layout") = "NHD", py::arg("causal") = false,
      py::arg("sm_scale") = py::none(), py::arg("window_left") = -1, py::arg("logits_soft_cap") = py::none(),
      py::arg("return_lse") = false,
      R"doc(Attention by walking the view block by block (online softmax, mask inside blocks).

q: (nnz_qo, num_qo_heads, head_dim); paged_kv_cache: the pool the view indexes; causal
and window_left must be the view's. Equals batch_prefill_with_paged_kv_cache.)doc");

  auto draw_doc = R"doc(The view as the course's box table.

request_names (default A, B, ...), page_labels (one per pool page, shown as "(label)"),
show_sharing ("shared"/"A-only" line), one_line_per_query (the course's Br = 7 picture),
skip_empty_rows, row_names (one per query row; default "A, pos 0").)doc";
  m.def(
      "draw_block_sparse",
      [](const V& view, const std::optional<std::vector<std::string>>& request_names,
         const std::optional<std::vector<std::string>>& page_labels, bool show_sharing, bool one_line_per_query,
         bool skip_empty_rows, const std::optional<std::vector<std::string>>& row_names) {
        return ref::draw_block_sparse(view, draw_options(request_names, page_labels, show_sharing, one_line_per_query,
                                                         skip_empty_rows, row_names));
      },
      py::arg("view"), py::arg("request_names") = py::none(), py::arg("page_labels") = py::none(),
      py::arg("show_sharing") = true, py::arg("one_line_per_query") = false, py::arg("skip_empty_rows") = false,
      py::arg("row_names") = py::none(), draw_doc);
  m.def(
      "draw_block_sparse_lookup",
      [](const V& view, const std::optional<std::vector<std::string>>& request_names, bool skip_empty_rows,
         const std::optional<std::vector<std::string>>& row_names) {
        return ref::draw_block_sparse_lookup(
            view, draw_options(request_names, std::nullopt, true, false, skip_empty_rows, row_names));
      },
      py::arg("view"), py::arg("request_names") = py::none(), py::arg("skip_empty_rows") = false,
      py::arg("row_names") = py::none(),
      "The view as the course's lookup table: one line \"A, pos 2 → pages [P0, P1, P2]\" per row block.");
}

void bind_cascade(py::module_& m) {
  py::class_<ref::CascadeLevel>(m, "CascadeLevel",
                                "One cascade level: groups of requests and their pages at this level.")
      .def_property_readonly("qo_indptr", [](const ref::CascadeLevel& l) { return to_numpy(l.qo_indptr); })
      .def_property_readonly("kv_indptr", [](const ref::CascadeLevel& l) { return to_numpy(l.kv_indptr); })
      .def_property_readonly("kv_indices", [](const ref::CascadeLevel& l) { return to_numpy(l.kv_indices); })
      .def_property_readonly("kv_last_page_len",
                             [](const ref::CascadeLevel& l) { return to_numpy(l.kv_last_page_len); })
      .def_property_readonly("request_indptr", [](const ref::CascadeLevel& l) { return to_numpy(l.request_indptr); })
      .def_readonly("causal", &ref::CascadeLevel::causal);
  py::class_<ref::CascadeLevels>(m, "CascadeLevels", R"doc(The multi-level description FlashInfer's
MultiLevelCascadeAttentionWrapper.plan takes: per level qo_indptr, kv_indptr, kv_indices,
kv_last_page_len (levels[0] most shared, levels[-1] each request's own pages).)doc")
      .def_readonly("page_size", &ref::CascadeLevels::page_size)
      .def_property_readonly("qo_indptr", [](const ref::CascadeLevels& l) { return to_numpy(l.qo_indptr); })
      .def_readonly("levels", &ref::CascadeLevels::levels);

  m.def(
      "build_cascade_levels",
      [](const IntArray& qo_indptr, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, int64_t page_size, const std::vector<std::vector<int32_t>>& level_page_ends,
         bool causal) {
        const char* fn = "build_cascade_levels";
        return ref::build_cascade_levels(
            to_int32_vector(qo_indptr, fn, "qo_indptr"), to_int32_vector(kv_indptr, fn, "kv_indptr"),
            to_int32_vector(kv_indices, fn, "kv_indices"), to_int32_vector(kv_last_page_len, fn, "kv_last_page_len"),
            page_size, level_page_ends, causal);
      },
      py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("page_size"), py::arg("level_page_ends"), py::arg("causal") = true,
      R"doc(Cascade levels from a flat page table and where each shared level ends.

level_page_ends[l][r]: pages of request r in levels 0..l (num_levels - 1 lists, whole
pages only). Adjacent requests with identical pages at a level form one group. With
causal, every request needs qo_len <= its last-level kv_len.)doc");
  m.def(
      "derive_cascade_level_ends",
      [](const IntArray& qo_indptr, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, int64_t page_size, int64_t num_levels, bool causal) {
        const char* fn = "derive_cascade_level_ends";
        return ref::derive_cascade_level_ends(
            to_int32_vector(qo_indptr, fn, "qo_indptr"), to_int32_vector(kv_indptr, fn, "kv_indptr"),
            to_int32_vector(kv_indices, fn, "kv_indices"), to_int32_vector(kv_last_page_len, fn, "kv_last_page_len"),
            page_size, num_levels, causal);
      },
      py::arg("qo_indptr"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("page_size"), py::arg("num_levels"), py::arg("causal") = true,
      "level_page_ends found from shared page ids (e.g. page tables built from RadixCache matches).");
  m.def(
      "cascade_attention",
      [](const FloatArray& q, const ref::CascadeLevels& levels, const KVCacheArg& paged_kv_cache,
         const std::string& kv_layout, bool causal, std::optional<double> sm_scale,
         std::optional<double> logits_soft_cap, bool return_levels) {
        const char* fn = "cascade_attention";
        const ref::PagedKVCache pool = pool_only(paged_kv_cache, kv_layout, fn);
        auto r = ref::cascade_attention(to_tensor(q, fn, "q"), levels, pool.pages, pool.layout,
                                        attention_options(causal, sm_scale, -1, logits_soft_cap));
        if (!return_levels) return py::object(py::make_tuple(to_numpy(r.o), to_numpy(r.lse)));
        py::list per_level;
        for (const auto& l : r.level) per_level.append(py::make_tuple(to_numpy(l.o), to_numpy(l.lse)));
        return py::object(py::make_tuple(to_numpy(r.o), to_numpy(r.lse), per_level));
      },
      py::arg("q"), py::arg("levels"), py::arg("paged_kv_cache"), py::arg("kv_layout") = "NHD",
      py::arg("causal") = true, py::arg("sm_scale") = py::none(), py::arg("logits_soft_cap") = py::none(),
      py::arg("return_levels") = false,
      R"doc(Attention through the levels, merged level by level: (o, lse) [, [(o_l, lse_l), ...]].

q: (nnz_qo, num_qo_heads, head_dim); paged_kv_cache: the shared pool. causal must match
the levels. Equals batch_prefill_with_paged_kv_cache over the flat page table.)doc");
  m.def(
      "draw_cascade",
      [](const ref::CascadeLevels& levels, const std::optional<std::vector<std::string>>& request_names,
         const std::optional<std::vector<std::string>>& page_labels) {
        return ref::draw_cascade(levels, draw_options(request_names, page_labels, false, false, false, std::nullopt));
      },
      py::arg("levels"), py::arg("request_names") = py::none(), py::arg("page_labels") = py::none(),
      "Each level as a block-sparse table (shared levels one line per query, the last with Br = 1).");
}

void bind_split(py::module_& m) {
  using P = ref::SplitKVPlan;
  py::class_<P>(m, "SplitKVPlan", R"doc(A split-KV decode schedule (FlashInfer's DecodePlan).

Work item k = (request_indices[k], kv_tile_indices[k]) reads pages
[t * c, min((t + 1) * c, num_pages_r)) with c = kv_chunk_size_in_pages and writes partial
row o_indptr[r] + t. block_valid_mask marks the real items of the padded grid.)doc")
      .def_readonly("split_kv", &P::split_kv)
      .def_readonly("kv_chunk_size_in_pages", &P::kv_chunk_size_in_pages)
      .def_readonly("num_work_items", &P::num_work_items)
      .def_readonly("padded_batch_size", &P::padded_batch_size)
      .def_readonly("max_grid_size", &P::max_grid_size)
      .def_readonly("enable_cuda_graph", &P::enable_cuda_graph)
      .def_property_readonly("request_indices", [](const P& p) { return to_numpy(p.request_indices); })
      .def_property_readonly("kv_tile_indices", [](const P& p) { return to_numpy(p.kv_tile_indices); })
      .def_property_readonly("o_indptr", [](const P& p) { return to_numpy(p.o_indptr); })
      .def_property_readonly("block_valid_mask",
                             [](const P& p) {
                               py::array_t<bool> out(static_cast<py::ssize_t>(p.block_valid_mask.size()));
                               for (size_t i = 0; i < p.block_valid_mask.size(); ++i)
                                 out.mutable_data()[i] = p.block_valid_mask[i] != 0;
                               return out;
                             })
      .def("__repr__", &plan_repr);

  m.def(
      "plan_split_kv",
      [](const IntArray& kv_page_counts, int64_t page_size, int64_t num_kv_heads, int64_t num_sm, int64_t ctas_per_sm,
         bool enable_cuda_graph, int64_t min_kv_chunk_tokens) {
        ref::SplitKVConfig c;
        c.page_size = page_size;
        c.num_kv_heads = num_kv_heads;
        c.num_sm = num_sm;
        c.ctas_per_sm = ctas_per_sm;
        c.enable_cuda_graph = enable_cuda_graph;
        c.min_kv_chunk_tokens = min_kv_chunk_tokens;
        return ref::plan_split_kv(to_int32_vector(kv_page_counts, "plan_split_kv", "kv_page_counts"), c);
      },
      py::arg("kv_page_counts"), py::arg("page_size"), py::arg("num_kv_heads"), py::arg("num_sm"),
      py::arg("ctas_per_sm") = 1, py::arg("enable_cuda_graph") = false, py::arg("min_kv_chunk_tokens") = 128,
      R"doc(Plan split-KV decode: the smallest chunk (pages, >= max(min_kv_chunk_tokens // page_size, 1))
whose work items fit num_sm * ctas_per_sm // num_kv_heads, found by binary search; no
split if batch_size * num_kv_heads already fills the device. Returns SplitKVPlan.)doc");

  m.def(
      "split_kv_decode",
      [](const FloatArray& q, const KVCacheArg& paged_kv_cache, const IntArray& kv_indptr, const IntArray& kv_indices,
         const IntArray& kv_last_page_len, const P& plan, const std::string& kv_layout, std::optional<double> sm_scale,
         int window_left, std::optional<double> logits_soft_cap, bool return_partials) {
        const char* fn = "split_kv_decode";
        auto cache = to_paged_cache(paged_kv_cache, kv_indptr, kv_indices, kv_last_page_len, kv_layout, fn);
        auto opt = attention_options(false, sm_scale, window_left, logits_soft_cap);
        auto partials = ref::split_kv_partials(to_tensor(q, fn, "q"), cache, plan, opt);
        auto r = ref::merge_split_kv(partials, plan);
        if (return_partials)
          return py::object(py::make_tuple(to_numpy(r.o), to_numpy(r.lse), to_numpy(partials.v), to_numpy(partials.s)));
        return py::object(py::make_tuple(to_numpy(r.o), to_numpy(r.lse)));
      },
      py::arg("q"), py::arg("paged_kv_cache"), py::arg("kv_indptr"), py::arg("kv_indices"), py::arg("kv_last_page_len"),
      py::arg("plan"), py::arg("kv_layout") = "NHD", py::arg("sm_scale") = py::none(), py::arg("window_left") = -1,
      py::arg("logits_soft_cap") = py::none(), py::arg("return_partials") = false,
      R"doc(Reference split-attend-merge decode following a plan: (o, lse) [, tmp_v, tmp_s].

q: (batch_size, num_qo_heads, head_dim). tmp_v (num_work_items, num_qo_heads, head_dim)
and tmp_s (num_work_items, num_qo_heads) are the per-chunk partial states. Equals
batch_decode_with_paged_kv_cache.)doc");
}

}  // namespace

void bind_structures(py::module_& m) {
  bind_pages(m);
  bind_radix(m);
  bind_block_sparse(m);
  bind_cascade(m);
  bind_split(m);
}

}  // namespace flashstep::python
