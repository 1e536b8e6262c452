#!/usr/bin/env python3
"""Execute a notebook's code cells in this interpreter, without Jupyter, and save it with
its outputs: for a GPU machine whose Python has no nbclient or ipykernel.

    notebook_exec.py NOTEBOOK --save EXECUTED.ipynb [--source-state FILE]

Cells run top to bottom in one namespace, in the notebook's folder, as a kernel would
run them (the last expression of a cell is not echoed: the notebooks print what they
show). Printed text (stdout, with the repository's path replaced by "<repository>")
becomes stream outputs; stderr, where libraries log, stays in the run's log; every matplotlib figure a cell leaves open
becomes a PNG output. The saved notebook records in its metadata (``flashstep``) the
GPU, the Python and PyTorch versions, the date, and the commit and tree state from a
build's source-state.txt, which the docs site shows above the outputs
(scripts/docs_notebook.py). Stops at the first cell that raises (exit status 1); the
saved notebook then holds the traceback.
"""
import argparse
import base64
import contextlib
import datetime
import io
import json
import os
import sys
import traceback
import warnings


def source_of(cell):
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def figures_as_outputs():
    """PNG display_data outputs of every open matplotlib figure, which are then closed."""
    if "matplotlib.pyplot" not in sys.modules:
        return []
    import matplotlib.pyplot as plt
    outputs = []
    for number in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(number).savefig(buf, format="png", bbox_inches="tight")
        outputs.append({"output_type": "display_data", "metadata": {},
                        "data": {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                                 "text/plain": ["<Figure>"]}})
    plt.close("all")
    return outputs


def run_metadata(source_state):
    meta = {"executed": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": sys.version.split()[0]}
    try:
        import torch
        meta["torch"] = torch.__version__
        if torch.cuda.is_available():
            meta["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    if source_state and os.path.exists(source_state):
        with open(source_state, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key in ("commit", "tree"):
                    meta[key] = value
    return meta


def execute(path, source_state=None):
    """Runs the notebook at `path`; returns (notebook dict with outputs, ok)."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    namespace = {"__name__": "__main__"}
    os.environ.setdefault("MPLBACKEND", "Agg")
    # plt.show() on the Agg backend only warns; the figures are collected after each cell.
    warnings.filterwarnings("ignore", message=".*non-interactive.*")
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path)))
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))  # notebooks/ is in the repository's root
    ok, count = True, 0
    try:
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            count += 1
            cell["execution_count"] = count
            out = io.StringIO()
            outputs = []
            try:
                # stdout only: libraries' logs and warnings (stderr) stay in the run's log
                with contextlib.redirect_stdout(out):
                    exec(compile(source_of(cell), f"<cell {count}>", "exec"), namespace)  # noqa: S102
            except Exception as e:  # noqa: BLE001  (recorded in the notebook, then we stop)
                ok = False
                outputs.append({"output_type": "error", "ename": type(e).__name__, "evalue": str(e),
                                "traceback": traceback.format_exc().splitlines()})
            text = out.getvalue().replace(root, "<repository>")  # no machine's paths in a stored run
            if text:
                outputs.insert(0, {"output_type": "stream", "name": "stdout", "text": text})
            outputs += figures_as_outputs()
            cell["outputs"] = outputs
            sys.stdout.write(out.getvalue())
            if not ok:
                print(outputs[-1]["traceback"][-1] if outputs[-1].get("traceback") else "", file=sys.stderr)
                break
    finally:
        os.chdir(here)
    nb.setdefault("metadata", {})["flashstep"] = run_metadata(source_state)
    return nb, ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook")
    parser.add_argument("--save", required=True, help="write the executed notebook here")
    parser.add_argument("--source-state", help="a build's source-state.txt (commit, tree)")
    args = parser.parse_args()
    nb, ok = execute(args.notebook, args.source_state)
    with open(args.save, "w", encoding="utf-8") as f:
        json.dump(nb, f, indent=1, ensure_ascii=False)
        f.write("\n")
    meta = nb["metadata"]["flashstep"]
    print(f"{'PASS' if ok else 'FAIL'}: {args.notebook} -> {args.save} ({meta.get('gpu', 'no GPU')}, "
          f"commit {meta.get('commit', '?')})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
