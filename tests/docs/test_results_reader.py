"""docs/results, and the one reader every report script and the docs site read it through
(bench/reports/results.py), on the committed files, CPU only:
- the layout: one folder per stage (named as the stage folders are) plus python/ and
  notebooks/, superseded runs in a folder's history/, names <gpu>_<what>_<date>[_<commit>];
- every results file loads, whatever program wrote it, into the one shape (device, commit,
  tree, command, date, ceilings, rows with their unit, peers, targets);
- the reader changes no number and no provenance: values checked against the raw JSON,
  read here without the reader;
- bad input is refused with the file's name.
Also bench/shapes.py, the one reader of the shapes files.
"""
import glob
import json
import math
import os
import re
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
RESULTS = os.path.join(SOURCE, "docs", "results")
sys.path.insert(0, os.path.join(SOURCE, "bench", "reports"))
sys.path.insert(0, os.path.join(SOURCE, "bench"))
results = pytest.importorskip("results")
shapes = pytest.importorskip("shapes")

STAGES = {os.path.basename(d) for d in glob.glob(os.path.join(SOURCE, "stages", "[0-9][0-9]_*"))}
# flashstep.cuda's runs; executed notebooks; the lessons of the features that cross stages
# (stages/rope/, stages/sinks/, ...: a folder with a chapter but no stage number)
OTHER_FOLDERS = {"python", "notebooks"} | {
    os.path.basename(os.path.dirname(d)) for d in glob.glob(os.path.join(SOURCE, "stages", "[a-z]*", "README.md"))}
NAME = re.compile(r"^[a-z0-9]+_[a-z0-9_]+_\d{4}-\d\d-\d\d(_v\d+)?(_[0-9a-f]{7})?(_checks)?\.(json|txt|log)$")


def all_json():
    return sorted(glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True))


def raw(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rel(path):
    return os.path.relpath(path, RESULTS)


def test_results_live_in_stage_folders():
    if not os.path.isdir(RESULTS):
        pytest.skip("no docs/results in this tree")
    loose = [n for n in os.listdir(RESULTS) if os.path.isfile(os.path.join(RESULTS, n))]
    assert not loose, f"files directly in docs/results/ (each belongs in its stage's folder): {loose}"
    folders = {n for n in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, n))}
    assert folders <= STAGES | OTHER_FOLDERS, f"folders that are no stage: {sorted(folders - STAGES - OTHER_FOLDERS)}"
    nested = [rel(d) for d in glob.glob(os.path.join(RESULTS, "*", "*")) if os.path.isdir(d)
              and os.path.basename(d) != "history"]
    assert not nested, f"a stage folder holds its runs, and history/ the superseded ones; not: {nested}"


def test_results_files_are_named_gpu_what_date_commit():
    names = [rel(p) for p in glob.glob(os.path.join(RESULTS, "**", "*.*"), recursive=True)
             if p.endswith((".json", ".txt", ".log")) and "notebooks" not in rel(p).split(os.sep)]
    bad = [n for n in names if not NAME.match(os.path.basename(n))]
    assert not bad, f"results files not named <gpu>_<what>_<date>[_<commit>]: {bad}"


def test_a_commit_in_a_name_is_the_commit_the_file_records():
    for path in all_json():
        m = re.search(r"_([0-9a-f]{7})\.json$", path)
        run = results.load(path)
        if m and run["commit"] is not None:
            assert run["commit"].startswith(m.group(1)), f"{rel(path)} records commit {run['commit']}"


@pytest.mark.parametrize("path", all_json(), ids=rel)
def test_every_results_file_reads_into_the_one_shape(path):
    run = results.load(path)
    assert run["writer"] in {w for w, _, _ in results.WRITERS}
    assert run["device"], f"{rel(path)}: no device"
    assert run["stage"] is None or run["stage"] in STAGES
    assert run["rows"], f"{rel(path)}: no rows"
    for r in run["rows"]:
        assert r["unit"] in ("GB/s", "TFLOP/s", "us"), r["name"]
        assert isinstance(r["value"], (int, float)) and math.isfinite(r["value"]), r["name"]
        assert r["median_us"] >= 0 and r["name"].startswith(r["impl"] + "/")
    assert all(r["impl"].startswith("peer_") for r in run["peers"])
    for t in run["targets"]:
        assert set(t) == {"what", "ratio", "goal", "met"} and t["met"] in (True, False, None)
        assert t["met"] is None or isinstance(t["ratio"], float)
    assert all(isinstance(v, float) for v in run["ceilings"].values())


def test_peers_are_named_by_the_stages_shapes():
    run = results.load(os.path.join(RESULTS, "02_paged", "h100_decode_2026-11-22_1a0fe42.json"))
    stage_shapes = {r["shape"] for r in run["rows"] if r["impl"] == "02_paged"}
    cudnn = {r["shape"] for r in run["peers"] if r["impl"] == "peer_torch_sdpa_cudnn"}
    assert cudnn and cudnn <= stage_shapes | {r["shape"] for r in run["rows"] if not r["impl"].startswith("peer_")}


def test_a_google_benchmark_run_keeps_its_numbers_and_provenance():
    path = os.path.join(RESULTS, "02_paged", "h100_decode_2026-11-22_1a0fe42.json")
    data = raw(path)
    row = next(b for b in data["benchmarks"] if b.get("aggregate_name") == "median"
               and b["run_name"].startswith("02_paged/b128_kv8192_p16/"))
    assert row["time_unit"] == "us"
    run = results.load(path)
    mine = {r["name"]: r for r in run["rows"]}["02_paged/b128_kv8192_p16"]
    assert mine["median_us"] == row["real_time"] and mine["value"] == row["GB/s"] and mine["unit"] == "GB/s"
    assert (run["commit"], run["date"], run["device"]) == (data["context"]["commit"], data["context"]["date"],
                                                           data["context"]["device"])
    assert (run["tree"], run["command"]) == (data["flashstep"]["tree"], data["flashstep"]["command"])
    assert run["ceilings"]["copy_ceiling_GB/s"] == float(data["context"]["copy_ceiling_GB/s"])
    assert [t["ratio"] for t in run["targets"]] == [t.get("ratio") for t in data["flashstep"]["targets"]]
    assert run["stage"] == "02_paged"


def test_the_other_writers_keep_their_numbers_and_provenance():
    sampling = os.path.join(RESULTS, "06_sampling", "h100_sampling_2026-11-27_8a879da.json")
    data, run = raw(sampling), results.load(sampling)
    assert run["writer"] == "sampling" and (run["commit"], run["tree"], run["command"]) == \
        (data["commit"], data["tree"], data["command"])
    first = data["flashstep"][0]
    assert {r["name"]: r for r in run["rows"]}[f"06_sampling/{first['name']}"]["median_us"] == first["median_us"]
    peer = data["peers"][0]
    assert {r["name"]: r for r in run["peers"]}[f"peer_{peer['impl']}/{peer['name']}"]["median_us"] == \
        peer["median_us"]
    assert [t["met"] for t in run["targets"]] == [t.get("met") for t in data["targets"]]

    cp = os.path.join(RESULTS, "08_context_parallel", "h200x2_cp_2026-11-22_400a877.json")
    data, run = raw(cp), results.load(cp)
    assert run["writer"] == "context_parallel" and run["commit"] == data["context"]["commit"]
    assert [r["median_us"] for r in run["rows"]] == [r["median_us"] for r in data["results"]]

    cost = os.path.join(RESULTS, "python", "h100_host_cost_2026-11-27_6db013c.json")
    data, run = raw(cost), results.load(cost)
    assert run["writer"] == "host_cost" and run["commit"] == "6db013c" and run["tree"] == "clean"  # from its log
    assert run["rows"][0]["median_us"] == pytest.approx(data[0]["flashstep"] * 1e6)
    assert run["peers"][0]["median_us"] == pytest.approx(data[0]["FlashInfer"] * 1e6)


def test_history_is_read_only_when_asked():
    current = {rel(r["path"]) for r in results.load_tree(RESULTS)}
    every = {rel(r["path"]) for r in results.load_tree(RESULTS, history=True)}
    assert current and not any("history" in p.split(os.sep) for p in current)
    assert every > current


@pytest.mark.parametrize("data,needle", [
    ({"something": 1}, "not a results file of any writer"),
    ({"benchmarks": [{"real_time": 1.0}]}, "has no name"),
    ({"stage": "06_sampling", "flashstep": [{"name": "x"}]}, "not a complete results file"),
])
def test_bad_files_are_refused_by_name(tmp_path, data, needle):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(results.ResultsError, match=needle) as e:
        results.load(str(path))
    assert "bad.json" in str(e.value)


def test_shapes_are_read_one_way(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("# bench-args: --tune\nname,set,batch,kv_len,num_qo_heads,num_kv_heads,head_dim,dtype\n"
                    "a,target,2,10,4,2,8,bf16\n\n# a comment\nb,extra,1,3,4,2,8,f32\n")
    assert [s["name"] for s in shapes.load_shapes(str(path))] == ["a", "b"]
    assert [s["name"] for s in shapes.load_shapes(str(path), {"extra"})] == ["b"]
    # q and o: 2 x 2 x 4 x 8 x 2 bytes = 256; K and V: 2 x 2 x 10 x 2 x 8 x 2 = 1280; lse 4 x 2 x 4 = 32
    assert shapes.decode_bytes(2, 10, 4, 2, 8, 2) == 256 + 1280 + 32
    # causal, 2 queries at the end of 3 keys: query 0 sees keys 0-1, query 1 keys 0-2
    assert shapes.visible_pairs([(2, 3)], causal=True) == 5 and shapes.visible_pairs([(2, 3)], causal=False) == 6


def test_the_sampling_merge_reads_its_bench_through_the_reader(tmp_path):
    sampling_report = pytest.importorskip("sampling_report")

    def median(name, us, **counters):
        return {"name": f"06_sampling/{name}/min_time:0.050/manual_time_median", "run_type": "aggregate",
                "run_name": f"06_sampling/{name}/min_time:0.050/manual_time", "aggregate_name": "median",
                "real_time": us, "time_unit": "us", **counters}
    mean = dict(median("b1", 99.0), aggregate_name="mean", name="06_sampling/b1/min_time:0.050/manual_time_mean")
    bench = {"context": {"date": "2026-01-01T00:00:00+00:00", "device": "GPU X"},
             "benchmarks": [mean, median("b1", 22.5, label="top_p_sampling_from_probs", batch=1.0, vocab=128256.0,
                                         rounds_mean=1.5, rounds_max=3.0),
                            dict(median("b128", 2.5, label="x"), time_unit="ms")]}
    path = tmp_path / "sampling_bench.json"
    path.write_text(json.dumps(bench))
    run, rows = sampling_report.bench_rows(str(path))
    assert run["device"] == "GPU X"
    assert rows[0] == {"name": "b1", "operator": "top_p_sampling_from_probs", "median_us": 22.5, "batch": 1,
                       "vocab": 128256, "GB/s": None, "rounds_mean": 1.5, "rounds_max": 3.0}
    assert [r["median_us"] for r in rows] == [22.5, 2500.0]  # the mean left out; ms read as ms
