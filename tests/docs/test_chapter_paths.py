"""Every repository path a chapter names exists.

A path in backticks with a folder in it (`stages/02_paged/decode_loop.cuh`,
`03_split_kv/merge_states.cuh`, `docs/results/07_hopper/...json`) must name a file or
folder of this tree: from the repository root, from the chapter's own folder, or from
stages/ (where a stage's chapter names another stage's file). A bare file name is left
alone (it may be a header of another project or a file named in the sentence before), and
so are placeholders and what a build makes (build/bin/...). A file that moved fails here until its chapters follow.
"""
import glob
import os
import re

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
PATH = re.compile(r"`((?:\.\./)*[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?)`")
CHAPTERS = sorted(glob.glob(os.path.join(SOURCE, "stages", "[0-9][0-9]_*", "README.md")) +
                  glob.glob(os.path.join(SOURCE, "docs", "concepts", "*.md")) +
                  [os.path.join(SOURCE, f) for f in ("README.md", "ARCHITECTURE.md")])


def exists(path, chapter):
    bases = (SOURCE, os.path.dirname(chapter), os.path.join(SOURCE, "stages"))
    return any(os.path.exists(os.path.normpath(os.path.join(b, path))) for b in bases)


def test_every_path_a_chapter_names_exists():
    missing = []
    for chapter in CHAPTERS:
        with open(chapter, encoding="utf-8") as f:
            text = f.read()
        for m in PATH.finditer(text):
            path = m.group(1)
            if "." not in os.path.basename(path.rstrip("/")) and not path.endswith("/"):
                continue  # not a file name (a ratio, an option like a/b)
            if path.split("/")[0].startswith("build") or "NN" in path:
                continue  # what a build makes, or a placeholder (stages/NN_name/)
            if not exists(path, chapter):
                missing.append(f"{os.path.relpath(chapter, SOURCE)}: `{path}`")
    assert not missing, "chapters name paths that are not in the repository:\n  " + "\n  ".join(missing)
