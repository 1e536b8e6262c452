"""scripts/format.sh and .clang-format, on files written here: --check flags a file the
config would change (exit 1, naming it), formatting rewrites it to the config's rules
(120 columns, Google's layout), and a formatted file then passes --check (exit 0).
Skipped, with a message, where clang-format 14 or newer is not installed."""
import os
import re
import shutil
import subprocess

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "scripts", "format.sh")

UNFORMATTED = """\
namespace flashstep{
int   add( int a,int b ){
return a+b;}
inline float scaled_sum(float first_argument_of_a_long_call, float second_argument_of_a_long_call, float scale_of_both) { return (first_argument_of_a_long_call + second_argument_of_a_long_call) * scale_of_both; }
}
"""


def clang_format_version():
    program = os.environ.get("CLANG_FORMAT", "clang-format")
    if not shutil.which(program):
        return None
    out = subprocess.run([program, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)", out)
    return int(m.group(1)) if m else None


pytestmark = pytest.mark.skipif((clang_format_version() or 0) < 14,
                                reason="clang-format 14 or newer is not installed (apt-get install clang-format)")


def run(*args):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True)


def test_check_flags_formats_and_then_passes(tmp_path):
    f = tmp_path / "unformatted.cpp"
    f.write_text(UNFORMATTED)
    checked = run("--check", str(f))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"{f}: " in checked.stdout and "1 of 1 files would change" in checked.stdout, checked.stdout
    assert f.read_text() == UNFORMATTED, "--check must not write"

    formatted = run(str(f))
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    text = f.read_text()
    assert text != UNFORMATTED
    assert "int add(int a, int b) { return a + b; }" in text, text  # Google's spacing, short body kept
    assert "}  // namespace flashstep" in text, text  # Google's namespace comment
    assert max(len(line) for line in text.splitlines()) <= 120, text

    again = run("--check", str(f))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "0 of 1 files would change" in again.stdout, again.stdout


def test_bad_arguments_are_named(tmp_path):
    bad = run("--fix")
    assert bad.returncode == 2 and "unknown option '--fix'" in bad.stderr, bad.stderr
    missing = run("--check", str(tmp_path / "absent.cu"))
    assert missing.returncode == 2 and "absent.cu" in missing.stderr, missing.stderr
    script = tmp_path / "report.py"
    script.write_text("#!/usr/bin/env python3\n# a comment\nx = {k: 1 for k in (1, 2)}\n")
    before = script.read_text()
    refused = run(str(script))
    assert refused.returncode == 2 and "report.py" in refused.stderr and "not a C++/CUDA source" in refused.stderr, \
        refused.stderr
    assert script.read_text() == before, "a file that is not C++ must be left alone"


@pytest.mark.skipif(clang_format_version() != 14,
                    reason="the tree was formatted with clang-format 14; another version may lay lines out "
                           "differently")
def test_the_tree_follows_the_config():
    if not os.path.isdir(os.path.join(SOURCE, ".git")):
        pytest.skip("not a git checkout: format.sh lists the tracked sources through git")
    checked = run("--check")
    assert checked.returncode == 0, "run scripts/format.sh on these files:\n" + checked.stdout + checked.stderr
