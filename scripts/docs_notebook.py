#!/usr/bin/env python3
"""Execute a notebook and render it as a page of the docs site.

    docs_notebook.py NOTEBOOK --out GENERATED_DIR
        writes GENERATED_DIR/notebooks/NAME.html (an HTML fragment: cells and outputs,
        plots embedded) and GENERATED_DIR/pages/notebook_NAME.md (the Doxygen page that
        \\htmlinclude-s it, labelled notebook_NAME).
    docs_notebook.py --index PAGE.md --notebooks NB.ipynb...   (or --no-module)
        writes the "Notebooks" page listing every notebook in file-name order.

Notebooks are stored without outputs; these outputs come from running them now, against
the module just built, so the site always shows what the code does today.
"""
import argparse
import html
import os
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


def render(path, out_dir):
    from nbconvert import HTMLExporter

    name = os.path.splitext(os.path.basename(path))[0]
    nb = notebook_run.execute(path)
    # The "basic" template gives the cells alone: no <script>, no CDN, no <html> wrapper;
    # plots are embedded as data: URIs. Doxygen's page supplies the rest of the site.
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    with open(os.path.join(out_dir, "notebooks", name + ".html"), "w", encoding="utf-8") as f:
        f.write('<div class="flashstep-notebook">\n' + body + "\n</div>\n")
    title = title_of(nb, name)
    page = [
        f"# {title} {{#{label_of(path)}}}",
        "",
        f"This page is the notebook `notebooks/{name}.ipynb`, executed while these docs were",
        "built (no GPU is needed; cells that want one say so and skip). Run it yourself:",
        "",
        "    PYTHONPATH=build/python /usr/bin/python3 -m jupyter notebook notebooks/",
        "",
        "or execute it the way the tests do:",
        "",
        f"    PYTHONPATH=build/python /usr/bin/python3 scripts/notebook_run.py notebooks/{name}.ipynb",
        "",
        f"\\htmlinclude {name}.html",
        "",
    ]
    with open(os.path.join(out_dir, "pages", f"notebook_{name}.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(page))


def index(page_path, notebooks, have_module):
    lines = ["# Notebooks {#notebooks}", ""]
    if have_module:
        lines += ["Each notebook drives the `flashstep` Python module (the CPU reference) and",
                  "was executed while this site was built. They follow the chapters' order.", ""]
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
    args = parser.parse_args()
    if args.index:
        index(args.index, args.notebooks, not args.no_module)
        return 0
    if not args.notebook or not args.out:
        parser.error("give NOTEBOOK and --out, or --index")
    try:
        render(args.notebook, args.out)
    except Exception as e:  # a failing notebook must fail the docs build, visibly
        print(f"docs_notebook.py: {args.notebook}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
