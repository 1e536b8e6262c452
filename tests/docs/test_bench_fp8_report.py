"""bench/reports/fp8_report.py on a small hand-made run, CPU only (no GPU, no torch): the FP8 decode
table takes every number from the two files, and each goal's ratio and verdict is the one
worked out by hand in the comments; a number the run lacks is "-" and its goal "n/a"."""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "bench", "reports", "fp8_report.py")

SHAPES = """# test shapes
name,set,batch,kv_len,num_qo_heads,num_kv_heads,head_dim,page_size,dtype,layout,page_order,kv_dtype,k_scale,v_scale
b128_kv8192_bf16,target,128,8192,32,8,128,16,bf16,NHD,sequential,bf16,1,1
b128_kv8192_e4m3,target,128,8192,32,8,128,16,bf16,NHD,sequential,e4m3,1,1
b128_kv8192_e4m3_scaled,target,128,8192,32,8,128,16,bf16,NHD,sequential,e4m3,0.5,2
b16_kv1024_e5m2,sweep,16,1024,32,8,128,16,bf16,NHD,sequential,e5m2,1,1
"""


def median(name, us):
    return {"name": f"{name}/min_time:0.050/repeats:5/manual_time_median", "run_type": "aggregate",
            "run_name": f"{name}/min_time:0.050/repeats:5/manual_time", "aggregate_name": "median",
            "real_time": us, "cpu_time": us, "time_unit": "us"}


def run(tmp_path):
    (tmp_path / "shapes.csv").write_text(SHAPES)
    # Read ceiling 3000 GB/s. b128 x kv 8192 at e4m3: q and o 2 x 128 x 32 x 128 x 2 bytes =
    # 2097152, K and V 2 x 128 x 8192 x 8 x 128 x 1 = 2147483648, lse 128 x 32 x 4 = 16384:
    # 2149597184 bytes, a floor of 716.532 us.
    bench = {"context": {"device": "GPU X", "read_ceiling_GB/s": "3000", "commit": "abc"},
             "benchmarks": [median("03_split_kv/b128_kv8192_bf16", 1400.0),
                            median("03_split_kv/b128_kv8192_e4m3", 750.0),
                            median("02_paged/b128_kv8192_e4m3", 760.0),
                            median("03_split_kv/b128_kv8192_e4m3_scaled", 760.0),
                            median("03_split_kv/b16_kv1024_e5m2", 40.0),
                            median("04_tensor_core/b128_kv8192_e4m3", 725.0),
                            median("04_tensor_core/b128_kv8192_bf16", 1450.0)]}
    peers = {"results": [
        {"impl": "flashinfer_cuda_core_decode", "shape": "b128_kv8192_e4m3", "median_us": 1775.0},
        {"impl": "flashinfer_tc_decode", "shape": "b128_kv8192_e4m3", "median_us": 895.0},
        {"impl": "flashinfer_tc_decode", "shape": "b128_kv8192_e4m3_scaled", "median_us": 800.0,
         "error": "marked wrong"},  # a marked row is no peer
        {"impl": "flashinfer_tc_decode", "shape": "b16_kv1024_e5m2", "median_us": 36.0}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "peers.json").write_text(json.dumps(peers))
    out = subprocess.run([sys.executable, SCRIPT, "--bench", str(tmp_path / "bench.json"), "--peers",
                          str(tmp_path / "peers.json"), "--shapes", str(tmp_path / "shapes.csv")],
                         capture_output=True, text=True, check=True)
    return out.stdout


def goal(text, stdout):
    line = next(l for l in stdout.splitlines() if l.endswith(text))
    return line.split()[0], line.split()[1]


def test_goals_are_the_ratios_worked_out_by_hand(tmp_path):
    out = run(tmp_path)
    # 750 / 1400 = 0.536 <= 0.55: met.
    assert goal("b128_kv8192_e4m3: 03 time / bf16 time <= 0.55", out) == ("MET", "0.536")
    # FlashInfer's best is the tensor-core wrapper's 895 us: 895 / 750 = 1.193 >= 1.15.
    assert goal("b128_kv8192_e4m3: FlashInfer best / 03 time >= 1.15", out) == ("MET", "1.193")
    # 750 / 716.532 = 1.047 <= 1.10.
    assert goal("b128_kv8192_e4m3: 03 time / FP8 read floor <= 1.1", out) == ("MET", "1.047")
    # Scaled 760 us against 750 without: 1.013, slower: missed.
    assert goal("b128_kv8192_e4m3_scaled: time with scales / without <= 1.0", out) == ("MISS", "1.013")
    # The scaled row's only FlashInfer row is marked wrong: no peer, no ratio.
    assert goal("b128_kv8192_e4m3_scaled: FlashInfer best / 03 time >= 1.15", out)[0] == "n/a"
    # b16 x kv 1024 is launch-bound: 36 / 40 = 0.9 < 1.0.
    assert goal("b16_kv1024_e5m2: FlashInfer best / 03 time >= 1.0", out) == ("MISS", "0.900")
    # Stage 04 judged on its own rows: 725 / 1450 = 0.5; 895 / 725 = 1.234; 725 / 716.532 = 1.012.
    assert goal("b128_kv8192_e4m3: 04 time / 04 bf16 time <= 0.55", out) == ("MET", "0.500")
    assert goal("b128_kv8192_e4m3: FlashInfer best / 04 time >= 1.15", out) == ("MET", "1.234")
    assert goal("b128_kv8192_e4m3: 04 time / FP8 read floor <= 1.1", out) == ("MET", "1.012")
    # No stage 04 row for b16 x kv 1024: no goal line for 04 there.
    assert not any(l.endswith("b16_kv1024_e5m2: FlashInfer best / 04 time >= 1.0") for l in out.splitlines())


def test_the_table_shows_what_the_run_measured_and_dashes_for_the_rest(tmp_path):
    out = run(tmp_path)
    row = next(l for l in out.splitlines() if l.startswith("b128_kv8192_e4m3 "))
    cells = row.split()
    assert cells[1:4] == ["760.0", "750.0", "1400.0"]  # stage 02, stage 03, stage 03 on bf16
    assert cells[4:6] == ["725.0", "1450.0"]            # stage 04, stage 04 on bf16
    assert cells[6] == "-"                              # stage 03's CUDA-core loop: not in this run
    assert cells[7:9] == ["1775.0", "895.0"]            # FlashInfer CUDA cores, tensor cores
    assert cells[9] == "716.5"                          # the floor
    e5m2 = next(l for l in out.splitlines() if l.startswith("b16_kv1024_e5m2 ")).split()
    assert e5m2[1] == "-" and e5m2[3] == "-"  # no stage 02 row, no bf16 shape of these sizes
    assert not any(l.startswith("b128_kv8192_bf16") for l in out.splitlines())  # a bf16 row is no FP8 row


PREFILL_SHAPES = """# test prefill shapes
name,set,mode,batch,qo_len,kv_len,num_qo_heads,num_kv_heads,head_dim,page_size,dtype,layout,page_order,causal,lengths,kv_dtype,k_scale,v_scale
append_b4_q512_kv8192_causal_bf16,target,prefill,4,512,8192,32,8,128,16,bf16,NHD,sequential,1,uniform,bf16,1,1
append_b4_q512_kv8192_causal_e4m3,target,prefill,4,512,8192,32,8,128,16,bf16,NHD,sequential,1,uniform,e4m3,1,1
append_b4_q512_kv8192_causal_e5m2,target,prefill,4,512,8192,32,8,128,16,bf16,NHD,sequential,1,uniform,e5m2,1,1
"""


def test_json_markdown_and_the_append_goal(tmp_path):
    run(tmp_path)
    (tmp_path / "prefill.csv").write_text(PREFILL_SHAPES)
    prefill = {"context": {}, "benchmarks": [dict(median("04_tensor_core/append_b4_q512_kv8192_causal_bf16", 500.0),
                                                  **{"TFLOP/s": 300.0}),
                                             dict(median("04_tensor_core/append_b4_q512_kv8192_causal_e4m3", 540.0),
                                                  **{"TFLOP/s": 276.0})]}
    (tmp_path / "prefill.json").write_text(json.dumps(prefill))
    out = subprocess.run([sys.executable, SCRIPT, "--bench", str(tmp_path / "bench.json"), "--peers",
                          str(tmp_path / "peers.json"), "--shapes", str(tmp_path / "shapes.csv"),
                          "--prefill-bench", str(tmp_path / "prefill.json"), "--prefill-shapes",
                          str(tmp_path / "prefill.csv"), "--json", str(tmp_path / "r.json"), "--markdown",
                          str(tmp_path / "t.md")], capture_output=True, text=True, check=True).stdout
    # 276 / 300 = 0.92 >= 0.9: met; the e5m2 row was not measured: n/a.
    assert goal("append_b4_q512_kv8192_causal_e4m3: 04 TFLOP/s / bf16 TFLOP/s >= 0.9", out) == ("MET", "0.920")
    assert goal("append_b4_q512_kv8192_causal_e5m2: 04 TFLOP/s / bf16 TFLOP/s >= 0.9", out)[0] == "n/a"
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["commit"] == "abc" and r["device"] == "GPU X"
    row = next(d for d in r["decode"] if d["shape"] == "b128_kv8192_e4m3")
    assert (row["us_03"], row["us_03_bf16"], row["flashinfer_tensor_core_us"]) == (750.0, 1400.0, 895.0)
    targets = {t["what"]: (t["met"], t["ratio"], t["goal"]) for t in r["targets"]}
    assert targets["b128_kv8192_e4m3: 03 time / bf16 time <= 0.55"] == (True, 750.0 / 1400.0, "<= 0.55")
    assert targets["append_b4_q512_kv8192_causal_e5m2: 04 TFLOP/s / bf16 TFLOP/s >= 0.9"][0] is None
    # The file is in the results files' one shape: the reader takes it as written.
    sys.path.insert(0, os.path.join(SOURCE, "bench", "reports"))
    import results
    back = results.load(str(tmp_path / "r.json"))
    assert back["writer"] == "results" and back["commit"] == "abc" and back["ceilings"] == {"read_ceiling_GB/s": 3000.0}
    rows = {x["name"]: x for x in back["rows"]}
    assert rows["03_split_kv/b128_kv8192_e4m3"]["median_us"] == 750.0
    assert rows["peer_flashinfer_tc_decode/b128_kv8192_e4m3"]["median_us"] == 895.0
    assert "peer_flashinfer_tc_decode/b128_kv8192_e4m3_scaled" not in rows  # marked wrong: not a row
    e4m3 = rows["04_tensor_core/append_b4_q512_kv8192_causal_e4m3"]
    assert (e4m3["unit"], e4m3["value"], e4m3["median_us"]) == ("TFLOP/s", 276.0, 540.0)
    assert "04_tensor_core/append_b4_q512_kv8192_causal_e5m2" not in rows  # not measured
    table = (tmp_path / "t.md").read_text()
    assert "| b128_kv8192_e4m3 | 750.0 | 1400.0 | 0.536 | - | 725.0 | 1775.0 | 895.0 | 716.5 |" in table
    assert "| append_b4_q512_kv8192_causal_e4m3 | 276.0 | 300.0 | 0.920 |" in table
