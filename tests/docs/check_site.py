#!/usr/bin/env python3
"""Open the built docs site and check it the way a reader would find it broken.

    check_site.py HTML_DIR

Checks, over every .html page and every .svg diagram of the site:
- every internal link (a/area href) and every resource (img/script/link/object/iframe)
  names a file that exists, and a #fragment names an id or anchor present in that file;
- no resource is loaded from the network (the site works offline: MathJax is local);
- the main page lists the course in order: the ten concept chapters in the course's
  order, then the stages, the notebooks, the results, the API reference;
- pages that use formulas load MathJax from the site, and MathJax's files are there.
Prints every problem found (file, what, target) and exits 1 if there is any.
"""
import os
import re
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

CHAPTERS = ["concept_sequence_attention", "concept_token_prediction", "concept_kv_cache",
            "concept_batching", "concept_paging", "concept_radix_tree",
            "concept_block_sparse", "concept_cascade", "concept_plan_run", "concept_sampling"]
AFTER_CHAPTERS = ["stages", "notebooks", "results", "cli", "api"]

LINK_ATTRS = {("a", "href"), ("area", "href")}
RESOURCE_ATTRS = {("img", "src"), ("script", "src"), ("link", "href"), ("iframe", "src"),
                  ("object", "data"), ("embed", "src"), ("source", "src")}


class Page(HTMLParser):
    """Collects a page's anchors (id / name) and its references, in document order."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.anchors = set()
        self.refs = []  # (kind, tag, target)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("id", "name"):
            if attrs.get(key):
                self.anchors.add(attrs[key])
        for (t, a) in LINK_ATTRS | RESOURCE_ATTRS:
            if tag == t and attrs.get(a):
                kind = "link" if (t, a) in LINK_ATTRS else "resource"
                # <link rel="..."> to a page is still a resource of the page
                self.refs.append((kind, tag, attrs[a]))
        # SVG diagrams link to pages with href / xlink:href on <a>.
        if tag == "a" and attrs.get("xlink:href"):
            self.refs.append(("link", tag, attrs["xlink:href"]))

    handle_startendtag = handle_starttag


_pages = {}


def parse(path):
    if path not in _pages:
        p = Page()
        with open(path, encoding="utf-8", errors="replace") as f:
            p.feed(f.read())
        _pages[path] = p
    return _pages[path]


def check_reference(site, page_path, kind, tag, target, problems):
    where = os.path.relpath(page_path, site)
    if target.startswith(("javascript:", "data:", "mailto:")):
        return
    url = urlsplit(target)
    if url.scheme in ("http", "https", "ftp") or target.startswith("//"):
        if kind == "resource":
            problems.append(f"{where}: <{tag}> loads {target} from the network (must be local)")
        return
    if url.scheme:
        problems.append(f"{where}: <{tag}> has an unknown scheme: {target}")
        return
    path = unquote(url.path)
    dest = page_path if path == "" else os.path.normpath(
        os.path.join(os.path.dirname(page_path), path))
    if not os.path.isfile(dest):
        problems.append(f"{where}: <{tag}> points to a missing file: {target}")
        return
    if url.fragment and dest.endswith((".html", ".svg")):
        if url.fragment not in parse(dest).anchors:
            problems.append(f"{where}: <{tag}> points to a missing anchor: {target}")


def check_course_order(site, problems):
    index = os.path.join(site, "index.html")
    if not os.path.isfile(index):
        problems.append("index.html is missing")
        return
    hrefs = [urlsplit(t).path for k, tag, t in parse(index).refs if tag == "a"]
    wanted = CHAPTERS + AFTER_CHAPTERS
    positions = []
    for label in wanted:
        page = label + ".html"
        if page not in hrefs:
            problems.append(f"index.html: the course does not link {page}")
            return
        positions.append(hrefs.index(page))
    if positions != sorted(positions):
        order = [label for _, label in sorted(zip(positions, wanted))]
        problems.append("index.html: course out of order: " + ", ".join(order))
    for label in wanted:
        if not os.path.isfile(os.path.join(site, label + ".html")):
            problems.append(f"{label}.html is missing")


def check_mathjax(site, pages, problems):
    for p in pages:
        with open(p, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if "MathJax" in text and "cdn" in text.lower() and re.search(r"https?://[^\"']*mathjax", text, re.I):
            problems.append(f"{os.path.relpath(p, site)}: loads MathJax from the network")
    for needed in ("MathJax.js", "jax/input/TeX/config.js", "jax/output/CommonHTML/jax.js"):
        if not os.path.isfile(os.path.join(site, "mathjax", needed)):
            problems.append(f"mathjax/{needed} is missing: formulas would not render offline")


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    site = os.path.abspath(argv[1])
    pages, diagrams = [], []
    for root, dirs, files in os.walk(site):
        if os.path.relpath(root, site).split(os.sep)[0] == "mathjax":
            continue  # MathJax's own files, checked by presence below
        for name in files:
            if name.endswith(".html"):
                pages.append(os.path.join(root, name))
            elif name.endswith(".svg"):
                diagrams.append(os.path.join(root, name))
    problems = []
    refs = 0
    for path in sorted(pages + diagrams):
        for kind, tag, target in parse(path).refs:
            refs += 1
            check_reference(site, path, kind, tag, target, problems)
    check_course_order(site, problems)
    check_mathjax(site, pages, problems)
    for p in problems:
        print("BROKEN:", p)
    print(f"{len(pages)} pages, {len(diagrams)} diagrams, {refs} links and resources checked; "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
