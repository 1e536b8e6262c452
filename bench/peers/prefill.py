"""Prefill/append and large-group decode peers (bench/shapes_prefill.csv: a "mode"
column; stage 04). Peers: SDPA flash and cuDNN on the contiguous equivalent (one call per
distinct request length; their is_causal aligns the mask top-left, so an append with
fewer queries than keys runs non-causal there and the row says so), and FlashInfer's
wrappers where `import flashinfer` works: the paged prefill wrapper with the fa2 and fa3
backends, and the tensor-core decode wrapper for decode rows (checked against cuDNN SDPA
like the decode files' rows), on a page-16 NHD pool laid out like the stage's
(decode.flashinfer_rows serves both files); and on prefill rows the ragged prefill wrapper
with both backends (rows flashinfer_<backend>_ragged, flashinfer_vo_rows), on contiguous
K/V as the _ragged stages read it. TFLOP/s counts 4 * head_dim flops per
(query, key) pair the peer's mask lets through, per query head, as flashstep_bench does;
decode rows count bytes (GB/s).
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel

from decode import PAGE_ORDER_SEED, paged_layout
from shapes import decode_bytes, prefill_lengths, visible_pairs
from timing import BACKENDS, DTYPES, run_peer, timed


def sdpa_prefill_rows(s, flush):
    """SDPA flash / cuDNN on the contiguous equivalent of a prefill shape."""
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    dv = int(s.get("head_dim_vo") or d)  # bench/shapes_mla_prefill.csv: v and o narrower than q and k
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
        v = torch.empty(n, hkv, kv, dv, dtype=dtype, device="cuda").uniform_(-1, 1)
        tensors.append((q, k, v, causal_req and qo == kv))
    top_left_only = causal_req and any(qo != kv for qo, kv in lengths)
    rows = []
    for impl, backend in BACKENDS.items():
        note = "contiguous equivalent, one call per distinct length"
        if top_left_only:
            note += "; non-causal where qo_len != kv_len (SDPA aligns is_causal top-left)"
        pairs = sum(visible_pairs([(t[0].shape[2], t[1].shape[2])] * t[0].shape[0], t[3]) for t in tensors)
        flops = 2.0 * (d + dv) * hq * pairs
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



def flashinfer_vo_rows(s, flush, backends=("fa2", "fa3"), storages=("ragged", "paged"), ragged_suffix=""):
    """FlashInfer's prefill wrappers with head_dim_vo (bench/shapes_mla_prefill.csv: q and k
    head_dim wide, v and o head_dim_vo; a shape without that column has v as wide as k): the
    ragged one on contiguous K/V as flashstep's ragged entry reads it (rows
    flashinfer_<backend><ragged_suffix>), and the paged one on a (k_cache, v_cache) pair of
    two pools, laid out as flashstep_bench lays out the shape's pages (rows
    flashinfer_<backend>_paged); `storages` picks which. TFLOP/s counts 2 (head_dim +
    head_dim_vo) flops per visible pair."""
    import itertools
    try:
        import flashinfer  # noqa: F401  (made importable offline by the peers bundle)
    except Exception as e:  # not installed here: say so in the results, time nothing
        return [{"impl": "flashinfer", "shape": s["name"], "error": f"flashinfer not importable: {e}"[:300]}]
    hq, hkv, d = int(s["num_qo_heads"]), int(s["num_kv_heads"]), int(s["head_dim"])
    dv = int(s.get("head_dim_vo") or d)
    dtype = DTYPES[s["dtype"]]
    lengths = prefill_lengths(s)
    causal = s["causal"] == "1"

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device="cuda")

    qo_indptr = i32([0] + list(itertools.accumulate(qo for qo, _ in lengths)))
    kv_indptr = i32([0] + list(itertools.accumulate(kv for _, kv in lengths)))
    q = torch.empty(int(qo_indptr[-1]), hq, d, dtype=dtype, device="cuda").uniform_(-3, 3)
    k = torch.empty(int(kv_indptr[-1]), hkv, d, dtype=dtype, device="cuda").uniform_(-1, 1)
    v = torch.empty(int(kv_indptr[-1]), hkv, dv, dtype=dtype, device="cuda").uniform_(-1, 1)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    page, layout = int(s["page_size"]), s.get("layout", "NHD")
    if "paged" in storages:  # the two pools and their page table, only for the paged rows
        indptr, indices, last, num_pages = paged_layout([kv for _, kv in lengths], page,
                                                        s.get("page_order", "sequential"), PAGE_ORDER_SEED)
        page_dims = (page, hkv) if layout == "NHD" else (hkv, page)
        pools = (torch.empty((num_pages,) + page_dims + (d,), dtype=dtype, device="cuda").uniform_(-1, 1),
                 torch.empty((num_pages,) + page_dims + (dv,), dtype=dtype, device="cuda").uniform_(-1, 1))
        paged = (i32(indptr), i32(indices), i32(last))
    version = getattr(flashinfer, "__version__", "unknown")
    flops = 2.0 * (d + dv) * hq * visible_pairs(lengths, causal)
    rows = []
    for backend in backends:
        for storage in storages:
            paged_row = storage == "paged"
            where = "paged, page %d %s" % (page, layout) if paged_row else "ragged"
            row = {"impl": "flashinfer_" + backend + ("_paged" if paged_row else ragged_suffix), "shape": s["name"],
                   "note": where + (", head_dim_vo %d" % dv if dv != d else ""), "flashinfer_version": version,
                   "flops": flops}
            try:
                if paged_row:
                    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, layout, backend=backend)
                    w.plan(qo_indptr, *paged, hq, hkv, d, page, head_dim_vo=dv, causal=causal, q_data_type=dtype,
                           kv_data_type=dtype)
                    args = (q, pools)
                else:
                    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
                    w.plan(qo_indptr, kv_indptr, hq, hkv, d, head_dim_vo=dv, causal=causal, q_data_type=dtype,
                           kv_data_type=dtype)
                    args = (q, k, v)
                w.run(*args)
                timed(row, lambda: w.run(*args), flush)
            except Exception as e:  # a backend this FlashInfer build or GPU lacks: recorded, not fatal
                row["error"] = (type(e).__name__ + ": " + str(e)).splitlines()[0][:300]
            rows.append(row)
    return rows
