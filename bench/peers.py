#!/usr/bin/env python3
"""Peers: PyTorch scaled_dot_product_attention (flash and cuDNN backends) on the shapes
of bench/shapes.csv, timed like flashstep_bench times the stages.

    python3 bench/peers.py --shapes bench/shapes.csv --out peers.json

Run it in the same GPU run as flashstep_bench (the benchmark policy: ratios are
only meaningful within one run). Each peer reads a *contiguous* KV cache,
k and v of shape (batch, num_kv_heads, kv_len, head_dim), with q of shape
(batch, num_qo_heads, 1, head_dim) and GQA through enable_gqa=True; page size, page
layout and page order do not apply, so shapes that differ only in those share one
measurement. Timing: CUDA events around one call, the L2 flushed before each call,
warm-up first; 5 repetitions of at least 50 ms (or 10 calls) each, and the median of
the repetitions' mean times. The call is captured once in a CUDA graph and replayed,
so Python's dispatch time (tens of microseconds, comparable to a small decode) stays
out of the measurement, as the C++ stages' launch time does; where capture fails the
call runs eagerly and the row says so. GB/s counts q, K, V, o and lse, the same bytes
the stages are credited with.
"""
import argparse
import csv
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "torch_sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "torch_sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def load_shapes(path):
    with open(path, encoding="utf-8") as f:
        rows = [line for line in f if line.strip() and not line.startswith("#")]
    return list(csv.DictReader(rows))


def shape_key(s):
    """What a contiguous-KV peer sees of a shape."""
    return (int(s["batch"]), int(s["kv_len"]), int(s["num_qo_heads"]), int(s["num_kv_heads"]),
            int(s["head_dim"]), s["dtype"])


def decode_bytes(batch, kv_len, hq, hkv, d, elem):
    return elem * (2 * batch * hq * d + 2 * batch * kv_len * hkv * d) + 4 * batch * hq


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


def run_peer(backend, q, k, v):
    """One call; returns (output, how GQA was passed). Tries enable_gqa=True first."""
    with sdpa_kernel([backend]):
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True), "enable_gqa=True"
        except RuntimeError as first:
            if k.shape[1] == q.shape[1]:
                raise
            try:  # some backends take differing head counts directly
                return F.scaled_dot_product_attention(q, k, v), "heads differ, no enable_gqa"
            except RuntimeError:
                raise first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bench/shapes.csv")
    parser.add_argument("--sets", default="target,sweep,extra")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sets = set(args.sets.split(","))

    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * props.L2_cache_size, dtype=torch.uint8, device="cuda")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "results": []}
    done = set()
    for s in load_shapes(args.shapes):
        if s["set"] not in sets or shape_key(s) in done:
            continue
        done.add(shape_key(s))
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
                o, gqa = run_peer(backend, q, k, v)
                outputs[impl] = o.float()
                fn, mode = as_graph(lambda: run_peer(backend, q, k, v))
                ms, means = time_call(fn, flush)
                row.update({"median_us": ms * 1e3, "repetition_means_us": [m * 1e3 for m in means],
                            "GB/s": nbytes / (ms * 1e-3) * 1e-9, "gqa": gqa, "mode": mode})
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
        del q, k, v, outputs
        torch.cuda.empty_cache()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
