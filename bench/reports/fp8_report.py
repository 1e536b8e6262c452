#!/usr/bin/env python3
"""The FP8 decode table of one run: flashstep_bench's rows and bench/peers/attention.py's FlashInfer
rows on bench/shapes_fp8.csv, measured in the same GPU run, and the FP8 speed goals.

    python3 bench/reports/fp8_report.py --bench bench.json --peers peers.json [--shapes bench/shapes_fp8.csv]

For every FP8 shape (a kv_dtype of e4m3 or e5m2): stage 02's and stage 03's median times,
the same stage's time on the bf16 pool of the same sizes (the row whose name ends in _bf16
instead of _<kv_dtype>[_scaled]), FlashInfer's two decode wrappers on the same FP8 pool,
and the floor: the bytes the row is credited with (q, K and V at one byte an element, o,
lse) over the read ceiling measured in the same run. Then the goals, each MET or MISS with
its ratio, judged on stage 03 (the decode stage that chooses between its split and stage
02's kernel):
  time <= 0.55 x the same stage's bf16 time      b128 x kv 8192 and b1 x kv 131072
  >= 1.15 x FlashInfer's faster FP8 wrapper       those two, b64 x kv 4096, b16 x kv 4096
  time <= 1.10 x the FP8 read floor               b128 x kv 8192 and b1 x kv 131072
  >= 1.0 x FlashInfer's faster FP8 wrapper        b1 x kv 16384, b16 x kv 1024 (launch-bound)
  with scales no slower than without             every shape and format
Stage 04 (tensor cores: the FP8 tiles widened in shared memory) has its own two columns,
its time on the FP8 pool and on the bf16 pool, and the same goals judged on it, marked 04.
A number the run did not measure is "-" and its goal "n/a", never filled in from elsewhere.
Nothing here is typed by hand: every number comes from the two files."""
import sys

from common import load, parser  # bench/reports/
from shapes import decode_bytes, load_shapes  # bench/shapes.py (common puts bench/ on the path)

STAGES = ("02_paged", "03_split_kv")
RATIO_GOALS = {  # sizes -> (time vs bf16, speedup vs FlashInfer's best, time vs floor)
    "b128_kv8192": (0.55, 1.15, 1.10),
    "b1_kv131072": (0.55, 1.15, 1.10),
    "b64_kv4096": (None, 1.15, None),
    "b16_kv4096": (None, 1.15, None),
    "b1_kv16384": (None, 1.0, None),
    "b16_kv1024": (None, 1.0, None),
}


def bench_medians(run):
    """{row name: median time in microseconds} of flashstep_bench's run (rows in error left out)."""
    return {r["name"]: r["median_us"] for r in run["rows"] if not r.get("error_occurred")}


def shape_bytes(s):
    """The bytes a decode of shape `s` is credited with (bench/shapes.py's decode_bytes): K and V
    at one byte an element on an FP8 pool."""
    elem = 4 if s["dtype"] == "f32" else 2
    kv_elem = 1 if s["kv_dtype"] in ("e4m3", "e5m2") else elem
    return decode_bytes(int(s["batch"]), int(s["kv_len"]), int(s["num_qo_heads"]), int(s["num_kv_heads"]),
                        int(s["head_dim"]), elem, kv_elem)


def fmt(x, spec="8.1f"):
    return format(x, spec) if x is not None else "-".rjust(int(spec.split(".")[0]))


def main():
    p = parser(__doc__, results=None, check=False, repo=False)
    p.add_argument("--bench", required=True)
    p.add_argument("--peers", action="append", default=[],
                   help="bench/peers/attention.py's JSON (again for another file)")
    p.add_argument("--shapes", default="bench/shapes_fp8.csv")
    a = p.parse_args()
    bench = load(a.bench)
    times = bench_medians(bench)
    read_gbps = bench["ceilings"].get("read_ceiling_GB/s", float("nan"))
    peers = {}
    for path in a.peers:
        try:
            run = load(path)
        except ValueError:  # a peers step cut short before its first shape: no file, or half of one
            continue
        for r in run["peers"]:
            if "error" not in r:
                peers[(r["impl"][len("peer_"):], r["shape"])] = r["median_us"]
    shapes = load_shapes(a.shapes)
    by_name = {s["name"]: s for s in shapes}

    print(f"device: {bench['device'] or '?'}, read ceiling {read_gbps:.0f} GB/s, commit {bench['commit'] or '?'}")
    head = (f"{'shape':30s} {'02 us':>8s} {'03 us':>8s} {'03 bf16':>8s} {'04 us':>8s} {'04 bf16':>8s} "
            f"{'FI cc':>8s} {'FI tc':>8s} "
            f"{'floor':>8s} {'x bf16':>7s} {'vs FI':>6s} {'% read':>7s}")
    print(head)
    goals = []
    for s in shapes:
        kv = s["kv_dtype"]
        if kv not in ("e4m3", "e5m2"):
            continue
        name = s["name"]
        sizes = name.split("_" + kv)[0]
        bf16_name = sizes + "_bf16"
        t02, t03 = times.get("02_paged/" + name), times.get("03_split_kv/" + name)
        t03_bf16 = times.get("03_split_kv/" + bf16_name) if bf16_name in by_name else None
        t04 = times.get("04_tensor_core/" + name)
        t04_bf16 = times.get("04_tensor_core/" + bf16_name) if bf16_name in by_name else None
        cc, tc = peers.get(("flashinfer_cuda_core_decode", name)), peers.get(("flashinfer_tc_decode", name))
        fi_best = min([t for t in (cc, tc) if t is not None], default=None)
        floor = shape_bytes(s) / (read_gbps * 1e9) * 1e6 if read_gbps == read_gbps else None
        x_bf16 = t03 / t03_bf16 if t03 and t03_bf16 else None
        vs_fi = fi_best / t03 if t03 and fi_best else None
        pct = 100 * floor / t03 if t03 and floor else None
        print(f"{name:30s} {fmt(t02)} {fmt(t03)} {fmt(t03_bf16)} {fmt(t04)} {fmt(t04_bf16)} {fmt(cc)} {fmt(tc)} {fmt(floor)} "
              f"{fmt(x_bf16, '7.3f')} {fmt(vs_fi, '6.2f')} {fmt(pct, '7.1f')}")
        g_bf16, g_fi, g_floor = RATIO_GOALS.get(sizes, (None, None, None))
        if g_bf16 is not None:
            goals.append((f"{name}: 03 time / bf16 time <= {g_bf16}", x_bf16, x_bf16 is not None and x_bf16 <= g_bf16))
        if g_fi is not None:
            goals.append((f"{name}: FlashInfer best / 03 time >= {g_fi}", vs_fi, vs_fi is not None and vs_fi >= g_fi))
        if g_floor is not None:
            r = t03 / floor if t03 and floor else None
            goals.append((f"{name}: 03 time / FP8 read floor <= {g_floor}", r, r is not None and r <= g_floor))
        if name.endswith("_scaled"):
            plain = times.get("03_split_kv/" + name[: -len("_scaled")])
            r = t03 / plain if t03 and plain else None
            goals.append((f"{name}: time with scales / without <= 1.0", r, r is not None and r <= 1.0))
        if t04 is not None:  # the same goals on stage 04's tensor-core FP8 decode
            r = t04 / t04_bf16 if t04_bf16 else None
            if g_bf16 is not None:
                goals.append((f"{name}: 04 time / 04 bf16 time <= {g_bf16}", r, r is not None and r <= g_bf16))
            r = fi_best / t04 if fi_best else None
            if g_fi is not None:
                goals.append((f"{name}: FlashInfer best / 04 time >= {g_fi}", r, r is not None and r >= g_fi))
            r = t04 / floor if floor else None
            if g_floor is not None:
                goals.append((f"{name}: 04 time / FP8 read floor <= {g_floor}", r, r is not None and r <= g_floor))
    print()
    for text, ratio, met in goals:
        verdict = "n/a " if ratio is None else ("MET " if met else "MISS")
        print(f"{verdict} {fmt(ratio, '7.3f')}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
