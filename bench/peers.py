#!/usr/bin/env python3
"""Peers: PyTorch scaled_dot_product_attention (flash and cuDNN backends) and FlashInfer's
batch decode wrapper on the decode shapes of bench/shapes.csv and
bench/shapes_split_kv.csv, timed like flashstep_bench times the stages.

    python3 bench/peers.py --shapes bench/shapes.csv --out peers.json
    python3 bench/peers.py --shapes bench/shapes_split_kv.csv --out peers.json [--peers sdpa|flashinfer]

Run it in the same GPU run as flashstep_bench (the benchmark policy: ratios are only
meaningful within one run). Timing, for every peer: CUDA events around one call, the L2
flushed before each call, warm-up first; 5 repetitions of at least 50 ms (or 10 calls)
each, and the median of the repetitions' mean times. The call is captured once in a CUDA
graph and replayed, so Python's dispatch time (tens of microseconds, comparable to a
small decode) stays out of the measurement, as the C++ stages' launch time does; where
capture fails the call runs eagerly and the row says so. GB/s counts q, K, V, o and lse,
the same bytes the stages are credited with (decode_bytes).

The decode peers:
  torch_sdpa_flash, torch_sdpa_cudnn   SDPA on a *contiguous* KV cache, k and v of shape
      (batch, num_kv_heads, kv_len, head_dim), q of shape (batch, num_qo_heads, 1,
      head_dim), GQA through enable_gqa=True. Page size, page layout and page order do
      not apply, so shapes that differ only in those share one measurement (rows keyed
      by shape_key, named by the first shape).
  flashinfer_cuda_core_decode, flashinfer_tc_decode   FlashInfer's
      BatchDecodeWithPagedKVCacheWrapper with use_tensor_cores False / True
      (https://docs.flashinfer.ai/api/decode.html), where `import flashinfer` works (a row
      says why where it does not), on a paged pool laid out as flashstep_bench lays out
      the shape's: its page_size, its layout (NHD or HND), its page order (sequential, or
      a random permutation of the pool's page ids from PAGE_ORDER_SEED, printed in the
      row's note), a quarter of spare pages, the dtype of its dtype column. Every shape is
      its own measurement. plan() runs outside the graph, run() is captured. Each row
      records max_abs_diff_vs_cudnn, its output's largest difference from cuDNN SDPA's on
      the same K/V (gathered from the pool through the page table), and is marked with an
      error where that is more than DECODE_CHECK_RTOL of cuDNN's largest |o|. (FlashInfer's
      lse is base 2; these rows do not use it.)
  An FP8 cache (bench/shapes_fp8.csv: the decode columns, then kv_dtype, k_scale,
      v_scale): both FlashInfer decode wrappers read a float8_e4m3fn / float8_e5m2 pool
      (kv_data_type in plan(), bf16 q and o), with k_scale and v_scale passed to run() where
      a row gives them; the bytes count K and V at one byte an element; the check against
      cuDNN widens the FP8 pool to q's dtype exactly and applies the scales as FlashInfer
      does (k_scale in the softmax scale, v_scale on the output). SDPA has no FP8 cache:
      its rows are the bf16 contiguous ones, shared by the shapes of equal sizes.
FlashInfer runs after SDPA, in child processes with a time limit (--flashinfer-timeout):
its kernels compile on first use, and a module that fails to load can end its process; a
child that dies or runs out of time leaves error rows for the shapes it did not finish,
and the JSON (written after every shape) keeps what was measured. --peers times one
family only, for a machine that allows no single command that long; bench/merge_results.py
joins several peers files of one run.

Two other shapes files are recognised by their columns: bench/shapes_prefill.csv (a
"mode" column; stage 04) and bench/shapes_cascade.csv (a "shared_prefix" column; stage
05). Their peers are described where their code starts below; the command is the same.
"""
import argparse
import csv
import importlib.util
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
# K/V element types of an FP8 cache (bench/shapes_fp8.csv's kv_dtype column)
KV_DTYPES = {**DTYPES, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def load_shapes(path):
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(rows))


def shape_key(s):
    """What a contiguous-KV peer sees of a shape."""
    return (int(s["batch"]), int(s["kv_len"]), int(s["num_qo_heads"]), int(s["num_kv_heads"]),
            int(s["head_dim"]), s["dtype"])


def decode_bytes(batch, kv_len, hq, hkv, d, elem, kv_elem=None):
    """q, K, V, o and lse; K and V at `kv_elem` bytes an element (an FP8 cache: 1), else `elem`."""
    kv_elem = elem if kv_elem is None else kv_elem
    return elem * 2 * batch * hq * d + kv_elem * 2 * batch * kv_len * hkv * d + 4 * batch * hq


def time_call(fn, flush, reps=5, min_ms=50.0, min_calls=10):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once(i):
        flush.fill_(i % 251)  # evict the L2 with a write that always changes memory
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    for i in range(3):
        once(i)
    means = []
    for r in range(reps):
        times = []
        while len(times) < min_calls or sum(times) < min_ms:
            times.append(once(len(times)))
        means.append(sum(times) / len(times))
    return statistics.median(means), means


def as_graph(call):
    """(replay function, "cuda_graph") for `call` captured once, or (call, "eager")."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay, "cuda_graph"
    except RuntimeError:
        torch.cuda.synchronize()
        return call, "eager"


def run_peer(backend, q, k, v, scale=None):
    """One call; returns (output, how GQA was passed). Tries enable_gqa=True first.
    `scale`: SDPA's softmax scale (None: 1/sqrt(head_dim))."""
    with sdpa_kernel([backend]):
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, scale=scale), "enable_gqa=True"
        except RuntimeError as first:
            if k.shape[1] == q.shape[1]:
                raise
            try:  # some backends take differing head counts directly
                return F.scaled_dot_product_attention(q, k, v, scale=scale), "heads differ, no enable_gqa"
            except RuntimeError:
                raise first


# ---- Prefill/append and large-group decode (bench/shapes_prefill.csv, stage 04) --------
# A shapes file with a "mode" column is a prefill file. Peers: SDPA flash and cuDNN on the
# contiguous equivalent (one call per distinct request length; their is_causal aligns the
# mask top-left, so an append with fewer queries than keys runs non-causal there and the
# row says so), and FlashInfer's wrappers where `import flashinfer` works: the paged
# prefill wrapper with the fa2 and fa3 backends, and the tensor-core decode wrapper for
# decode rows (checked against cuDNN SDPA like the decode files' rows), on a page-16 NHD
# pool laid out like the stage's. TFLOP/s counts 4 * head_dim flops per (query, key) pair
# the peer's mask lets through, per query head, as flashstep_bench does; decode rows count
# bytes (GB/s). flashinfer_rows serves the decode files too (the module's docstring).

def spread_lengths(batch, longest):
    """bench/shapes_prefill.csv's "spread": request i of n gets longest/32 * 32^(i/(n-1))."""
    if batch == 1:
        return [longest]
    return [int(math.floor(longest / 32.0 * 32.0 ** (i / (batch - 1)) + 0.5)) for i in range(batch - 1)] + [longest]


def prefill_lengths(s):
    batch, qo, kv = int(s["batch"]), int(s["qo_len"]), int(s["kv_len"])
    if s["lengths"] == "spread":
        return list(zip(spread_lengths(batch, qo), spread_lengths(batch, kv)))
    return [(qo, kv)] * batch


def visible_pairs(lengths, causal):
    total = 0
    for qo, kv in lengths:
        if not causal:
            total += qo * kv
        else:  # bottom-right aligned: query i sees keys 0 .. i + kv - qo
            total += sum(max(0, min(kv, i + kv - qo + 1)) for i in range(qo))
    return total


def sdpa_prefill_rows(s, flush):
    """SDPA flash / cuDNN on the contiguous equivalent of a prefill shape."""
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    dtype = DTYPES[s["dtype"]]
    lengths = prefill_lengths(s)
    causal_req = s["causal"] == "1"
    groups = {}  # (qo, kv) -> count: requests of one length run as one batched call
    for qk in lengths:
        groups[qk] = groups.get(qk, 0) + 1
    tensors = []
    for (qo, kv), n in groups.items():
        q = torch.empty(n, hq, qo, d, dtype=dtype, device="cuda").uniform_(-3, 3)
        k = torch.empty(n, hkv, kv, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        v = torch.empty(n, hkv, kv, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        tensors.append((q, k, v, causal_req and qo == kv))
    top_left_only = causal_req and any(qo != kv for qo, kv in lengths)
    rows = []
    for impl, backend in BACKENDS.items():
        note = "contiguous equivalent, one call per distinct length"
        if top_left_only:
            note += "; non-causal where qo_len != kv_len (SDPA aligns is_causal top-left)"
        pairs = sum(visible_pairs([(t[0].shape[2], t[1].shape[2])] * t[0].shape[0], t[3]) for t in tensors)
        flops = 4.0 * d * hq * pairs
        row = {"impl": impl, "shape": s["name"], "flops": flops, "note": note}

        def call():
            with sdpa_kernel([backend]):
                for q, k, v, causal in tensors:
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        try:
            call()
            timed(row, call, flush)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0][:300]
        rows.append(row)
    del tensors
    return rows


def sdpa_decode_rows(s, flush):
    """SDPA flash / cuDNN on a decode row of a prefill file (contiguous K/V, GB/s)."""
    batch, kv_len = int(s["batch"]), int(s["kv_len"])
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    dtype = DTYPES[s["dtype"]]
    q = torch.empty(batch, hq, 1, d, dtype=dtype, device="cuda").uniform_(-3, 3)
    k = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    v = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    nbytes = decode_bytes(batch, kv_len, hq, hkv, d, q.element_size())
    rows = []
    for impl, backend in BACKENDS.items():
        row = {"impl": impl, "shape": s["name"], "bytes": nbytes, "note": "contiguous equivalent"}
        try:
            _, row["gqa"] = run_peer(backend, q, k, v)
            timed(row, lambda: run_peer(backend, q, k, v), flush)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0][:300]
        rows.append(row)
    del q, k, v
    return rows


def paged_layout(kv_lens, page, page_order="sequential", seed=None):
    """The page table flashstep_bench builds for a batch (make_layout in
    stages/harness/case.cpp): request b owns ceil(kv_lens[b] / page) pages, taken in request
    order from a list of every page id of a pool with a quarter more pages than the batch
    uses (spare pages nobody owns). The list is 0, 1, 2, ... ("sequential") or a random
    permutation drawn from `seed` ("shuffled": a server's pool after many evictions; the same
    kind of permutation as flashstep_bench's, not the same one, which comes from C++'s
    std::shuffle). Returns (kv_indptr, kv_indices, last_page_len, num_pages) as lists."""
    pages = [(kv + page - 1) // page for kv in kv_lens]
    used = sum(pages)
    num_pages = used + used // 4 + 1
    order = list(range(num_pages))
    if page_order == "shuffled":
        random.Random(seed).shuffle(order)
    last = [kv - (p - 1) * page if p else 0 for kv, p in zip(kv_lens, pages)]
    return [0] + list(itertools.accumulate(pages)), order[:used], last, num_pages


def cudnn_decode_reference(q, pool, kv_indices, kv_len, layout, k_scale=1.0, v_scale=1.0):
    """cuDNN SDPA's output, (batch, num_qo_heads, head_dim) in fp32, on the K/V that a decode
    batch of `kv_len` keys per request holds in the paged `pool` (NHD or HND `layout`),
    gathered through its page table `kv_indices` into contiguous (requests, kv_heads,
    kv_len, head_dim) copies a few requests at a time (DECODE_CHECK_CHUNK_BYTES of K and V).
    An FP8 pool is gathered as bytes and widened to q's dtype (exact: every e4m3 and e5m2
    value is a bf16 and an fp16 value); its scales enter as FlashInfer applies them, k_scale
    in the softmax scale and v_scale on the output."""
    batch = q.shape[0]
    fp8 = pool.element_size() == 1
    scale = k_scale / math.sqrt(pool.shape[4]) if k_scale != 1.0 else None
    page, hkv, d = (pool.shape[2], pool.shape[3], pool.shape[4]) if layout == "NHD" else \
        (pool.shape[3], pool.shape[2], pool.shape[4])
    table = kv_indices.long().view(batch, -1)
    chunk = max(1, int(DECODE_CHECK_CHUNK_BYTES // (2 * kv_len * hkv * d * pool.element_size())))
    out = []
    for b in range(0, batch, chunk):
        if fp8:  # indexed as bytes (the index kernels need not know the FP8 types), then widened
            pages = pool.view(torch.uint8)[table[b:b + chunk]].view(pool.dtype).to(q.dtype)
        else:
            pages = pool[table[b:b + chunk]]  # (n, pages, 2, page, hkv, d) or (n, pages, 2, hkv, page, d)
        if layout == "HND":
            pages = pages.transpose(3, 4)
        n = pages.shape[0]
        kv = pages.permute(2, 0, 1, 3, 4, 5).reshape(2, n, -1, hkv, d)[:, :, :kv_len].transpose(2, 3)
        o, _ = run_peer(BACKENDS["torch_sdpa_cudnn"], q[b:b + chunk].unsqueeze(2), kv[0].contiguous(),
                        kv[1].contiguous(), scale=scale)
        out.append(o.squeeze(2).float() * v_scale)
        del pages, kv
    return torch.cat(out)


PAGE_ORDER_SEED = 20240607  # the "shuffled" page order's permutation; printed with the rows
DECODE_CHECK_CHUNK_BYTES = 1e9  # K and V gathered at a time for the cuDNN reference
DECODE_CHECK_RTOL = 0.02  # a decode row whose output is further from cuDNN's than this
#                           fraction of cuDNN's largest |o| (about 5 bf16 steps) is marked


def flashinfer_rows(s, flush, backends=("fa2", "fa3")):
    """FlashInfer on a paged pool laid out as flashstep_bench lays out the shape's: its
    prefill wrappers (`backends`) on a prefill row, its decode wrapper on a decode row. A
    row of a decode shapes file (no "mode" column) gets both decode variants, CUDA cores and
    tensor cores, on the shape's page size, layout and page order; a decode row of the
    prefill file the tensor-core one on page-16 NHD. Each decode row records its largest
    difference from cuDNN SDPA's output on the same K/V (max_abs_diff_vs_cudnn) and is
    marked with an error where that is large. A shape with a kv_dtype column of e4m3 or
    e5m2 (bench/shapes_fp8.csv) reads an FP8 pool (kv_data_type float8_e4m3fn /
    float8_e5m2 in plan()), with its k_scale and v_scale passed to run() unless both are 1."""
    try:
        import flashinfer  # noqa: F401  (made importable offline by the peers bundle)
    except Exception as e:  # not installed here: say so in the results, time nothing
        return [{"impl": "flashinfer", "shape": s["name"], "error": f"flashinfer not importable: {e}"[:300]}]
    hq, hkv, d, page = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"]), int(s["page_size"])
    dtype = DTYPES[s["dtype"]]
    kv_dtype = KV_DTYPES[s.get("kv_dtype") or s["dtype"]]
    k_scale, v_scale = float(s.get("k_scale") or 1), float(s.get("v_scale") or 1)
    scales = {"k_scale": k_scale, "v_scale": v_scale} if (k_scale, v_scale) != (1.0, 1.0) else {}
    decode_file = "mode" not in s
    decode = decode_file or s["mode"] == "decode"
    layout, order = s.get("layout", "NHD"), s.get("page_order", "sequential")
    lengths = [(1, int(s["kv_len"]))] * int(s["batch"]) if decode else prefill_lengths(s)
    causal = not decode and s["causal"] == "1"
    indptr, indices, last, num_pages = paged_layout([kv for _, kv in lengths], page, order, PAGE_ORDER_SEED)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    kv_indptr, kv_indices, last = i32(indptr), i32(indices), i32(last)
    qo_indptr = i32([0] + list(itertools.accumulate(qo for qo, _ in lengths)))
    pool_shape = (num_pages, 2, page, hkv, d) if layout == "NHD" else (num_pages, 2, hkv, page, d)
    pool = torch.empty(pool_shape, dtype=dtype, device="cuda").uniform_(-1, 1)
    if kv_dtype != dtype:  # an FP8 cache: the same draw, rounded (torch's conversion saturates nothing here)
        pool = pool.to(kv_dtype)
    q = torch.empty(int(qo_indptr[-1]), hq, d, dtype=dtype, device="cuda").uniform_(-3, 3)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    note = "paged, page %d %s" % (page, layout)
    if kv_dtype != dtype:
        note += ", kv %s" % s["kv_dtype"]
    if scales:
        note += ", k_scale %g v_scale %g" % (k_scale, v_scale)
    if order == "shuffled":
        note += ", shuffled pages (seed %d)" % PAGE_ORDER_SEED
    if decode_file:
        variants = [("flashinfer_cuda_core_decode", False), ("flashinfer_tc_decode", True)]
    elif decode:
        variants = [("flashinfer_tc_decode", True)]
    else:
        variants = [("flashinfer_" + b, b) for b in backends]
    rows, outputs = [], {}
    for impl, how in variants:
        row = {"impl": impl, "shape": s["name"], "note": note, "flashinfer_version": getattr(flashinfer, "__version__",
                                                                                            "unknown")}
        if decode_file:
            row["note"] += ", use_tensor_cores=%s" % how
            if order == "shuffled":
                row["page_order_seed"] = PAGE_ORDER_SEED
        try:
            if decode:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, layout, use_tensor_cores=how)
                w.plan(kv_indptr, kv_indices, last, hq, hkv, d, page, q_data_type=dtype, kv_data_type=kv_dtype)
                row["bytes"] = decode_bytes(len(lengths), int(s["kv_len"]), hq, hkv, d, q.element_size(),
                                            pool.element_size())
            else:
                w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, layout, backend=how)
                w.plan(qo_indptr, kv_indptr, kv_indices, last, hq, hkv, d, page, causal=causal,
                       q_data_type=dtype, kv_data_type=dtype)
                row["flops"] = 4.0 * d * hq * visible_pairs(lengths, causal)
            # plan() above, outside the graph; run() captured in it and replayed (an FP8
            # cache's scales as run() arguments, FlashInfer's API)
            out = w.run(q, pool, **scales)
            if decode:
                outputs[impl] = out.float()
            timed(row, lambda: w.run(q, pool, **scales), flush)
        except Exception as e:  # a backend this FlashInfer build or GPU lacks: recorded, not fatal
            row["error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
        rows.append(row)
    if outputs:  # the same attention as cuDNN's on the same K/V: a wrong page table or layout shows here
        check_decode_rows(rows, outputs, lambda: cudnn_decode_reference(q, pool, kv_indices, int(s["kv_len"]), layout,
                                                                         k_scale, v_scale))
    return rows


def check_decode_rows(rows, outputs, reference):
    """Records in each row of `rows` whose impl has an output in `outputs` its largest
    difference from `reference()` (cuDNN SDPA's output), and marks the row with an error
    where that is more than DECODE_CHECK_RTOL of the reference's largest |o|."""
    try:
        ref = reference()
    except Exception as e:  # cuDNN unavailable here: the rows stay, unchecked, and say why
        for row in rows:
            if row["impl"] in outputs:
                row["check_error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
        return
    ref_max = ref.abs().max().item()
    for row in rows:
        if row["impl"] not in outputs:
            continue
        diff = (outputs[row["impl"]] - ref).abs().max().item()
        row.update({"max_abs_diff_vs_cudnn": diff, "cudnn_max_abs": ref_max})
        if not diff <= DECODE_CHECK_RTOL * ref_max:  # NaN fails too
            row["error"] = (f"output differs from cuDNN SDPA's on the same K/V: max |diff| {diff:.3g}, more than "
                            f"{DECODE_CHECK_RTOL} x max |o| {ref_max:.3g}")


# ---- Shared-prefix (cascade) shapes (bench/shapes_cascade.csv, stage 05) ---------------
# A shapes file with a "shared_prefix" column. Every request holds shared_prefix keys,
# then kv_len keys of its own; decode rows have one query per request, prefill rows
# qo_len queries per request at the end of its keys (causal, bottom-right aligned). One
# page pool per shape, laid out as flashstep lays it out: the prefix's whole pages first
# (the same page ids in every request's table), then each request's own pages (the
# prefix's partial last page, if any, and its own keys), sequential ids. Peers:
#   flashinfer_cascade           MultiLevelCascadeAttentionWrapper, two levels: every query
#                                of the batch against the shared whole pages (one "request"
#                                of batch x qo_len queries), then each request's own pages;
#                                causal on the last level only (append rows)
#   flashinfer_cuda_core_decode  BatchDecodeWithPagedKVCacheWrapper over the flat tables,
#   flashinfer_tc_decode         use_tensor_cores False / True (decode rows)
#   flashinfer_fa2               BatchPrefillWithPagedKVCacheWrapper fa2 over the flat
#                                tables, causal (prefill rows)
#   torch_sdpa_cudnn             SDPA's cuDNN backend on a contiguous copy (the prefix
#                                repeated in every request's K/V), where that copy fits in
#                                CASCADE_SDPA_MAX_BYTES; prefill rows run non-causal there
# Decode rows count GB/s with the bytes a flat decode reads (q, every request's whole K/V,
# o, lse), whatever the peer reads; prefill rows count TFLOP/s from the visible pairs.
# FlashInfer's API: https://docs.flashinfer.ai/api/cascade.html,
# https://docs.flashinfer.ai/api/decode.html, https://docs.flashinfer.ai/api/prefill.html

CASCADE_SDPA_MAX_BYTES = 20e9  # K and V of the contiguous copy


def cascade_layout(s):
    """The page tables of a shared-prefix shape, as plain lists: "flat" (indptr, indices,
    last_page_len: every request's whole table), "levels" (qo_indptr, kv_indptr, indices,
    last_page_len per level: the shared whole pages, then each request's own pages; None
    where the prefix has no whole page or a request has no key of its own), "qo" and "kv"
    (queries and keys per request), "num_pages", "shared_keys" (keys on shared pages)."""
    batch, own, prefix, page = int(s["batch"]), int(s["kv_len"]), int(s["shared_prefix"]), int(s["page_size"])
    qo = 1 if s["mode"] == "decode" else int(s["qo_len"])
    n_shared = prefix // page
    own_keys = prefix - n_shared * page + own  # the prefix's partial page, then the request's keys
    own_pages = (own_keys + page - 1) // page
    shared_ids = list(range(n_shared))
    own_ids = [list(range(n_shared + i * own_pages, n_shared + (i + 1) * own_pages)) for i in range(batch)]
    flat_pages = [shared_ids + ids for ids in own_ids]
    flat_last = own_keys - (own_pages - 1) * page if own_pages else page
    lay = {"qo": [qo] * batch, "kv": [prefix + own] * batch, "num_pages": n_shared + batch * own_pages,
           "shared_keys": n_shared * page,
           "flat": ([0] + list(itertools.accumulate(len(p) for p in flat_pages)),
                    [i for p in flat_pages for i in p], [flat_last] * batch),
           "levels": None}
    if n_shared > 0 and own_keys > 0:
        lay["levels"] = [
            ([0, batch * qo], [0, n_shared], shared_ids, [page]),
            ([0] + list(itertools.accumulate([qo] * batch)),
             [0] + list(itertools.accumulate([own_pages] * batch)),
             [i for ids in own_ids for i in ids], [own_keys - (own_pages - 1) * page] * batch),
        ]
    return lay


def cascade_amounts(s, lay, elem, causal):
    """What a row of this shape is credited with: {"bytes": ...} (decode) or {"flops": ...}."""
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    if s["mode"] == "decode":
        return {"bytes": decode_bytes(len(lay["kv"]), lay["kv"][0], hq, hkv, d, elem)}
    return {"flops": 4.0 * d * hq * visible_pairs(list(zip(lay["qo"], lay["kv"])), causal)}


def timed(row, fn, flush):
    """Times `fn` (captured in a CUDA graph where it can be) into `row`, with its rate."""
    fn, mode = as_graph(fn)
    ms, means = time_call(fn, flush)
    row.update({"median_us": ms * 1e3, "repetition_means_us": [m * 1e3 for m in means], "mode": mode})
    if "bytes" in row:
        row["GB/s"] = row["bytes"] / (ms * 1e-3) * 1e-9
    else:
        row["TFLOP/s"] = row["flops"] / (ms * 1e-3) * 1e-12


def sdpa_cascade_rows(s, flush):
    """cuDNN SDPA on the contiguous copy of a shared-prefix shape, or a row saying why not."""
    lay = cascade_layout(s)
    batch, keys = len(lay["kv"]), lay["kv"][0]
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    dtype = DTYPES[s["dtype"]]
    elem = torch.empty(0, dtype=dtype).element_size()
    row = {"impl": "torch_sdpa_cudnn", "shape": s["name"],
           "note": "contiguous copy, the shared prefix repeated in every request's K/V"}
    kv_bytes = 2.0 * batch * keys * hkv * d * elem
    if kv_bytes > CASCADE_SDPA_MAX_BYTES:
        row["error"] = (f"skipped: the contiguous copy's K/V would take {kv_bytes / 1e9:.1f} GB "
                        f"(more than {CASCADE_SDPA_MAX_BYTES / 1e9:.0f} GB)")
        return [row]
    decode = s["mode"] == "decode"
    if not decode:
        row["note"] += "; non-causal (SDPA aligns is_causal top-left)"
    row.update(cascade_amounts(s, lay, elem, causal=False))
    try:
        q = torch.empty(batch, hq, lay["qo"][0], d, dtype=dtype, device="cuda").uniform_(-3, 3)
        k = torch.empty(batch, hkv, keys, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        v = torch.empty(batch, hkv, keys, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        backend = BACKENDS["torch_sdpa_cudnn"]
        _, gqa = run_peer(backend, q, k, v)
        row["gqa"] = gqa
        timed(row, lambda: run_peer(backend, q, k, v), flush)
    except RuntimeError as e:  # includes running out of memory
        row["error"] = str(e).splitlines()[0][:300]
    return [row]


def flashinfer_cascade_rows(s, flush):
    """FlashInfer on one page pool of a shared-prefix shape: its two-level cascade, and its
    flat decode (CUDA cores, tensor cores) or flat fa2 prefill over the whole page tables.
    The cascade row records its largest difference from the flat peers' outputs."""
    try:
        import flashinfer  # noqa: F401  (made importable offline by the peers bundle)
    except Exception as e:  # not installed here: say so in the results, time nothing
        return [{"impl": "flashinfer", "shape": s["name"], "error": f"flashinfer not importable: {e}"[:300]}]
    hq, hkv, d, page = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"]), int(s["page_size"])
    dtype = DTYPES[s["dtype"]]
    decode = s["mode"] == "decode"
    causal = s["causal"] == "1" and not decode
    lay = cascade_layout(s)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    flat = [i32(x) for x in lay["flat"]]
    levels = [[i32(x) for x in level] for level in lay["levels"]] if lay["levels"] else None
    qo_indptr = i32([0] + list(itertools.accumulate(lay["qo"])))
    pool = torch.empty(lay["num_pages"], 2, page, hkv, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    q = torch.empty(sum(lay["qo"]), hq, d, dtype=dtype, device="cuda").uniform_(-3, 3)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    amounts = cascade_amounts(s, lay, q.element_size(), causal)

    def cascade():
        if levels is None:
            raise ValueError("no two-level cascade: the prefix has no whole page, or a request no key of its own")
        w = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
        w.plan([lv[0] for lv in levels], [lv[1] for lv in levels], [lv[2] for lv in levels],
               [lv[3] for lv in levels], hq, hkv, d, page, causal=causal, q_data_type=dtype, kv_data_type=dtype)
        return w

    def flat_decode(tensor_cores):
        def make():
            w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
            w.plan(flat[0], flat[1], flat[2], hq, hkv, d, page, q_data_type=dtype, kv_data_type=dtype)
            return w
        return make

    def flat_prefill():
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
        w.plan(qo_indptr, flat[0], flat[1], flat[2], hq, hkv, d, page, causal=causal,
               q_data_type=dtype, kv_data_type=dtype)
        return w

    variants = [("flashinfer_cascade", cascade,
                 "two levels: the %d shared whole pages for all %d queries, then each request's own pages"
                 % (lay["shared_keys"] // page, len(q)))]
    if decode:
        variants += [("flashinfer_cuda_core_decode", flat_decode(False), "flat page tables, use_tensor_cores=False"),
                     ("flashinfer_tc_decode", flat_decode(True), "flat page tables, use_tensor_cores=True")]
    else:
        variants += [("flashinfer_fa2", flat_prefill, "flat page tables, fa2, causal" if causal else
                      "flat page tables, fa2")]
    rows, outputs = [], {}
    for impl, make, what in variants:
        row = {"impl": impl, "shape": s["name"], "note": "paged, page %d NHD, %s" % (page, what), **amounts,
               "flashinfer_version": getattr(flashinfer, "__version__", "unknown")}
        if impl == "flashinfer_cascade":
            row["shared_flops"] = 4.0 * d * hq * len(q) * lay["shared_keys"]
        try:
            w = make()  # plan outside the graph; run inside it
            outputs[impl] = w.run(q, pool).float()
            timed(row, lambda: w.run(q, pool), flush)
        except Exception as e:  # a wrapper this FlashInfer build or GPU lacks: recorded, not fatal
            row["error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
        rows.append(row)
    flat_out = [impl for impl in outputs if impl != "flashinfer_cascade"]
    if "flashinfer_cascade" in outputs and flat_out:  # the same attention: a wrong page table shows here
        rows[0]["max_abs_diff_vs_flat"] = max((outputs["flashinfer_cascade"] - outputs[impl]).abs().max().item()
                                              for impl in flat_out)
        rows[0]["compared_with"] = flat_out
    del pool, q, workspace, outputs
    return rows


def flashinfer_child(args, shapes, flush, sets):
    """--flashinfer-child: FlashInfer's rows of the shapes file, one JSON line per shape
    (appended to --out as each shape finishes), from the shape after --start-after on."""
    names = [s["name"] for s in shapes if s["set"] in sets]
    start = names.index(args.start_after) + 1 if args.start_after else 0
    for s in shapes:
        if s["set"] not in sets or names.index(s["name"]) < start:
            continue
        if "shared_prefix" in s:
            rows = flashinfer_cascade_rows(s, flush)
        else:
            rows = flashinfer_rows(s, flush, args.flashinfer_backends.split(","))
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"shape": s["name"], "rows": rows}) + "\n")
        torch.cuda.empty_cache()
    return 0


def flashinfer_all(args, shapes, sets, on_shape):
    """FlashInfer's rows, timed in child processes, handed to on_shape(shape, rows) shape by
    shape as they come (so the caller can write its JSON after each: a run cut short keeps
    what it measured). A FlashInfer module that fails to load can end the process that
    loads it (a missing symbol kills it outright), so a child that dies costs the shape it
    was on, recorded as an error, and a new child carries on from the next shape; a child
    that runs past --flashinfer-timeout (its kernels compile on first use) is stopped, and
    the shapes it did not reach get an error row."""
    names = [s["name"] for s in shapes if s["set"] in sets]
    done, after = set(), None

    def take(lines, seen):
        """Hands on the shapes the child has finished since `seen` bytes of its file."""
        if not os.path.exists(lines):
            return seen
        with open(lines, "rb") as f:
            f.seek(seen)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        for line in complete.decode("utf-8").splitlines():
            entry = json.loads(line)
            done.add(entry["shape"])
            on_shape(entry["shape"], entry["rows"])
        return seen + len(complete)

    with tempfile.TemporaryDirectory() as tmp:
        lines, log_path = os.path.join(tmp, "flashinfer.jsonl"), os.path.join(tmp, "child.log")
        seen = 0
        while len(done) < len(names):
            cmd = [sys.executable, os.path.abspath(__file__), "--shapes", args.shapes, "--sets", args.sets,
                   "--flashinfer-backends", args.flashinfer_backends, "--out", lines, "--flashinfer-child"]
            if after:
                cmd += ["--start-after", after]
            deadline = time.monotonic() + args.flashinfer_timeout
            with open(log_path, "w", encoding="utf-8") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    seen = take(lines, seen)
                timed_out = proc.poll() is None
                if timed_out:  # e.g. a module compiling: the shapes left get an error row
                    proc.kill()
                proc.wait()
            seen = take(lines, seen)
            pending = [n for n in names if n not in done]
            if not pending:
                break
            if timed_out:
                for n in pending:
                    on_shape(n, [{"impl": "flashinfer", "shape": n, "error": "the FlashInfer process ran past "
                                  f"--flashinfer-timeout ({args.flashinfer_timeout:.0f} s)"}])
                break
            if proc.returncode == 0:
                break
            with open(log_path, encoding="utf-8", errors="replace") as log:
                tail = (log.read().strip().splitlines() or ["no output"])[-1]
            on_shape(pending[0], [{"impl": "flashinfer", "shape": pending[0],
                                   "error": f"the FlashInfer process died (rc {proc.returncode}): {tail}"[:300]}])
            done.add(pending[0])
            after = pending[0]


def flashinfer_version(out):
    """The FlashInfer version the results' rows ran with, or None."""
    return next((r["flashinfer_version"] for r in out["results"] if "flashinfer_version" in r), None)


def prefill_main(args, shapes, flush, out, sets, families):
    """PyTorch SDPA on every shape first, then FlashInfer in child processes; the JSON is
    written after each shape, so a run cut short keeps what it measured."""
    by_name = {s["name"]: s for s in shapes}
    for s in shapes:
        if s["set"] not in sets or "sdpa" not in families:
            continue
        if "shared_prefix" in s:
            rows = sdpa_cascade_rows(s, flush)
        else:
            rows = sdpa_prefill_rows(s, flush) if s["mode"] == "prefill" else sdpa_decode_rows(s, flush)
        print_rows(s, rows, out)
        torch.cuda.empty_cache()
        write_json(args.out, out)
    if "flashinfer" in families:
        flashinfer_into(args, shapes, sets, out, by_name)
    out["complete"] = True
    write_json(args.out, out)
    return 0


def flashinfer_into(args, shapes, sets, out, by_name):
    """FlashInfer's rows of every shape into `out`, the JSON written after each shape."""
    def on_shape(name, rows):
        print_rows(by_name[name], rows, out)
        out["flashinfer"] = flashinfer_version(out)
        write_json(args.out, out)
    if importlib.util.find_spec("flashinfer") is None:  # no child to start: every shape says why
        for s in shapes:
            if s["set"] in sets:
                on_shape(s["name"], [{"impl": "flashinfer", "shape": s["name"],
                                      "error": "flashinfer not importable: No module named 'flashinfer'"}])
        return
    flashinfer_all(args, shapes, sets, on_shape)
    out["flashinfer"] = flashinfer_version(out)


def decode_main(args, shapes, flush, out, sets, families):
    """A decode shapes file (bench/shapes.csv, bench/shapes_split_kv.csv): PyTorch SDPA once
    per shape_key (contiguous K/V: what it sees of a shape), then FlashInfer on every shape
    (page size, layout and page order are its own shapes), in child processes."""
    done = set()
    for s in shapes:
        if "sdpa" not in families or s["set"] not in sets or shape_key(s) in done:
            continue
        done.add(shape_key(s))
        sdpa_decode_file_rows(s, flush, out)
        torch.cuda.empty_cache()
        write_json(args.out, out)  # after every shape: a run cut short keeps what it measured
    if "flashinfer" in families:
        flashinfer_into(args, shapes, sets, out, {s["name"]: s for s in shapes})
    out["complete"] = True
    write_json(args.out, out)
    return 0


def sdpa_decode_file_rows(s, flush, out):
    """SDPA flash and cuDNN on the contiguous K/V of a decode-file shape, rows keyed by its
    shape_key (a later shape with the same key reuses them), appended to `out`."""
    batch, kv_len, hq, hkv, d, dtype_name = shape_key(s)
    dtype = DTYPES[dtype_name]
    q = torch.empty(batch, hq, 1, d, dtype=dtype, device="cuda").uniform_(-3, 3)
    k = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    v = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    nbytes = decode_bytes(batch, kv_len, hq, hkv, d, q.element_size())
    outputs = {}
    for impl, backend in BACKENDS.items():
        row = {"impl": impl, "key": list(shape_key(s)), "first_shape": s["name"], "bytes": nbytes}
        try:
            o, row["gqa"] = run_peer(backend, q, k, v)
            outputs[impl] = o.float()
            timed(row, lambda: run_peer(backend, q, k, v), flush)
        except RuntimeError as e:
            row["error"] = str(e).splitlines()[0][:300]
        out["results"].append(row)
        msg = f"{row['GB/s']:8.1f} GB/s" if "GB/s" in row else "unsupported: " + row["error"]
        print(f"{impl:18s} {s['name']:28s} {msg}", flush=True)
    if len(outputs) == 2:  # the two peers must agree, or one of them is not a peer
        a, b = outputs.values()
        diff = (a - b).abs().max().item()
        for row in out["results"][-2:]:
            row["max_abs_diff_flash_vs_cudnn"] = diff


def write_json(path, data):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def print_rows(s, rows, out):
    """Appends a shape's rows to the results and prints one line per row."""
    for row in rows:
        out["results"].append(row)
        if "TFLOP/s" in row:
            msg = f"{row['TFLOP/s']:8.1f} TFLOP/s"
        elif "GB/s" in row:
            msg = f"{row['GB/s']:8.1f} GB/s"
        else:
            msg = "unsupported: " + row.get("error", "?")
        if "error" in row and "median_us" in row:  # timed, then found wrong: not a peer
            msg += " -- MARKED: " + row["error"]
        print(f"{row['impl']:27s} {s['name']:30s} {msg}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bench/shapes.csv")
    parser.add_argument("--sets", default="target,sweep,extra")
    parser.add_argument("--out", required=True)
    parser.add_argument("--peers", default="sdpa,flashinfer",
                        help="which peers to time: sdpa (PyTorch SDPA flash and cuDNN), flashinfer, or both "
                        "(default); bench/merge_results.py takes one --peers file per run of this script")
    parser.add_argument("--flashinfer-backends", default="fa2,fa3",
                        help="prefill file: FlashInfer prefill backends to time (each compiles on first use); "
                        "the cascade file always times fa2 for its flat prefill")
    parser.add_argument("--flashinfer-timeout", type=float,
                        help="seconds a FlashInfer process may take (its modules compile on first use; "
                        "default 180, 300 for the cascade file, which loads three kinds of kernel per shape, "
                        "and for the decode files, which time two wrappers on every shape)")
    parser.add_argument("--flashinfer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-after", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = set(args.sets.split(","))
    families = set(args.peers.split(","))
    if not families <= {"sdpa", "flashinfer"}:
        parser.error(f"--peers: sdpa, flashinfer or both, not {args.peers!r}")

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * props.L2_cache_size, dtype=torch.uint8, device="cuda")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "peers": sorted(families),
           "results": []}
    shapes = load_shapes(args.shapes)
    if args.flashinfer_timeout is None:
        args.flashinfer_timeout = 180.0 if shapes and "mode" in shapes[0] and "shared_prefix" not in shapes[0] else 300.0
    if args.flashinfer_child:
        return flashinfer_child(args, shapes, flush, sets)
    if shapes and "mode" in shapes[0]:  # bench/shapes_prefill.csv or bench/shapes_cascade.csv
        return prefill_main(args, shapes, flush, out, sets, families)
    return decode_main(args, shapes, flush, out, sets, families)


if __name__ == "__main__":
    sys.exit(main())
