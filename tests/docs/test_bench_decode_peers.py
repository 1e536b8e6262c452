"""The decode benchmark's scripts on small hand-made runs, CPU only (no GPU, no torch):
bench/reports/merge_results.py joins SDPA's rows (keyed by sizes: one per shape of those sizes),
FlashInfer's decode rows (one per shape: page size, layout and page order are theirs),
and several peers files of one run, and adds % of the read ceiling where the run measured
it; bench/reports/split_kv_report.py computes stage 03's decode goals (ratios to cuDNN and to the
faster FlashInfer wrapper, their geomean and worst shape, the layout and page-order check)
and shows the new columns only for a run that has them, so that the committed chapter
regenerates unchanged (--check); bench/reports/decode_report.py does the same for the decode chapters.
Every expected number is worked out by hand in the comments."""
import json
import os
import re
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BENCH = os.path.join(SOURCE, "bench", "reports")
SPLIT_KV_SHAPES = os.path.join(SOURCE, "bench", "shapes_split_kv.csv")
sys.path.insert(0, BENCH)
split_kv_report = pytest.importorskip("split_kv_report")  # bench/reports/, beside merge_results.py
results = pytest.importorskip("results")  # bench/reports/results.py: the one reader

KEY_B128_KV8192 = [128, 8192, 32, 8, 128, "bf16"]  # SDPA's key of every b128 x kv 8192 shape


def median(name, us, **counters):
    return {"name": f"{name}/min_time:0.050/repeats:5/manual_time_median", "run_type": "aggregate",
            "run_name": f"{name}/min_time:0.050/repeats:5/manual_time", "aggregate_name": "median",
            "real_time": us, "cpu_time": us, "time_unit": "us", **counters}


def peer(impl, us, gbps, **where):
    return {"impl": impl, "median_us": us, "repetition_means_us": [us] * 5, "mode": "cuda_graph", "bytes": 1e9,
            "GB/s": gbps, **where}


def flashinfer(impl, shape, us, gbps, layout="NHD", **extra):
    tc = impl == "flashinfer_tc_decode"
    return peer(impl, us, gbps, shape=shape, note=f"paged, page 16 {layout}, use_tensor_cores={tc}",
                flashinfer_version="0.0.test", **extra)


def write_run(tmp_path, read_ceiling=True, peers_files=None):
    """bench.json (copy ceiling 3000 GB/s, read ceiling 3300 GB/s unless `read_ceiling` is
    False) and the peers files `peers_files` ({file name: rows}); returns their paths."""
    ctx = {"date": "2026-01-01T00:00:00+00:00", "device": "GPU X", "copy_ceiling_GB/s": "3000",
           "gemm_bf16_ceiling_TFLOP/s": "800", "shapes_file": "bench/shapes_split_kv.csv"}
    if read_ceiling:
        ctx["read_ceiling_GB/s"] = "3300"
    bench = {"context": ctx, "benchmarks": [median("ceiling/copy_d2d", 700.0, **{"GB/s": 3000.0}),
                                            median("03_split_kv/b128_kv8192_p16", 1400.0, **{"GB/s": 3069.0})]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "source-state.txt").write_text("commit=abc1234\ntree=clean\n")
    paths = []
    for name, rows in (peers_files or {}).items():
        (tmp_path / name).write_text(json.dumps({"device": "GPU X", "torch": "t", "cuda": "c", "cudnn": 1,
                                                 "flashinfer": "0.0.test", "complete": True, "results": rows}))
        paths.append(str(tmp_path / name))
    return paths


def merge(tmp_path, peers_paths):
    args = [sys.executable, os.path.join(BENCH, "merge_results.py"), "--bench", str(tmp_path / "bench.json"),
            "--shapes", SPLIT_KV_SHAPES, "--source-state", str(tmp_path / "source-state.txt"),
            "--out", str(tmp_path / "results.json")]
    for p in peers_paths:
        args += ["--peers", p]
    run = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    data = json.loads((tmp_path / "results.json").read_text())
    return data, {b["run_name"]: b for b in data["benchmarks"] if b["name"].startswith("peer_")}


def test_merge_keys_sdpa_by_sizes_flashinfer_by_shape_and_adds_the_read_ceiling(tmp_path):
    cudnn = peer("torch_sdpa_cudnn", 1400.0, 3053.0, key=KEY_B128_KV8192, first_shape="b128_kv8192_p16",
                 gqa="enable_gqa=True")
    wrong = flashinfer("flashinfer_cuda_core_decode", "b128_kv8192_p16_hnd", 900.0, 4000.0, "HND",
                       max_abs_diff_vs_cudnn=0.5, error="output differs from cuDNN SDPA's on the same K/V")
    first = [cudnn, flashinfer("flashinfer_tc_decode", "b128_kv8192_p16", 4000.0, 1000.0),
             flashinfer("flashinfer_tc_decode", "b128_kv8192_p16_hnd", 2600.0, 1650.0, "HND",
                        max_abs_diff_vs_cudnn=0.001), wrong,
             {"impl": "flashinfer", "shape": "b1_kv1024_p16", "error": "flashinfer not importable: no"}]
    second = [flashinfer("flashinfer_tc_decode", "b128_kv8192_p16", 2000.0, 2000.0)]  # timed again
    data, peers = merge(tmp_path, write_run(tmp_path, peers_files={"peers.json": first,
                                                                    "peers_flashinfer.json": second}))
    # SDPA's row repeats on the four b128 x kv 8192 shapes of the file (page size, layout,
    # page order are not its concern)
    assert {n for n in peers if n.startswith("peer_torch_sdpa_cudnn/")} == {
        "peer_torch_sdpa_cudnn/b128_kv8192_p16", "peer_torch_sdpa_cudnn/b128_kv8192_p16_hnd",
        "peer_torch_sdpa_cudnn/b128_kv8192_p16_shuffled", "peer_torch_sdpa_cudnn/b128_kv8192_p1_shuffled"}
    assert peers["peer_torch_sdpa_cudnn/b128_kv8192_p16_hnd"]["real_time"] == 1400.0
    # FlashInfer's rows name their shape: 1650 GB/s is 55% of the copy ceiling (3000), 50% of
    # the read ceiling (3300)
    hnd = peers["peer_flashinfer_tc_decode/b128_kv8192_p16_hnd"]
    assert hnd["pct_of_ceiling"] == pytest.approx(55.0) and hnd["pct_of_read_ceiling"] == pytest.approx(50.0)
    assert hnd["label"] == "bf16 paged, page 16 HND, use_tensor_cores=True, cuda_graph"
    assert hnd["max_abs_diff_vs_cudnn"] == 0.001
    assert not any(n.startswith("peer_flashinfer_tc_decode/b128_kv8192_p16_") and n != hnd["run_name"] for n in peers)
    # the later peers file's row replaces the earlier one's
    assert peers["peer_flashinfer_tc_decode/b128_kv8192_p16"]["GB/s"] == 2000.0
    assert sum(b["run_name"] == "peer_flashinfer_tc_decode/b128_kv8192_p16" for b in data["benchmarks"]) == 1
    # a row marked wrong is no peer: it is listed with the errors, not merged
    assert "peer_flashinfer_cuda_core_decode/b128_kv8192_p16_hnd" not in peers
    assert wrong in data["flashstep"]["peer_errors"] and len(data["flashstep"]["peer_errors"]) == 2
    assert data["flashstep"]["peers_complete"] is True
    assert data["flashstep"]["peers"]["flashinfer"] == "0.0.test"


def test_merge_of_a_run_without_the_read_ceiling_has_no_such_counter(tmp_path):
    rows = [flashinfer("flashinfer_tc_decode", "b128_kv8192_p16", 2000.0, 1500.0)]
    _, peers = merge(tmp_path, write_run(tmp_path, read_ceiling=False, peers_files={"peers.json": rows}))
    row = peers["peer_flashinfer_tc_decode/b128_kv8192_p16"]
    assert row["pct_of_ceiling"] == pytest.approx(50.0) and "pct_of_read_ceiling" not in row


def test_merge_of_a_peers_file_cut_short_is_incomplete(tmp_path):
    paths = write_run(tmp_path, peers_files={"peers.json": []})
    data, _ = merge(tmp_path, paths + [str(tmp_path / "never_written.json")])
    assert data["flashstep"]["peers_complete"] is False


def rows_of(*rows):
    return {r["run_name"].split("/min_time")[0]: r for r in rows}


def goal_rows():
    """Stage 03 on two goal shapes and the layout check, with its peers:
      b1_kv1024_p16    03 300 GB/s, 02 200, cuDNN 400, FlashInfer 350 (CUDA cores) / 420 (tensor cores)
      b128_kv65536_p16 03 3100 GB/s, cuDNN 3100, FlashInfer 3000 / 2900
      b128_kv8192_p16 at 1000 us; _hnd 1010 us (+1.0%), _p16_shuffled 1050 us (+5.0%), _p1_shuffled absent."""
    g = "GB/s"
    return rows_of(median("03_split_kv/b1_kv1024_p16", 14.0, **{g: 300.0}),
                   median("02_paged/b1_kv1024_p16", 21.0, **{g: 200.0}),
                   median("peer_torch_sdpa_cudnn/b1_kv1024_p16", 10.5, **{g: 400.0}),
                   median("peer_torch_sdpa_flash/b1_kv1024_p16", 13.5, **{g: 310.0}),
                   median("peer_flashinfer_cuda_core_decode/b1_kv1024_p16", 12.0, **{g: 350.0}),
                   median("peer_flashinfer_tc_decode/b1_kv1024_p16", 10.0, **{g: 420.0}),
                   median("03_split_kv/b128_kv65536_p16", 11000.0, **{g: 3100.0, "pct_of_read_ceiling": 93.9}),
                   median("peer_torch_sdpa_cudnn/b128_kv65536_p16", 11000.0, **{g: 3100.0}),
                   median("peer_flashinfer_cuda_core_decode/b128_kv65536_p16", 11400.0, **{g: 3000.0}),
                   median("peer_flashinfer_tc_decode/b128_kv65536_p16", 11800.0, **{g: 2900.0}),
                   median("03_split_kv/b128_kv8192_p16", 1000.0, **{g: 4000.0}),
                   median("03_split_kv/b128_kv8192_p16_hnd", 1010.0, **{g: 3960.0}),
                   median("03_split_kv/b128_kv8192_p16_shuffled", 1050.0, **{g: 3810.0}))


def as_run(data):
    """A results file's JSON (without rows) as the report scripts see it, through the one reader."""
    return results.from_gbench("results.json", dict(data, benchmarks=[]))


def new_run():
    return as_run({"context": {"copy_ceiling_GB/s": "3000", "read_ceiling_GB/s": "3300", "device": "GPU X",
                               "commit": "abc1234", "date": "2026-01-01"},
                   "flashstep": {"peers": {"flashinfer": "0.0.test"}}})


def test_decode_goals_are_ratios_to_cudnn_and_the_faster_flashinfer_wrapper():
    goals = split_kv_report.decode_goals(new_run(), goal_rows())
    assert len(goals["shapes"]) == 21 and goals["shapes"][-1]["shape"] == "b1_kv131072_p16"
    b1 = goals["shapes"][0]
    assert b1["shape"] == "b1_kv1024_p16" and b1["flashinfer"] == "peer_flashinfer_tc_decode/b1_kv1024_p16"
    assert b1["vs_02"] == pytest.approx(1.5) and b1["vs_cudnn"] == pytest.approx(0.75)
    assert b1["vs_flashinfer"] == pytest.approx(300 / 420)           # 0.714..., the faster wrapper
    assert b1["pct_of_read_ceiling"] == pytest.approx(300 / 3300 * 100)  # no counter: from the ceiling
    big = next(x for x in goals["shapes"] if x["shape"] == "b128_kv65536_p16")
    assert big["flashinfer"].startswith("peer_flashinfer_cuda_core_decode/")
    assert big["vs_flashinfer"] == pytest.approx(3100 / 3000) and big["pct_of_read_ceiling"] == 93.9  # its counter
    cudnn = goals["vs_cudnn"]
    # geomean of 0.75 and 1.0 = sqrt(0.75) = 0.8660; the worst is below 1: missed, though 19 shapes are missing
    assert cudnn["geomean"] == pytest.approx(0.866, abs=1e-4) and cudnn["worst"] == 0.75
    assert cudnn["worst_shape"] == "b1_kv1024_p16" and cudnn["met"] is False
    assert cudnn["measured"] == 2 and cudnn["of"] == 21 and len(cudnn["missing"]) == 19
    fi = goals["vs_flashinfer"]
    assert fi["geomean"] == pytest.approx((300 / 420 * 3100 / 3000) ** 0.5, abs=1e-4) and fi["met"] is False
    layout = {x["shape"]: x for x in goals["layout"]}
    assert layout["b128_kv8192_p16_hnd"]["time_pct_vs_base"] == pytest.approx(1.0)  # 1010 / 1000
    assert layout["b128_kv8192_p16_hnd"]["met"] is True
    assert layout["b128_kv8192_p16_shuffled"]["time_pct_vs_base"] == pytest.approx(5.0)
    assert layout["b128_kv8192_p16_shuffled"]["met"] is False  # more than 3% slower
    assert layout["b128_kv8192_p1_shuffled"]["met"] is None


def test_every_shape_at_or_above_its_peer_meets_the_goal():
    rows = {}
    for shape in split_kv_report.GOAL_SHAPES:  # 03 at 1000 GB/s, cuDNN at 1000 or 800: every ratio >= 1
        rows.update(rows_of(median(f"03_split_kv/{shape}", 10.0, **{"GB/s": 1000.0}),
                            median(f"peer_torch_sdpa_cudnn/{shape}", 10.0, **{"GB/s": 800.0 if "b1_" in shape
                                                                                else 1000.0})))
    g = split_kv_report.decode_goals(new_run(), rows)["vs_cudnn"]
    assert g["met"] is True and g["worst"] == 1.0 and g["missing"] == []
    # 5 of the 21 shapes are batch 1 (four of the sweep, and kv 131072): 1.25^(5/21)
    assert g["geomean"] == pytest.approx(1.25 ** (5 / 21), abs=1e-4)


def table_row(text, first_cells):
    return next(line for line in text.splitlines() if line.startswith(first_cells))


def test_the_sweep_gains_columns_only_where_the_run_has_them():
    rows = goal_rows()
    verdicts = split_kv_report.targets(rows)
    new = split_kv_report.markdown(new_run(), rows, verdicts, "results.json")
    # 03 300 GB/s: 10.0% of the copy ceiling (3000), 9.1% of the read ceiling (3300);
    # 300 / 200 = 1.50, 300 / 400 = 0.75, 300 / 420 = 0.71
    assert ("| batch | kv_len | 02_paged | 03_split_kv | cuDNN | flash | FlashInfer | 03 % of copy | 03 % of read | "
            "03 / 02 | 03 / cuDNN | 03 / FlashInfer |") in new
    assert table_row(new, "| 1 | 1024 |") == "| 1 | 1024 | 200 | 300 | 400 | 310 | 420 | 10.0 | 9.1 | 1.50 | 0.75 | 0.71 |"
    assert table_row(new, "| 1 | 4096 |") == "| 1 | 4096 |  |  |  |  | – |  | – |  |  | – |"
    assert "read 3,300 GB/s" in new and "FlashInfer 0.0.test" in new
    assert table_row(new, "| 03 / cuDNN SDPA, worst shape |") == \
        "| 03 / cuDNN SDPA, worst shape | 0.750 | `b1_kv1024_p16` | >= 1.00 | **no** |"
    assert table_row(new, "| 03 / cuDNN SDPA, geomean") == "| 03 / cuDNN SDPA, geomean over 2 of 21 shapes | 0.866 | | | |"
    assert table_row(new, "| HND |") == "| HND | `b128_kv8192_p16_hnd` | +1.0% | <= +2.0% | yes |"
    assert table_row(new, "| shuffled pages of one token |").endswith("| – | <= +2.0% | not measured |")
    # 1010 us for 3960 GB/s: 120.0% of the read ceiling; no FlashInfer row for this shape
    assert table_row(new, "| `b128_kv8192_p16_hnd` |") == "| `b128_kv8192_p16_hnd` |  | 3,960 | 1,010.0 | 120.0 | – | – |"
    # a run made before the read ceiling and FlashInfer's decode rows: the table as it was
    old_rows = {k: v for k, v in rows.items() if "flashinfer" not in k}
    old = split_kv_report.markdown(as_run({"context": {"copy_ceiling_GB/s": "3000"}}), old_rows, verdicts, "results.json")
    assert "| batch | kv_len | 02_paged | 03_split_kv | cuDNN | flash | 03 % of copy | 03 / 02 | 03 / cuDNN |" in old
    assert table_row(old, "| 1 | 1024 |") == "| 1 | 1024 | 200 | 300 | 400 | 310 | 10.0 | 1.50 | 0.75 |"
    assert "Decode goals" not in old and "Copy ceiling measured in the same run: 3,000 GB/s. bf16" in old
    assert table_row(old, "| shape |") == "| shape | 02_paged GB/s | 03_split_kv GB/s | 03 time (us) |"


def test_the_stage_03_chapter_regenerates_from_the_files_it_cites():
    chapter = os.path.join(SOURCE, "stages", "03_split_kv", "README.md")
    if not os.path.exists(chapter):
        pytest.skip("no stage 03 chapter in this tree")
    with open(chapter, encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"<!-- split_kv results:begin -->.*?<!-- split_kv results:end -->", text, re.S)
    if not section:
        pytest.skip("the stage 03 chapter has no generated section")
    section = section.group(0)
    args = [sys.executable, os.path.join(BENCH, "split_kv_report.py"),
            re.search(r"from `(docs/results/[^`]+\.json)`", section).group(1)]
    tune = re.search(r"\*\*Knobs\*\* \(`bench/stages/split_kv_tune.cpp`, `([^`]+)`", section)
    clean = re.search(r"peers from `([^`]+)`", section)
    image = re.search(r"\]\(([\w./-]+\.png)\)", section)
    if tune:
        args += ["--tune", tune.group(1)]
    if clean:
        args += ["--clean", clean.group(1)]
    if image:
        args += ["--plot", os.path.join("stages", "03_split_kv", image.group(1))]
    args += ["--readme", os.path.join("stages", "03_split_kv", "README.md"), "--check"]
    run = subprocess.run(args, cwd=SOURCE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0 and run.stdout.strip().endswith("up to date"), (
        "stages/03_split_kv/README.md's generated section differs from what bench/reports/split_kv_report.py writes "
        "from the files it cites:\n" + run.stdout)


def scratch_decode_repo(tmp_path, read_ceiling, flashinfer_rows):
    """A repository holding bench/shapes.csv, a stage 02 chapter with its markers, and one
    results JSON of bench/shapes.csv: 02_paged on b128_kv8192_p16 at 1400 us, 3069 GB/s (102.3%
    of the copy ceiling, 93.0% of the read ceiling), cuDNN at 1400 us, 3053 GB/s, FlashInfer's
    two wrappers at 2980 and 3100 GB/s where `flashinfer_rows`."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "stages" / "02_paged").mkdir(parents=True)
    (repo / "docs" / "results").mkdir(parents=True)
    with open(os.path.join(SOURCE, "bench", "shapes.csv"), encoding="utf-8") as f:
        (repo / "bench" / "shapes.csv").write_text(f.read())
    (repo / "stages" / "02_paged" / "README.md").write_text("# 02\n\n<!-- results:begin -->\n<!-- results:end -->\n")
    ctx = {"date": "2026-01-01T00:00:00+00:00", "device": "GPU X", "commit": "abc1234",
           "copy_ceiling_GB/s": "3000", "gemm_bf16_ceiling_TFLOP/s": "800"}
    stage = {"GB/s": 3069.0, "pct_of_ceiling": 102.3, "label": "bf16 paged, cuda_graph"}
    if read_ceiling:
        ctx["read_ceiling_GB/s"] = "3300"
        stage["pct_of_read_ceiling"] = 93.0
    rows = [median("02_paged/b128_kv8192_p16", 1400.0, **stage),
            median("peer_torch_sdpa_cudnn/b128_kv8192_p16", 1400.0, **{"GB/s": 3053.0})]
    if flashinfer_rows:
        rows += [median("peer_flashinfer_cuda_core_decode/b128_kv8192_p16", 1442.0, **{"GB/s": 2980.0}),
                 median("peer_flashinfer_tc_decode/b128_kv8192_p16", 1386.0, **{"GB/s": 3100.0})]
    results = repo / "docs" / "results" / "gpu_decode.json"
    results.write_text(json.dumps({"context": ctx, "benchmarks": rows,
                                   "flashstep": {"shapes_file": "bench/shapes.csv", "targets": []}}))
    return repo, results


@pytest.mark.parametrize("new_run", [True, False])
def test_the_decode_chapter_shows_the_read_ceiling_and_flashinfer_where_the_run_has_them(tmp_path, new_run):
    pytest.importorskip("matplotlib")  # decode_report.py draws the bandwidth plot too
    repo, results = scratch_decode_repo(tmp_path, new_run, new_run)
    run = subprocess.run([sys.executable, os.path.join(BENCH, "decode_report.py"), "--repo", str(repo),
                          "--results", str(results)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    text = (repo / "stages" / "02_paged" / "README.md").read_text()
    # the chapter: one summary table (the ceiling, the peers), the per-shape table left to --full
    assert text.count("| measured | value | goal | met |") == 1 and "| shape |" not in text
    if new_run:
        assert "| 02_paged % of the read ceiling, highest over 1 shapes (`b128_kv8192_p16`) | 93.0 | | |" in text
    else:
        assert "| 02_paged % of the copy ceiling, highest over 1 shapes (`b128_kv8192_p16`) | 102 | | |" in text
    assert table_row(text, "| speed vs cuDNN SDPA").endswith("| 1.00x - 1.00x | | |")
    assert "[docs/results](../../docs/results/)" in text
    full = subprocess.run([sys.executable, os.path.join(BENCH, "decode_report.py"), "--repo", str(repo),
                           "--results", str(results), "--full"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert full.returncode == 0, full.stdout
    assert (repo / "stages" / "02_paged" / "README.md").read_text() == text  # --full writes nothing
    row = table_row(full.stdout, "| `b128_kv8192_p16` |")
    text = full.stdout
    if new_run:  # 93.0% of the read ceiling; flash SDPA not measured; cuDNN's time over 02's: 1.00x
        assert row == ("| `b128_kv8192_p16` | 128 x 8192 | 16 | NHD | 1,400 | 3,069 | 102 | 93.0 | 3,053 | – | "
                       "2,980 | 3,100 | 1.00x |")
        assert "a kernel that only reads 3,300 GB/s (bytes read)" in text
        assert "| FlashInfer decode GB/s | FlashInfer tensor-core decode GB/s |" in text
    else:
        assert row == "| `b128_kv8192_p16` | 128 x 8192 | 16 | NHD | 1,400 | 3,069 | 102 | 3,053 | – | 1.00x |"
        assert "(bytes read)" not in text and "% of read" not in text and "FlashInfer" not in text


def test_the_floor_table_is_the_launch_floor_plus_the_bytes_at_the_read_ceiling():
    # b1 x kv 1024: 03 at 15 us and 280 GB/s moves 4.2 MB; at a 3000 GB/s read ceiling that
    # is 1.4 us, plus a 4 us launch floor: 5.4 us, so 03 is 15 / 5.4 = 2.78 floors and
    # cuDNN (10.8 us) exactly 2.00.
    data = as_run({"context": {"launch_floor_1_us": "4.0", "launch_floor_2_us": "6.5"}})
    rows = {"03_split_kv/b1_kv1024_p16": {"real_time": 15.0, "time_unit": "us", "GB/s": 280.0, "bytes": 4.2e6},
            "peer_torch_sdpa_cudnn/b1_kv1024_p16": {"real_time": 10.8, "time_unit": "us", "GB/s": 388.9,
                                                    "bytes": 4.2e6}}
    lines = split_kv_report.floor_markdown(data, rows, 3000.0, False)
    assert "4.0 us for a CUDA graph of one empty kernel" in lines[1] and "(6.5 us for two)" in lines[1]
    assert "| 1 | 1024 | 5.4 | 15.0 | 2.78 | 2.00 |" in lines
    assert len([x for x in lines if x.startswith("| 1 |") or x.startswith("| 4 |")]) == 1  # only measured shapes
    # a run without the launch floor (or the read ceiling) gets no table
    assert split_kv_report.floor_markdown(as_run({"context": {}}), rows, 3000.0, False) == []
    assert split_kv_report.floor_markdown(data, rows, None, False) == []


def test_the_chapter_carries_one_summary_table_and_points_to_the_results_page():
    rows = goal_rows()
    verdicts = split_kv_report.targets(rows)
    text = split_kv_report.chapter_markdown(new_run(), rows, verdicts, "docs/results/03_split_kv/r.json",
                                            page="docs/results/03_split_kv")
    assert text.count("| measured | value | goal | met |") == 1
    assert "| batch | kv_len |" not in text and "Against the floor" not in text  # on the results page
    assert table_row(text, "| 03 / cuDNN SDPA, worst shape") == \
        "| 03 / cuDNN SDPA, worst shape (`b1_kv1024_p16`) | 0.750 | >= 1.00 | **no** |"
    assert table_row(text, "| 03 time, HND") == \
        "| 03 time, HND vs sequential NHD page 16 (`b128_kv8192_p16_hnd`) | +1.0% | <= +2.0% | yes |"
    assert "[docs/results/03_split_kv](../../docs/results/03_split_kv/)" in text
