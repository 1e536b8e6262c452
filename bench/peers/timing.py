"""How every peer is timed, the way flashstep_bench times the stages: CUDA events around
one call, the L2 evicted before each call, warm-up first; 5 repetitions of at least 50 ms
(or 10 calls) each, and the median of the repetitions' mean times. The call is captured
once in a CUDA graph and replayed, so Python's dispatch time (tens of microseconds,
comparable to a small decode) stays out of the measurement, as the C++ stages' launch
time does; where capture fails the call runs eagerly and the row says so. Also PyTorch
SDPA's call, and the peers' JSON written after every shape.
"""
import json
import os
import statistics

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



def l2_flush(mode="write"):
    """A function of the call's index that evicts the L2 before a timed call. "write" (every
    peer's) fills a buffer of twice the L2 with a value that changes every call, so the write
    always changes memory; "read" sums such a buffer, which evicts the L2 with clean lines
    and leaves no dirty line behind (bench/stages/split_kv_flush.cu says why that matters
    for small decodes)."""
    size = 2 * torch.cuda.get_device_properties(0).L2_cache_size
    if mode == "write":
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        return lambda i: buf.fill_(i % 251)
    if mode == "read":
        buf = torch.rand(size // 4, dtype=torch.float32, device="cuda")
        return lambda i: buf.sum()
    raise ValueError(f"l2_flush: mode must be 'write' or 'read', not {mode!r}")


def time_call(fn, flush, reps=5, min_ms=50.0, min_calls=10):
    """(median of the repetitions' mean ms, the means) of `fn`, `flush(i)` before each call."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once(i):
        flush(i)
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


def timed(row, fn, flush):
    """Times `fn` (captured in a CUDA graph where it can be) into `row`, with its rate."""
    fn, mode = as_graph(fn)
    ms, means = time_call(fn, flush)
    row.update({"median_us": ms * 1e3, "repetition_means_us": [m * 1e3 for m in means], "mode": mode})
    if "bytes" in row:
        row["GB/s"] = row["bytes"] / (ms * 1e-3) * 1e-9
    else:
        row["TFLOP/s"] = row["flops"] / (ms * 1e-3) * 1e-12


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

