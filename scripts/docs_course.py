#!/usr/bin/env python3
"""The docs site's course: every page in reading order, with previous/next links.

    docs_course.py --index docs/index.md --pages PAGE.md|DIR... --out COURSE_DIR \
                   --layout-in docs/DoxygenLayout.xml --layout-out LAYOUT.xml

The reading order is the main page's tree of \\subpage commands, depth first: the
concept chapters, the stages page and each stage, the notebooks page and each notebook,
the results, the command, the API reference. Each page (a hand-written chapter or a
generated stage, notebook or results page) is written to COURSE_DIR with
- its title made safe for Doxygen's Markdown: "# 5. Paging" would become an ordered list
  starting at 5 (on the page and in every link to it), so the space after the dot is a
  no-break space ("5.&nbsp;Paging"), which no list starts with and which reads as a space
  on the page, in links and in the browser tab (an escaped dot, "5\\.", kept its
  backslash in the tab's <title>);
- a previous / up / next bar at its end (class "flashstep-pagenav").
The layout file gets the "Course" menu (top tabs and sidebar): the same tree, in order.
"""
import argparse
import os
import re
import sys
from xml.sax.saxutils import escape

TITLE = re.compile(r"^#\s+(.*?)\s*\{#([A-Za-z0-9_]+)\}\s*$")
SUBPAGE = re.compile(r"\\subpage\s+([A-Za-z0-9_]+)")
NUMBERED = re.compile(r"^(\d+)\.\s+")
LAYOUT_MARKER = "<!-- flashstep: the course menu (scripts/docs_course.py) -->"


class Page:
    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().splitlines()
        at = next((i for i, l in enumerate(self.lines) if l.startswith("# ")), None)
        m = TITLE.match(self.lines[at]) if at is not None else None
        if not m:
            raise ValueError(f"{path}: the first heading must read '# Title {{#label}}'")
        self.title_at = at
        self.title = m.group(1).replace("\\.", ".")  # as a reader sees it
        self.label = m.group(2)
        self.children = SUBPAGE.findall("\n".join(self.lines))


def load(paths):
    pages = {}
    for p in paths:
        files = [os.path.join(p, f) for f in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for f in files:
            if f.endswith(".md"):
                page = Page(f)
                if page.label in pages:
                    raise ValueError(f"{f}: label {page.label} also in {pages[page.label].path}")
                pages[page.label] = page
    return pages


def reading_order(root, pages):
    """[(label, parent label)], depth first from the main page's \\subpage tree."""
    order, seen = [], set()

    def walk(page):
        for child in page.children:
            if child in seen:
                continue
            if child not in pages:
                raise ValueError(f"{page.path}: \\subpage {child}: no such page")
            seen.add(child)
            order.append((child, page.label))
            walk(pages[child])

    walk(root)
    return order


def safe_title(title):
    """'5. Paging' -> '5.&nbsp;Paging' (see module doc)."""
    return NUMBERED.sub(r"\1.&nbsp;", title)


def nav_bar(i, order, pages):
    label, parent = order[i]
    parts = []
    prev = order[i - 1][0] if i > 0 else "index"
    parts.append(f"&larr; Previous: \\ref {prev}")
    if parent != "index":
        parts.append(f"Up: \\ref {parent}")
    if i + 1 < len(order):
        parts.append(f"Next: \\ref {order[i + 1][0]} &rarr;")
    return ['', '<div class="flashstep-pagenav">', " &nbsp;|&nbsp; ".join(parts), "</div>", ""]


def write_course(order, pages, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    wanted = set()
    for i, (label, _) in enumerate(order):
        page = pages[label]
        lines = list(page.lines)
        lines[page.title_at] = f"# {safe_title(page.title)} {{#{label}}}"
        name = f"{label}.md"
        wanted.add(name)
        text = "\n".join(lines).rstrip() + "\n" + "\n".join(nav_bar(i, order, pages))
        path = os.path.join(out_dir, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:  # unchanged pages keep their time stamp
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    for old in os.listdir(out_dir):  # a removed page leaves nothing behind
        if old.endswith(".md") and old not in wanted:
            os.remove(os.path.join(out_dir, old))


def menu(order, pages, indent):
    """The layout's Course menu: one <tab> per page, nested like the \\subpage tree."""
    children = {}
    for label, parent in order:
        children.setdefault(parent, []).append(label)

    def tab(label, depth):
        attrs = (f'visible="yes" title="{escape(pages[label].title, {chr(34): "&quot;"})}" '
                 f'url="@ref {label}"')
        pad = indent + "  " * depth
        kids = children.get(label, [])
        if not kids:
            return [f"{pad}<tab type=\"user\" {attrs}/>"]
        return ([f"{pad}<tab type=\"usergroup\" {attrs}>"] +
                [l for k in kids for l in tab(k, depth + 1)] + [f"{pad}</tab>"])

    # Top level: the chapters under one "Concepts" entry (they have no parent page of
    # their own), then the other parts of the course.
    top = children.get("index", [])
    chapters = [l for l in top if l.startswith("concept_")]
    rest = [l for l in top if not l.startswith("concept_")]
    lines = [f'{indent}<tab type="usergroup" visible="yes" title="Course" url="index.html">']
    if chapters:
        lines.append(f'{indent}  <tab type="usergroup" visible="yes" title="Concepts" '
                     f'url="@ref {chapters[0]}">')
        lines += [l for c in chapters for l in tab(c, 2)]
        lines.append(f"{indent}  </tab>")
    lines += [l for r in rest for l in tab(r, 1)]
    lines.append(f"{indent}</tab>")
    return lines


def write_layout(order, pages, layout_in, layout_out):
    with open(layout_in, encoding="utf-8") as f:
        text = f.read()
    at = text.find(LAYOUT_MARKER)
    if at < 0:
        raise ValueError(f"{layout_in}: no line '{LAYOUT_MARKER}'")
    line_start = text.rfind("\n", 0, at) + 1
    indent = text[line_start:at]
    text = text.replace(LAYOUT_MARKER, "\n".join(menu(order, pages, indent)).lstrip(), 1)
    with open(layout_out, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", required=True, help="the main page (docs/index.md)")
    parser.add_argument("--pages", nargs="+", required=True, help="page files or folders")
    parser.add_argument("--out", required=True, help="folder for the pages with navigation")
    parser.add_argument("--layout-in", required=True)
    parser.add_argument("--layout-out", required=True)
    parser.add_argument("--stamp")
    args = parser.parse_args()
    try:
        with open(args.index, encoding="utf-8") as f:
            root_text = f.read()
        root = type("Root", (), {"label": "index", "path": args.index,
                                 "children": SUBPAGE.findall(root_text)})()
        pages = load(args.pages)
        order = reading_order(root, pages)
        lost = sorted(set(pages) - {label for label, _ in order})
        if lost:
            raise ValueError("pages no \\subpage leads to (add them to the course): " + ", ".join(lost))
        write_course(order, pages, args.out)
        write_layout(order, pages, args.layout_in, args.layout_out)
    except (ValueError, OSError) as e:
        print(f"docs_course.py: {e}", file=sys.stderr)
        return 1
    if args.stamp:
        with open(args.stamp, "w", encoding="utf-8") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
