#!/usr/bin/env python3
"""Sampling peers: FlashInfer's sampling operators and PyTorch's sort-based, top-k and
multinomial samplers on the shapes of bench/shapes_sampling.csv, timed as
flashstep_sampling_bench times stage 06.

    python3 bench/peers/sampling.py --shapes bench/shapes_sampling.csv --out peers_sampling.json

Run it on the same GPU, right after flashstep_sampling_bench (ratios are only meaningful
within one run). Inputs are the softmax of standard-normal logits, one row per output,
fp32. Timing is bench/peers/timing.py's: the call captured once in a CUDA graph and replayed
(eager where capture fails, and the row says so), the L2 flushed before every call,
warm-up first, the median of 5 repetitions' mean times. FlashInfer is used where
`import flashinfer` works; its top_k_first order is left out (its fast path needs the
separate top-k module, whose JIT build takes over ten minutes).

PyTorch peers:
  torch_sort_top_p        sort, cumsum, mask the tail past top_p, renormalize, multinomial
  torch_sort_top_k_top_p  the same with ranks >= top_k masked too
  torch_topk_top_p        torch.topk(k), top-p within the k, renormalize, multinomial
  torch_topk              torch.topk(k), renormalize, multinomial
  torch_min_p             mask p < max * min_p, multinomial
  torch_multinomial       torch.multinomial on the row (softmax first for logits)
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/shapes.py
from shapes import load_shapes  # noqa: E402
from timing import as_graph, l2_flush, time_call, write_json  # noqa: E402  (bench/peers/)


def sort_based(probs, top_k, top_p):
    """The textbook sampler: sort, cumulative sum, mask, renormalize, draw."""
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(sorted_p, dim=-1)
    mask = (cumulative - sorted_p) > top_p  # keep the head up to and including the crossing token
    if top_k:
        mask |= torch.arange(probs.shape[-1], device=probs.device) >= top_k
    sorted_p = sorted_p.masked_fill(mask, 0.0)
    sorted_p = sorted_p / sorted_p.sum(dim=-1, keepdim=True)
    picked = torch.multinomial(sorted_p, 1)
    return torch.gather(order, -1, picked)


def topk_then_top_p(probs, k, top_p):
    values, idx = torch.topk(probs, k, dim=-1)
    if top_p < 1.0:
        cumulative = torch.cumsum(values, dim=-1)
        values = values.masked_fill((cumulative - values) > top_p * values.sum(dim=-1, keepdim=True), 0.0)
    values = values / values.sum(dim=-1, keepdim=True)
    return torch.gather(idx, -1, torch.multinomial(values, 1))


def min_p_torch(probs, min_p):
    kept = probs.masked_fill(probs < probs.max(dim=-1, keepdim=True).values * min_p, 0.0)
    return torch.multinomial(kept, 1)


def peers_for(shape, x, fi):
    """(name, call) pairs for one shape; x is probs, or logits for the logits operators."""
    op, k, p, m = shape["operator"], int(shape["top_k"]), float(shape["top_p"]), float(shape["min_p"])
    order = shape["order"]
    out = []
    if op == "top_p_sampling_from_probs":
        out.append(("torch_sort_top_p", lambda: sort_based(x, 0, p)))
        if fi: out.append(("flashinfer", lambda: fi.sampling.top_p_sampling_from_probs(x, p)))
    elif op == "top_k_top_p_sampling_from_probs":
        out.append(("torch_sort_top_k_top_p", lambda: sort_based(x, k, p)))
        out.append(("torch_topk_top_p", lambda: topk_then_top_p(x, k, p)))
        if fi and order == "joint":
            out.append(("flashinfer", lambda: fi.sampling.top_k_top_p_sampling_from_probs(
                x, k, p, filter_apply_order="joint")))
    elif op == "top_k_sampling_from_probs":
        out.append(("torch_topk", lambda: topk_then_top_p(x, k, 1.0)))
        if fi: out.append(("flashinfer", lambda: fi.sampling.top_k_sampling_from_probs(x, k)))
    elif op == "min_p_sampling_from_probs":
        out.append(("torch_min_p", lambda: min_p_torch(x, m)))
        if fi: out.append(("flashinfer", lambda: fi.sampling.min_p_sampling_from_probs(x, m)))
    elif op == "sampling_from_probs":
        out.append(("torch_multinomial", lambda: torch.multinomial(x, 1)))
        if fi: out.append(("flashinfer", lambda: fi.sampling.sampling_from_probs(x)))
    elif op == "sampling_from_logits":
        out.append(("torch_multinomial", lambda: torch.multinomial(torch.softmax(x, dim=-1), 1)))
        if fi: out.append(("flashinfer", lambda: fi.sampling.sampling_from_logits(x)))
    elif op == "top_k_renorm_probs" and fi:
        out.append(("flashinfer", lambda: fi.sampling.top_k_renorm_probs(x, k)))
    elif op == "top_p_renorm_probs" and fi:
        out.append(("flashinfer", lambda: fi.sampling.top_p_renorm_probs(x, p)))
    elif op == "top_k_mask_logits" and fi:
        out.append(("flashinfer", lambda: fi.sampling.top_k_mask_logits(x, k)))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bench/shapes_sampling.csv")
    parser.add_argument("--sets", default="target,extra")
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-flashinfer", action="store_true", help="PyTorch peers only")
    args = parser.parse_args()
    fi, fi_version = None, None
    if not args.no_flashinfer:
        try:
            import flashinfer
            import flashinfer.sampling  # noqa: F401
            fi, fi_version = flashinfer, getattr(flashinfer, "__version__", "?")
        except Exception as e:  # not installed here: PyTorch peers only, and say so
            print(f"flashinfer not importable ({type(e).__name__}: {e}); PyTorch peers only", flush=True)
    torch.manual_seed(0)
    flush = l2_flush("write")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
           "flashinfer": fi_version, "results": []}
    for s in load_shapes(args.shapes, set(args.sets.split(","))):
        batch, vocab = int(s["batch"]), int(s["vocab"])
        logits = torch.randn(batch, vocab, device="cuda")
        logit_input = s["operator"] in ("sampling_from_logits", "top_k_mask_logits")
        x = logits if logit_input else torch.softmax(logits, dim=-1)
        for impl, call in peers_for(s, x, fi):
            row = {"impl": impl, "name": s["name"], "operator": s["operator"], "order": s["order"],
                   "batch": batch, "vocab": vocab}
            try:
                call()
                torch.cuda.synchronize()
                fn, mode = as_graph(call)
                ms, means = time_call(fn, flush)
                row.update({"median_us": ms * 1e3, "repetition_means_us": [v * 1e3 for v in means], "mode": mode})
            except Exception as e:  # an operator this FlashInfer build lacks, or a failed JIT
                torch.cuda.synchronize()
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            out["results"].append(row)
            msg = f"{row['median_us']:9.1f} us ({row['mode']})" if "median_us" in row else row["error"]
            print(f"{impl:24s} {s['name']:40s} {msg}", flush=True)
        del logits, x
        torch.cuda.empty_cache()
        write_json(args.out, out)  # after every shape: a run cut short keeps what it measured
    out["complete"] = True
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
