#!/usr/bin/env python3
"""Host time of plan() and run() per call, flashstep.cuda beside FlashInfer in one process.

Engines call plan() every step and run() every layer, so both are part of every step's
host time. For each wrapper (decode, paged prefill, ragged prefill, cascade) and each
shape, plan() is timed with the index arrays on the host (int32 CPU tensors) and on the
device; run() is timed as `--run-calls` calls queued without synchronising on a batch
with nothing for the GPU to wait on (1 request x 256 keys). FlashInfer is timed the same
way where `import flashinfer` works, and the table gives flashstep / FlashInfer.

The calls an engine makes every step are timed the same way (wrapper "engine"): decode
and ragged-prefill run() into the caller's output (`run(q, pool, out=o)`, as vLLM's
FlashInfer backend calls it), and the samplers on one row of a 32000-token vocabulary
with a seed and offset given (`top_p_sampling_from_probs(probs, 0.9, seed=7, offset=0)`)
and with the default CUDA generator (no seed), and at batch 128 x 128256.

    PYTHONPATH=python FLASHSTEP_CAPI=build-gpu-python/libflashstep_capi.so \\
        python3 bench/peers/host_cost.py [--json OUT.json] [--wrappers decode,prefill,ragged,cascade]

Shapes (bf16, 32/8 heads, head_dim 128, page 16): batch x kv length 1 x 4096, 16 x 4096,
128 x 4096 and 128 x 32768; prefill appends 16 query rows per request (causal), the
cascade puts a shared 1024-key prefix before each request's own keys. plan(): the median
of --repeats calls after two warm-up calls, the GPU idle before each (a plan() that has
to wait reads device index arrays back, as FlashInfer's does). Goals: plan() within 1.5x
of FlashInfer's, run() no slower. The last lines are a PASS/FAIL table.
"""
import argparse
import json
import statistics
import sys
import time

import torch

SHAPES = [(1, 4096), (16, 4096), (128, 4096), (128, 32768)]
HQ, HKV, D, PAGE, DTYPE = 32, 8, 128, 16, torch.bfloat16
QO_PER_REQUEST, PREFIX = 16, 1024
PLAN_GOAL, RUN_GOAL = 1.5, 1.0


def flashinfer_or_none():
    try:
        import flashinfer
        return flashinfer
    except Exception as e:  # noqa: BLE001  (any import failure: no peer in this process)
        print(f"FlashInfer does not import here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): "
              "flashstep alone", file=sys.stderr)
        return None


def table(batch, kv_len, qo_len):
    """Host int32 index arrays of a batch: every request kv_len keys on consecutive pages."""
    pages = -(-kv_len // PAGE)
    return {"qo_indptr": torch.arange(0, (batch + 1) * qo_len, qo_len, dtype=torch.int32),
            "indptr": torch.arange(0, (batch + 1) * pages, pages, dtype=torch.int32),
            "indices": torch.randperm(batch * pages, dtype=torch.int32) if batch * pages else
            torch.zeros(0, dtype=torch.int32),
            "last": torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32),
            "kv_indptr": torch.arange(0, (batch + 1) * kv_len, kv_len, dtype=torch.int32)}


class Case:
    """One wrapper kind at one shape: the tensors, and plan()/run() of either library."""

    def __init__(self, kind, batch, kv_len):
        self.kind, self.batch, self.kv_len = kind, batch, kv_len
        self.qo_len = QO_PER_REQUEST if kind in ("prefill", "ragged") else 1
        self.t = table(batch, kv_len, self.qo_len)
        rows = batch * self.qo_len
        self.q = torch.randn(rows, HQ, D, dtype=DTYPE, device="cuda")
        if kind == "ragged":
            self.k = torch.empty(batch * kv_len, HKV, D, dtype=DTYPE, device="cuda").normal_()
            self.v = torch.empty_like(self.k).normal_()
        else:
            prefix_pages = PREFIX // PAGE if kind == "cascade" else 0
            num_pages = int(self.t["indptr"][-1]) + prefix_pages
            self.pool = torch.empty(num_pages, 2, PAGE, HKV, D, dtype=DTYPE, device="cuda").normal_()
            if kind == "cascade":
                shared = torch.arange(int(self.t["indptr"][-1]), num_pages, dtype=torch.int32)
                self.levels = [[torch.tensor([0, batch], dtype=torch.int32), self.t["qo_indptr"]],
                               [torch.tensor([0, prefix_pages], dtype=torch.int32), self.t["indptr"]],
                               [shared, self.t["indices"]],
                               [torch.tensor([PAGE], dtype=torch.int32), self.t["last"]]]

    def arrays(self, place):
        if place == "host":
            return self.t, getattr(self, "levels", None)
        t = {k: v.cuda() for k, v in self.t.items()}
        levels = [[a.cuda() for a in level] for level in self.levels] if self.kind == "cascade" else None
        return t, levels

    def wrapper(self, lib, ws):
        if self.kind == "decode":
            return lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        if self.kind == "prefill":
            return lib.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        if self.kind == "ragged":
            return lib.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
        return lib.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")

    def plan(self, w, t, levels, flashinfer):
        kv = {"kv_data_type": DTYPE} if flashinfer else {}
        if self.kind == "decode":
            w.plan(t["indptr"], t["indices"], t["last"], HQ, HKV, D, PAGE, q_data_type=DTYPE, **kv)
        elif self.kind == "prefill":
            w.plan(t["qo_indptr"], t["indptr"], t["indices"], t["last"], HQ, HKV, D, PAGE, causal=True,
                   q_data_type=DTYPE, **kv)
        elif self.kind == "ragged":
            w.plan(t["qo_indptr"], t["kv_indptr"], HQ, HKV, D, causal=True, q_data_type=DTYPE, **kv)
        else:
            w.plan(*levels, HQ, HKV, D, PAGE, q_data_type=DTYPE, **kv)

    def run(self, w):
        if self.kind == "ragged":
            return w.run(self.q, self.k, self.v)
        return w.run(self.q, self.pool)


def plan_seconds(case, lib, ws, place, repeats, flashinfer):
    w = case.wrapper(lib, ws)
    t, levels = case.arrays(place)
    times = []
    for i in range(repeats + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        case.plan(w, t, levels, flashinfer)
        elapsed = time.perf_counter() - start
        if i >= 2:
            times.append(elapsed)
    torch.cuda.synchronize()
    return statistics.median(times), getattr(w, "stage", None)


def run_seconds(case, lib, ws, calls, flashinfer):
    w = case.wrapper(lib, ws)
    t, levels = case.arrays("host")
    case.plan(w, t, levels, flashinfer)
    for _ in range(20):
        case.run(w)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        case.run(w)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls


# The samplers an engine calls, with FlashInfer's arguments; "joint" where an order is
# taken (FlashInfer's top_k_first order builds its slow-to-compile top-k module).
SAMPLERS = [
    ("top_p_sampling_from_probs", "probs", lambda lib, x, kw: _sampling(lib).top_p_sampling_from_probs(x, 0.9, **kw)),
    ("top_k_sampling_from_probs", "probs", lambda lib, x, kw: _sampling(lib).top_k_sampling_from_probs(x, 50, **kw)),
    ("sampling_from_logits", "logits", lambda lib, x, kw: _sampling(lib).sampling_from_logits(x, **kw)),
    ("top_k_top_p_sampling_from_logits", "logits", lambda lib, x, kw: _sampling(lib).top_k_top_p_sampling_from_logits(
        x, 50, 0.9, filter_apply_order="joint", **kw)),
]
SAMPLING_SHAPES = [(1, 32000), (128, 128256)]


def _sampling(lib):
    return getattr(lib, "sampling", lib)  # flashinfer.sampling; flashstep.cuda has the names itself


PROFILE_TOP = 0  # --profile N: cProfile's N costliest functions of each flashstep engine row


def profile(call, calls, what):
    """Where the host time of `call` goes: cProfile over `calls` calls, the costliest
    functions by their own time, printed under `what`."""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(PROFILE_TOP)
    print(f"# profile of {what}, {calls} calls:")
    print("\n".join("#   " + line for line in text.getvalue().splitlines() if line.strip()))


def host_seconds(call, calls, rounds=5):
    """Host time of one call: the median over `rounds` of `calls` calls queued after the
    GPU went idle (few enough that the launch queue never fills and blocks the host)."""
    for _ in range(20):
        call()
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return statistics.median(times)


def engine_rows(libs, ws, calls):
    """Rows of the calls an engine makes: run() into out=, and the samplers."""
    rows = []
    for kind in ("decode", "ragged"):
        case = Case(kind, 1, 256)
        row = {"wrapper": "engine", "call": f"{kind} run(out=o)", "index arrays": "host", "batch": 1, "kv_len": 256}
        for name, lib in libs:
            try:
                w = case.wrapper(lib, ws[name])
                t, levels = case.arrays("host")
                case.plan(w, t, levels, name == "FlashInfer")
                o = torch.empty_like(case.q)
                if kind == "ragged":
                    call = lambda: w.run(case.q, case.k, case.v, out=o)  # noqa: E731
                else:
                    call = lambda: w.run(case.q, case.pool, out=o)  # noqa: E731
                row[name] = host_seconds(call, calls)
                if PROFILE_TOP and name == "flashstep":
                    profile(call, calls, row["call"])
            except Exception as e:  # noqa: BLE001
                row[name + " error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append(row)
        print_row(row)
    for batch, vocab in SAMPLING_SHAPES:
        logits = torch.randn(batch, vocab, device="cuda") * 3
        inputs = {"logits": logits, "probs": torch.softmax(logits, -1)}
        for fn, what, call in SAMPLERS:
            for seeded in (True, False):
                row = {"wrapper": "engine", "call": f"{fn}({'seed=7, offset=0' if seeded else 'generator'})",
                       "index arrays": "host", "batch": batch, "kv_len": 0, "vocab": vocab}
                for name, lib in libs:
                    kw = {"seed": 7, "offset": 0} if seeded else {}
                    try:
                        x = inputs[what]
                        call(lib, x, kw)
                        row[name] = host_seconds(lambda: call(lib, x, kw), calls)
                        if PROFILE_TOP and name == "flashstep":
                            profile(lambda: call(lib, x, kw), calls, f"{row['call']} at {batch} x {vocab}")
                    except Exception as e:  # noqa: BLE001
                        row[name + " error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                rows.append(row)
                print_row(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wrappers", default="decode,prefill,ragged,cascade,engine",
                        help="any of decode, prefill, ragged, cascade (plan() and run()) and engine (the calls "
                             "an engine makes every step: run(out=), the samplers)")
    parser.add_argument("--engine-calls", type=int, default=200, help="calls queued per round of an engine row")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run-calls", type=int, default=2000)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print cProfile's N costliest functions of each flashstep engine row")
    args = parser.parse_args()
    global PROFILE_TOP
    PROFILE_TOP = args.profile
    sys.path.insert(0, "python")
    import flashstep.cuda as fsc
    usable, why = fsc.available()
    if not usable:
        print(f"host_cost.py: flashstep.cuda cannot run here: {why}", file=sys.stderr)
        return 2
    fi = flashinfer_or_none()
    libs = [("flashstep", fsc)] + ([("FlashInfer", fi)] if fi is not None else [])
    ws = {name: torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for name, _ in libs}
    print(f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
          + (f", FlashInfer {getattr(fi, '__version__', '?')}" if fi else ""))
    rows = []
    for kind in args.wrappers.split(","):
        if kind == "engine":
            rows += engine_rows(libs, ws, args.engine_calls)
            continue
        for batch, kv_len in [(1, 256)] + SHAPES:
            case = Case(kind, batch, kv_len)
            measures = [("run", None)] if (batch, kv_len) == (1, 256) else [("plan", "host"), ("plan", "device")]
            for what, place in measures:
                row = {"wrapper": kind, "call": what, "index arrays": place or "host", "batch": batch,
                       "kv_len": kv_len}
                for name, lib in libs:
                    try:
                        if what == "plan":
                            seconds, stage = plan_seconds(case, lib, ws[name], place, args.repeats,
                                                          name == "FlashInfer")
                            if stage:
                                row["stage"] = stage
                        else:
                            seconds = run_seconds(case, lib, ws[name], args.run_calls, name == "FlashInfer")
                        row[name] = seconds
                    except Exception as e:  # noqa: BLE001  (a refused case is reported, not fatal)
                        row[name + " error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                rows.append(row)
                print_row(row)
            del case
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return summary(rows, fi is not None)


HEADER = "| wrapper | call | index arrays | batch x kv | stage | flashstep | FlashInfer | ratio | goal |"


_header_printed = False


def print_row(row):
    global _header_printed
    if not _header_printed:
        print(HEADER)
        print("|:--|:--|:--|:--|:--|--:|--:|--:|:--|")
        _header_printed = True
    fs, fi = row.get("flashstep"), row.get("FlashInfer")
    unit, scale = ("ms", 1e3) if row["call"] == "plan" else ("us", 1e6)
    cell = lambda s, k: f"{s * scale:.3g} {unit}" if s is not None else row.get(k + " error", "-")  # noqa: E731
    ratio = fs / fi if fs is not None and fi else None
    goal = PLAN_GOAL if row["call"] == "plan" else RUN_GOAL
    row["ratio"], row["goal"] = ratio, goal
    verdict = "-" if ratio is None else ("PASS" if ratio <= goal else "FAIL") + f" (<= {goal:g}x)"
    call = row["call"] if "(" in row["call"] else row["call"] + "()"
    size = f"{row['batch']} x {row['vocab']} (vocab)" if row.get("vocab") else f"{row['batch']} x {row['kv_len']}"
    print(f"| {row['wrapper']} | {call} | {row['index arrays']} | {size} | "
          f"{row.get('stage', '')} | {cell(fs, 'flashstep')} | {cell(fi, 'FlashInfer')} | "
          f"{'-' if ratio is None else f'{ratio:.2f}x'} | {verdict} |")
    sys.stdout.flush()


def summary(rows, with_peer):
    """PASS/FAIL per wrapper and call; exit status 1 when a goal is missed."""
    print("\nhost cost against FlashInfer (PASS: plan() <= 1.5x, run() and the engine's calls <= 1.0x at every row)")
    failed = False
    for kind in dict.fromkeys(r["wrapper"] for r in rows):
        for call in dict.fromkeys(r["call"] for r in rows if r["wrapper"] == kind):
            mine = [r for r in rows if r["wrapper"] == kind and r["call"] == call]
            ratios = [r["ratio"] for r in mine if r["ratio"] is not None]
            if not with_peer or not ratios:
                print(f"  {kind:8s} {call}: no FlashInfer comparison")
                continue
            worst = max(ratios)
            ok = worst <= (PLAN_GOAL if call == "plan" else RUN_GOAL) and len(ratios) == len(mine)
            failed |= not ok
            print(f"  {kind:8s} {call}: worst ratio {worst:.2f}x over {len(ratios)} of {len(mine)} rows: "
                  f"{'PASS' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
