"""Decode peers (bench/shapes.csv, bench/shapes_split_kv.csv, bench/shapes_fp8.csv: no
"mode" column), timed as bench/peers/timing.py says. GB/s counts q, K, V, o and lse, the
same bytes the stages are credited with (decode_bytes).

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

clean_l2_rows: SDPA flash and cuDNN again on stage 03's tuning shapes, after a read-only L2
flush (l2_flush("read")): the counterpart of flashstep_split_kv_tune's tune03/auto_clean_l2
rows, written as Google Benchmark-shaped rows named peer_clean_l2_<impl>/<shape>.
"""
import itertools
import math
import random

import torch

from children import flashinfer_into
from shapes import decode_bytes, prefill_lengths, shape_key, visible_pairs
from timing import BACKENDS, DTYPES, KV_DTYPES, as_graph, run_peer, time_call, timed, write_json

PAGE_ORDER_SEED = 20240607  # the "shuffled" page order's permutation; printed with the rows
DECODE_CHECK_CHUNK_BYTES = 1e9  # K and V gathered at a time for the cuDNN reference
DECODE_CHECK_RTOL = 0.02  # a decode row whose output is further from cuDNN's than this
#                           fraction of cuDNN's largest |o| (about 5 bf16 steps) is marked


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



def main(args, shapes, flush, out, sets, families):
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



# Stage 03's tuning shapes, the ones flashstep_split_kv_tune times with a read-only flush.
TUNED = {"b1_kv1024_p16", "b1_kv16384_p16", "b1_kv131072_p16", "b4_kv4096_p16", "b16_kv4096_p16",
         "b64_kv4096_p16", "b128_kv8192_p16"}


def clean_l2_rows(shapes, flush):
    """SDPA flash and cuDNN on the TUNED shapes, `flush` a read-only one: Google Benchmark-
    shaped median rows (bench/reports/split_kv_report.py --clean reads them)."""
    rows = []
    for s in shapes:
        if s["name"] not in TUNED:
            continue
        batch, kv_len, hq, hkv, d, dtype_name = shape_key(s)
        dtype = DTYPES[dtype_name]
        q = torch.empty(batch, hq, 1, d, dtype=dtype, device="cuda").uniform_(-3, 3)
        k = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        v = torch.empty(batch, hkv, kv_len, d, dtype=dtype, device="cuda").uniform_(-1, 1)
        nbytes = decode_bytes(batch, kv_len, hq, hkv, d, q.element_size())
        for impl, backend in BACKENDS.items():
            name = f"peer_clean_l2_{impl}/{s['name']}"
            try:
                run_peer(backend, q, k, v)
                fn, mode = as_graph(lambda: run_peer(backend, q, k, v))
                ms, _ = time_call(fn, flush)
            except RuntimeError as e:
                print(f"{name:48s} unsupported: {str(e).splitlines()[0][:200]}", flush=True)
                continue
            gbps = nbytes / (ms * 1e-3) * 1e-9
            rows.append({"name": name + "_median", "run_name": name, "run_type": "aggregate",
                         "aggregate_name": "median", "real_time": ms * 1e3, "cpu_time": ms * 1e3,
                         "time_unit": "us", "GB/s": gbps, "bytes": nbytes, "label": f"{mode}, read-only L2 flush"})
            print(f"{name:48s} {ms * 1e3:9.1f} us {gbps:8.1f} GB/s", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows
