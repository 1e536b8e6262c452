"""Every CTest test that doctest_discover_tests made runs exactly one doctest test case,
and every test case a program lists is run by exactly one CTest test.

CTest calls a doctest program with `--test-case=<name>`. A name that CMake or doctest
cuts (a ';' splits a CMake list, an unescaped ',' splits doctest's filter, '*' and '?'
are wildcards) then selects no test case, or several: the program's own main fails a run
that selects none, but only when the test runs, which for a GPU test is on a GPU machine.
This check runs on any machine: it asks each program, with the CTest test's own
arguments, which test cases they select (`--list-test-cases` runs nothing, GPU or not).

Usage: check_ctest_names.py BUILD_DIR
"""
import concurrent.futures
import json
import subprocess
import sys


def listed(command):
    """The test case names `command` (a doctest program and its arguments) selects."""
    run = subprocess.run(command + ["--list-test-cases"], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} --list-test-cases exited {run.returncode}:\n{run.stdout}{run.stderr}")
    return [line for line in run.stdout.splitlines()
            if line and not line.startswith("[doctest]") and not line.startswith("=====")]


def main(build_dir):
    shown = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"], capture_output=True,
                           text=True, check=True)
    tests = json.loads(shown.stdout)["tests"]
    doctest_tests = []  # (CTest name, command, the test case name it passes)
    for t in tests:
        command = t.get("command") or []
        case = [a for a in command[1:] if a.startswith("--test-case=")]
        if case:
            doctest_tests.append((t["name"], command, case[0]))
    if not doctest_tests:
        print("FAIL: no doctest test found in CTest's list (was the build configured?)")
        return 1
    programs = sorted({command[0] for _, command, _ in doctest_tests})
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        every_case = dict(zip(programs, pool.map(lambda p: listed([p]), programs)))
        selected = list(pool.map(lambda t: listed(t[1]), doctest_tests))

    failures = []
    runs = {(p, case): [] for p in programs for case in every_case[p]}
    for (name, command, arg), cases in zip(doctest_tests, selected):
        if len(cases) != 1:
            failures.append(f"CTest test {name!r} ({arg}) selects {len(cases)} test cases of {command[0]}"
                            + (f": {cases}" if cases else "") + ": its name was cut or holds a wildcard")
            continue
        if not name.endswith(cases[0]):
            failures.append(f"CTest test {name!r} runs test case {cases[0]!r}, which its name does not end with")
        runs[(command[0], cases[0])].append(name)
    for (program, case), names in sorted(runs.items()):
        if len(names) != 1:
            failures.append(f"test case {case!r} of {program} is run by {len(names)} CTest tests"
                            + (f": {names}" if names else " (CTest never runs it)"))
    for f in failures:
        print("FAIL:", f)
    total = sum(len(v) for v in every_case.values())
    print(f"{len(doctest_tests)} CTest tests over {total} test cases of {len(programs)} doctest programs: "
          + ("every test resolves to exactly one test case" if not failures else f"{len(failures)} failures"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
