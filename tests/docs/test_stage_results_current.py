"""The results sections of the stage chapters are generated, never typed.

- A `<!-- results:begin -->` section names the results JSON it was generated from;
  regenerating it from that file with bench/reports/decode_report.py (in a scratch copy of the files
  the script reads and writes) must give the same numbers: those of every table row, in
  order, and the commit and date. The prose around the tables may be reworded (in the
  script or by hand) without failing here; a number typed by hand, or a JSON replaced
  without rerunning the report, fails.
- Every results file a chapter cites (in any generated section) must exist.
- The other generated sections (stages 03-10, each written by its own script in
  bench/reports/) are written again with the script's --check from the files they cite:
  a section that differs from what its files generate fails.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SECTION = re.compile(r"<!-- results:begin -->.*?<!-- results:end -->", re.S)
CITED = re.compile(r"docs/results/[\w./-]+\.json")
CHAPTERS = sorted(glob.glob(os.path.join(SOURCE, "stages", "[0-9][0-9]_*", "README.md")))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_every_cited_results_file_exists():
    missing = [(os.path.relpath(c, SOURCE), f) for c in CHAPTERS for f in set(CITED.findall(read(c)))
               if not os.path.exists(os.path.join(SOURCE, f))]
    assert not missing, f"chapters cite results files that are not in the repository: {missing}"


def facts(section):
    """What a results section must take from its JSON: the numbers of its table rows, row by
    row, and the commits and dates it names. Words and prose lines are left out."""
    rows = [re.findall(r"\d[\d,.]*", line) for line in section.splitlines() if line.lstrip().startswith("|")]
    commits = re.findall(r"commit `([0-9a-f]{7,}(?:-dirty)?)`", section)
    dates = re.findall(r"\d{4}-\d\d-\d\dT[\d:+]+", section)
    return rows, commits, dates


def test_report_sections_match_the_json_they_cite(tmp_path):
    report = os.path.join(SOURCE, "bench", "reports", "decode_report.py")
    by_file = {}
    for chapter in CHAPTERS:
        for section in SECTION.findall(read(chapter)):
            for cited in set(CITED.findall(section)):
                by_file.setdefault(cited, []).append(chapter)
    if not by_file or not os.path.exists(report):
        pytest.skip("no chapter has a results section generated from docs/results yet")
    stale = []
    for n, (cited, chapters) in enumerate(sorted(by_file.items())):
        repo = tmp_path / f"repo{n}"  # a scratch copy of what decode_report.py reads and writes
        for path in CHAPTERS + glob.glob(os.path.join(SOURCE, "bench", "*.csv")):
            dest = repo / os.path.relpath(path, SOURCE)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest)
        (repo / os.path.dirname(cited)).mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.join(SOURCE, cited), repo / cited)
        run = subprocess.run([sys.executable, report, "--repo", str(repo), "--results", str(repo / cited)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert run.returncode == 0, run.stdout
        for chapter in chapters:
            regenerated = [facts(x) for x in SECTION.findall(read(repo / os.path.relpath(chapter, SOURCE)))]
            if [facts(x) for x in SECTION.findall(read(chapter))] != regenerated:
                stale.append((os.path.relpath(chapter, SOURCE), cited))
    assert not stale, ("the tables (or commit, date) of results sections differ from what "
                       f"`python3 bench/reports/decode_report.py --results FILE` generates from the file they cite: {stale}")


def test_hopper_sections_match_the_json_they_cite():
    """Stage 07's two generated sections, written again by bench/reports/hopper_report.py --check
    from the results and step files they cite."""
    chapter = os.path.join(SOURCE, "stages", "07_hopper", "README.md")
    if not os.path.exists(chapter):
        pytest.skip("no stage 07 chapter")
    text = read(chapter)
    results = re.search(r"<!-- hopper results:begin -->.*?<!-- hopper results:end -->", text, re.S)
    steps = re.search(r"<!-- hopper steps:begin -->.*?<!-- hopper steps:end -->", text, re.S)
    assert results and steps, "stages/07_hopper/README.md lacks its generated sections"
    cited = sorted(set(CITED.findall(results.group(0))))
    assert len(cited) == 1, f"the results section must cite one results file, not {cited}"
    args = [sys.executable, os.path.join(SOURCE, "bench", "reports", "hopper_report.py"), "--repo", SOURCE, "--check",
            "--results", os.path.join(SOURCE, cited[0])]
    for step in CITED.findall(steps.group(0)):
        args += ["--step", os.path.join(SOURCE, step)]
    run = subprocess.run(args, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


# The other chapters' generated sections: (chapter, the section's markers, the report that
# writes it). Each cites the one results file it was generated from.
OWN_REPORTS = [
    ("04_tensor_core", "prefill results", "prefill_report.py"),
    ("05_cascade", "cascade results", "cascade_report.py"),
    ("08_context_parallel", "context_parallel results", "cp_report.py"),
    ("09_engine", "mixed-step", "mixed_step_report.py"),
    ("10_mla", "mla results", "mla_report.py"),
]


@pytest.mark.parametrize("stage,marker,script", OWN_REPORTS, ids=[s for s, _, _ in OWN_REPORTS])
def test_own_report_sections_match_the_json_they_cite(stage, marker, script):
    chapter = os.path.join(SOURCE, "stages", stage, "README.md")
    if not os.path.exists(chapter):
        pytest.skip(f"no stage {stage} chapter")
    section = re.search(f"<!-- {marker}:begin -->.*?<!-- {marker}:end -->", read(chapter), re.S)
    assert section, f"stages/{stage}/README.md lacks its generated section"
    cited = sorted(set(CITED.findall(section.group(0))))
    assert len(cited) == 1, f"the section must cite one results file, not {cited}"
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", script), "--repo", SOURCE,
                          "--check", "--results", os.path.join(SOURCE, cited[0])], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_sampling_sections_match_the_json_they_cite():
    """Stage 06's results section and its "how it got there" table (one row per results file,
    named by its file name, oldest first), written again by sampling_report.py --check."""
    chapter = os.path.join(SOURCE, "stages", "06_sampling", "README.md")
    if not os.path.exists(chapter):
        pytest.skip("no stage 06 chapter")
    text = read(chapter)
    section = re.search(r"<!-- sampling-results:begin -->.*?<!-- sampling-results:end -->", text, re.S)
    history = re.search(r"<!-- sampling-history:begin -->.*?<!-- sampling-history:end -->", text, re.S)
    assert section and history, "stages/06_sampling/README.md lacks its generated sections"
    cited = sorted(set(CITED.findall(section.group(0))))
    assert len(cited) == 1, f"the results section must cite one results file, not {cited}"
    older = []
    for name in re.findall(r"^\| `([\w.-]+\.json)` \|", history.group(0), re.M):
        found = glob.glob(os.path.join(SOURCE, "docs", "results", "06_sampling", "**", name), recursive=True)
        assert len(found) == 1, f"the history table's {name} is not one file of docs/results/06_sampling/"
        older.append(found[0])
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "sampling_report.py"), "chapter",
                          "--repo", SOURCE, "--check", "--results", os.path.join(SOURCE, cited[0]),
                          "--history", *older], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def is_mixed_step(path):
    """A results file of stage 09's mixed-step timing (bench/reports/results.py's writer
    "mixed_step"), which mixed_step_report.py writes its section from."""
    data = json.loads(read(path))
    return isinstance(data, dict) and bool(data.get("rows")) and "variants" in data["rows"][0]


def test_engine_sections_match_the_json_they_cite():
    """Stage 09's two generated sections (the measurements, the walk through one step), written
    again by bench/reports/engine_report.py --check from the results files they cite. Before
    docs/results/09_engine/ holds a results file, the sections cite none; once it does, they
    must cite them."""
    chapter = os.path.join(SOURCE, "stages", "09_engine", "README.md")
    if not os.path.exists(chapter):
        pytest.skip("no stage 09 chapter")
    text = read(chapter)
    results = re.search(r"<!-- engine results:begin -->.*?<!-- engine results:end -->", text, re.S)
    step = re.search(r"<!-- engine step:begin -->.*?<!-- engine step:end -->", text, re.S)
    assert results and step, "stages/09_engine/README.md lacks its generated sections"
    cited = sorted(set(CITED.findall(results.group(0)) + CITED.findall(step.group(0))))
    committed = [p for p in glob.glob(os.path.join(SOURCE, "docs", "results", "09_engine", "*.json"))
                 if not is_mixed_step(p)]  # the mixed-step timing has its own section
    if not cited:
        assert not committed, ("docs/results/09_engine/ holds results files that the chapter does not cite: run "
                               "`python3 bench/reports/engine_report.py --results docs/results/09_engine/*.json`")
        return
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "engine_report.py"), "--repo",
                          SOURCE, "--check", "--results", *[os.path.join(SOURCE, c) for c in cited]],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_fp8_sections_match_what_generates_them():
    """The FP8 lesson's two generated sections (stages/fp8/README.md): the speed table, written again by bench/reports/fp8_report.py
    --chapter --check from the results file it cites, and the accuracy table, computed again
    by bench/reports/fp8_accuracy.py --check (float64 on the CPU; needs numpy)."""
    chapter = os.path.join(SOURCE, "stages", "fp8", "README.md")
    text = read(chapter)
    section = re.search(r"<!-- fp8 results:begin -->.*?<!-- fp8 results:end -->", text, re.S)
    assert section, "stages/fp8/README.md lacks its FP8 results section"
    cited = sorted(set(f for f in CITED.findall(section.group(0)) if "_fp8_results_" in f))
    assert len(cited) == 1, f"the FP8 section must cite one fp8 results file, not {cited}"
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "fp8_report.py"), "--repo", SOURCE,
                          "--check", "--chapter", os.path.join(SOURCE, cited[0])], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    pytest.importorskip("numpy")
    run = subprocess.run([sys.executable, os.path.join(SOURCE, "bench", "reports", "fp8_accuracy.py"), "--repo", SOURCE,
                          "--check"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
