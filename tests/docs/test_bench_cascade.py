"""Stage 05's benchmark scripts on a synthetic run of bench/shapes_cascade.csv, CPU only:
bench/reports/merge_results.py computes the cascade's speed goals as time ratios of the rows (a
flat stage's or a peer's time over stage 05's, the fastest flat stage per decode shape,
and the worst of those), and bench/reports/cascade_report.py writes them into the chapter's
generated section, refuses a chapter without its markers, and tells a current section
from a stale one with --check."""
import csv
import json
import os
import shutil
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SHAPES = os.path.join(SOURCE, "bench", "shapes_cascade.csv")
BEGIN, END = "<!-- cascade results:begin -->", "<!-- cascade results:end -->"
if not os.path.exists(SHAPES):  # the shapes file comes with stage 05
    pytest.skip("no bench/shapes_cascade.csv in this tree", allow_module_level=True)


def shapes():
    with open(SHAPES, encoding="utf-8") as f:
        return list(csv.DictReader(line for line in f if line.strip() and not line.startswith("#")))


def median(name, us, **counters):
    return {"name": f"{name}/min_time:0.050/repeats:5/manual_time_median", "run_type": "aggregate",
            "run_name": f"{name}/min_time:0.050/repeats:5/manual_time", "aggregate_name": "median",
            "real_time": us, "cpu_time": us, "time_unit": "us", **counters}


def peer(impl, shape, us):
    return {"impl": impl, "shape": shape, "median_us": us, "repetition_means_us": [us] * 5, "mode": "cuda_graph",
            "note": "synthetic", "bytes": 1e9, "GB/s": 1e9 / (us * 1e-6) * 1e-9}


def synthetic_run(tmp_path, drop=()):
    """bench.json and peers.json of a made-up run: every decode shape has stage 05 at 100 µs
    and the flat stages at 120 / 99 / 101 µs (0.99x of the fastest), except p1024_b8_s1024
    (05 at 110 µs: 0.90x) and the target (05 at 300 µs, 03 at 4200 µs, FlashInfer's cascade
    at 600 µs); the append shape has 05 at 50 µs, 04 at 60 µs, FlashInfer's cascade at 45 µs.
    Rows named in `drop` are left out."""
    rows = [median("ceiling/copy_d2d", 700.0, **{"GB/s": 3000.0})]
    results = []
    for s in shapes():
        n = s["name"]
        if s["mode"] == "decode":
            times = {"05_cascade": 100.0, "02_paged": 120.0, "03_split_kv": 99.0, "04_tensor_core": 101.0}
            if n == "p1024_b8_s1024":
                times["05_cascade"] = 110.0
            if n == "p32768_b128_s128":
                times.update({"05_cascade": 300.0, "03_split_kv": 4200.0, "02_paged": 5000.0, "04_tensor_core": 4300.0})
            fi = {"flashinfer_cascade": 600.0 if n == "p32768_b128_s128" else 200.0,
                  "flashinfer_cuda_core_decode": 900.0, "flashinfer_tc_decode": 400.0}
        else:
            times = {"05_cascade": 50.0, "04_tensor_core": 60.0}
            fi = {"flashinfer_cascade": 45.0, "flashinfer_fa2": 70.0}
        times.update({"05_cascade[cascade]": times["05_cascade"], "05_cascade[flat]": 99.0})
        rows += [median(f"{st}/{n}", us, label="bf16 paged, cuda_graph; cascade, 2 levels", shared_flops=6.9e10)
                 for st, us in times.items() if f"{st}/{n}" not in drop]
        results += [peer(impl, n, us) for impl, us in fi.items() if f"peer_{impl}/{n}" not in drop]
    bench = {"context": {"date": "2026-01-01T00:00:00+00:00", "device": "GPU X", "copy_ceiling_GB/s": "3000",
                         "gemm_bf16_ceiling_TFLOP/s": "800", "shapes_file": "bench/shapes_cascade.csv"},
             "benchmarks": rows}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "peers.json").write_text(json.dumps({"device": "GPU X", "flashinfer": "0.0.test", "complete": True,
                                                     "results": results}))
    (tmp_path / "source-state.txt").write_text("commit=abc1234\ntree=clean\n")


def merge(tmp_path, out):
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "merge_results.py"),
                          "--bench", str(tmp_path / "bench.json"), "--peers", str(tmp_path / "peers.json"),
                          "--shapes", SHAPES, "--source-state", str(tmp_path / "source-state.txt"),
                          "--command", "scripts/gpu-run.sh --shapes bench/shapes_cascade.csv bench", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def goals(data):
    return {t["target"]: t for t in data["flashstep"]["targets"]}


def test_cascade_goals_are_time_ratios_of_this_run(tmp_path):
    synthetic_run(tmp_path)
    data = merge(tmp_path, tmp_path / "results.json")
    t = data["flashstep"]["targets"]
    assert [x["ratio"] for x in t[:4]] == [2.0, 14.0, 0.9, 1.2]  # FlashInfer, 03, FlashInfer (append), 04 (append)
    assert [x["met"] for x in t[:4]] == [True, False, False, True]
    assert t[0]["goal"] == ">= 2.00" and t[1]["goal"] == ">= 15.00"
    decode = [s["name"] for s in shapes() if s["mode"] == "decode"]
    worst, per_shape = t[4], t[5:]
    assert [x["numerator"] for x in per_shape] == [f"05_cascade/{n}" for n in decode]
    assert per_shape[1]["denominator"] == "03_split_kv/" + per_shape[1]["numerator"].split("/")[1]
    assert {x["ratio"] for x in per_shape} == {0.99, 0.9, 14.0}
    assert worst["ratio"] == 0.9 and worst["numerator"] == "05_cascade/p1024_b8_s1024" and worst["met"] is False
    assert "peer_flashinfer_cascade/p32768_b128_s128" in {b["run_name"] for b in data["benchmarks"]}
    assert data["flashstep"]["peers"]["flashinfer"] == "0.0.test"
    # the forced-path rows are kept, and are no goal's
    assert any(b["name"].startswith("05_cascade[flat]/") for b in data["benchmarks"])
    assert not any("[" in x.get("numerator", "") + str(x.get("denominator")) for x in t)


def test_a_missing_row_is_not_measured_and_the_fastest_flat_stage_that_ran_counts(tmp_path):
    synthetic_run(tmp_path, drop=("04_tensor_core/append_p8192_b16_q256", "03_split_kv/p4096_b8_s128",
                                  "05_cascade/p1024_b8_s1024"))
    t = goals(merge(tmp_path, tmp_path / "results.json"))
    append = next(x for k, x in t.items() if "04_tensor_core on the flat" in k)
    assert append["met"] is None and append["missing"] == ["04_tensor_core/append_p8192_b16_q256"]
    no_03 = next(x for x in t.values() if x.get("numerator") == "05_cascade/p4096_b8_s128" and "candidates" in x)
    assert no_03["denominator"] == "04_tensor_core/p4096_b8_s128" and no_03["ratio"] == 1.01
    worst = next(x for k, x in t.items() if "worst" in k)
    # every measured shape is above the goal, one is missing: not measured, and it is named
    assert worst["met"] is None and worst["missing"] == ["05_cascade/p1024_b8_s1024"]


def scratch_repo(tmp_path, chapter):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "stages" / "05_cascade").mkdir(parents=True)
    (repo / "docs" / "results").mkdir(parents=True)
    shutil.copy(SHAPES, repo / "bench" / "shapes_cascade.csv")
    (repo / "stages" / "05_cascade" / "README.md").write_text(chapter)
    return repo


def report(repo, results, *extra):
    return subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "cascade_report.py"), "--repo", str(repo),
                           "--results", str(results), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def test_report_writes_the_section_and_check_tells_stale_from_current(tmp_path):
    pytest.importorskip("matplotlib")
    synthetic_run(tmp_path)
    repo = scratch_repo(tmp_path, f"# Stage 05\n\nprose\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    results = repo / "docs" / "results" / "gpu_cascade.json"
    merge(tmp_path, results)
    assert report(repo, results, "--check").returncode == 1  # "old" is stale
    run = report(repo, results)
    assert run.returncode == 0, run.stdout
    text = (repo / "stages" / "05_cascade" / "README.md").read_text()
    assert text.startswith("# Stage 05\n\nprose\n\n" + BEGIN) and text.endswith(END + "\n\nafter\n")
    assert "commit `abc1234`" in text and "GPU X" in text and "flashinfer 0.0.test" in text
    # the chapter: one summary table; the per-shape tables are --full's
    assert text.count("| measured | value | goal | met |") == 1 and "| `p32768_b128_s128`" not in text
    assert "batch 128 decode (speedup) | 2.00 | >= 2.00 | yes |" in text
    assert "(missed: `p1024_b8_s1024` 0.90) | met on " in text
    full = report(repo, results, "--full")
    assert full.returncode == 0, full.stdout
    row = next(line for line in full.stdout.splitlines() if line.startswith("| `p32768_b128_s128`"))
    assert "| 300 |" in row and "| 4,200 |" in row and "| 600 |" in row and "2.00x" in row and "14.00x" in row
    assert "batch 128 decode (speedup): 2.00 (goal >= 2.00), met" in full.stdout
    assert "missed on `p1024_b8_s1024` (0.90)" in full.stdout
    assert (repo / "docs" / "results" / "05_cascade" / "cascade_sweep.png").stat().st_size > 0
    check = report(repo, results, "--check")
    assert check.returncode == 0 and "up to date" in check.stdout
    (repo / "stages" / "05_cascade" / "README.md").write_text(text.replace("| 2.00 |", "| 1.99 |"))
    assert report(repo, results, "--check").returncode == 1


def test_report_refuses_a_chapter_without_markers_and_another_shapes_file(tmp_path):
    synthetic_run(tmp_path)
    chapter = "# Stage 05\n\nno generated section yet\n"
    repo = scratch_repo(tmp_path, chapter)
    results = tmp_path / "results.json"
    data = merge(tmp_path, results)
    run = report(repo, results)
    assert run.returncode == 2 and BEGIN in run.stdout
    assert (repo / "stages" / "05_cascade" / "README.md").read_text() == chapter
    assert not (repo / "docs" / "results" / "05_cascade" / "cascade_sweep.png").exists()
    data["context"]["shapes_file"] = "bench/shapes_prefill.csv"
    results.write_text(json.dumps(data))
    assert report(repo, results).returncode == 2
