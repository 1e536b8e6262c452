"""The results sections of the stage chapters are generated, never typed: regenerating
them from the committed results JSON (bench/report.py, in a scratch copy of the files it
reads and writes) must give exactly the committed text. A chapter edited by hand, or
results JSON committed without rerunning the report, fails here."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SECTION = re.compile(r"<!-- results:begin -->.*?<!-- results:end -->", re.S)


def test_stage_results_sections_match_the_results_json(tmp_path):
    results = glob.glob(os.path.join(SOURCE, "docs", "results", "*.json"))
    report = os.path.join(SOURCE, "bench", "report.py")
    if not results or not os.path.exists(report):
        pytest.skip("no results JSON in docs/results yet (or no bench/report.py): nothing to compare")
    chapters = sorted(glob.glob(os.path.join(SOURCE, "stages", "[0-9][0-9]_*", "README.md")))
    for path in chapters + results + glob.glob(os.path.join(SOURCE, "bench", "*.csv")):
        dest = tmp_path / os.path.relpath(path, SOURCE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest)
    run = subprocess.run([sys.executable, report, "--repo", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 0, run.stdout
    stale = []
    for path in chapters:
        with open(path, encoding="utf-8") as f:
            committed = SECTION.findall(f.read())
        with open(tmp_path / os.path.relpath(path, SOURCE), encoding="utf-8") as f:
            regenerated = SECTION.findall(f.read())
        if committed != regenerated:
            stale.append(os.path.relpath(path, SOURCE))
    assert not stale, ("results sections differ from what `python3 bench/report.py` generates "
                       f"from docs/results: {stale}")
