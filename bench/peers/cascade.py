"""Shared-prefix (cascade) peers (bench/shapes_cascade.csv: a "shared_prefix" column;
stage 05).

Every request holds shared_prefix keys, then kv_len keys of its own; decode rows have one
query per request, prefill rows qo_len queries per request at the end of its keys (causal,
bottom-right aligned). One page pool per shape, laid out as flashstep lays it out: the
prefix's whole pages first (the same page ids in every request's table), then each
request's own pages (the prefix's partial last page, if any, and its own keys),
sequential ids. Peers:
  flashinfer_cascade           MultiLevelCascadeAttentionWrapper, two levels: every query
                               of the batch against the shared whole pages (one "request"
                               of batch x qo_len queries), then each request's own pages;
                               causal on the last level only (append rows)
  flashinfer_cuda_core_decode  BatchDecodeWithPagedKVCacheWrapper over the flat tables,
  flashinfer_tc_decode         use_tensor_cores False / True (decode rows)
  flashinfer_fa2               BatchPrefillWithPagedKVCacheWrapper fa2 over the flat
                               tables, causal (prefill rows)
  torch_sdpa_cudnn             SDPA's cuDNN backend on a contiguous copy (the prefix
                               repeated in every request's K/V), where that copy fits in
                               CASCADE_SDPA_MAX_BYTES; prefill rows run non-causal there
Decode rows count GB/s with the bytes a flat decode reads (q, every request's whole K/V,
o, lse), whatever the peer reads; prefill rows count TFLOP/s from the visible pairs.
FlashInfer's API: https://docs.flashinfer.ai/api/cascade.html,
https://docs.flashinfer.ai/api/decode.html, https://docs.flashinfer.ai/api/prefill.html
"""
import itertools

import torch

from shapes import decode_bytes, visible_pairs
from timing import BACKENDS, DTYPES, run_peer, timed

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

