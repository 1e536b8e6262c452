"""`flashstep validate` and `flashstep bench`: exit 0 only when every case passes; on a
machine or build without a GPU they say so and exit 77 (skipped), never 0."""
import json
import os
import re
import subprocess


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_validate_passes_or_says_why_it_cannot_run(flashstep, seed):
    r = flashstep("validate", "--quick", "--seed", str(seed))
    if r.rc == 77:
        assert "nothing to validate" in r.out, r
        assert not have_gpu() or "no CUDA stages" in r.out, r
        return
    assert r.rc == 0, r
    assert re.search(r"stage\s+cases\s+max error\s+pass\s+time", r.out), r
    assert "FAIL" not in r.out, r


def test_validate_rejects_an_unknown_stage(flashstep):
    r = flashstep("validate", "--stage", "no_such_stage")
    if r.rc == 77:
        return  # no stages in this build: nothing to check the name against
    assert r.rc == 2, r
    assert "no_such_stage" in r.err, r


def test_bench_writes_results_or_says_why_it_cannot_run(flashstep, tmp_path):
    out = tmp_path / "bench.json"
    r = flashstep("bench", "--quick", "--out", str(out), timeout=900)
    if r.rc == 77:
        assert "nothing to benchmark" in r.out, r
        assert not out.exists()
        return
    assert r.rc == 0, r
    data = json.loads(out.read_text())
    assert data, r
