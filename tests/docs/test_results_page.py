"""The results page a reader can find their way in: contents, a section per stage and per
run, the rows as a table by shape, every row folded away; and plots whose series differ in
colour and in marker, drawn at the page's width."""
import json
import os
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import docs_results  # noqa: E402
from plot_style import COLORS, series_styles  # noqa: E402  (docs_results put bench/reports on the path)


def bench(name, us, **counters):
    return {"name": name, "run_type": "iteration", "real_time": us, "time_unit": "us", **counters}


def write_run(path, rows, device="GPU X"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"context": {"device": device, "commit": "abc1234", "copy_ceiling_GB/s": 3000.0},
                                "benchmarks": rows}))


def make_results(tmp_path):
    results = tmp_path / "results"
    impls = ["02_paged", "03_split_kv", "04_tensor_core", "04_tensor_core_ragged", "peer_torch_sdpa_cudnn",
             "peer_flashinfer_tc_decode", "peer_flashinfer_cuda_core_decode"]
    shapes = ["b1_kv1024_p16", "b16_kv4096_p16", "b128_kv8192_p16"]
    rows = [bench(f"{i}/{s}", 10.0 + k + j, **{"GB/s": 1000.0 + 100 * k + j}) for k, i in enumerate(impls)
            for j, s in enumerate(shapes)]
    rows.append(bench("tune/02_paged/variant_a/b1_kv1024_p16", 12.0, **{"GB/s": 900.0}))
    write_run(results / "02_paged" / "h100_decode_2026-01-02_abc1234.json", rows)
    write_run(results / "04_tensor_core" / "h100_prefill_2026-01-03_abc1234.json",
              [bench("04_tensor_core/b4_q4096", 1000.0, **{"TFLOP/s": 300.0}),
               bench("peer_flashinfer_fa3/b4_q4096", 800.0, **{"TFLOP/s": 420.0})])
    return results, impls, shapes


def test_the_page_has_contents_and_a_section_per_stage_and_run(tmp_path):
    results, impls, shapes = make_results(tmp_path)
    out = tmp_path / "gen"
    for sub in ("pages", "images"):
        (out / sub).mkdir(parents=True)
    runs = docs_results.load_dir(str(results))
    titles = {"02_paged": ("stage_02_paged", "Stage 02 — paged decode")}
    page = open(docs_results.results_page(runs, str(out), titles), encoding="utf-8").read()
    contents = page[page.index("## Contents"):page.index("## Stage 02")]
    assert "[Stage 02 — paged decode](#results_02_paged)" in contents
    assert "[decode, H100, 2026-01-02, commit abc1234](#results_02_paged_h100_decode_2026_01_02_abc1234)" in contents
    assert "[04_tensor_core](#results_04_tensor_core)" in contents  # a folder without a chapter title: its name
    assert "## Stage 02 — paged decode {#results_02_paged}" in page and "\\ref stage_02_paged" in page
    assert "### decode, H100, 2026-01-02, commit abc1234 {#results_02_paged_h100_decode_2026_01_02_abc1234}" in page
    # the table by shape: a row per shape, a column per stage or peer
    head = next(l for l in page.splitlines() if l.startswith("| shape |") and "02 paged" in l)
    assert head.count("|") == len(impls) + 2
    for s in shapes:
        assert sum(1 for l in page.splitlines() if l.startswith(f"| `{s}` |")) == 1, s
    assert "1 rows with longer names" in page
    # every row of each file, folded under its summary, exact names kept
    assert page.count('<details class="flashstep-rows">') == 2
    assert "<code>tune/02_paged/variant_a/b1_kv1024_p16</code>" in page
    # a plot per run, no wider than the page
    from PIL import Image
    for name in ("results_h100_decode_2026_01_02_abc1234.png", "results_h100_prefill_2026_01_03_abc1234.png"):
        assert f"]({name})" in page
        assert Image.open(out / "images" / name).size[0] <= 1000, name


@pytest.mark.parametrize("count", [2, 7, 12, len(COLORS)])
def test_the_series_of_a_plot_differ_in_colour_and_in_marker(count):
    names = ["01_naive", "02_paged", "03_split_kv", "04_tensor_core", "04_tensor_core_ragged", "05_cascade",
             "05_cascade[cascade]", "05_cascade[flat]", "07_hopper", "07_hopper_ragged", "peer_torch_sdpa_cudnn",
             "peer_torch_sdpa_flash", "peer_flashinfer_fa2", "peer_flashinfer_fa3"][:count]
    styles = series_styles(names)
    assert len({s.color for s in styles.values()}) == count
    assert len({s.marker for s in styles.values()}) == count
    assert len({s.hatch for s in styles.values()}) == count


def test_every_committed_run_plots_with_distinct_series():
    runs = docs_results.load_dir(os.path.join(SOURCE, "docs", "results"))
    for run in runs:
        rows, _ = docs_results.plotted_rows(run)
        impls = sorted({r["name"].split("/", 1)[0] for r in rows})
        if not impls:
            continue
        styles = series_styles(impls)
        assert len({s.color for s in styles.values()}) == len(impls), run["shown"]
        assert len({s.marker for s in styles.values()}) == len(impls), run["shown"]
