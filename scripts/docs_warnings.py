#!/usr/bin/env python3
"""Which Doxygen warnings fail the docs build.

    docs_warnings.py WARNINGS.log --public PATH [PATH...] [--remove-on-failure FILE]

Doxygen writes every warning to WARNINGS.log (WARN_LOGFILE, format "$file:$line: $text").
Fatal ones are printed in full; missing comments on internal helpers are summed up, one
line per file with the first symbols it leaves undocumented (every warning stays in
WARNINGS.log). The build fails on:
  - any warning in a public header: a file under one of the --public paths (the
    reference's headers and stages/stage.hpp, what another project includes);
  - any warning that is not about a missing comment (a broken \\ref or link, a bad
    \\param name, a page that does not parse), wherever it is.
A missing comment on an internal helper (kernels/, a stage's own files, the harness) is
printed, not fatal: those files say what they need to in their headers and the chapters.
"""
import argparse
import os
import re
import sys

UNDOCUMENTED = re.compile(r"is not documented|are not documented|not documented\.|Member .* is not documented|"
                          r"Compound .* is not documented|parameters? .* not documented|return type of .* is not documented")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--public", nargs="+", required=True)
    p.add_argument("--remove-on-failure", help="a file to delete when the build fails (the site's stamp, "
                   "so that the next build runs again)")
    a = p.parse_args()
    public = [os.path.realpath(x) for x in a.public]
    text = open(a.log, encoding="utf-8", errors="replace").read() if os.path.exists(a.log) else ""
    # A warning starts with "<file>:<line>: warning:" (continuation lines follow it).
    entries = re.split(r"\n(?=\S[^\n]*?:\d+: warning:)", text.strip()) if text.strip() else []
    fatal = []
    for e in entries:
        m = re.match(r"(\S[^:]*):\d+: warning:", e)
        path = os.path.realpath(m.group(1)) if m else ""
        in_public = any(path == x or path.startswith(x + os.sep) for x in public)
        if in_public or not UNDOCUMENTED.search(e):
            fatal.append(e)
    for e in fatal:
        print(e)
    by_file = {}
    for e in entries:
        if e in fatal:
            continue
        m = re.match(r"(\S[^:]*):\d+: warning: (?:Member |Compound |The following parameters? of )?([\w:~<>]+)", e)
        path, symbol = (m.group(1), m.group(2)) if m else ("?", e[:60])
        root = os.path.commonpath(public) if len(public) > 1 else os.path.dirname(public[0])
        shown_path = os.path.relpath(os.path.realpath(path), root) if path != "?" else path
        by_file.setdefault(shown_path, []).append(symbol.split("::")[-1])
    for path, symbols in sorted(by_file.items()):
        shown = ", ".join(dict.fromkeys(symbols))
        print(f"docs: {path}: {len(symbols)} undocumented ({shown[:110] + ' ...' if len(shown) > 110 else shown})")
    print(f"docs: {len(entries)} Doxygen warning(s), {len(fatal)} fatal "
          f"(public headers, or not about a missing comment); all of them in {a.log}")
    if fatal and a.remove_on_failure and os.path.exists(a.remove_on_failure):
        os.remove(a.remove_on_failure)
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
