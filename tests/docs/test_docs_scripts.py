"""The docs' generator scripts and the site checker, on small synthetic inputs: each must
produce what its input says, and fail loudly on input it cannot use."""
import json
import os
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import docs_results  # noqa: E402
import docs_stage_pages  # noqa: E402

CHECKER = os.path.join(SOURCE, "tests", "docs", "check_site.py")


def write_json(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def bench(name, real_time, unit="ns", **counters):
    return {"name": name, "run_type": "iteration", "real_time": real_time, "time_unit": unit,
            **counters}


# ---- docs_results.py ---------------------------------------------------------------

def test_results_table_shows_what_the_json_says(tmp_path):
    f = write_json(tmp_path / "h100.json", {
        "context": {"device": "NVIDIA H100", "commit": "abc1234", "date": "2025-01-01"},
        "benchmarks": [bench("decode/02_paged/b16", 2500.0, "ns", **{"GB/s": 1234.6}),
                       bench("decode/01_naive/b16", 0.5, "ms")]})
    res = docs_results.load(f)
    assert [r["name"] for r in res["rows"]] == ["decode/02_paged/b16", "decode/01_naive/b16"]
    assert res["rows"][0]["median_us"] == pytest.approx(2.5)
    assert res["rows"][1]["median_us"] == pytest.approx(500.0)
    assert [(r["unit"], r["value"]) for r in res["rows"]] == [("GB/s", 1234.6), ("us", pytest.approx(500.0))]
    table = docs_results.table(res["rows"])
    lines = table.splitlines()
    assert len(lines) == 2 + 2  # header, rule, two rows
    assert "| `decode/02_paged/b16` | 2.50 | 1,235 |" in table
    assert "NVIDIA H100" in docs_results.provenance(res) and "abc1234" in docs_results.provenance(res)


def test_targets_are_shown_as_the_run_computed_them(tmp_path):
    f = write_json(tmp_path / "t.json", {"benchmarks": [bench("x", 1.0)], "flashstep": {"targets": [
        {"target": "A vs B", "ratio": 0.9328, "goal": ">= 1.05", "met": False},
        {"target": "C vs D", "goal": ">= 1.00", "met": None}]}})
    table = docs_results.targets_table(docs_results.load(f)["targets"])
    assert "| A vs B | 0.933 | >= 1.05 | **missed** |" in table
    assert "| C vs D |  | >= 1.00 | not measured |" in table


def test_only_medians_of_aggregates_are_kept(tmp_path):
    reps = [bench("s/x/manual_time", float(t)) for t in (1, 2, 3)]
    aggs = [dict(bench("s/x/manual_time_" + a, 2.0), run_type="aggregate", aggregate_name=a,
                 run_name="s/x/manual_time") for a in ("mean", "median", "stddev")]
    res = docs_results.load(write_json(tmp_path / "a.json", {"benchmarks": reps + aggs}))
    assert [r["name"] for r in res["rows"]] == ["s/x"]


def test_run_options_are_not_part_of_a_row_name(tmp_path):
    row = dict(bench("02_paged/b16_kv4096_p16/min_time:0.050/repeats:5/manual_time_median", 3.0),
               run_type="aggregate", aggregate_name="median",
               run_name="02_paged/b16_kv4096_p16/min_time:0.050/repeats:5/manual_time")
    res = docs_results.load(write_json(tmp_path / "r.json", {"benchmarks": [row]}))
    assert [r["name"] for r in res["rows"]] == ["02_paged/b16_kv4096_p16"]


def test_stage_rows_match_the_stage_name_exactly():
    res = {"path": "r.json", "rows": [{"name": n, "median_us": 1.0} for n in ("02_paged/a", "12_paged/b", "x_02_paged_y")]}
    rows = docs_results.rows_for_stage([res], "02_paged")[0][1]
    assert [r["name"] for r in rows] == ["02_paged/a", "x_02_paged_y"]


@pytest.mark.parametrize("data,needle", [
    ({"context": {}}, "not a results file of any writer"),
    ({"benchmarks": [{"real_time": 1.0}]}, "has no name"),
    ({"benchmarks": [bench("x", 1.0, "weeks")]}, "unknown time_unit"),
    ({"benchmarks": [bench("x", float("nan"))]}, "is not a time"),
    ({"benchmarks": [bench("x", -1.0)]}, "is not a time"),
])
def test_bad_results_files_are_refused_by_name(tmp_path, data, needle):
    with pytest.raises(docs_results.ResultsError, match=needle):
        docs_results.load(write_json(tmp_path / "bad.json", data))


def test_not_json_is_refused(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(docs_results.ResultsError, match="broken.json"):
        docs_results.load(str(p))


# ---- docs_stage_pages.py -----------------------------------------------------------

def make_repo(tmp_path):
    repo = tmp_path / "repo"
    for name in ("01_naive", "02_paged"):
        (repo / "stages" / name).mkdir(parents=True)
    (repo / "stages" / "01_naive" / "README.md").write_text(
        "# Stage 01: naive\n\nSee [the next stage](../02_paged/README.md), the kernel "
        "[naive.cu](naive.cu), [FlashInfer](https://flashinfer.ai) and ![tiles](tiles.png).\n")
    (repo / "stages" / "01_naive" / "tiles.png").write_bytes(b"\x89PNG fake")
    (repo / "stages" / "02_paged" / "README.md").write_text("# Stage 02: paged\n\nText.\n")
    (repo / "docs" / "results").mkdir(parents=True)
    write_json(repo / "docs" / "results" / "run.json",
               {"context": {"device": "GPU X"}, "benchmarks": [bench("02_paged/b1", 10.0)]})
    return repo


def test_stage_pages_are_labelled_linked_and_carry_their_results(tmp_path):
    repo = make_repo(tmp_path)
    out = tmp_path / "gen"
    rc = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "docs_stage_pages.py"),
                         "--source-dir", str(repo), "--results-dir", str(repo / "docs" / "results"),
                         "--out", str(out), "--stamp", str(tmp_path / "stamp")]).returncode
    assert rc == 0
    naive = (out / "pages" / "stage_01_naive.md").read_text()
    assert naive.startswith("# Stage 01: naive {#stage_01_naive}")
    assert "[the next stage](@ref stage_02_paged)" in naive
    assert "naive.cu (`stages/01_naive/naive.cu`)" in naive
    assert "[FlashInfer](https://flashinfer.ai)" in naive
    assert "![tiles](tiles.png)" in naive and (out / "images" / "tiles.png").exists()
    assert "No benchmark rows for `01_naive`" in naive
    paged = (out / "pages" / "stage_02_paged.md").read_text()
    assert "`02_paged/b1`" in paged and "GPU X" in paged
    index = (out / "pages" / "stages.md").read_text()
    assert index.index("stage_01_naive") < index.index("stage_02_paged")
    assert (out / "pages" / "results.md").exists()


def test_a_missing_image_fails_the_stage_pages(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "stages" / "01_naive" / "tiles.png").unlink()
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "docs_stage_pages.py"),
                          "--source-dir", str(repo), "--results-dir", str(repo / "docs" / "results"),
                          "--out", str(tmp_path / "gen"), "--stamp", str(tmp_path / "stamp")],
                         stderr=subprocess.PIPE, text=True)
    assert run.returncode == 1 and "tiles.png does not exist" in run.stderr
    assert not (tmp_path / "stamp").exists()


# ---- check_site.py: it must be able to fail ----------------------------------------

def make_site(tmp_path, body):
    site = tmp_path / "html"
    (site / "mathjax" / "jax" / "input" / "TeX").mkdir(parents=True)
    (site / "mathjax" / "jax" / "output" / "CommonHTML").mkdir(parents=True)
    for f in ("MathJax.js", "jax/input/TeX/config.js", "jax/output/CommonHTML/jax.js"):
        (site / "mathjax" / f).write_text("//")
    pages = ["concept_sequence_attention", "concept_token_prediction", "concept_kv_cache",
             "concept_batching", "concept_paging", "concept_radix_tree", "concept_block_sparse",
             "concept_cascade", "concept_plan_run", "concept_sampling", "stages", "notebooks",
             "results", "cli", "api"]
    links = "".join(f'<a href="{p}.html">{p}</a>' for p in pages)
    (site / "index.html").write_text(f"<html><body>{links}{body}</body></html>")
    for p in pages:
        (site / f"{p}.html").write_text('<html><body><a id="top"></a></body></html>')
    return site


def run_checker(site):
    return subprocess.run([sys.executable, CHECKER, str(site)], stdout=subprocess.PIPE, text=True)


def test_checker_passes_a_sound_site(tmp_path):
    run = run_checker(make_site(tmp_path, '<a href="api.html#top">ok</a><img src="mathjax/MathJax.js">'))
    assert run.returncode == 0, run.stdout


@pytest.mark.parametrize("body,needle", [
    ('<a href="nowhere.html">x</a>', "missing file: nowhere.html"),
    ('<a href="api.html#nope">x</a>', "missing anchor: api.html#nope"),
    ('<img src="plot.png">', "missing file: plot.png"),
    ('<script src="https://cdn.example.org/mathjax/MathJax.js"></script>', "from the network"),
])
def test_checker_finds_each_kind_of_breakage(tmp_path, body, needle):
    run = run_checker(make_site(tmp_path, body))
    assert run.returncode == 1 and needle in run.stdout, run.stdout


def test_checker_finds_a_course_out_of_order(tmp_path):
    site = make_site(tmp_path, "")
    text = (site / "index.html").read_text()
    a, b = '<a href="concept_kv_cache.html">', '<a href="concept_paging.html">'
    text = text.replace(a, "@@").replace(b, a).replace("@@", b)
    (site / "index.html").write_text(text)
    run = run_checker(site)
    assert run.returncode == 1 and "out of order" in run.stdout, run.stdout


def test_links_inside_code_stay_verbatim_and_code_labels_survive(tmp_path):
    folder = tmp_path / "stages" / "05_x"
    folder.mkdir(parents=True)
    text = ("```\nlane in [0, n)   see [not a link](nowhere)\n```\n"
            "Use `a[i](j)` here, then [`kernel.cuh`](kernel.cuh) and [b](b.cu).\n")
    out = docs_stage_pages.rewrite_links(text, str(folder), str(tmp_path), {}, str(tmp_path))
    assert "lane in [0, n)   see [not a link](nowhere)" in out
    assert "`a[i](j)`" in out
    assert "`kernel.cuh` (`stages/05_x/kernel.cuh`)" in out and "b (`stages/05_x/b.cu`)" in out


def test_a_chapter_with_its_own_results_section_gets_no_second_one(tmp_path):
    repo = make_repo(tmp_path)
    readme = repo / "stages" / "02_paged" / "README.md"
    readme.write_text("# Stage 02: paged\n\n<!-- results:begin -->\nNo results yet.\n<!-- results:end -->\n")
    out = tmp_path / "gen"
    subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "docs_stage_pages.py"),
                    "--source-dir", str(repo), "--results-dir", str(repo / "docs" / "results"),
                    "--out", str(out), "--stamp", str(tmp_path / "stamp")], check=True)
    page = (out / "pages" / "stage_02_paged.md").read_text()
    assert "Measured results (generated)" not in page and "\\ref results" in page
