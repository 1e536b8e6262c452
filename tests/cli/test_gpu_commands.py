"""`flashstep validate` and `flashstep bench`: exit 0 only when every case passes; on a
machine or build without a GPU they say so and exit 77 (skipped), never 0."""
import json
import os
import re
import shutil
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


def test_validate_list_fits_a_terminal_and_names_every_stage_folder(flashstep):
    r = flashstep("validate", "--list")
    if r.rc == 77:
        assert "no CUDA stages" in r.out, r
        return
    assert r.rc == 0, r
    widest = max(r.out.splitlines(), key=len)
    assert len(widest) <= 80, widest
    stages_dir = os.path.join(os.path.dirname(__file__), "..", "..", "stages")
    for folder in sorted(os.listdir(stages_dir)):
        if re.fullmatch(r"\d\d_\w+", folder):
            # every stage folder in the registry is listed under its own name
            assert f"\n  {folder}\n" in r.out, (folder, r)


def test_validate_of_a_stage_outside_the_registry_says_where_it_is_validated(flashstep):
    for name, program in (("06_sampling", "flashstep_sampling_tests"), ("08", "flashstep_cp_tests")):
        r = flashstep("validate", "--stage", name)
        if r.rc == 77 and "no CUDA stages" in r.out:
            return
        assert r.rc == 77, r
        assert "is not validated by this command" in r.out and program in r.out, r
        assert "no stage named" not in r.out + r.err, r


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


def test_bench_without_its_program_names_the_target_to_build(flashstep, tmp_path):
    # The command alone in a folder of its own, as after scripts/tour.sh, which builds the
    # command and the stages but not flashstep_bench.
    alone = tmp_path / "build" / "bin"
    alone.mkdir(parents=True)
    exe = shutil.copy(os.environ["FLASHSTEP_CLI"], alone / "flashstep")
    run = subprocess.run([exe, "bench", "--quick", "--out", str(tmp_path / "b.json")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 77, run
    if "no CUDA stages" in flashstep("validate", "--list").out:
        assert "this build has no CUDA stages to benchmark" in run.stdout, run
    else:
        assert f"cmake --build '{tmp_path / 'build'}' --target flashstep_bench" in run.stdout, run
        assert "FLASHSTEP_BUILD_BENCH=ON" not in run.stdout, run
