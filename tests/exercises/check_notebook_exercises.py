#!/usr/bin/env python3
"""Each concept notebook's "your turn" exercise, checked without Jupyter.

A notebook NN (01..10) has two tagged code cells: `your-turn` defines the learner's
function with a blank body (it returns None), `your-turn-check` draws fresh inputs and
asserts the function's result against the reference. For each notebook:

1. as shipped, the check cell runs, raises nothing and asks for the blank to be filled
   (so the notebook still runs top to bottom in CI);
2. with the solution of exercises/notebooks/NN_name.py, the check cell says "correct";
3. with that solution's answer spoiled (one number, flag or entry changed), the check
   cell fails (its assert, or the reference refusing the array): the check compares.

    check_notebook_exercises.py NOTEBOOKS_DIR SOLUTIONS_DIR
"""
import contextlib
import io
import json
import os
import re
import sys

import numpy as np


def tagged(nb, tag):
    cells = [c for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError(f"expected one cell tagged {tag!r}, found {len(cells)}")
    source = cells[0]["source"]
    return "".join(source) if isinstance(source, list) else source


def spoiled(answer):
    """The answer with one entry changed: an int + 1, a number + 1, a flag flipped."""
    if isinstance(answer, tuple):
        return (spoiled(answer[0]),) + answer[1:]
    if isinstance(answer, (bool, np.bool_)):
        return not answer
    if isinstance(answer, (int, np.integer)):
        return answer + 1
    a = np.array(answer, copy=True)
    if a.dtype == bool:
        a.flat[0] = not a.flat[0]
    elif a.size:
        a.flat[-1] = a.flat[-1] + 1 if np.isfinite(a.flat[-1]) else 0
    else:
        a = np.zeros(1, dtype=a.dtype)  # an empty answer becomes a non-empty one
    return a


def run(attempt, check, solution=None, spoil=False):
    """Executes the two cells (the attempt replaced by `solution`); returns what they print."""
    ns = {}
    exec(attempt, ns)
    if solution is not None:
        exec(solution, ns)
    if spoil:
        names = re.findall(r"^def (my_\w+)\(", attempt, re.M)
        right = ns[names[0]]
        ns[names[0]] = lambda *args: spoiled(right(*args))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(check, ns)
    return out.getvalue()


def main(nb_dir, solutions_dir):
    problems = []
    names = sorted(n[:-len(".ipynb")] for n in os.listdir(nb_dir) if re.match(r"(0[1-9]|10)_.*\.ipynb$", n))
    if len(names) != 10:
        problems.append(f"expected the ten concept notebooks 01..10, found {names}")
    for name in names:
        with open(os.path.join(nb_dir, name + ".ipynb"), encoding="utf-8") as f:
            nb = json.load(f)
        try:
            attempt, check = tagged(nb, "your-turn"), tagged(nb, "your-turn-check")
            with open(os.path.join(solutions_dir, name + ".py"), encoding="utf-8") as f:
                solution = f.read()
        except (ValueError, OSError) as e:
            problems.append(f"{name}: {e}")
            continue
        try:
            shipped = run(attempt, check)
            if "your turn" not in shipped:
                problems.append(f"{name}: as shipped, the check should ask for the blank; it printed {shipped!r}")
        except Exception as e:  # noqa: BLE001 (any error is the finding)
            problems.append(f"{name}: as shipped, the check raised {type(e).__name__}: {e}")
        try:
            solved = run(attempt, check, solution)
            if "correct" not in solved:
                problems.append(f"{name}: with the solution, the check should say correct; it printed {solved!r}")
        except Exception as e:  # noqa: BLE001
            problems.append(f"{name}: with the solution, the check raised {type(e).__name__}: {e}")
        try:
            run(attempt, check, solution, spoil=True)
            problems.append(f"{name}: a spoiled solution passed the check: it does not compare")
        except Exception:  # noqa: BLE001 (an assert, or the reference refusing a wrong array)
            pass
        print(f"{name}: waits as shipped, passes solved, fails spoiled" if not any(
            p.startswith(name) for p in problems) else f"{name}: PROBLEM")
    for p in problems:
        print("PROBLEM:", p)
    print(f"{len(names)} notebook exercises checked; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
