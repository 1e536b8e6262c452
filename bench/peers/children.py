"""FlashInfer's peers in child processes: its kernels compile on first use, and a module
that fails to load can end the process that loads it, so bench/peers/attention.py times
FlashInfer in children with a time limit (--flashinfer-timeout), after SDPA; a child that
dies or runs out of time leaves error rows for the shapes it did not finish, and the JSON
(written after every shape) keeps what was measured.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

from timing import print_rows, write_json

ATTENTION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.py")


def flashinfer_all(args, shapes, sets, on_shape):
    """FlashInfer's rows, timed in child processes, handed to on_shape(shape, rows) shape by
    shape as they come (so the caller can write its JSON after each: a run cut short keeps
    what it measured). A FlashInfer module that fails to load can end the process that
    loads it (a missing symbol kills it outright), so a child that dies costs the shape it
    was on, recorded as an error, and a new child carries on from the next shape; a child
    that runs past --flashinfer-timeout (its kernels compile on first use) is stopped, and
    the shapes it did not reach get an error row."""
    names = [s["name"] for s in shapes if s["set"] in sets]
    done, after = set(), None

    def take(lines, seen):
        """Hands on the shapes the child has finished since `seen` bytes of its file."""
        if not os.path.exists(lines):
            return seen
        with open(lines, "rb") as f:
            f.seek(seen)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        for line in complete.decode("utf-8").splitlines():
            entry = json.loads(line)
            done.add(entry["shape"])
            on_shape(entry["shape"], entry["rows"])
        return seen + len(complete)

    with tempfile.TemporaryDirectory() as tmp:
        lines, log_path = os.path.join(tmp, "flashinfer.jsonl"), os.path.join(tmp, "child.log")
        seen = 0
        while len(done) < len(names):
            cmd = [sys.executable, ATTENTION, "--shapes", args.shapes, "--sets", args.sets,
                   "--flashinfer-backends", args.flashinfer_backends, "--out", lines, "--flashinfer-child"]
            if after:
                cmd += ["--start-after", after]
            deadline = time.monotonic() + args.flashinfer_timeout
            with open(log_path, "w", encoding="utf-8") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
                while proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    seen = take(lines, seen)
                timed_out = proc.poll() is None
                if timed_out:  # e.g. a module compiling: the shapes left get an error row
                    proc.kill()
                proc.wait()
            seen = take(lines, seen)
            pending = [n for n in names if n not in done]
            if not pending:
                break
            if timed_out:  # the child's last line says where it was (a JIT build names its module)
                with open(log_path, encoding="utf-8", errors="replace") as log:
                    last = (log.read().strip().splitlines() or ["no output"])[-1]
                why = f"the FlashInfer process ran past --flashinfer-timeout ({args.flashinfer_timeout:.0f} s)"
                for n in pending:
                    on_shape(n, [{"impl": "flashinfer", "shape": n, "error": f"{why}; its last line: {last}"[:300]}])
                break
            if proc.returncode == 0:
                break
            with open(log_path, encoding="utf-8", errors="replace") as log:
                tail = (log.read().strip().splitlines() or ["no output"])[-1]
            on_shape(pending[0], [{"impl": "flashinfer", "shape": pending[0],
                                   "error": f"the FlashInfer process died (rc {proc.returncode}): {tail}"[:300]}])
            done.add(pending[0])
            after = pending[0]


def flashinfer_version(out):
    """The FlashInfer version the results' rows ran with, or None."""
    return next((r["flashinfer_version"] for r in out["results"] if "flashinfer_version" in r), None)



def flashinfer_into(args, shapes, sets, out, by_name):
    """FlashInfer's rows of every shape into `out`, the JSON written after each shape."""
    def on_shape(name, rows):
        print_rows(by_name[name], rows, out)
        out["flashinfer"] = flashinfer_version(out)
        write_json(args.out, out)
    if importlib.util.find_spec("flashinfer") is None:  # no child to start: every shape says why
        for s in shapes:
            if s["set"] in sets:
                on_shape(s["name"], [{"impl": "flashinfer", "shape": s["name"],
                                      "error": "flashinfer not importable: No module named 'flashinfer'"}])
        return
    flashinfer_all(args, shapes, sets, on_shape)
    out["flashinfer"] = flashinfer_version(out)

