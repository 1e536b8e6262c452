"""Every repository path a chapter names exists.

The chapters are the stage chapters (stages/NN_name/README.md), the docs pages
(docs/*.md, docs/concepts/*.md), README.md and ARCHITECTURE.md. A path they name is
checked in three forms:

- In backticks, with a folder in it. One that starts at a top-level folder of the tree
  (`kernels/...`, `stages/...`, `bench/...`, `docs/...`, `scripts/...`, `tests/...`,
  `python/...`, and the other top-level folders) must exist from the repository root, a
  folder as well as a file; a pattern (`docs/results/*.json`) must match something. Any
  other path with a file name (`03_split_kv/merge_states.cuh`, `../02_paged/...`) must
  exist from the root, from the chapter's own folder, or from stages/ (where a stage's
  chapter names another stage's file).
- As a link target, `[text](target)`, `href="..."` or `src="..."`: resolved from the
  chapter's folder, as a Markdown viewer does; web addresses and #anchors are left alone.
- In plain text, a file under a top-level folder (`kernels/flashstep/kernels/state.cuh`
  in a sentence or a generated table) must exist from the root.

A bare file name is left alone (it may be a header of another project or a file named in
the sentence before), and so are placeholders (NN_name, <stage>) and what a build makes
(build/bin/...). So is the command a results file recorded, quoted by a generated section
after "command" or "Command:" in backticks: it is the command as it ran, at the commit the
run names, with that commit's paths. A file that moved fails here until its chapters follow.
"""
import glob
import os
import re

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
TOP = ("kernels", "stages", "bench", "docs", "scripts", "tests", "python", "reference", "capi", "cli",
       "notebooks", "cmake")
CHAPTERS = sorted(glob.glob(os.path.join(SOURCE, "stages", "*", "README.md")) +
                  glob.glob(os.path.join(SOURCE, "docs", "*.md")) +
                  glob.glob(os.path.join(SOURCE, "docs", "concepts", "*.md")) +
                  [os.path.join(SOURCE, f) for f in ("README.md", "ARCHITECTURE.md")])

TICKED = re.compile(r"`((?:\.\./)*[A-Za-z0-9_.*-]+(?:/[A-Za-z0-9_.*-]+)+/?)`")
LINKED = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=\"([^\"]+)\"")
PLAIN = re.compile(r"(?<![\w./`<-])((?:%s)/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.[A-Za-z0-9]+)\b" % "|".join(TOP))


RECORDED = re.compile(r"[Cc]ommand:? `[^`\n]*`")


def without_recorded_commands(text):
    """`text` less the commands results files recorded (the module's doc)."""
    return RECORDED.sub("", text)


def placeholder(path):
    return "NN" in path or "<" in path or path.split("/")[0].startswith("build")


def exists_from(base, path):
    full = os.path.normpath(os.path.join(base, path))
    return bool(glob.glob(full)) if "*" in path else os.path.exists(full)


def broken_ticked(text, folder, root=SOURCE):
    broken = []
    for path in TICKED.findall(text):
        if placeholder(path):
            continue
        if path.split("/")[0] in TOP:
            if not exists_from(root, path):
                broken.append(path)
            continue
        if "." not in os.path.basename(path.rstrip("/")) and not path.endswith("/"):
            continue  # not a file name (a ratio, an option like a/b)
        if not any(exists_from(b, path) for b in (root, folder, os.path.join(root, "stages"))):
            broken.append(path)
    return broken


def broken_linked(text, folder):
    broken = []
    for m in LINKED.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            continue  # a web address, a mailto:, an anchor on the same page
        path = target.split("#")[0].split("?")[0]
        if path and not placeholder(path) and not exists_from(folder, path):
            broken.append(target)
    return broken


def broken_plain(text, root=SOURCE):
    return [p for p in PLAIN.findall(text) if not placeholder(p) and not exists_from(root, p)]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def test_the_chapters_are_found():
    names = {os.path.relpath(c, SOURCE) for c in CHAPTERS}
    for name in ("README.md", "ARCHITECTURE.md", "stages/02_paged/README.md", "docs/python_gpu.md",
                 "docs/concepts/08_cascade.md"):
        assert name in names, sorted(names)


def test_a_moved_file_is_caught_in_each_form():
    # What the checks must find, in a chapter written in stages/02_paged/.
    folder = os.path.join(SOURCE, "stages", "02_paged")
    text = ("the loop in `kernels/decode_loop.cuh` and `stages/02_paged/decode_loop.cuh`; "
            "[the kernel](decode_loop.cuh), [gone](../02_paged/gone.cuh), "
            "[anchor](#the-kernel), [site](https://docs.flashinfer.ai/x.html); "
            "a table cell: v5 (kernels/decode_loop.cuh, ee57f3e), see kernels/flashstep/kernels/state.cuh; "
            "a folder `stages/harness/` and one that is not there, `stages/harnesses`; "
            "a pattern `docs/results/*/*.json` and `docs/results/*.nothing`; "
            "placeholders `stages/NN_name/`, build/bin/flashstep, `docs/results/<stage>/x.json`; "
            "a copy at https://github.com/o/r/blob/main/kernels/missing.cuh")
    assert broken_ticked(text, folder) == ["kernels/decode_loop.cuh", "stages/harnesses",
                                           "docs/results/*.nothing"]
    assert broken_linked(text, folder) == ["../02_paged/gone.cuh"]
    assert broken_plain(text) == ["kernels/decode_loop.cuh"]
    # a recorded command keeps the paths it ran with; the same path in a sentence is checked
    recorded = "Command: `bench/gone_run.sh build-gpu/bin <out>`; and bench/gone_run.sh in a sentence"
    assert broken_plain(without_recorded_commands(recorded)) == ["bench/gone_run.sh"]


def test_every_path_a_chapter_names_exists():
    missing = []
    for chapter in CHAPTERS:
        text, folder = without_recorded_commands(read(chapter)), os.path.dirname(chapter)
        name = os.path.relpath(chapter, SOURCE)
        missing += [f"{name}: `{p}` (in backticks)" for p in broken_ticked(text, folder)]
        missing += [f"{name}: ({p}) (a link, from {os.path.relpath(folder, SOURCE)}/)"
                    for p in broken_linked(text, folder)]
        missing += [f"{name}: {p} (in the text)" for p in broken_plain(text)]
    assert not missing, "chapters name paths that are not in the repository:\n  " + "\n  ".join(missing)
