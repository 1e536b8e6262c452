"""The host-side structures through the Python module: page allocator, radix cache,
block-sparse view, cascade levels, split-KV planner. Expected values are the course's or
computed here from the definitions (a Python naive model for the radix cache)."""
import numpy as np
import pytest

import flashstep as fs

ATOL = 1e-12  # double reference against double reference, different summation order

# The course's tokens: K and V of "The", "cat", "sat", "ran", "fast" (d_model 2, one head).
K = np.array([[1, 0], [0, 1], [1, 1], [1, -1], [0, -1]], dtype=np.float64)
V = np.array([[1, 1], [2, 0], [0, 1], [1, 0], [0, 1]], dtype=np.float64)
WORDS = ["The", "cat", "sat", "ran", "fast"]


def example_pool():
    """Pages P0..P4, page_size 1, NHD: (5, 2, 1, 1, 2)."""
    pool = np.zeros((5, 2, 1, 1, 2))
    pool[:, 0, 0, 0, :] = K
    pool[:, 1, 0, 0, :] = V
    return pool


# ---- page allocator ----------------------------------------------------------------------


def test_allocator_hands_out_pages_in_order_and_reports_exhaustion():
    alloc = fs.PageAllocator(3, 16)
    assert alloc.try_allocate() == 0
    assert list(alloc.allocate(2)) == [1, 2]
    assert alloc.try_allocate() == fs.NO_PAGE == -1
    with pytest.raises(fs.OutOfPages):
        alloc.allocate(1)
    assert issubclass(fs.OutOfPages, RuntimeError)
    assert alloc.decref(1)
    with pytest.raises(ValueError, match="double free"):
        alloc.decref(1)
    with pytest.raises(ValueError, match="page must be in"):
        alloc.refcount(99)
    alloc.check_invariants()


def test_fork_shares_prefix_pages_and_copy_on_write_copies_the_shared_tail(rng):
    # The course's "The cat sat" / "The cat ran", page size 1: P0, P1 shared.
    alloc = fs.PageAllocator(8, 1)
    seqs = fs.PagedSequences(alloc)
    a = seqs.add_sequence()
    seqs.append_tokens(a, 2)
    b = seqs.fork(a)
    seqs.append_tokens(a, 1)
    seqs.append_tokens(b, 1)
    assert list(seqs.pages(a)) == [0, 1, 2]
    assert list(seqs.pages(b)) == [0, 1, 3]
    indptr, indices, last = seqs.page_table([a, b])
    assert list(indptr) == [0, 3, 6] and list(indices) == [0, 1, 2, 0, 1, 3] and list(last) == [1, 1]
    # Page size 4: a shared, half-filled last page is copied before the child writes.
    alloc4 = fs.PageAllocator(6, 4)
    seqs4 = fs.PagedSequences(alloc4)
    x = seqs4.add_sequence()
    seqs4.append_tokens(x, 6)
    y = seqs4.fork(x)
    r = seqs4.append_tokens(y, 1)
    assert r.copies.tolist() == [[1, 2]]
    assert list(r.new_pages) == [2]
    pool = rng.standard_normal((6, 2, 4, 1, 3))
    before = pool.copy()
    fs.copy_pages(pool, r.copies)
    np.testing.assert_array_equal(pool[2], before[1])
    np.testing.assert_array_equal(pool[[0, 1, 3, 4, 5]], before[[0, 1, 3, 4, 5]])
    # A failed append changes nothing.
    with pytest.raises(fs.OutOfPages):
        seqs4.append_tokens(x, 100)
    assert seqs4.seq_len(x) == 6


def test_worked_example_2048_500_example_and_a_random_workload(rng):
    r = fs.account_memory([500], 16, 2048)
    assert r["contiguous_slots_wasted"] == 1548
    assert r["slots_wasted"] == 12
    lens = rng.integers(1, 2049, size=30)
    r = fs.account_memory(lens.tolist(), 16, 2048)
    pages = int(np.sum((lens + 15) // 16))
    assert r["slots_wasted"] == pages * 16 - int(lens.sum())
    assert r["contiguous_slots_wasted"] == 30 * 2048 - int(lens.sum())
    with pytest.raises(ValueError, match="seq_lens"):
        fs.account_memory([3000], 16, 2048)


# ---- radix cache -------------------------------------------------------------------------


def test_radix_edge_split_is_the_worked_examples():
    A, B, C, D, E, F, G = range(7)
    alloc = fs.PageAllocator(16, 1)
    cache = fs.RadixCache(alloc)
    cache.insert([A, B, C, D, E], alloc.allocate(5))
    m = cache.match_prefix([A, B, C, F, G])
    assert m.length == 3 and list(m.pages) == [0, 1, 2]
    assert cache.insert([A, B, C, F, G], np.concatenate([m.pages, alloc.allocate(2)])) == 3
    assert cache.draw(list("ABCDEFG")) == (
        "Root\n"
        "  └─\"A B C\"─→ [P0 P1 P2]\n"
        "                ├─\"D E\"─→ [P3 P4]\n"
        "                └─\"F G\"─→ [P5 P6]\n")
    keys = [list(n["key"]) for n in cache.nodes()]
    assert keys == [[], [A, B, C], [D, E], [F, G]]
    assert fs.draw_radix_tree(cache, WORDS, one_line_per_page=True).startswith('Root\n  └─"The"─→ [P0]\n')


class NaiveCache:
    """One entry per cached page: prefix tuple -> [page, last use, locks]. Linear scans."""

    def __init__(self, page_size):
        self.ps, self.entries, self.clock = page_size, {}, 0

    def match(self, tokens):
        self.clock += 1
        pages, k = [], 1
        while k * self.ps <= len(tokens) and tuple(tokens[: k * self.ps]) in self.entries:
            e = self.entries[tuple(tokens[: k * self.ps])]
            e[1] = self.clock
            pages.append(e[0])
            k += 1
        return (k - 1) * self.ps, pages

    def insert(self, tokens, pages):
        self.clock += 1
        cached, missing = 0, False
        for k in range(1, len(tokens) // self.ps + 1):
            key = tuple(tokens[: k * self.ps])
            if key in self.entries:
                self.entries[key][1] = self.clock
                cached = cached if missing else k * self.ps
            else:
                missing = True
                self.entries[key] = [pages[k - 1], self.clock, 0]
        return cached

    def lock(self, tokens, length, delta):
        for k in range(1, length // self.ps + 1):
            self.entries[tuple(tokens[: k * self.ps])][2] += delta

    def evict(self, n):
        out = []
        while len(out) < n:
            leaves = [k for k, e in self.entries.items() if e[2] == 0 and not any(
                len(o) == len(k) + self.ps and o[: len(k)] == k for o in self.entries)]
            if not leaves:
                break
            out.append(self.entries.pop(min(leaves, key=lambda k: self.entries[k][1]))[0])
        return out


@pytest.mark.parametrize("page_size", [1, 2])
def test_radix_cache_agrees_with_a_python_naive_model(rng, page_size):
    alloc = fs.PageAllocator(12, page_size)
    cache = fs.RadixCache(alloc)
    model = NaiveCache(page_size)
    history = [[]]
    for step in range(300):
        base = history[rng.integers(len(history))]
        tokens = base[: rng.integers(len(base) + 1)] + rng.integers(0, 3, rng.integers(0, 7)).tolist()
        history.append(tokens)
        op = rng.integers(3)
        if op == 0:  # a request: match, pin, allocate the rest (evicting for room), insert
            m = cache.match_prefix(tokens)
            assert (m.length, list(m.pages)) == model.match(tokens), step
            cache.lock(m.last_node)
            model.lock(tokens, m.length, +1)
            need = -(-len(tokens) // page_size) - len(m.pages)
            if need > alloc.num_free_pages:
                shortfall = need - alloc.num_free_pages
                assert list(cache.evict(shortfall)) == model.evict(shortfall), step
            if need <= alloc.num_free_pages:
                fresh = alloc.allocate(need)
                got = cache.insert(tokens, np.concatenate([m.pages, fresh]).astype(np.int32))
                assert got == model.insert(tokens, list(m.pages) + list(fresh)), step
                for p in fresh:
                    alloc.decref(int(p))
            cache.unlock(m.last_node)
            model.lock(tokens, m.length, -1)
        elif op == 1:
            n = int(rng.integers(0, 4))
            assert list(cache.evict(n)) == model.evict(n), step
        else:
            m = cache.match_prefix(tokens)
            assert (m.length, list(m.pages)) == model.match(tokens), step
        cache.check_invariants()
        # Full contents: (prefix, page, last use) of every cached page.
        prefix, rows = {}, []
        for n in cache.nodes():
            p = [] if n["parent"] < 0 else prefix[n["parent"]]
            for k, page in enumerate(n["pages"]):
                p = p + list(n["key"][k * page_size:(k + 1) * page_size])
                rows.append((tuple(p), int(page), n["last_access"]))
            prefix[n["id"]] = p
        assert sorted(rows) == sorted((k, e[0], e[1]) for k, e in model.entries.items()), step
        assert alloc.num_used_pages == cache.cached_pages


def test_radix_bad_calls_raise_value_error():
    alloc = fs.PageAllocator(4, 2)
    cache = fs.RadixCache(alloc)
    with pytest.raises(ValueError, match="is free"):
        cache.insert([1, 2], [3])
    with pytest.raises(ValueError, match="no node with id"):
        cache.lock(12)
    with pytest.raises(ValueError, match="no lock to release"):
        cache.unlock(0)


# ---- block-sparse view -------------------------------------------------------------------


def test_block_sparse_worked_example_lookup_and_attention():
    pool = example_pool()
    qo_indptr, kv_indptr, kv_indices, last = [0, 3, 7], [0, 3, 7], [0, 1, 2, 0, 1, 3, 4], [1, 1]
    view = fs.build_block_sparse(qo_indptr, kv_indptr, kv_indices, last, 1, 5, 1, causal=True)
    assert fs.draw_block_sparse_lookup(view) == (
        "A, pos 0 → pages [P0]\n"
        "A, pos 1 → pages [P0, P1]\n"
        "A, pos 2 → pages [P0, P1, P2]\n"
        "B, pos 0 → pages [P0]\n"
        "B, pos 1 → pages [P0, P1]\n"
        "B, pos 2 → pages [P0, P1, P3]\n"
        "B, pos 3 → pages [P0, P1, P3, P4]\n")
    assert "A, pos 0-2" in fs.draw_block_sparse(
        fs.build_block_sparse(qo_indptr, kv_indptr, kv_indices, last, 1, 5, 3, causal=True), page_labels=WORDS)
    q = np.array([[1, 0], [0, 1], [1, 1], [1, 0], [0, 1], [1, -1], [0, -1]], dtype=np.float64)[:, None, :]
    o = fs.block_sparse_attention(q, pool, view, causal=True, sm_scale=1.0)
    np.testing.assert_allclose(o[2, 0], [0.63, 0.79], atol=0.01)  # the course's row "A, pos 2"
    ref = fs.batch_prefill_with_paged_kv_cache(q, qo_indptr, pool, kv_indptr, kv_indices, last, causal=True,
                                              sm_scale=1.0)
    np.testing.assert_allclose(o, ref, rtol=0, atol=ATOL)


def random_paged_batch(rng, page_size, batch, heads=(2, 1), head_dim=4, decode=False):
    """Random lengths, shuffled pages, NaN in every slot no request owns."""
    kv_lens = rng.integers(0, 30, batch)
    qo_lens = np.ones(batch, dtype=int) if decode else np.array([rng.integers(0, k + 1) for k in kv_lens])
    pages = (kv_lens + page_size - 1) // page_size
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(kv_indptr[-1]) + 2
    kv_indices = rng.permutation(num_pages)[: kv_indptr[-1]].astype(np.int32)
    last = np.where(pages > 0, kv_lens - (pages - 1) * page_size, 0).astype(np.int32)
    pool = np.full((num_pages, 2, page_size, heads[1], head_dim), np.nan)
    for r in range(batch):
        for t in range(kv_lens[r]):
            pool[kv_indices[kv_indptr[r] + t // page_size], :, t % page_size] = rng.standard_normal((2, heads[1], head_dim))
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), heads[0], head_dim))
    return q, qo_indptr, pool, kv_indptr, kv_indices, last


@pytest.mark.parametrize("page_size,Br", [(1, 1), (3, 2), (4, 5)])
def test_block_sparse_walk_equals_batch_prefill(rng, page_size, Br):
    q, qo_indptr, pool, kv_indptr, kv_indices, last = random_paged_batch(rng, page_size, 3)
    view = fs.build_block_sparse(qo_indptr, kv_indptr, kv_indices, last, page_size, pool.shape[0], Br, causal=True)
    o, lse = fs.block_sparse_attention(q, pool, view, causal=True, return_lse=True)
    ro, rlse = fs.batch_prefill_with_paged_kv_cache(q, qo_indptr, pool, kv_indptr, kv_indices, last, causal=True,
                                                   return_lse=True)
    np.testing.assert_allclose(o, ro, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, rlse, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="view was built with"):
        fs.block_sparse_attention(q, pool, view, causal=False)


# ---- cascade -----------------------------------------------------------------------------


def test_cascade_levels_and_merge_equal_flat(rng):
    # R0 = P0 P1 P2, R1 = P0 P1 P3 P4, R2 = P0 P5; decode / append 2 / decode.
    qo_indptr, kv_indptr = [0, 1, 3, 4], [0, 3, 7, 9]
    kv_indices, last = [0, 1, 2, 0, 1, 3, 4, 0, 5], [1, 1, 1]
    ends = fs.derive_cascade_level_ends(qo_indptr, kv_indptr, kv_indices, last, 1, 3)
    assert [list(e) for e in ends] == [[1, 1, 1], [2, 2, 1]]
    levels = fs.build_cascade_levels(qo_indptr, kv_indptr, kv_indices, last, 1, ends)
    assert [list(l.qo_indptr) for l in levels.levels] == [[0, 4], [0, 3, 4], [0, 1, 3, 4]]
    assert [list(l.kv_indices) for l in levels.levels] == [[0], [1], [2, 3, 4, 5]]
    assert [l.causal for l in levels.levels] == [False, False, True]
    pool = rng.standard_normal((6, 2, 1, 2, 3))
    q = rng.standard_normal((4, 4, 3))
    o, lse, per_level = fs.cascade_attention(q, levels, pool, return_levels=True)
    assert len(per_level) == 3
    ro, rlse = fs.batch_prefill_with_paged_kv_cache(q, qo_indptr, pool, kv_indptr, kv_indices, last, causal=True,
                                                   return_lse=True)
    np.testing.assert_allclose(o, ro, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, rlse, rtol=0, atol=ATOL)
    assert fs.draw_cascade(levels).startswith("level 0 (shared pages")
    with pytest.raises(ValueError, match="queries but only"):
        fs.build_cascade_levels([0, 3, 7], [0, 3, 7], [0, 1, 2, 0, 1, 3, 4], [1, 1], 1, [[2, 2]])


# ---- split-KV planner --------------------------------------------------------------------


def test_split_plan_fields():
    p = fs.plan_split_kv([10000], page_size=16, num_kv_heads=8, num_sm=132)
    assert p.split_kv and p.kv_chunk_size_in_pages == 625 and p.num_work_items == 16
    p = fs.plan_split_kv([10, 1, 1], page_size=16, num_kv_heads=1, num_sm=4, ctas_per_sm=2,
                         enable_cuda_graph=True, min_kv_chunk_tokens=0)
    assert p.kv_chunk_size_in_pages == 2
    assert list(p.request_indices) == [0, 0, 0, 0, 0, 1, 2, 0]
    assert list(p.kv_tile_indices) == [0, 1, 2, 3, 4, 0, 0, 0]
    assert list(p.o_indptr) == [0, 5, 6, 7]
    assert p.block_valid_mask.tolist() == [True] * 7 + [False]
    assert p.padded_batch_size == 8
    assert not fs.plan_split_kv([3] * 64, page_size=16, num_kv_heads=8, num_sm=132).split_kv
    with pytest.raises(ValueError, match="kv_page_counts"):
        fs.plan_split_kv([-1], page_size=16, num_kv_heads=1, num_sm=1)


@pytest.mark.parametrize("page_size", [1, 4])
def test_split_attend_merge_equals_unsplit_decode(rng, page_size):
    q, _, pool, kv_indptr, kv_indices, last = random_paged_batch(rng, page_size, 4, heads=(4, 2), decode=True)
    plan = fs.plan_split_kv(np.diff(kv_indptr), page_size=page_size, num_kv_heads=2, num_sm=3,
                            min_kv_chunk_tokens=0)
    o, lse, tmp_v, tmp_s = fs.split_kv_decode(q, pool, kv_indptr, kv_indices, last, plan, return_partials=True)
    assert tmp_v.shape == (plan.num_work_items, 4, 4)
    ro, rlse = fs.batch_decode_with_paged_kv_cache(q, pool, kv_indptr, kv_indices, last, return_lse=True)
    np.testing.assert_allclose(o, ro, rtol=0, atol=ATOL)
    np.testing.assert_allclose(lse, rlse, rtol=0, atol=ATOL)


def test_every_structure_has_a_docstring():
    names = ["PageAllocator", "PagedSequences", "AppendResult", "account_memory", "copy_pages", "RadixCache",
             "RadixMatch", "draw_radix_tree", "BlockSparseView", "build_block_sparse", "block_sparse_attention",
             "draw_block_sparse", "draw_block_sparse_lookup", "CascadeLevel", "CascadeLevels",
             "build_cascade_levels", "derive_cascade_level_ends", "cascade_attention", "draw_cascade",
             "SplitKVPlan", "plan_split_kv", "split_kv_decode"]
    for name in names:
        doc = getattr(fs, name).__doc__
        assert doc and len(doc.strip()) > 20, name
