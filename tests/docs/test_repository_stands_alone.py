"""The repository stands on its own: no tracked file (JSON and notebooks included) refers
to a document the repository does not ship, describes how its work was organised rather
than the software, or names a path on some machine.

Public papers and docs cited by title and link are fine, and so are ordinary words in
their ordinary sense (a page that carries a reference count, CMake's helpers). The
patterns below are written so that this file does not match them itself (main jo[b]).
Run with FLASHSTEP_STANDS_ALONE_ROOT=<folder> to check another tree (the test's own
plant check does).
"""
import os
import re
import subprocess

import pytest

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

# (what it is, pattern), matched ignoring case except where the case is the point (the
# upper-case shell variable of the output folder is not its lower-case namesake).
FORBIDDEN = [
    ("a document outside the repository", r"\.\./shar[e]d|steerin[g]|seeds/[0-9]|\bthe prime[r]\b|"
                                          r"\b(DESIG[N]|STYL[E])\.md\b"),
    ("how the work was organised", r"\bmain jo[b]\b|\bdevic[e] call|GPU imag[e]|files come bac[k]|"
                                   r"carry the buil[d]|helpers'? uncommitte[d]|"
                                   r"the issue'?s (ratio )?target[s]|targets of the issu[e]"),
    ("how the work was organised", r"(?-i:\$OU[T]\b)"),
    ("an absolute path of some machine", r"(^|[\s\"'(=:])/(home|root|work|mnt|srv|Users)/[\w.-]"),
    ("Google Benchmark's path of the binary", r"\"executabl[e]\":"),
]
# Binary files are not read; everything else is, as text.
BINARY = re.compile(r"\.(png|jpg|jpeg|gif|ico|pdf|woff2?|ttf)$")


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout.decode()
        files = [f for f in out.split("\0") if f]
        if files:
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    # Not a git checkout (a source archive): every file outside build folders.
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]
        files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return files


def hits(root):
    found = []
    compiled = [(what, re.compile(p, re.I)) for what, p in FORBIDDEN]
    for rel in tracked_files(root):
        path = os.path.join(root, rel)
        if BINARY.search(rel) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                for what, rx in compiled:
                    m = rx.search(line)
                    if m:
                        found.append(f"{rel}:{n}: {what}: ...{line[max(0, m.start() - 30):m.end() + 30].strip()}...")
    return found


def test_no_outside_references_work_traces_or_machine_paths():
    root = os.environ.get("FLASHSTEP_STANDS_ALONE_ROOT", SOURCE)
    found = hits(root)
    assert not found, "the repository should stand on its own; found:\n" + "\n".join(found[:50])


@pytest.mark.parametrize("planted", ["see ../shar" + "ed/x.md", "as DESIG" + "N.md says", "the main jo" + "b",
                                     '"executab' + 'le": "/ho' + 'me/me/bench"', "cd /wor" + "k/main", "logs under $OU" + "T/run"])
def test_a_planted_phrase_is_found(tmp_path, planted):
    (tmp_path / "notes.md").write_text("fine text\n" + planted + "\n")
    assert hits(str(tmp_path)), planted
