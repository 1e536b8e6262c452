"""What every report script shares: its command line (one parser: --results, --repo,
--check), the shapes files (bench/shapes.py, the one reader of bench/shapes*.csv), the
results files (results.py, the one reader of docs/results), and the writing of a
chapter's generated section between its marker lines, with the numbers formatted one way.
"""
import argparse
import math
import os
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
REPO = os.path.abspath(os.path.join(BENCH, ".."))
sys.path.insert(0, BENCH)
import shapes as bench_shapes  # noqa: E402  (bench/shapes.py)
from results import load, medians  # noqa: E402,F401  (bench/reports/results.py, re-exported)


def parser(doc, results="required", check=True, repo=True, what="results JSON"):
    """The argument parser every report script starts from: its description (the first line
    of `doc`), --results (`results`: "required", "optional" or None for a script that
    takes its inputs otherwise), with `repo` --repo (the checkout whose chapters and shapes
    are read and written; default: this one) and, with `check`, --check (write nothing; exit 1 where
    a chapter's section differs from what the files generate)."""
    return add_arguments(argparse.ArgumentParser(description=doc.strip().splitlines()[0]), results, check, repo,
                         what)


def add_arguments(ap, results="required", check=True, repo=True, what="results JSON"):
    """parser()'s arguments added to `ap` (a subcommand's parser, say); returns `ap`."""
    if results:
        ap.add_argument("--results", required=results == "required", help=what)
    if repo:
        ap.add_argument("--repo", default=REPO, help="the repository whose chapters are written (default: this one)")
    if check:
        ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a chapter's section differs")
    return ap


def load_shapes(repo, name="shapes.csv"):
    """The rows of bench/`name` of `repo` (bench/shapes.py's load_shapes)."""
    return bench_shapes.load_shapes(os.path.join(repo, "bench", name))


def results_path(repo, stage, name=""):
    """docs/results/<stage>/<name> of `repo`: where a stage's runs, plots and checks live."""
    return os.path.join(repo, "docs", "results", stage, name)


def save_plot(fig, out_png):
    """Writes a matplotlib figure to `out_png` (its folder made if missing) and closes it."""
    import matplotlib.pyplot as plt
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def split_chapter(chapter, begin, end, script, repo):
    """(text, head, tail) of a chapter whose generated section lies between a line `begin`
    and, after it, a line `end` (head ends before `begin`, tail starts after `end`); or
    None after saying on stderr, as `script`, what is missing."""
    shown = os.path.relpath(chapter, repo)
    if not os.path.exists(chapter):
        print(f"{script}: no chapter {shown}", file=sys.stderr)
        return None
    with open(chapter, encoding="utf-8") as f:
        text = f.read()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        print(f"{script}: {shown} needs one line `{begin}` and, after it, one line `{end}` where the section goes",
              file=sys.stderr)
        return None
    head, rest = text.split(begin, 1)
    return text, head, rest.split(end, 1)[1]


def write_section(chapter, begin, end, script, repo, render, check, before_write=None):
    """Puts render() between a chapter's `begin` and `end` lines (split_chapter; render is
    called only when the chapter has them). With `check`,
    writes nothing and says whether the chapter is up to date (0) or stale (1); otherwise
    calls `before_write` (a plot, say), writes the chapter and returns 0. 2 where the
    chapter or its markers are missing."""
    parts = split_chapter(chapter, begin, end, script, repo)
    if parts is None:
        return 2
    text, head, tail = parts
    new = head + begin + "\n" + render() + "\n" + end + tail
    if check:
        print("up to date" if new == text else "stale")
        return 0 if new == text else 1
    if before_write:
        before_write()
    with open(chapter, "w", encoding="utf-8") as f:
        f.write(new)
    return 0


def value(rows, name, key="TFLOP/s"):
    """Row `name`'s field `key` (a rate, or "median_us") as a float; None where the run has
    no such row or the row no such field."""
    r = rows.get(name)
    return None if r is None or key not in r else float(r[key])


def ratio(a, b):
    """a / b, or None where either is missing (or b is 0)."""
    return None if a is None or b is None or b == 0 else a / b


def fmt(x, digits=3):
    """`digits` significant digits with thousands separators; "–" for a missing number."""
    if x is None:
        return "–"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def shapes_file_of(run):
    """The shapes file a run measured (bench/reports/merge_results.py records it), or ""."""
    raw = run["raw"] if isinstance(run["raw"], dict) else {}
    blocks = (raw.get("flashstep"), raw.get("context"))  # a sampling file's "flashstep" is a list of rows
    return next((b["shapes_file"] for b in blocks if isinstance(b, dict) and b.get("shapes_file")), "")


def run_of_shapes(path, shapes_name, script):
    """The run in results file `path` and its rows by name, or None (after saying why on
    stderr) when it was not measured on bench/<shapes_name>."""
    run = load(path)
    measured = shapes_file_of(run)
    if not measured.endswith(shapes_name):
        print(f"{script}: {path} is a run of {measured or 'an unknown shapes file'}, not bench/{shapes_name}",
              file=sys.stderr)
        return None
    return run, by_name(run)


def by_name(run):
    """{row name: row} of a run ("02_paged/b16_kv4096_p16": its row)."""
    return {r["name"]: r for r in run["rows"]}


def context(run):
    """A run's device, commit and date (those it recorded) and its ceilings, as one dict:
    what a section's provenance line names."""
    ctx = {k: run[k] for k in ("device", "commit", "date", "tree", "command") if run[k] is not None}
    ctx.update(run["ceilings"])
    return ctx
