#!/usr/bin/env python3
"""The docs' stage pages: each stages/NN_name/README.md as a page, with its results.

    docs_stage_pages.py --source-dir REPO --results-dir REPO/docs/results \
                        --out GENERATED_DIR --stamp STAMP

For every stage folder (in teaching order) it writes GENERATED_DIR/pages/stage_NN_name.md:
the README, its title labelled `stage_NN_name`, links to repository files turned into
file names (the site has no copy of the sources), images copied next to the site's, and
a "Measured results" section generated from docs/results/*.json. It also writes the
"stages" index page and the results page (scripts/docs_results.py).
"""
import argparse
import glob
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import docs_results  # noqa: E402
import stage_registry  # noqa: E402

LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def outside_code(text, fix):
    """Applies `fix` to `text` with fenced code blocks and inline code spans masked, so
    that nothing Markdown shows verbatim is rewritten (a link's label may still hold an
    inline code span: the mask keeps it whole and puts it back)."""
    saved = []

    def mask(m):
        saved.append(m.group(0))
        return f"\x00{len(saved) - 1}\x00"

    masked = INLINE_CODE.sub(mask, FENCE.sub(mask, text))
    fixed = fix(masked)
    return re.sub(r"\x00(\d+)\x00", lambda m: saved[int(m.group(1))], fixed)


# A line that starts with a number and a dot ("404. The fa3 ratio ...") continues the
# paragraph above it on GitHub, where only "1." may interrupt a paragraph; Doxygen would
# start an ordered list there. Doxygen's \. writes the dot and keeps the paragraph.
NUMBER_AT_LINE_START = re.compile(r"^(\s*\d+)\.(\s)", re.M)
# GitHub's inline math, $...$ (no space inside either dollar), and display math, $$...$$,
# as Doxygen's \f$...\f$ and \f[...\f] (MathJax on the site).
DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
INLINE_MATH = re.compile(r"(?<![\\$\w])\$(?=\S)([^$\n]*?\S)\$(?![\w$])")


def github_to_doxygen(text):
    """What GitHub's Markdown and Doxygen's read differently, outside code: numbers at a
    line start inside a paragraph, and $-math."""

    def paragraph_numbers(piece):
        lines = piece.split("\n")
        for i in range(1, len(lines)):
            if not NUMBER_AT_LINE_START.match(lines[i]) or not lines[i - 1].strip():
                continue
            # the block of lines above, up to a blank line: a paragraph, unless it is a list
            # (an item, or an item's continuation), a heading, a table or a quote
            start = i
            while start > 0 and lines[start - 1].strip():
                start -= 1
            block = lines[start:i]
            if not any(re.match(r"^\s*([-*+]|\d+\.)\s|^\s*(#|\||>)", l) for l in block):
                lines[i] = NUMBER_AT_LINE_START.sub(r"\1\\.\2", lines[i], count=1)
        return "\n".join(lines)

    def math(piece):
        piece = DISPLAY_MATH.sub(lambda m: "\\f[" + m.group(1) + "\\f]", piece)
        return INLINE_MATH.sub(lambda m: "\\f$" + m.group(1) + "\\f$", piece)

    return outside_code(text, lambda piece: math(paragraph_numbers(piece)))


def stage_label(folder):
    return "stage_" + re.sub(r"[^0-9A-Za-z_]", "_", os.path.basename(folder))


def rewrite_links(text, folder, source_dir, labels, images_out):
    """Markdown links of a README, made valid inside the site (see module doc)."""

    def fix(m):
        bang, label, target = m.group(1), m.group(2), m.group(3)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            return m.group(0)  # web links and in-page anchors stay
        path = os.path.normpath(os.path.join(folder, target.split("#")[0]))
        if bang:  # an image: copy it beside the site's images
            if not os.path.isfile(path):
                raise ValueError(f"{folder}/README.md: image {target} does not exist")
            shutil.copy(path, os.path.join(images_out, os.path.basename(path)))
            return f"![{label}]({os.path.basename(path)})"
        if os.path.basename(path) == "README.md" and os.path.dirname(path) in labels:
            return f"[{label}](@ref {labels[os.path.dirname(path)]})"
        rel = os.path.relpath(path, source_dir)
        if os.path.isdir(path) and rel.replace(os.sep, "/").startswith("docs/results"):
            return f"[{label}](@ref results)"  # a results folder: the page that shows its files
        return f"{label} (`{rel}`)" if label and label != rel and label != f"`{rel}`" else f"`{rel}`"

    return outside_code(text, lambda piece: LINK.sub(fix, piece))


def stage_page(folder, source_dir, labels, results, out_dir, registry=None):
    name = os.path.basename(folder)
    with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    title_at = next((i for i, l in enumerate(lines) if l.startswith("# ")), None)
    if title_at is None:
        raise ValueError(f"{folder}/README.md: no '# Title' line")
    title = lines[title_at][2:].strip()
    lines[title_at] = f"# {title} {{#{labels[folder]}}}"
    body = rewrite_links(github_to_doxygen("\n".join(lines)), folder, source_dir, labels,
                         os.path.join(out_dir, "images"))
    if re.search(r"<!-- [\w -]*results:begin -->", text):
        # The chapter carries its own results section (bench/reports/decode_report.py's, or stage 03's,
        # 04's or 06's own markers), generated from a results JSON; point to the full page.
        section = ["", "All measured rows of every stage: \\ref results.", ""]
    else:
        section = ["", "## Measured results (generated)", ""]
        found = False
        for res, rows in docs_results.rows_for_stage(results, name):
            if rows:
                found = True
                section += ["From " + docs_results.provenance(res) + ":", "",
                            docs_results.table(rows), ""]
        if not found:
            section += [f"No benchmark rows for `{name}` in `docs/results/*.json` yet. They are",
                        "written on a GPU machine by `flashstep bench`; this section is generated",
                        "from them when the docs are built. See also \\ref results.", ""]
    section += registry_section(name, registry)
    page = os.path.join(out_dir, "pages", f"{labels[folder]}.md")
    with open(page, "w", encoding="utf-8") as f:
        f.write(body.rstrip() + "\n" + "\n".join(section))
    return title


def chapter_title(folder):
    """The '# Title' of a stage's README."""
    with open(os.path.join(folder, "README.md"), encoding="utf-8") as f:
        return next((l[2:].strip() for l in f if l.startswith("# ")), os.path.basename(folder))


def registry_section(name, registry):
    """The page's closing lines: the stage's entries in the attention registry, each with
    what it supports (StageInfo::capabilities, as `flashstep validate --list` prints it),
    and how to validate it; or, for a folder with no entry, that `flashstep validate` does
    not run it. `registry` is (entries, where they were read): stage_registry.entries()."""
    entries, where = registry if registry else ([], "")
    mine = stage_registry.for_folder(entries, name)
    lines = ["## Validating it (generated)", ""]
    if not mine:  # its own interface (06's operators, 08's ranks, 09's engine)
        names = ", ".join("`" + e["name"] + "`" for e in entries)
        listed = f" (which lists {names})" if entries else ""
        return lines + [f"Source: `stages/{name}/`. It is not an attention stage of the registry{listed}, so "
                        "`flashstep validate` does not run it; its chapter says how it is validated.", ""]
    lines += [f"Source: `stages/{name}/`. Its {'entry' if len(mine) == 1 else 'entries'} in the attention "
              f"registry, read from {where} when these docs were built:", ""]
    for e in mine:
        lines.append(f"- `{e['name']}`: {e['capabilities']}.")
    commands = " and ".join(f"`flashstep validate --stage {e['name']}`" for e in mine)
    return lines + ["", f"Validate {'it' if len(mine) == 1 else 'them'} against the CPU reference on a GPU with "
                    f"{commands}.", ""]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--results-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--cli", help="the flashstep command: its `validate --list` is the registry, where it "
                        "has the CUDA stages (else the sources are read: scripts/stage_registry.py)")
    args = parser.parse_args()
    for sub in ("pages", "images"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    for old in glob.glob(os.path.join(args.out, "pages", "stage_*.md")):
        os.remove(old)  # a stage that was renamed must not leave its old page behind
    try:
        # a tree without the registry (the course before its first CUDA stage) has no entries
        registry = (stage_registry.entries(args.source_dir, args.cli)
                    if os.path.isfile(os.path.join(args.source_dir, "stages", "registry.cpp"))
                    else ([], "no stages/registry.cpp in this tree"))
        results = docs_results.load_dir(args.results_dir)
        folders = sorted(d for d in glob.glob(os.path.join(args.source_dir, "stages", "[0-9][0-9]_*"))
                         if os.path.isfile(os.path.join(d, "README.md")))
        labels = {f: stage_label(f) for f in folders}
        docs_results.results_page(results, args.out,
                                  {os.path.basename(f): (labels[f], chapter_title(f)) for f in folders})
        index = ["# The stages {#stages}", "",
                 "Each stage changes one thing about how the GPU computes attention, says why",
                 "it is faster, and is validated against the CPU reference before it is timed.",
                 "In teaching order:", ""]
        for f in folders:
            stage_page(f, args.source_dir, labels, results, args.out, registry)
            index.append(f"- \\subpage {labels[f]}")
        if not folders:
            index += ["No stage has its chapter (`stages/NN_name/README.md`) yet."]
        index.append("")
        with open(os.path.join(args.out, "pages", "stages.md"), "w", encoding="utf-8") as fh:
            fh.write("\n".join(index))
    except (ValueError, OSError, stage_registry.RegistryError) as e:
        print(f"docs_stage_pages.py: {e}", file=sys.stderr)
        return 1
    with open(args.stamp, "w", encoding="utf-8") as fh:
        fh.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
