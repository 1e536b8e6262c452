#!/usr/bin/env python3
"""The text index of the docs site's pages, for the course's text search (docs/search_text.md).

    docs_search.py HTML_DIR        writes HTML_DIR/search_text_index.js

Doxygen's own search box finds symbols and page titles only, from the start of the name:
its client-side engine has no full-text index, and the full-text one (doxysearch) needs a
web server. The site is read offline, from files, so this script indexes the text of every
page (the chapters, stages, notebooks, results, command and API pages; not the
per-symbol reference pages, which Doxygen's box already finds) after Doxygen has written
them: one entry per section, with its page, anchor, heading and text. The search page's
script (docs/search_text.js) reads it from a <script> tag, which works from file:// where
a fetch() of a JSON file would not.
"""
import html
import html.parser
import json
import os
import sys

MAX_SECTION_TEXT = 6000  # characters kept per section: enough to find it, small enough to load fast
SKIP_TAGS = {"script", "style", "head"}


class _PageText(html.parser.HTMLParser):
    """The sections of a Doxygen page: (anchor, heading, text) for the text before the
    first heading and under each <h1>-<h3> of the page's contents."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title, self.sections = "", []
        self._skip = 0
        self._in_title = self._in_contents = False
        self._depth = 0  # <div> depth inside div.contents
        self._heading = None  # [anchor, text] of the heading being read
        self._pending_anchor = ""
        self._current = ["", "", []]

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in SKIP_TAGS:
            self._skip += 1
        if tag == "div" and "headertitle" in (a.get("class") or ""):
            self._in_title = True
        if tag == "div" and not self._in_contents and (a.get("class") or "") == "contents":
            self._in_contents, self._depth = True, 0
        elif tag == "div" and self._in_contents:
            self._depth += 1
        if not self._in_contents:
            return
        if tag == "a" and "anchor" in (a.get("class") or "") and a.get("id"):
            if self._heading is not None:  # Doxygen puts a heading's anchor inside it
                self._heading[0] = a["id"]
            else:
                self._pending_anchor = a["id"]
        if tag in ("h1", "h2", "h3"):
            self._heading = [self._pending_anchor, []]
            self._pending_anchor = ""

    def handle_endtag(self, tag):
        if tag in SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        if tag == "div" and self._in_title:
            self._in_title = False
        if tag == "div" and self._in_contents:
            if self._depth == 0:
                self._in_contents = False
            else:
                self._depth -= 1
        if tag in ("h1", "h2", "h3") and self._heading is not None:
            self._close()
            anchor, words = self._heading
            self._current = [anchor, " ".join("".join(words).split()), []]
            self._heading = None

    def handle_data(self, data):
        if self._skip:
            return
        if self._in_title:
            self.title += data
        elif self._heading is not None:
            self._heading[1].append(data)
        elif self._in_contents:
            self._current[2].append(data)

    def _close(self):
        anchor, heading, words = self._current
        text = " ".join("".join(words).split())
        if text or heading:
            self.sections.append((anchor, heading, text[:MAX_SECTION_TEXT]))

    def finish(self):
        self._close()
        return " ".join(self.title.split()), self.sections


def is_course_page(path, text):
    """A page of the course (a Doxygen \\page, the main page), not a symbol's or a file's."""
    name = os.path.basename(path)
    return name == "index.html" or ("<!-- PageDoc -->" in text and not name.startswith(("search", "__")))


def index_site(html_dir):
    pages = []
    for name in sorted(os.listdir(html_dir)):
        if not name.endswith(".html"):
            continue
        path = os.path.join(html_dir, name)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if not is_course_page(path, text) or name == "search_text.html":
            continue
        parser = _PageText()
        parser.feed(text)
        title, sections = parser.finish()
        pages.append({"p": name, "t": title or name,
                      "s": [{"a": a, "h": h, "x": x} for a, h, x in sections]})
    return pages


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        print(__doc__, file=sys.stderr)
        return 2
    pages = index_site(argv[1])
    if not pages:
        print(f"docs_search.py: no pages found in {argv[1]}", file=sys.stderr)
        return 1
    out = os.path.join(argv[1], "search_text_index.js")
    with open(out, "w", encoding="utf-8") as f:
        f.write("// Generated by scripts/docs_search.py: the text of every page, by section.\n")
        f.write("var FLASHSTEP_TEXT_INDEX = " + json.dumps(pages, ensure_ascii=False, separators=(",", ":")) + ";\n")
    sections = sum(len(p["s"]) for p in pages)
    print(f"docs_search.py: {len(pages)} pages, {sections} sections indexed -> {out} "
          f"({os.path.getsize(out) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
