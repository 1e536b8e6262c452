"""scripts/notebook_exec.py (a notebook run without Jupyter, as on a GPU machine) and the
docs' use of a stored GPU run (scripts/docs_notebook.py), on small synthetic notebooks."""
import json
import os
import subprocess
import sys

import nbformat

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.join(SOURCE, "scripts"))
import docs_notebook  # noqa: E402

EXEC = os.path.join(SOURCE, "scripts", "notebook_exec.py")


def write_notebook(path, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A title")] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))
    return str(path)


def run_exec(nb_path, out_path, state=None):
    cmd = [sys.executable, EXEC, nb_path, "--save", str(out_path)]
    if state:
        cmd += ["--source-state", str(state)]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, MPLBACKEND="Agg"))


def test_exec_keeps_prints_in_order_and_the_source_state(tmp_path):
    nb = write_notebook(tmp_path / "n.ipynb", ["x = 6 * 7\nprint('first', x)", "print('second', x + 1)"])
    state = tmp_path / "source-state.txt"
    state.write_text("commit=abc1234\ntree=clean\n")
    run = run_exec(nb, tmp_path / "out.ipynb", state)
    assert run.returncode == 0, run.stderr
    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    nbformat.validate(out)
    code = [c for c in out.cells if c.cell_type == "code"]
    assert [c.outputs[0]["text"] for c in code] == ["first 42\n", "second 43\n"]
    assert [c.execution_count for c in code] == [1, 2]
    assert out.metadata["flashstep"]["commit"] == "abc1234" and out.metadata["flashstep"]["tree"] == "clean"


def test_exec_runs_in_the_notebooks_folder_and_stops_at_an_error(tmp_path):
    (tmp_path / "data.txt").write_text("hello")
    nb = write_notebook(tmp_path / "n.ipynb", ["print(open('data.txt').read())", "raise ValueError('boom')",
                                               "print('never')"])
    run = run_exec(nb, tmp_path / "out.ipynb")
    assert run.returncode == 1
    assert "FAIL" in run.stdout
    out = json.loads((tmp_path / "out.ipynb").read_text())
    code = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert code[0]["outputs"][0]["text"] == "hello\n"
    assert code[1]["outputs"][-1]["ename"] == "ValueError" and code[1]["outputs"][-1]["evalue"] == "boom"
    assert code[2].get("outputs") == []


def test_exec_turns_open_figures_into_png(tmp_path):
    nb = write_notebook(tmp_path / "n.ipynb", ["import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"])
    run = run_exec(nb, tmp_path / "out.ipynb")
    assert run.returncode == 0, run.stderr
    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    images = [o for o in out.cells[1].outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1


def test_docs_use_a_stored_run_only_when_its_code_is_the_notebooks(tmp_path):
    nb = write_notebook(tmp_path / "n.ipynb", ["print(1)"])
    stored = tmp_path / "runs"
    stored.mkdir()
    assert docs_notebook.stored_run(nb, str(stored)) is None  # none stored
    run = nbformat.read(nb, as_version=4)
    run.metadata["flashstep"] = {"gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "executed": "2026-01-01"}
    nbformat.write(run, str(stored / "n.ipynb"))
    found = docs_notebook.stored_run(nb, str(stored))
    assert found is not None
    label = docs_notebook.run_label(found)
    assert "NVIDIA H100 80GB HBM3" in label and "`abc1234`" in label
    write_notebook(tmp_path / "n.ipynb", ["print(2)"])  # the notebook changed since that run
    assert docs_notebook.stored_run(nb, str(stored)) is None


def test_exec_keeps_machine_paths_and_logs_out_of_the_stored_outputs(tmp_path):
    (tmp_path / "notebooks").mkdir()
    nb = write_notebook(tmp_path / "notebooks" / "n.ipynb", [
        "import os, sys\nprint('root is', os.path.dirname(os.getcwd()))\nprint('a log line', file=sys.stderr)"])
    run = run_exec(nb, tmp_path / "out.ipynb")
    assert run.returncode == 0, run.stderr
    assert "a log line" in run.stderr
    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    assert [o["text"] for o in out.cells[1].outputs] == ["root is <repository>\n"]
