#!/usr/bin/env python3
"""The peers (PyTorch SDPA, flash and cuDNN backends) timed after a read-only L2 flush,
on stage 03's tuning shapes: the counterpart of flashstep_split_kv_tune's
tune03/auto_clean_l2 rows (see bench/split_kv_flush.cu for why).

    python3 bench/split_kv_clean_peers.py --shapes bench/shapes_split_kv.csv --out clean.json

Everything else is bench/peers.py's (contiguous KV, enable_gqa, one call captured in a
CUDA graph and replayed, 5 repetitions of at least 50 ms or 10 calls, median of the
repetitions' means); only the flush differs: a sum over twice the L2, which evicts it
with reads and leaves no dirty line behind. Writes Google Benchmark-shaped JSON (median
rows named peer_clean_l2_<impl>/<shape>).
"""
import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import BACKENDS, DTYPES, as_graph, decode_bytes, load_shapes, run_peer, shape_key  # noqa: E402

TUNED = {"b1_kv1024_p16", "b1_kv16384_p16", "b1_kv131072_p16", "b4_kv4096_p16", "b16_kv4096_p16",
         "b64_kv4096_p16", "b128_kv8192_p16"}


def time_call(fn, flush, reps=5, min_ms=50.0, min_calls=10):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        flush.sum()  # reads 2 x L2: evicts it with clean lines
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)

    for _ in range(3):
        once()
    means = []
    for _ in range(reps):
        times = []
        while len(times) < min_calls or sum(times) < min_ms:
            times.append(once())
        means.append(sum(times) / len(times))
    return statistics.median(means)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="bench/shapes_split_kv.csv")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    props = torch.cuda.get_device_properties(0)
    flush = torch.rand(2 * props.L2_cache_size // 4, dtype=torch.float32, device="cuda")
    rows = []
    for s in load_shapes(a.shapes):
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
                ms = time_call(fn, flush)
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
    out = {"context": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "flush": "read-only: sum over 2 x L2"},
           "benchmarks": rows}
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
