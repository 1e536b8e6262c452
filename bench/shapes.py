"""The benchmark's shapes, read one way by every script: bench/shapes*.csv are data (a
header line, then one shape a row; lines starting with "#" are comments, such as a
"# bench-args:" line for flashstep_bench), and what a shape's geometry implies (the
bytes a decode moves, the (query, key) pairs a prefill's mask lets through). Pure
Python: the peers (bench/peers/) and the reports (bench/reports/) both import it.
"""
import csv
import math


def load_shapes(path, sets=None):
    """The rows of a shapes file as dicts keyed by its header (comment lines skipped); with
    `sets`, only the rows whose "set" column is one of them."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip() and not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    return rows if sets is None else [s for s in rows if s["set"] in sets]


def shape_key(s):
    """What a contiguous-KV peer sees of a shape."""
    return (int(s["batch"]), int(s["kv_len"]), int(s["num_qo_heads"]), int(s["num_kv_heads"]),
            int(s["head_dim"]), s["dtype"])


def decode_bytes(batch, kv_len, hq, hkv, d, elem, kv_elem=None):
    """q, K, V, o and lse; K and V at `kv_elem` bytes an element (an FP8 cache: 1), else `elem`."""
    kv_elem = elem if kv_elem is None else kv_elem
    return elem * 2 * batch * hq * d + kv_elem * 2 * batch * kv_len * hkv * d + 4 * batch * hq


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



def mla_work(s, ckv_dim=512, kpe_dim=64, elem=2):
    """(flops, bytes) of an MLA shape (bench/shapes_mla.csv), absorbed form: each visible
    (query row, key) pair costs 2 (ckv + kpe) flops for the score and 2 ckv for the output;
    the bytes are the latent cache once, q (ckv + kpe wide), o (ckv wide) and lse."""
    batch, kv, qo, heads = int(s["batch"]), int(s["kv_len"]), int(s["qo_len"]), int(s["num_heads"])
    pairs = visible_pairs([(qo, kv)] * batch, s["causal"] == "1") * heads
    flops = 2 * pairs * (ckv_dim + kpe_dim) + 2 * pairs * ckv_dim
    rows = batch * qo * heads
    nbytes = elem * batch * kv * (ckv_dim + kpe_dim) + elem * rows * (2 * ckv_dim + kpe_dim) + 4 * rows
    return flops, nbytes
