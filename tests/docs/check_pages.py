#!/usr/bin/env python3
"""Read the built docs site the way a learner sees it (no browser: the HTML itself).

    check_pages.py HTML_DIR SOURCE_DIR

The course is expected in this order, worked out from the source tree alone: the concept
chapters (docs/concepts/NN_*.md, by number), then the pages the main page (docs/index.md)
lists, in its order, with every stage with a chapter (stages/NN_name/README.md, by
number) after the stages page and every notebook (notebooks/NN_*.ipynb, by number) after
the notebooks page.
Checks:
- every course page exists and its title reads as written: no ordered list in it, and a
  leading "N." only where N is the page's own number (chapter 5 is "5. Paging...");
- every page's browser tab title (<title>) reads as written too: no Markdown escape left
  in it ("5\\. Paging"), the project's name once ("flashstep: flashstep: ..." is not), and
  on a course page exactly "flashstep: " and the page's title;
- no link anywhere in the site holds a list (<ol>/<ul>/<li> inside <a>): a link inside a
  sentence must stay inside the sentence;
- the main page does not number the chapters again (their titles carry the number);
- the sidebar (navtreedata.js) and the top menu (menudata.js) list every course page,
  in course order;
- every course page ends with a previous/next bar linking to its neighbours in that
  order (the first page's "previous" is the main page; the last has no "next").
Prints every problem (page, what) and exits 1 if there is any.
"""
import glob
import os
import re
import sys
from html.parser import HTMLParser

problems = []


def problem(page, what):
    problems.append(f"{page}: {what}")


def expected_course(source):
    """[(label, number or None)] in reading order: the concept chapters by file number, then
    the other pages docs/index.md lists, with every stage after "stages" and every notebook
    after "notebooks" (both by folder or file number)."""
    chapters = []
    for path in sorted(glob.glob(os.path.join(source, "docs", "concepts", "[0-9][0-9]_*.md"))):
        with open(path, encoding="utf-8") as f:
            m = re.search(r"\{#([A-Za-z0-9_]+)\}", f.readline())
        if not m:
            problem(path, "first line has no {#label}")
            continue
        chapters.append((m.group(1), int(os.path.basename(path)[:2])))
    with open(os.path.join(source, "docs", "index.md"), encoding="utf-8") as f:
        listed = re.findall(r"\\subpage\s+(\w+)", f.read())
    labels = [label for label, _ in chapters]
    if [x for x in listed if x.startswith("concept_")] != labels:
        problem("index.md", f"the main page does not list the chapters in file order: {listed}")
    course = list(chapters)
    for label in listed:
        if label.startswith("concept_"):
            continue
        course.append((label, None))
        if label == "stages":
            for d in sorted(glob.glob(os.path.join(source, "stages", "[0-9][0-9]_*"))):
                if os.path.isfile(os.path.join(d, "README.md")):
                    course.append(("stage_" + os.path.basename(d), int(os.path.basename(d)[:2])))
        elif label == "notebooks":
            for nb in sorted(glob.glob(os.path.join(source, "notebooks", "[0-9][0-9]_*.ipynb"))):
                name = os.path.splitext(os.path.basename(nb))[0]
                course.append(("notebook_" + name, int(name[:2])))
    for required in ("stages", "notebooks", "api"):
        if required not in listed:
            problem("index.md", f"the main page does not list \\subpage {required}")
    return course


class Reader(HTMLParser):
    """The page title's text and tags, lists inside links, and the previous/next bar."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title_text, self.title_tags, self.in_title = "", [], 0
        self.tab_title, self.in_tab_title = "", False
        self.link_depth, self.lists_in_links = 0, []
        self.in_nav, self.nav_links, self.current_link = 0, [], None
        self.depth_stack = []
        self.ol_depth, self.links_in_ol = 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "title":
            self.in_tab_title = True
        classes = (a.get("class") or "").split()
        if tag == "div":
            kind = "title" if "title" in classes and not self.in_title else (
                "nav" if "flashstep-pagenav" in classes else None)
            self.depth_stack.append(kind)
            if kind == "title":
                self.in_title += 1
            elif kind == "nav":
                self.in_nav += 1
        elif self.in_title:
            self.title_tags.append(tag)
        if tag == "ol":
            self.ol_depth += 1
        if tag == "a":
            self.link_depth += 1
            if self.ol_depth and a.get("href"):
                self.links_in_ol.append(a["href"])
            if self.in_nav and a.get("href"):
                self.current_link = [a["href"], ""]
        elif tag in ("ol", "ul", "li") and self.link_depth:
            self.lists_in_links.append(tag)

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_tab_title = False
        if tag == "ol":
            self.ol_depth = max(0, self.ol_depth - 1)
        if tag == "div" and self.depth_stack:
            kind = self.depth_stack.pop()
            if kind == "title":
                self.in_title -= 1
            elif kind == "nav":
                self.in_nav -= 1
        if tag == "a":
            self.link_depth = max(0, self.link_depth - 1)
            if self.current_link is not None:
                self.nav_links.append(tuple(self.current_link))
                self.current_link = None

    def handle_data(self, data):
        if self.in_tab_title:
            self.tab_title += data
        if self.in_title:
            self.title_text += data
        if self.in_nav:
            if self.current_link is not None:
                self.current_link[1] += data
            else:
                self.nav_links.append((None, data))


def read(path):
    r = Reader()
    with open(path, encoding="utf-8") as f:
        r.feed(f.read())
    return r


def nav_order(path, pattern):
    """Page file names in the order a navigation data file lists them."""
    if not os.path.isfile(path):
        problem(os.path.basename(path), "missing")
        return []
    with open(path, encoding="utf-8") as f:
        return [m.split("#")[0] for m in re.findall(pattern, f.read())]


def in_order(listed, wanted):
    """The first wanted page missing from `listed` after its predecessor, or None."""
    at = 0
    for page in wanted:
        try:
            at = listed.index(page, at) + 1
        except ValueError:
            return page
    return None


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    html_dir, source = sys.argv[1], sys.argv[2]
    course = expected_course(source)
    files = [label + ".html" for label, _ in course]

    # Titles, and the previous/next bar of every course page.
    for i, (label, number) in enumerate(course):
        path = os.path.join(html_dir, label + ".html")
        if not os.path.isfile(path):
            problem(label + ".html", "missing: the course page was not built")
            continue
        page = read(path)
        title = " ".join(page.title_text.split())
        if not title:
            problem(label + ".html", "no page title")
        if any(t in ("ol", "ul", "li") for t in page.title_tags):
            problem(label + ".html", f"the title holds a list ({page.title_tags}): {title!r}")
        lead = re.match(r"(\d+)\.", title)
        if lead and int(lead.group(1)) != number:
            problem(label + ".html", f"title starts with {lead.group(0)!r} but the page is number "
                                     f"{number}: {title!r}")
        if label.startswith("concept_") and not (lead and int(lead.group(1)) == number):
            problem(label + ".html", f"chapter {number}'s title should start with '{number}.': {title!r}")
        tab = " ".join(page.tab_title.split())
        if tab != f"flashstep: {title}":
            problem(label + ".html", f"the browser tab reads {tab!r}, not 'flashstep: ' and the title {title!r}")
        links = [(href.split("#")[0], text) for href, text in page.nav_links if href]
        prev = files[i - 1] if i > 0 else "index.html"
        nxt = files[i + 1] if i + 1 < len(files) else None
        if not links:
            problem(label + ".html", "no previous/next bar (div.flashstep-pagenav)")
            continue
        if links[0][0] != prev:
            problem(label + ".html", f"'previous' links to {links[0][0]}, expected {prev}")
        if nxt and links[-1][0] != nxt:
            problem(label + ".html", f"'next' links to {links[-1][0]}, expected {nxt}")
        if not nxt and links[-1][0] in files[:i]:
            pass  # the last page: its bar ends with "previous" or "up"
        words = " ".join(t for _, t in page.nav_links)
        if "Previous" not in words or (nxt and "Next" not in words):
            problem(label + ".html", f"the bar does not say Previous/Next: {words!r}")

    # No list inside a link on any page of the site; every tab title as written.
    for path in sorted(glob.glob(os.path.join(html_dir, "*.html"))):
        page = read(path)
        tab = " ".join(page.tab_title.split())
        if "\\" in tab or tab.startswith("flashstep: flashstep: ") or not tab:
            problem(os.path.basename(path), f"the browser tab reads {tab!r}")
        if page.lists_in_links:
            problem(os.path.basename(path), f"a link holds a list ({', '.join(page.lists_in_links)}): "
                                            "the link breaks its sentence")

    # The main page lists the chapters without numbering them a second time ("1. 1. ...").
    index = os.path.join(html_dir, "index.html")
    if os.path.isfile(index):
        numbered = [h for h in read(index).links_in_ol if h.split("#")[0] in files]
        if numbered:
            problem("index.html", f"course pages in a numbered list, numbered twice: {numbered[:3]}")
    else:
        problem("index.html", "missing")

    # The sidebar and the top menu list the course in order.
    for data, pattern in (("navtreedata.js", r'\[\s*"[^"]*",\s*"([^"]+)"'),
                          ("menudata.js", r'url:"([^"]+)"')):
        missing = in_order(nav_order(os.path.join(html_dir, data), pattern), files)
        if missing:
            problem(data, f"{missing} is not listed after the page before it in the course "
                          f"(expected order: {', '.join(files)})")

    for p in problems:
        print(p)
    print(f"check_pages.py: {len(course)} course pages, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
