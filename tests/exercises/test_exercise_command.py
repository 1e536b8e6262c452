"""`flashstep exercise`, driven as a learner drives it: the list names every exercise of
the tree (each CPU folder under exercises/cpu/, each stage's exercise file), `check`
runs a built exercise and passes its verdict on, `hint` prints the hint of each."""
import os
import re
import subprocess

import pytest

CLI = os.environ["FLASHSTEP_CLI"]
SOURCE = os.environ["FLASHSTEP_SOURCE_DIR"]
CPU_DIR = os.path.join(SOURCE, "exercises", "cpu")
CPU_FOLDERS = sorted(d for d in os.listdir(CPU_DIR) if re.match(r"\d\d_", d))
STAGE_EXERCISES = sorted(os.path.relpath(os.path.join(SOURCE, "stages", d, f), SOURCE)
                         for d in os.listdir(os.path.join(SOURCE, "stages")) if re.match(r"\d\d_", d)
                         for f in os.listdir(os.path.join(SOURCE, "stages", d)) if f.startswith("exercise."))


def flashstep(*args):
    return subprocess.run([CLI, "exercise", *args], capture_output=True, text=True, timeout=120)


def rows():
    """The list's rows: number -> (name, topic, needs, built, file)."""
    r = flashstep("list")
    assert r.returncode == 0, r
    table = {}
    for line in r.stdout.splitlines():
        m = re.match(r"\s+(\d+)\s+(\S+)\s+(chapter \d+|stage \d\d|lesson \w+)\s+(CPU|GPU|Hopper GPU)\s+(yes|no CUDA build|no)\s+(\S+)$",
                     line)
        if m:
            table[int(m.group(1))] = m.groups()[1:]
    return table


def test_the_list_names_every_exercise_of_the_tree_once():
    table = rows()
    files = [row[4] for row in table.values()]
    assert sorted(table) == list(range(1, len(table) + 1)), table
    for n, folder in enumerate(CPU_FOLDERS, 1):
        assert table[n][4] == f"exercises/cpu/{folder}/attempt.cpp", (n, table[n])
        assert table[n][2] == "CPU", table[n]
    stage_files = sorted(f for f in files if f.startswith("stages/"))
    assert stage_files == STAGE_EXERCISES, (stage_files, STAGE_EXERCISES)
    for name, topic, needs, built, file in table.values():
        assert os.path.isfile(os.path.join(SOURCE, file)), file
        if file.startswith("stages/"):
            assert needs == ("CPU" if file.endswith(".cpp") else "GPU" if "07_hopper" not in file else "Hopper GPU"), file


def test_every_concept_chapter_has_a_cpu_exercise():
    chapters = {int(row[1].split()[1]) for row in rows().values() if row[1].startswith("chapter")}
    assert chapters == set(range(1, 11)), chapters


def test_check_runs_the_built_exercise_and_passes_its_verdict_on():
    r = flashstep("check", "1", "--seed", "7")
    assert r.returncode == 1, r  # the shipped attempt fails
    assert "seed 7" in r.stdout and "FAIL" in r.stdout, r.stdout
    assert "cmake --build" in r.stdout and "flashstep_exercise_cpu_01_causal_attention" in r.stdout, r.stdout
    by_name = flashstep("check", "causal_attention", "--seed", "7")
    assert by_name.returncode == 1 and by_name.stdout == r.stdout, by_name


@pytest.mark.parametrize("number", range(1, 41))
def test_every_exercise_has_a_hint(number):
    table = rows()
    if number not in table:
        pytest.skip("fewer exercises")
    r = flashstep("hint", str(number))
    assert r.returncode == 0, r
    assert r.stdout.startswith(f"exercise {number}, {table[number][0]}"), r.stdout
    assert "# Hint" in r.stdout, r.stdout


def test_a_gpu_exercise_without_a_cuda_build_says_so():
    table = rows()
    missing = [n for n, row in table.items() if row[3] == "no CUDA build"]
    if not missing:
        pytest.skip("this build has the CUDA stages")
    r = flashstep("check", str(missing[0]))
    assert r.returncode == 77, r
    assert "no CUDA stages" in r.stdout, r.stdout


@pytest.mark.parametrize("args", [["check", "0"], ["check", "nope"], ["hint", "999"], ["check"], []])
def test_a_bad_exercise_is_a_usage_error(args):
    r = flashstep(*args)
    assert r.returncode == 2, r
    assert "error" in r.stderr, r
