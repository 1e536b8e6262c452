#!/usr/bin/env python3
"""The validation harness's tolerance table as a Markdown table, for the docs.

    docs_tolerances.py OUT.md        (with the flashstep module importable)

Every number is read from the harness itself (flashstep.tolerance_table(), compiled from
stages/harness/compare.cpp); nothing here is typed. Where the module was built without
the harness (no CUDA toolkit), the page says so instead of showing numbers from elsewhere.
"""
import sys

NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "e4m3": "FP8 e4m3", "e5m2": "FP8 e5m2"}


def fmt(x):
    return f"{x:.3g}"


def table(rows):
    lines = ["| q, o | K/V | o: atol | o: rtol | o: norm | lse: atol | lse: rtol | lse: norm | where the budget comes from |",
             "|:--|:--|--:|--:|--:|--:|--:|--:|:--|"]
    for r in rows:
        lines.append("| " + " | ".join([NAMES.get(r["dtype"], r["dtype"]), NAMES.get(r["kv_dtype"], r["kv_dtype"])] +
                                        [fmt(x) for x in r["o"]] + [fmt(x) for x in r["lse"]] + [r["why"]]) + " |")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import flashstep
        rows = flashstep.tolerance_table()
        text = table(rows) + "\n"
    except (ImportError, AttributeError) as e:
        text = ("(This build's Python module has no copy of the table: it was built without the CUDA toolkit, "
                f"whose headers the harness needs ({e}). `flashstep.cuda.tolerance` reads it from the C library "
                "on a GPU build.)\n")
    with open(argv[1], "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
