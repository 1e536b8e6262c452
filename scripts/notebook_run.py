#!/usr/bin/env python3
"""Execute a flashstep notebook top to bottom; fail on the first cell that raises.

    notebook_run.py NOTEBOOK [--timeout SECONDS] [--save EXECUTED.ipynb]

Used by the CTest notebook suite (tests/notebooks) and by the docs build
(scripts/docs_notebook.py), so both run notebooks the same way:
- the kernel is this very interpreter (Debian's /usr/bin/python3 under CTest), through a
  private kernelspec, so a `python3` kernel registered elsewhere cannot swap in an
  interpreter without numpy or without the module;
- the `flashstep` module comes from PYTHONPATH (the build tree's python/ folder);
- cells run with the notebook's folder as working directory;
- committed notebooks must carry no outputs (they are produced here, never stored).
"""
import argparse
import json
import os
import re
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

KERNEL_NAME = "flashstep-python3"


def _private_kernelspec(root):
    """Write a kernelspec that launches sys.executable's ipykernel; return its folder."""
    spec_dir = os.path.join(root, "kernels", KERNEL_NAME)
    os.makedirs(spec_dir, exist_ok=True)
    spec = {
        # -Xfrozen_modules=off silences the debugger's start-up warning on Python 3.11.
        "argv": [sys.executable, "-Xfrozen_modules=off", "-m", "ipykernel_launcher",
                 "-f", "{connection_file}"],
        "display_name": "flashstep (this Python)",
        "language": "python",
    }
    with open(os.path.join(spec_dir, "kernel.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return root


def stored_outputs(nb):
    """Names of the code cells that carry outputs or execution counts (must be none)."""
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
            bad.append(i)
    return bad


def execute(path, timeout=300):
    """Execute the notebook at `path`; return the executed notebook node.

    Raises CellExecutionError (with the failing cell and its traceback) on error.
    """
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    bad = stored_outputs(nb)
    if bad:
        raise ValueError(f"{path}: code cells {bad} carry stored outputs; commit notebooks "
                         "without outputs (they are executed by the tests and the docs build)")
    # The kernel runs in the notebook's folder: make PYTHONPATH entries absolute first.
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)
    with tempfile.TemporaryDirectory(prefix="flashstep-kernel-") as jupyter_dir:
        os.environ["JUPYTER_PATH"] = _private_kernelspec(jupyter_dir)
        os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        client = NotebookClient(
            nb, timeout=timeout, kernel_name=KERNEL_NAME, allow_errors=False,
            resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}})
        client.execute()
    return nb


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument("--save", help="write the executed notebook here")
    args = parser.parse_args()
    start = time.time()
    try:
        nb = execute(args.notebook, args.timeout)
    except CellExecutionError as e:
        plain = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # IPython colours the traceback
        print(f"FAIL: {args.notebook}: a cell raised:\n{plain}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"FAIL: {e}", file=sys.stderr)
        return 1
    cells = sum(1 for c in nb.cells if c.cell_type == "code")
    # Show what the notebook printed, so a CTest log documents the run.
    for c in nb.cells:
        for out in c.get("outputs", []):
            if out.get("output_type") == "stream":
                sys.stdout.write(out.get("text", ""))
    if args.save:
        nbformat.write(nb, args.save)
    print(f"PASS: {args.notebook}: {cells} code cells ran in {time.time() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
