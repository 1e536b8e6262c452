"""The plan/run contract engines rely on, on a GPU, for every wrapper, against the
float64 oracle of cuda_support.py:

- CUDA graphs: with use_cuda_graph=True, run() captured after one plan() replays
  correctly after later plan()s of the same batch size (and query rows), whatever the
  new lengths: shorter, longer, with empty requests, on a permuted page table; index
  arrays on the host or the device. A planted stale grid (the graph flag dropped) fails.
- plan() while the previous run() is in flight: a long batch, then at once a re-plan to
  other lengths (from the same host arrays, rewritten) and a second run, both orders.
- two wrappers on two CUDA streams, 30 rounds without synchronising.

Skipped with a message where PyTorch, a GPU or the C library is missing.
"""
import itertools

import pytest

import cuda_support as cs

WORKSPACE_BYTES = 256 << 20
HKV, GROUP, D = 2, 4, 128
HQ = HKV * GROUP


def workspace(torch, nbytes=WORKSPACE_BYTES):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def claims_graph_safety(fsc, stage):
    names = [name for name, _, _ in fsc.stages()]
    if stage not in names:
        pytest.fail(f"stage {stage} is not in the registry ({', '.join(names)})")
    return fsc._graph_safe(stage)


# ---- batches: page tables over one pool, ragged K/V, the oracle ------------------------------

def random_pool(torch, g, num_pages, page_size, dtype, layout):
    """Random K/V in every slot: a stage reading a page or slot it was not given mixes
    numbers the oracle does not, and fails the comparison."""
    shape = (num_pages, 2, page_size, HKV, D) if layout == "NHD" else (num_pages, 2, HKV, page_size, D)
    return ((torch.rand(shape, generator=g, device="cuda") * 2 - 1)).to(getattr(torch, dtype))


def page_table(torch, g, kv_lens, page_size, num_pages):
    """(indptr, indices, last_page_len) as CPU int32 tensors: each request on random
    distinct pages of the pool; a request with no keys has no pages and last_page_len 0."""
    pages = [-(-n // page_size) for n in kv_lens]
    if sum(pages) > num_pages:
        raise ValueError(f"the pool has {num_pages} pages, the batch needs {sum(pages)}")
    order = torch.randperm(num_pages, generator=g, device="cuda")[:sum(pages)].to(torch.int32).cpu()
    indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)], dtype=torch.int32)
    return indptr, order.contiguous(), last


def request_kv(pool, layout, indptr, indices, last, page_size, i):
    """Request i's keys and values from the pool, (kv_len, Hkv, D) float64 each."""
    ids = indices[int(indptr[i]):int(indptr[i + 1])].long().to(pool.device)
    n = 0 if len(ids) == 0 else (len(ids) - 1) * page_size + int(last[i])
    pages = pool[ids]  # (p, 2, ...)
    if layout == "HND":
        pages = pages.transpose(2, 3)  # (p, 2, page_size, Hkv, D)
    k = pages[:, 0].reshape(-1, HKV, D)[:n].double()
    v = pages[:, 1].reshape(-1, HKV, D)[:n].double()
    return k, v


def check(torch, fsc, o, lse, refs, dtype, what):
    cs.assert_close(torch, o, torch.cat([r[0] for r in refs]), fsc.tolerance(dtype, "o"), what + " o")
    cs.assert_close(torch, lse, torch.cat([r[1] for r in refs]), fsc.tolerance(dtype, "lse"), what + " lse")


def split_rows(rng, rows, batch):
    """batch query lengths >= 1 summing to rows."""
    cuts = sorted(rng.choice(range(1, rows), size=batch - 1, replace=False).tolist())
    return [b - a for a, b in zip([0] + cuts, cuts + [rows])]


def indptr_of(lengths):
    import torch
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)


def placed(t, place):
    """An index array on the host (as given) or copied to the device."""
    return t.cuda() if place == "device" else t


# ---- one kind of wrapper: its batches, its plan() and run(), its oracle -------------------------

class Paged:
    """Decode or paged prefill over one random pool."""

    def __init__(self, torch, fsc, g, rng, mode, dtype, layout, page_size, num_pages, causal=False):
        self.torch, self.fsc, self.g, self.rng = torch, fsc, g, rng
        self.mode, self.dtype, self.layout, self.page_size, self.causal = mode, dtype, layout, page_size, causal
        self.num_pages = num_pages
        self.pool = random_pool(torch, g, num_pages, page_size, dtype, layout)

    def wrapper(self, graph, batch, rows, max_pages, stage=None, ws=None):
        fsc, torch = self.fsc, self.torch
        ws = workspace(torch) if ws is None else ws
        buf = lambda n: torch.empty(n, dtype=torch.int32, device="cuda")  # noqa: E731
        if self.mode == "decode":
            if not graph:
                return fsc.BatchDecodeWithPagedKVCacheWrapper(ws, self.layout, stage=stage)
            return fsc.BatchDecodeWithPagedKVCacheWrapper(ws, self.layout, True, False, buf(batch + 1), buf(max_pages),
                                                          buf(batch), stage=stage)
        if not graph:
            return fsc.BatchPrefillWithPagedKVCacheWrapper(ws, self.layout, stage=stage)
        return fsc.BatchPrefillWithPagedKVCacheWrapper(ws, self.layout, True, buf(batch + 1), buf(batch + 1),
                                                       buf(max_pages), buf(batch), stage=stage)

    def batch(self, qo_lens, kv_lens):
        indptr, indices, last = page_table(self.torch, self.g, kv_lens, self.page_size, self.num_pages)
        return {"qo_lens": list(qo_lens), "kv_lens": list(kv_lens), "qo_indptr": indptr_of(qo_lens),
                "indptr": indptr, "indices": indices, "last": last}

    def plan(self, w, b, place="host", host=None):
        t = b if host is None else host
        args = [placed(t["indptr"], place), placed(t["indices"], place), placed(t["last"], place)]
        if self.mode == "decode":
            w.plan(*args, HQ, HKV, D, self.page_size, q_data_type=self.dtype)
        else:
            w.plan(placed(t["qo_indptr"], place), *args, HQ, HKV, D, self.page_size, causal=self.causal,
                   q_data_type=self.dtype)

    def run(self, w, q, out=None, lse=None):
        return w.run(q, self.pool, out=out, lse=lse, return_lse=True)

    def refs(self, b, q):
        qo = [0] + list(itertools.accumulate(b["qo_lens"]))
        out = []
        for i in range(len(b["kv_lens"])):
            k, v = request_kv(self.pool, self.layout, b["indptr"], b["indices"], b["last"], self.page_size, i)
            out.append(cs.attention_reference(self.torch, q[qo[i]:qo[i + 1]], k, v, causal=self.causal))
        return out


class Ragged:
    """Ragged prefill; K/V live in static buffers of `capacity` rows (a graph reads the
    addresses it captured), refilled for each batch."""

    def __init__(self, torch, fsc, g, rng, dtype, capacity, causal=False):
        self.torch, self.fsc, self.g, self.rng, self.dtype, self.causal = torch, fsc, g, rng, dtype, causal
        self.k = cs.random_rows(torch, g, capacity, HKV, D, dtype)
        self.v = cs.random_rows(torch, g, capacity, HKV, D, dtype)
        self.nnz_kv = 0
        self.mode = "prefill"

    def wrapper(self, graph, batch, rows, max_pages, stage=None, ws=None):
        fsc, torch = self.fsc, self.torch
        ws = workspace(torch) if ws is None else ws
        if not graph:
            return fsc.BatchPrefillWithRaggedKVCacheWrapper(ws, stage=stage)
        buf = lambda n: torch.empty(n, dtype=torch.int32, device="cuda")  # noqa: E731
        return fsc.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", True, buf(batch + 1), buf(batch + 1), stage=stage)

    def batch(self, qo_lens, kv_lens):
        return {"qo_lens": list(qo_lens), "kv_lens": list(kv_lens), "qo_indptr": indptr_of(qo_lens),
                "kv_indptr": indptr_of(kv_lens)}

    def plan(self, w, b, place="host", host=None):
        t = b if host is None else host
        n = sum(b["kv_lens"])
        # new keys for this batch, in the static buffers (the previous run may still read
        # them: the fill is ordered after it on the stream)
        self.k[:n].copy_(cs.random_rows(self.torch, self.g, n, HKV, D, self.dtype))
        self.v[:n].copy_(cs.random_rows(self.torch, self.g, n, HKV, D, self.dtype))
        b["k"], b["v"] = self.k[:n].double(), self.v[:n].double()
        self.nnz_kv = n
        w.plan(placed(t["qo_indptr"], place), placed(t["kv_indptr"], place), HQ, HKV, D, causal=self.causal,
               q_data_type=self.dtype)

    def run(self, w, q, out=None, lse=None):
        return w.run(q, self.k[:self.nnz_kv], self.v[:self.nnz_kv], out=out, lse=lse, return_lse=True)

    def refs(self, b, q):
        qo = [0] + list(itertools.accumulate(b["qo_lens"]))
        kv = [0] + list(itertools.accumulate(b["kv_lens"]))
        return [cs.attention_reference(self.torch, q[qo[i]:qo[i + 1]], b["k"][kv[i]:kv[i + 1]],
                                       b["v"][kv[i]:kv[i + 1]], causal=self.causal) for i in range(len(qo) - 1)]


class Cascade(Paged):
    """Two levels over one pool: a prefix every request shares, then each request's own
    pages; one query per request."""

    def __init__(self, torch, fsc, g, rng, dtype, layout, page_size, num_pages):
        super().__init__(torch, fsc, g, rng, "decode", dtype, layout, page_size, num_pages)
        self.mode = "cascade"

    def wrapper(self, graph, batch, rows, max_pages, stage=None, ws=None):
        ws = workspace(self.torch) if ws is None else ws
        return self.fsc.MultiLevelCascadeAttentionWrapper(2, ws, self.layout, use_cuda_graph=graph)

    def batch(self, qo_lens, kv_lens, prefix=None):
        prefix = self.page_size * 3 if prefix is None else prefix
        shared = self.page_size * -(-prefix // self.page_size)  # whole pages
        indptr, indices, last = page_table(self.torch, self.g, [shared] + list(kv_lens), self.page_size,
                                           self.num_pages)
        n = len(kv_lens)
        p0 = int(indptr[1])
        own_indptr = indptr[1:] - p0
        # FlashInfer's multi-level form: per level (qo_indptr, kv_indptr, kv_indices,
        # kv_last_page_len); level 0 one group of every request, level 1 one per request
        levels = [[indptr_of([n]), indptr_of([1] * n)],
                  [indptr_of([p0]), own_indptr.contiguous()],
                  [indices[:p0].contiguous(), indices[p0:].contiguous()],
                  [indptr_of([self.page_size])[1:].contiguous(), last[1:].contiguous()]]
        return {"qo_lens": [1] * n, "kv_lens": list(kv_lens), "levels": levels, "table": (indptr, indices, last)}

    def plan(self, w, b, place="host", host=None):
        t = b if host is None else host
        levels = [[placed(a, place) for a in level] for level in t["levels"]]
        w.plan(*levels, HQ, HKV, D, self.page_size, q_data_type=self.dtype)

    def refs(self, b, q):
        indptr, indices, last = b["table"]
        k0, v0 = request_kv(self.pool, self.layout, indptr, indices, last, self.page_size, 0)
        out = []
        for i in range(len(b["kv_lens"])):
            k, v = request_kv(self.pool, self.layout, indptr, indices, last, self.page_size, i + 1)
            out.append(cs.attention_reference(self.torch, q[i:i + 1], self.torch.cat([k0, k]),
                                              self.torch.cat([v0, v])))
        return out


# ---- the graph contract ---------------------------------------------------------------------------

BATCH, ROWS = 13, 64


def scenarios(rng, mode, batch, rows, page_size):
    """(name, qo_lens, kv_lens) of the captured batch and the re-plans after it."""
    def qo():
        return [1] * batch if mode in ("decode", "cascade") else split_rows(rng, rows, batch)

    def kv(q_lens, low, high):
        return [int(x) + (q if mode == "prefill" else 0) for x, q in zip(rng.integers(low, high, size=batch), q_lens)]

    first_qo = qo()
    first = kv(first_qo, 1, 300)
    empty_qo = qo()
    empty = kv(empty_qo, 1, 200)
    for i in (1, batch // 2, batch - 1):
        empty[i] = 0
    short_qo, long_qo = qo(), qo()
    return [("captured", first_qo, first), ("shorter", short_qo, kv(short_qo, 0, 20)),
            ("longer", long_qo, kv(long_qo, 1000, 2049)), ("with empty requests", empty_qo, empty),
            ("permuted page table", first_qo, first)]


def max_pages(cases, page_size, extra=0):
    return max(sum(-(-n // page_size) for n in kv) for _, _, kv in cases) + extra


def kind_of(torch, fsc, g, rng, kind, dtype="bfloat16", layout="NHD", page_size=16, causal=False, pages=None):
    if kind == "ragged":
        return Ragged(torch, fsc, g, rng, dtype, pages, causal)
    if kind == "cascade":
        return Cascade(torch, fsc, g, rng, dtype, layout, page_size, pages)
    return Paged(torch, fsc, g, rng, kind, dtype, layout, page_size, pages, causal)


def replay_after_replans(torch, fsc, rng, kind, stage, dtype, layout, page_size, causal, place, plant=False):
    """Captures run() after the first batch of scenarios(), re-plans each of them and
    replays, comparing with the oracle. Returns the stage plan() chose and the names of
    the re-plans the library refused (only the cascade may refuse: its graph freezes the
    level structure)."""
    g = cs.generator(torch, rng, f"graph {kind} {stage} {dtype} {layout} {page_size} {causal} {place}")
    mode = "prefill" if kind in ("prefill", "ragged") else kind
    cases = scenarios(rng, mode, BATCH, ROWS, page_size)
    capacity = max_pages(cases, page_size if kind != "ragged" else 1) + 4 * page_size
    k = kind_of(torch, fsc, g, rng, kind, dtype, layout, page_size, causal, pages=capacity)
    rows = BATCH if mode != "prefill" else ROWS
    w = k.wrapper(True, BATCH, rows, capacity, stage)
    if plant:  # the bug this suite must catch: a stage planned as if no graph replayed it
        w._use_cuda_graph = False
    first = k.batch(cases[0][1], cases[0][2])
    k.plan(w, first, place)
    if kind != "cascade":
        assert claims_graph_safety(fsc, w.stage), f"plan() chose {w.stage} for a graph, which does not claim it"
    q = cs.random_rows(torch, g, rows, HQ, D, dtype)
    out = torch.empty(rows, HQ, D, dtype=getattr(torch, dtype), device="cuda")
    lse = torch.empty(rows, HQ, dtype=torch.float32, device="cuda")
    k.run(w, q, out, lse)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        k.run(w, q, out, lse)
    refused = []
    for name, qo_lens, kv_lens in cases:
        b = k.batch(qo_lens, kv_lens) if name != "captured" else first
        try:
            k.plan(w, b, place)
        except ValueError as e:
            if kind != "cascade" or "graph" not in str(e):
                raise
            refused.append(name)
            continue
        q.copy_(cs.random_rows(torch, g, rows, HQ, D, dtype))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(torch, fsc, out, lse, k.refs(b, q), dtype,
              f"{kind} {w.stage} graph replay after re-plan '{name}' (lengths {kv_lens})")
    return w.stage, refused


DECODE_GRAPH = [(stage, dtype, layout, page) for stage, dtype in
                ((None, "bfloat16"), ("02_paged", "float16"), ("03_split_kv", "bfloat16"),
                 ("03_split_kv", "float32"), ("04_tensor_core", "bfloat16"))
                for layout, page in (("NHD", 16), ("HND", 1))]


@pytest.mark.parametrize("place", ["host", "device"])
@pytest.mark.parametrize("stage,dtype,layout,page_size", DECODE_GRAPH)
def test_decode_graph_replays_after_replan(torch, fsc, rng, stage, dtype, layout, page_size, place):
    if stage is not None and not claims_graph_safety(fsc, stage):
        pytest.skip(f"{stage} does not claim graph safety (test_cuda_arguments pins which stages do)")
    chosen, _ = replay_after_replans(torch, fsc, rng, "decode", stage, dtype, layout, page_size, False, place)
    if stage is None:  # the default for a GQA group of 4 (docs/python_gpu.md)
        assert chosen == "03_split_kv", chosen


@pytest.mark.parametrize("place", ["host", "device"])
@pytest.mark.parametrize("layout,page_size", [("NHD", 16), ("HND", 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_prefill_graph_replays_after_replan(torch, fsc, rng, layout, page_size, causal, place):
    chosen, _ = replay_after_replans(torch, fsc, rng, "prefill", None, "float16", layout, page_size, causal, place)
    assert chosen == "04_tensor_core", chosen


@pytest.mark.parametrize("place", ["host", "device"])
@pytest.mark.parametrize("stage,dtype", [(None, "bfloat16"), ("04_tensor_core_ragged", "float16"),
                                         ("01_naive", "float32")])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_prefill_graph_replays_after_replan(torch, fsc, rng, stage, dtype, causal, place):
    if stage is not None and not claims_graph_safety(fsc, stage):
        pytest.skip(f"{stage} does not claim graph safety (test_cuda_arguments pins which stages do)")
    chosen, _ = replay_after_replans(torch, fsc, rng, "ragged", stage, dtype, "NHD", 1, causal, place)
    if stage is None:
        assert chosen == "04_tensor_core_ragged", chosen


@pytest.mark.parametrize("place", ["host", "device"])
@pytest.mark.parametrize("layout,page_size", [("NHD", 16), ("HND", 1)])
def test_cascade_graph_replays_after_replan_or_refuses(torch, fsc, rng, layout, page_size, place):
    _, refused = replay_after_replans(torch, fsc, rng, "cascade", None, "bfloat16", layout, page_size, False, place)
    # the same lengths on other pages is the same launch: it must replay
    assert "permuted page table" not in refused and "captured" not in refused, refused
    print(f"re-plans the cascade refused under its captured graph: {refused or 'none'}")


def test_a_stale_grid_is_caught(torch, fsc, rng):
    """The planted bug: a prefill planned without the graph flag sizes its grid from the
    first lengths; replays after re-plans must then fail the oracle (or be refused)."""
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        replay_after_replans(torch, fsc, rng, "prefill", "04_tensor_core", "float16", "NHD", 16, True, "host",
                             plant=True)


def test_graph_mode_refuses_another_batch_size(torch, fsc, rng):
    g = cs.generator(torch, rng, "graph batch size")
    k = Paged(torch, fsc, g, rng, "decode", "bfloat16", "NHD", 16, 200)
    w = k.wrapper(True, 8, 8, 190)
    k.plan(w, k.batch([1] * 4, [30, 1, 70, 16]))
    with pytest.raises(ValueError, match=r"use_cuda_graph=True: this wrapper's first plan\(\) fixed batch_size 4; "
                                         r"this plan has batch_size 5"):
        k.plan(w, k.batch([1] * 5, [30, 1, 70, 16, 9]))
    for name, _, _ in fsc.stages():
        if not fsc._graph_safe(name):
            with pytest.raises(ValueError, match=rf"stage {name} cannot plan for a captured CUDA graph "
                                                 r"\(use_cuda_graph=True\)"):
                k.plan(k.wrapper(True, 8, 8, 190, stage=name), k.batch([1] * 4, [30, 1, 70, 16]))


# ---- plan() while the previous run() is in flight ----------------------------------------------

def long_and_other(rng, kind):
    """Two batches of `kind`: a long one (a run that takes a while) and another."""
    if kind in ("decode", "cascade"):
        long = [int(x) for x in rng.integers(16384, 32769, size=64)]
        return ([1] * 64, long), ([1] * 64, [int(x) for x in rng.integers(1, 4097, size=64)])
    qo = [256] * 8
    return (qo, [int(x) for x in rng.integers(8192, 16385, size=8)]), (qo, [int(x) for x in rng.integers(256, 2049,
                                                                                                          size=8)])


def fill_host(host, b):
    """Writes batch b's index arrays into the reused host tensors `host` (same keys) and
    returns views of the right lengths: what an engine does with its staging buffers."""
    out = {}
    for key, value in b.items():
        if key in host:
            host[key][:len(value)].copy_(value)
            out[key] = host[key][:len(value)]
        elif key == "levels":
            out[key] = [[fill_level(host, f"levels{i}{j}", a) for j, a in enumerate(level)]
                        for i, level in enumerate(value)]
        else:
            out[key] = value
    return out


def fill_level(host, key, a):
    host[key][:len(a)].copy_(a)
    return host[key][:len(a)]


def host_buffers(torch, batches, pinned):
    """Host int32 tensors big enough for every index array of `batches`, reused."""
    host = {}
    for b in batches:
        for key, value in b.items():
            items = [(key, value)] if key in ("qo_indptr", "indptr", "indices", "last", "kv_indptr") else []
            if key == "levels":
                items = [(f"levels{i}{j}", a) for i, level in enumerate(value) for j, a in enumerate(level)]
            for name, a in items:
                if name not in host or len(host[name]) < len(a):
                    host[name] = torch.empty(max(len(a), 1), dtype=torch.int32)
    if pinned:
        host = {key: t.pin_memory() for key, t in host.items()}
    return host


@pytest.mark.parametrize("kind", ["decode", "prefill", "ragged", "cascade"])
@pytest.mark.parametrize("long_first", [True, False])
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_replan_while_the_previous_run_is_in_flight(torch, fsc, rng, kind, long_first, memory):
    g = cs.generator(torch, rng, f"in flight {kind} {long_first} {memory}")
    dtype, page = "bfloat16", 16
    (qa, ka), (qb, kb) = long_and_other(rng, kind)
    if not long_first:
        (qa, ka), (qb, kb) = (qb, kb), (qa, ka)
    pages = (sum(-(-n // page) for n in ka + kb) + 8) if kind != "ragged" else sum(ka) + sum(kb)
    k = kind_of(torch, fsc, g, rng, kind, dtype, "NHD", page, False, pages=pages)
    w = k.wrapper(False, len(qa), sum(qa), pages)
    a, b = k.batch(qa, ka), k.batch(qb, kb)
    host = host_buffers(torch, [a, b], memory == "pinned")
    q_a = cs.random_rows(torch, g, sum(qa), HQ, D, dtype)
    q_b = cs.random_rows(torch, g, sum(qb), HQ, D, dtype)
    torch.cuda.synchronize()
    k.plan(w, a, "host", fill_host(host, a))
    o_a, lse_a = k.run(w, q_a)
    # no synchronisation: a's kernels may still run while b is planned from the same
    # host arrays, rewritten (ragged: b's keys are written after a's run on the stream)
    k.plan(w, b, "host", fill_host(host, b))
    o_b, lse_b = k.run(w, q_b)
    torch.cuda.synchronize()
    check(torch, fsc, o_a, lse_a, k.refs(a, q_a), dtype, f"{kind} first run (planned before the re-plan)")
    check(torch, fsc, o_b, lse_b, k.refs(b, q_b), dtype, f"{kind} second run (planned while the first ran)")


@pytest.mark.parametrize("kind", ["decode", "prefill", "ragged", "cascade"])
def test_two_wrappers_on_two_streams(torch, fsc, rng, kind):
    g = cs.generator(torch, rng, f"two streams {kind}")
    dtype, page, rounds = "bfloat16", 16, 30
    mode = "prefill" if kind in ("prefill", "ragged") else kind
    plans = []
    for _ in range(2 * rounds):
        if mode == "prefill":
            qo = split_rows(rng, 96, 6)
            plans.append((qo, [q + int(x) for q, x in zip(qo, rng.integers(0, 1500, size=6))]))
        else:
            plans.append(([1] * 8, [int(x) for x in rng.integers(0, 2049, size=8)]))
    pages = max(sum(-(-n // page) for n in kv) for _, kv in plans) + 8 if kind != "ragged" else 96 * 1600
    makers = [kind_of(torch, fsc, g, rng, kind, dtype, "NHD", page, False, pages=pages) for _ in range(2)]
    wrappers = [m.wrapper(False, 8, 96, pages) for m in makers]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    results = []
    for r in range(rounds):
        for j in range(2):
            qo, kv = plans[2 * r + j]
            m, w = makers[j], wrappers[j]
            with torch.cuda.stream(streams[j]):
                b = m.batch(qo, kv)
                m.plan(w, b)
                q = cs.random_rows(torch, g, sum(qo), HQ, D, dtype)
                o, lse = m.run(w, q)
                results.append((m, b, q, o, lse, r, j))
    torch.cuda.synchronize()
    for m, b, q, o, lse, r, j in results:
        check(torch, fsc, o, lse, m.refs(b, q), dtype, f"{kind} round {r} stream {j}")
