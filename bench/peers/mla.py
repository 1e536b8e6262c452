#!/usr/bin/env python3
"""MLA peers (bench/shapes_mla.csv): FlashInfer's BatchMLAPagedAttentionWrapper with its fa2
and fa3 backends, and PyTorch's absorbed form on contiguous latents, timed as
bench/peers/timing.py times every peer (CUDA graph, L2 written over before each call,
median of the repetitions' means).

    python3 bench/peers/mla.py --shapes bench/shapes_mla.csv --out mla_peers.json [--peers torch,fa2,fa3]

Rows are named as flashstep_bench names the stage's: peer_flashinfer_mla_fa2/<shape>,
peer_flashinfer_mla_fa3/<shape>, peer_torch_bmm/<shape>, each with median_us, TFLOP/s and
GB/s (shapes.mla_work: the same flops and bytes the stage is credited with).

The inputs: a paged latent cache of the shape's page size with a quarter of spare pages and
the pages of each request in a random order (seed printed in the file), q_nope (the absorbed
query, 512 wide) and q_pe (64) from a normal distribution, sm_scale 1/sqrt(192) (DeepSeek-V3's
query/key head dim before absorption). torch_bmm: scores = [q_nope, q_pe] . [c, k_pe]^T in
the dtype, the softmax in fp32, the output P . c in the dtype, on each request's latents
gathered once, outside the timed call. Each FlashInfer row records max_abs_diff_vs_fp32,
its largest difference from a float32 computation on the first two requests.
"""
import argparse
import datetime
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/shapes.py
from shapes import load_shapes, mla_work  # noqa: E402
from timing import l2_flush, print_rows, timed, write_json  # noqa: E402

CKV, KPE = 512, 64
SEED = 20261129


def make_inputs(s, gen):
    batch, kv, qo, heads = int(s["batch"]), int(s["kv_len"]), int(s["qo_len"]), int(s["num_heads"])
    page = int(s["page_size"])
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[s["dtype"]]
    pages_per = (kv + page - 1) // page
    num_pages = batch * pages_per + (batch * pages_per) // 4
    order = list(range(num_pages))
    random.Random(SEED).shuffle(order)
    kv_indices = torch.tensor(order[: batch * pages_per], dtype=torch.int32, device="cuda")
    kv_indptr = torch.arange(0, batch * pages_per + 1, pages_per, dtype=torch.int32, device="cuda")
    qo_indptr = torch.arange(0, batch * qo + 1, qo, dtype=torch.int32, device="cuda")
    kv_len = torch.full((batch,), kv, dtype=torch.int32, device="cuda")
    ckv = torch.randn(num_pages, page, CKV, generator=gen, device="cuda").to(dtype)
    kpe = torch.randn(num_pages, page, KPE, generator=gen, device="cuda").to(dtype)
    q_nope = torch.randn(batch * qo, heads, CKV, generator=gen, device="cuda").to(dtype)
    q_pe = torch.randn(batch * qo, heads, KPE, generator=gen, device="cuda").to(dtype)
    return dict(batch=batch, kv=kv, qo=qo, heads=heads, page=page, dtype=dtype, kv_indices=kv_indices,
                kv_indptr=kv_indptr, qo_indptr=qo_indptr, kv_len=kv_len, ckv=ckv, kpe=kpe, q_nope=q_nope,
                q_pe=q_pe, sm_scale=1.0 / math.sqrt(192.0), causal=s["causal"] == "1")


def gather(x, r):
    """Request r's latents and rotary keys, contiguous (kv_len, width)."""
    pages_per = (x["kv"] + x["page"] - 1) // x["page"]
    ids = x["kv_indices"][r * pages_per:(r + 1) * pages_per].long()
    return x["ckv"][ids].reshape(-1, CKV)[: x["kv"]], x["kpe"][ids].reshape(-1, KPE)[: x["kv"]]


def reference(x, requests):
    """float32 absorbed MLA of the first `requests` requests: (rows, heads, 512)."""
    outs = []
    for r in range(requests):
        c, kp = gather(x, r)
        q = x["q_nope"][r * x["qo"]:(r + 1) * x["qo"]].float()
        qp = x["q_pe"][r * x["qo"]:(r + 1) * x["qo"]].float()
        s = (torch.einsum("thd,kd->thk", q, c.float()) + torch.einsum("thd,kd->thk", qp, kp.float())) * x["sm_scale"]
        if x["causal"]:
            i = torch.arange(x["qo"], device="cuda")[:, None, None]
            j = torch.arange(x["kv"], device="cuda")[None, None, :]
            s = s.masked_fill(j > i + x["kv"] - x["qo"], float("-inf"))
        outs.append(torch.einsum("thk,kd->thd", torch.softmax(s, dim=-1), c.float()))
    return torch.cat(outs)


def timed_both(row, fn, flush):
    """timing.timed (which writes GB/s where a row has bytes), then TFLOP/s from the same median."""
    timed(row, fn, flush)
    row["TFLOP/s"] = row["flops"] / (row["median_us"] * 1e-6) * 1e-12


def flashinfer_row(s, x, backend, ref, flush, work):
    flops, nbytes = work
    row = {"name": f"peer_flashinfer_mla_{backend}/{s['name']}", "impl": f"flashinfer_mla_{backend}",
           "shape": s["name"], "flops": flops, "bytes": nbytes}
    try:
        import flashinfer
        row["flashinfer_version"] = getattr(flashinfer, "__version__", "?")
        ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
        w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
        w.plan(qo_indptr=x["qo_indptr"], kv_indptr=x["kv_indptr"], kv_indices=x["kv_indices"],
               kv_len_arr=x["kv_len"], num_heads=x["heads"], head_dim_ckv=CKV, head_dim_kpe=KPE,
               page_size=x["page"], causal=x["causal"], sm_scale=x["sm_scale"], q_data_type=x["dtype"],
               kv_data_type=x["dtype"])
        out = torch.empty_like(x["q_nope"])

        def call():
            w.run(q_nope=x["q_nope"], q_pe=x["q_pe"], ckv_cache=x["ckv"], kpe_cache=x["kpe"], out=out)

        call()
        torch.cuda.synchronize()
        n = ref.shape[0]
        row["max_abs_diff_vs_fp32"] = (out[:n].float() - ref).abs().max().item()
        timed_both(row, call, flush)
    except Exception as e:  # noqa: BLE001 (a peer that cannot run is a row that says why)
        row["error"] = f"{type(e).__name__}: {e}"[:400]
    return row


def torch_row(s, x, flush, work):
    flops, nbytes = work
    row = {"name": f"peer_torch_bmm/{s['name']}", "impl": "torch_bmm", "shape": s["name"], "flops": flops,
           "bytes": nbytes}
    b, qo, h = x["batch"], x["qo"], x["heads"]
    try:
        lat = torch.stack([torch.cat(gather(x, r), dim=-1) for r in range(b)])  # (b, kv, 576)
        c = lat[:, :, :CKV]
        q = torch.cat([x["q_nope"], x["q_pe"]], dim=-1).reshape(b, qo * h, CKV + KPE)
        mask = None
        if x["causal"]:
            i = torch.arange(qo, device="cuda").repeat_interleave(h)[:, None]
            j = torch.arange(x["kv"], device="cuda")[None, :]
            mask = j > i + x["kv"] - qo

        def call():
            sc = torch.bmm(q, lat.transpose(1, 2)).float() * x["sm_scale"]
            if mask is not None:
                sc = sc.masked_fill(mask, float("-inf"))
            return torch.bmm(torch.softmax(sc, dim=-1).to(x["dtype"]), c)

        call()
        timed_both(row, call, flush)
        del lat
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"[:400]
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="bench/shapes_mla.csv")
    ap.add_argument("--sets", default="target,extra")
    ap.add_argument("--peers", default="torch,fa2,fa3")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    peers = args.peers.split(",")
    shapes = load_shapes(args.shapes, args.sets.split(","))
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "date": datetime.datetime.now().isoformat(), "seed": SEED, "shapes": args.shapes, "complete": False,
           "results": []}
    try:
        import flashinfer
        out["flashinfer"] = getattr(flashinfer, "__version__", "?")
    except Exception:  # noqa: BLE001  (the rows say why FlashInfer did not run)
        out["flashinfer"] = None
    flush = l2_flush()
    gen = torch.Generator(device="cuda")
    gen.manual_seed(SEED)
    for s in shapes:
        x = make_inputs(s, gen)
        work = mla_work(s)
        ref = reference(x, min(2, x["batch"]))
        rows = []
        if "torch" in peers:
            rows.append(torch_row(s, x, flush, work))
        for backend in ("fa2", "fa3"):
            if backend in peers:
                rows.append(flashinfer_row(s, x, backend, ref, flush, work))
        print_rows(s, rows, out)
        write_json(args.out, out)
        del x
        torch.cuda.empty_cache()
    out["complete"] = True
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
