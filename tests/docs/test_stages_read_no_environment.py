"""No stage chooses its code from the environment (ARCHITECTURE.md, after "Which way data
flows"): no C++ or CUDA file under stages/ or kernels/ calls getenv, std::getenv or
secure_getenv. What won a measurement is the code; what lost is the chapter's paragraph
with its numbers, or a numbered experiment file.

Comments and string literals are left out, so a comment may name the function.

`python3 tests/docs/test_stages_read_no_environment.py [ROOT]` checks another tree (an
older commit, checked out with `git worktree add`) and prints every call, file:line first.
"""
import os
import re
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

SCANNED = ("stages", "kernels")
SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".cu", ".c", ".cc", ".cpp", ".inl")
CALL = re.compile(r"\b(?:secure_)?getenv\s*\(")
# a comment or a literal (string or character), each replaced by blanks of its length
# less its newlines, so line numbers stay right
HIDDEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def code_only(text):
    return HIDDEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def calls(root):
    """(path relative to root, line, the line) of every getenv call under SCANNED."""
    found = []
    for top in SCANNED:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs.sort()
            for name in sorted(names):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(d, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                lines = text.splitlines()
                for m in CALL.finditer(code_only(text)):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append((os.path.relpath(path, root), line, lines[line - 1].strip()))
    return sorted(found)


def test_no_stage_or_kernel_reads_the_environment():
    found = calls(SOURCE)
    assert not found, "stage code reads the environment (make the winner the code):\n" + "\n".join(
        f"{p}:{n}: {line}" for p, n, line in found)


def test_the_check_finds_a_planted_call(tmp_path):
    stage = tmp_path / "stages" / "99_planted"
    stage.mkdir(parents=True)
    (stage / "kernel.cu").write_text('// getenv("A") in a comment is fine\n'
                                     'const char* s = "getenv(B)";\n'
                                     '/* getenv("C") */ int mode() {\n'
                                     '  return std::getenv("FLASHSTEP_MODE") != nullptr;\n'
                                     '}\n')
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.cuh").write_text("bool on = secure_getenv (\"X\");\n")
    assert [(p, n) for p, n, _ in calls(str(tmp_path))] == [("kernels/k.cuh", 1),
                                                           ("stages/99_planted/kernel.cu", 4)]


if __name__ == "__main__":
    root = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else SOURCE
    hits = calls(root)
    for p, n, line in hits:
        print(f"{p}:{n}: {line}")
    print(f"{len(hits)} getenv call(s) under {', '.join(SCANNED)} of {root}")
    sys.exit(1 if hits else 0)
