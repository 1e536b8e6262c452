#!/usr/bin/env python3
"""The notebooks folder, checked without running anything:
- every concept chapter (docs/concepts/NN_*.md) has a notebook with the same NN;
- each chapter refers to its notebook page (\\ref notebook_<name>);
- no notebook stores outputs or execution counts (outputs are made by running them);
- each notebook is valid nbformat 4, starts with a Markdown title, and uses the module;
- each stored GPU run (RUNS_DIR, docs/results/notebooks/: executed copies that the docs
  show, saved by scripts/gpu-python.sh) belongs to a notebook, was run from the same code,
  and names its GPU and commit.

    check_notebooks.py NOTEBOOKS_DIR CONCEPTS_DIR [RUNS_DIR]
"""
import os
import re
import sys

import nbformat


def main(argv):
    nb_dir, concepts_dir = argv[1], argv[2]
    problems = []
    notebooks = sorted(n for n in os.listdir(nb_dir) if n.endswith(".ipynb"))
    by_number = {}
    for name in notebooks:
        m = re.match(r"(\d\d)_", name)
        if not m:
            problems.append(f"{name}: name must start with a two-digit number (reading order)")
            continue
        by_number.setdefault(m.group(1), []).append(name)
        nb = nbformat.read(os.path.join(nb_dir, name), as_version=4)
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as e:
            problems.append(f"{name}: not valid nbformat: {e}")
        first = nb.cells[0] if nb.cells else None
        if first is None or first.cell_type != "markdown" or not first.source.startswith("# "):
            problems.append(f"{name}: must start with a Markdown cell '# Title'")
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
                problems.append(f"{name}: cell {i} stores outputs; clear them before committing")
        if not any("import flashstep" in c.source for c in nb.cells if c.cell_type == "code"):
            problems.append(f"{name}: never imports the flashstep module")
    for chapter in sorted(os.listdir(concepts_dir)):
        m = re.match(r"(\d\d)_.*\.md$", chapter)
        if not m:
            continue
        names = by_number.get(m.group(1), [])
        if not names:
            problems.append(f"{chapter}: no notebook numbered {m.group(1)}")
            continue
        with open(os.path.join(concepts_dir, chapter), encoding="utf-8") as f:
            text = f.read()
        for n in names:
            label = "notebook_" + n[:-len(".ipynb")]
            if f"\\ref {label}" not in text:
                problems.append(f"{chapter}: does not refer to its notebook (\\ref {label})")
    runs_dir = argv[3] if len(argv) > 3 else None
    runs = sorted(n for n in os.listdir(runs_dir) if n.endswith(".ipynb")) if runs_dir and os.path.isdir(runs_dir) else []
    for name in runs:
        run = nbformat.read(os.path.join(runs_dir, name), as_version=4)
        if name not in notebooks:
            problems.append(f"stored run {name}: no notebook of that name in {nb_dir}")
            continue
        nb = nbformat.read(os.path.join(nb_dir, name), as_version=4)
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        if code != [c.source for c in run.cells if c.cell_type == "code"]:
            problems.append(f"stored run {name}: its code differs from the notebook's; re-run "
                            "scripts/gpu-python.sh notebooks on a GPU machine and copy it again")
        meta = run.metadata.get("flashstep", {})
        if not meta.get("gpu") or not meta.get("commit"):
            problems.append(f"stored run {name}: its metadata must name the GPU and the commit it ran on")
        if any(o.get("output_type") == "error" for c in run.cells for o in c.get("outputs", [])):
            problems.append(f"stored run {name}: a cell raised in that run")
    for p in problems:
        print("PROBLEM:", p)
    print(f"{len(notebooks)} notebooks and {len(runs)} stored run(s) checked; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
