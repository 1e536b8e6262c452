#!/usr/bin/env python3
"""Run a command and save its standard output for the docs to quote verbatim.

    docs_capture.py OUT [--wrap COLUMNS] -- COMMAND [ARGS...]

Fails (and shows the output) if the command fails, so a chapter never quotes the output
of a broken run. With --wrap (for `--help` texts), a line longer than COLUMNS is wrapped
at spaces, its continuation lines indented to where the line's text column starts (an
option's description, after the gap that follows the option), so that the page shows the
help within its width, laid out as the command lays it out.
"""
import re
import subprocess
import sys
import textwrap

# "  --seed INT                  Seed of ...": the description starts after a gap of 2+ spaces
OPTION_LINE = re.compile(r"^(\s*\S.*?\s{2,})(\S.*)$")


def wrap_help(text, columns):
    """`text` with each option whose description runs past `columns` re-flowed: the
    option line and the lines that continue its description (indented to its description
    column) joined, then wrapped at spaces to `columns`, continuations indented to that
    column. Other long lines are wrapped at their own indent. Lines that fit stay as the
    command wrote them."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        m = OPTION_LINE.match(line)
        if m and len(m.group(1)) <= columns // 2:
            head, body = m.group(1), [m.group(2)]
            j = i + 1
            while j < len(lines) and lines[j].startswith(" " * len(head)) and lines[j][len(head):len(head) + 1] != " " \
                    and lines[j].strip():
                body.append(lines[j].strip())
                j += 1
            entry = lines[i:j]
            if max(len(l) for l in entry) > columns:
                pieces = textwrap.wrap(" ".join(body), width=max(20, columns - len(head)), break_long_words=False,
                                       break_on_hyphens=False)
                entry = [head + pieces[0]] + [" " * len(head) + p for p in pieces[1:]]
            out += entry
            i = j
            continue
        if len(line) > columns:  # a line of text: keep its own indent
            indent = len(line) - len(line.lstrip())
            pieces = textwrap.wrap(line[indent:], width=max(20, columns - indent), break_long_words=False,
                                   break_on_hyphens=False)
            out += [line[:indent] + p for p in pieces]
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def main(argv):
    args = argv[1:]
    if "--" not in args or args.index("--") < 1:
        sys.exit("usage: docs_capture.py OUT [--wrap COLUMNS] -- COMMAND [ARGS...]")
    split = args.index("--")
    out, options, cmd = args[0], args[1:split], args[split + 1:]
    wrap = None
    if options:
        if len(options) != 2 or options[0] != "--wrap" or not options[1].isdigit():
            sys.exit("usage: docs_capture.py OUT [--wrap COLUMNS] -- COMMAND [ARGS...]")
        wrap = int(options[1])
    if not cmd:
        sys.exit("usage: docs_capture.py OUT [--wrap COLUMNS] -- COMMAND [ARGS...]")
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        sys.exit(f"docs_capture.py: `{' '.join(cmd)}` exited with {run.returncode}")
    with open(out, "w", encoding="utf-8") as f:
        f.write(wrap_help(run.stdout, wrap) if wrap else run.stdout)


if __name__ == "__main__":
    main(sys.argv)
