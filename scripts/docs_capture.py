#!/usr/bin/env python3
"""Run a command and save its standard output for the docs to quote verbatim.

    docs_capture.py OUT -- COMMAND [ARGS...]

Fails (and shows the output) if the command fails, so a chapter never quotes the output
of a broken run.
"""
import subprocess
import sys


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: docs_capture.py OUT -- COMMAND [ARGS...]")
    out, cmd = argv[1], argv[3:]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout + run.stderr)
        sys.exit(f"docs_capture.py: `{' '.join(cmd)}` exited with {run.returncode}")
    with open(out, "w", encoding="utf-8") as f:
        f.write(run.stdout)


if __name__ == "__main__":
    main(sys.argv)
