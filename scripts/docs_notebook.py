#!/usr/bin/env python3
"""Execute a notebook and render it as a page of the docs site.

    docs_notebook.py NOTEBOOK --out GENERATED_DIR [--stored RUNS_DIR]
        writes GENERATED_DIR/notebooks/NAME.html (an HTML fragment: cells and outputs,
        plots embedded) and GENERATED_DIR/pages/notebook_NAME.md (the Doxygen page that
        \\htmlinclude-s it, labelled notebook_NAME). With --stored, a notebook that has a
        current executed copy there (a GPU run saved by scripts/gpu-python.sh) is shown
        with that run's outputs, labelled with its GPU and commit, instead of being run.
    docs_notebook.py --index PAGE.md --notebooks NB.ipynb...   (or --no-module)
        writes the "Notebooks" page listing every notebook in file-name order.

Notebooks are stored without outputs; these outputs come from running them now, against
the module just built, so the site always shows what the code does today, except where a
stored GPU run of the same code exists (GPU cells skip on the machine that builds docs).
"""
import argparse
import html
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nbformat  # noqa: E402

import notebook_run  # noqa: E402


def title_of(nb, fallback):
    """The first Markdown heading of the notebook, without its '#'."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def label_of(path):
    return "notebook_" + os.path.splitext(os.path.basename(path))[0]


def code_sources(nb):
    """The code cells' sources, in order: what a stored run must share with its notebook."""
    return [c.source for c in nb.cells if c.cell_type == "code"]


def stored_run(path, stored_dir):
    """The executed copy of `path` in `stored_dir` (a GPU run that scripts/gpu-python.sh
    saved, with the GPU and commit in its metadata), when one exists and its code is the
    notebook's; else None (then the notebook is executed here, as usual)."""
    if not stored_dir:
        return None
    stored = os.path.join(stored_dir, os.path.basename(path))
    if not os.path.exists(stored):
        return None
    nb = nbformat.read(stored, as_version=4)
    if code_sources(nb) != code_sources(nbformat.read(path, as_version=4)):
        print(f"docs_notebook.py: {stored} was run from other code than {path}; executing the notebook "
              "here instead (re-run scripts/gpu-python.sh notebooks to refresh it)", file=sys.stderr)
        return None
    return nb


def commits_since(commit, repo):
    """How many commits the tree at `repo` is past `commit` (None where git cannot tell)."""
    try:
        run = subprocess.run(["git", "-C", repo, "rev-list", "--count", f"{commit}..HEAD"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return int(run.stdout) if run.returncode == 0 and run.stdout.strip().isdigit() else None


def run_label(nb, repo=None):
    """Sentences naming where a stored run happened, from its metadata, and, where git can
    tell, how far the tree these docs come from has moved since: the outputs are that
    run's, not this build's."""
    meta = nb.metadata.get("flashstep", {})
    tree = " (a tree with changes)" if meta.get("tree") == "modified" else ""
    commit = meta.get("commit", "unknown")
    text = (f"The outputs below are not from this build: they come from a run on an "
            f"{meta.get('gpu', 'unknown GPU')} at commit `{commit}`{tree}, {meta.get('executed', 'date unknown')} "
            f"(PyTorch {meta.get('torch', '?')}), stored in `docs/results/notebooks/` by `scripts/gpu-python.sh "
            "notebooks`.")
    later = commits_since(commit, repo) if repo and commit != "unknown" else None
    if later:
        text += (f" The tree these docs were built from is {later} commit{'s' if later != 1 else ''} later: "
                 "the stages and their speeds may have changed since; a new run on a GPU refreshes them.")
    return text + " Without a GPU its GPU cells skip, and the tests check that they do."


def render(path, out_dir, stored_dir=None):
    from nbconvert import HTMLExporter

    name = os.path.splitext(os.path.basename(path))[0]
    nb = stored_run(path, stored_dir)
    stored = nb is not None
    if not stored:
        nb = notebook_run.execute(path)
    title = title_of(nb, name)
    # The page's title is the notebook's first heading: shown once, not twice.
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            lines = cell.source.splitlines()
            if lines and lines[0].startswith("# "):
                cell.source = "\n".join(lines[1:]).lstrip("\n")
            break
    # The "basic" template gives the cells alone: no <script>, no CDN, no <html> wrapper;
    # plots are embedded as data: URIs. Doxygen's page supplies the rest of the site.
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    with open(os.path.join(out_dir, "notebooks", name + ".html"), "w", encoding="utf-8") as f:
        f.write('<div class="flashstep-notebook">\n' + body + "\n</div>\n")
    if stored:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        intro = [f"This page is the notebook `notebooks/{name}.ipynb`. {run_label(nb, repo)} Execute it",
                 "yourself after the README's commands, the way the tests do (it prints each cell's output):"]
    else:
        intro = [f"This page is the notebook `notebooks/{name}.ipynb`, executed while these docs were",
                 "built (no GPU is needed; cells that want one say so and skip). Execute it yourself",
                 "after the README's commands, the way the tests do (it prints each cell's output):"]
    page = [
        f"# {title} {{#{label_of(path)}}}",
        "",
        *intro,
        "",
        f"    PYTHONPATH=build/python /usr/bin/python3 scripts/notebook_run.py notebooks/{name}.ipynb",
        "",
        "or open it in Jupyter to change and re-run cells (Debian's Jupyter is not among the",
        "packages the README's commands install):",
        "",
        "    sudo apt-get install jupyter-notebook",
        "    PYTHONPATH=$PWD/build/python jupyter notebook notebooks/   # absolute: the kernel runs in notebooks/",
        "",
        f"\\htmlinclude {name}.html",
        "",
    ]
    with open(os.path.join(out_dir, "pages", f"notebook_{name}.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(page))


def highlight_css(path):
    """Colours for the notebooks' code (nbconvert marks tokens with Pygments classes)."""
    from pygments.formatters import HtmlFormatter
    with open(path, "w", encoding="utf-8") as f:
        f.write("/* Generated by scripts/docs_notebook.py from Pygments' default style. */\n")
        prefix = ".flashstep-notebook .highlight"
        rules = HtmlFormatter().get_style_defs(prefix).splitlines()
        # Only the token colours: Pygments also emits global rules (pre, line numbers).
        f.write("\n".join(r for r in rules if r.startswith(prefix)) + "\n")


def index(page_path, notebooks, have_module):
    lines = ["# Notebooks {#notebooks}", ""]
    if have_module:
        lines += ["Each notebook drives the `flashstep` Python module (the CPU reference; notebooks",
                  "11 and 12 also the GPU stages through `flashstep.cuda`) and was executed while",
                  "this site was built, or, for GPU notebooks, on a GPU machine (each page says",
                  "which). They follow the chapters' order.", ""]
    else:
        lines += ["This build has no Python module (configured with",
                  "`-DFLASHSTEP_BUILD_PYTHON=OFF`), so the notebooks were not executed or",
                  "rendered here; each page below only names its file in `notebooks/`.", ""]
    pages_dir = os.path.dirname(page_path)
    current = {label_of(n) + ".md" for n in notebooks}
    for old in os.listdir(pages_dir):  # a removed or renamed notebook leaves no page behind
        if old.startswith("notebook_") and old.endswith(".md") and old not in current:
            os.remove(os.path.join(pages_dir, old))
    for nb_path in sorted(notebooks):
        name = os.path.basename(nb_path)
        lines.append(f"- \\subpage {label_of(nb_path)} (`{html.escape(name)}`)")
        if not have_module:  # a placeholder, so that the chapters' references resolve
            title = title_of(nbformat.read(nb_path, as_version=4), name)
            with open(os.path.join(pages_dir, label_of(nb_path) + ".md"), "w", encoding="utf-8") as f:
                f.write(f"# {title} {{#{label_of(nb_path)}}}\n\nNot executed in this build (no Python "
                        f"module): see `notebooks/{name}`.\n")
    lines.append("")
    with open(page_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?")
    parser.add_argument("--out", help="generated docs folder")
    parser.add_argument("--index", help="write the notebook index page here")
    parser.add_argument("--notebooks", nargs="*", default=[])
    parser.add_argument("--no-module", action="store_true")
    parser.add_argument("--css", help="also write the code highlighting stylesheet here")
    parser.add_argument("--stored", help="folder of executed notebooks from a GPU run (docs/results/notebooks)")
    args = parser.parse_args()
    if args.index:
        index(args.index, args.notebooks, not args.no_module)
        if args.css:
            highlight_css(args.css)
        return 0
    if not args.notebook or not args.out:
        parser.error("give NOTEBOOK and --out, or --index")
    try:
        render(args.notebook, args.out, args.stored)
    except Exception as e:  # a failing notebook must fail the docs build, visibly
        print(f"docs_notebook.py: {args.notebook}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
