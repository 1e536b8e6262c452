#!/usr/bin/env python3
"""Attention peers: PyTorch scaled_dot_product_attention (flash and cuDNN backends) and
FlashInfer's wrappers on a shapes file's shapes, timed like flashstep_bench times the stages.

    python3 bench/peers/attention.py --shapes bench/shapes.csv --out peers.json [--peers sdpa|flashinfer]
    python3 bench/peers/attention.py --shapes bench/shapes_split_kv.csv --clean-l2 --out clean.json

Run it in the same GPU run as flashstep_bench (the benchmark policy: ratios are only
meaningful within one run). How a peer is timed: bench/peers/timing.py. Which peers run
on a shape depends on the shapes file, recognised by its columns, one module per workload:
  decode.py    bench/shapes.csv, shapes_split_kv.csv, shapes_fp8.csv (no "mode" column)
  prefill.py   bench/shapes_prefill.csv (a "mode" column; stage 04), and
               bench/shapes_mla_prefill.csv (a "head_dim_vo" column too: FlashInfer's ragged and paged wrappers)
  cascade.py   bench/shapes_cascade.csv (a "shared_prefix" column too; stage 05)
SDPA runs first, then FlashInfer in child processes with a time limit
(--flashinfer-timeout; bench/peers/children.py says why). --peers times one family only,
for a machine that allows no single command that long; bench/reports/merge_results.py
joins several peers files of one run. --clean-l2 times SDPA on stage 03's tuning shapes
after a read-only L2 flush instead (decode.clean_l2_rows), as Google Benchmark-shaped JSON.
"""
import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # bench/shapes.py
import cascade  # noqa: E402  (bench/peers/, beside this script)
import decode  # noqa: E402
import prefill  # noqa: E402
from children import flashinfer_into  # noqa: E402
from shapes import load_shapes  # noqa: E402
from timing import l2_flush, print_rows, write_json  # noqa: E402


def flashinfer_child(args, shapes, flush, sets):
    """--flashinfer-child: FlashInfer's rows of the shapes file, one JSON line per shape
    (appended to --out as each shape finishes), from the shape after --start-after on."""
    names = [s["name"] for s in shapes if s["set"] in sets]
    start = names.index(args.start_after) + 1 if args.start_after else 0
    for s in shapes:
        if s["set"] not in sets or names.index(s["name"]) < start:
            continue
        if "shared_prefix" in s:
            rows = cascade.flashinfer_cascade_rows(s, flush)
        elif s.get("head_dim_vo") and s["head_dim_vo"] != s["head_dim"]:  # bench/shapes_mla_prefill.csv
            rows = prefill.flashinfer_vo_rows(s, flush, args.flashinfer_backends.split(","))
        else:
            rows = decode.flashinfer_rows(s, flush, args.flashinfer_backends.split(","))
            if s.get("mode") == "prefill":  # bench/shapes_prefill.csv: the ragged wrapper too (the _ragged stages)
                backends = args.flashinfer_backends.split(",")
                rows += prefill.flashinfer_vo_rows(s, flush, backends, ("ragged",), "_ragged")
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"shape": s["name"], "rows": rows}) + "\n")
        torch.cuda.empty_cache()
    return 0


def prefill_main(args, shapes, flush, out, sets, families):
    """A prefill or cascade file: PyTorch SDPA on every shape first, then FlashInfer in
    child processes; the JSON is written after each shape, so a run cut short keeps what
    it measured."""
    by_name = {s["name"]: s for s in shapes}
    for s in shapes:
        if s["set"] not in sets or "sdpa" not in families:
            continue
        if "shared_prefix" in s:
            rows = cascade.sdpa_cascade_rows(s, flush)
        else:
            rows = prefill.sdpa_prefill_rows(s, flush) if s["mode"] == "prefill" else prefill.sdpa_decode_rows(s, flush)
        print_rows(s, rows, out)
        torch.cuda.empty_cache()
        write_json(args.out, out)
    if "flashinfer" in families:
        flashinfer_into(args, shapes, sets, out, by_name)
    out["complete"] = True
    write_json(args.out, out)
    return 0


def clean_l2_main(args, shapes):
    rows = decode.clean_l2_rows(shapes, l2_flush("read"))
    out = {"context": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "flush": "read-only: sum over 2 x L2"},
           "benchmarks": rows}
    write_json(args.out, out)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="bench/shapes.csv")
    parser.add_argument("--sets", default="target,sweep,extra")
    parser.add_argument("--out", required=True)
    parser.add_argument("--peers", default="sdpa,flashinfer",
                        help="which peers to time: sdpa (PyTorch SDPA flash and cuDNN), flashinfer, or both "
                        "(default); bench/reports/merge_results.py takes one --peers file per run of this script")
    parser.add_argument("--flashinfer-backends", default="fa2,fa3",
                        help="prefill file: FlashInfer prefill backends to time (each compiles on first use); "
                        "the cascade file always times fa2 for its flat prefill")
    parser.add_argument("--flashinfer-timeout", type=float,
                        help="seconds a FlashInfer process may take (its modules compile on first use; "
                        "default 180, 300 for the cascade file, which loads three kinds of kernel per shape, "
                        "and for the decode files, which time two wrappers on every shape)")
    parser.add_argument("--clean-l2", action="store_true",
                        help="SDPA only, on stage 03's tuning shapes, after a read-only L2 flush")
    parser.add_argument("--flashinfer-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--start-after", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sets = set(args.sets.split(","))
    families = set(args.peers.split(","))
    if not families <= {"sdpa", "flashinfer"}:
        parser.error(f"--peers: sdpa, flashinfer or both, not {args.peers!r}")

    shapes = load_shapes(args.shapes)
    if args.clean_l2:
        return clean_l2_main(args, shapes)
    torch.manual_seed(0)
    flush = l2_flush("write")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "peers": sorted(families),
           "results": []}
    if args.flashinfer_timeout is None:
        prefill_file = shapes and "mode" in shapes[0] and "shared_prefix" not in shapes[0]
        args.flashinfer_timeout = 180.0 if prefill_file else 300.0
    if args.flashinfer_child:
        return flashinfer_child(args, shapes, flush, sets)
    if shapes and "mode" in shapes[0]:  # bench/shapes_prefill.csv or bench/shapes_cascade.csv
        return prefill_main(args, shapes, flush, out, sets, families)
    return decode.main(args, shapes, flush, out, sets, families)


if __name__ == "__main__":
    sys.exit(main())
