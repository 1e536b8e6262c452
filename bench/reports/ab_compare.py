"""A before/after comparison of the same benchmark rows: two sets of Google Benchmark JSON
files (flashstep_bench, flashstep_sampling_bench) of two builds, run in the same process
order on the same GPU. For every row both sides have, the median over each side's files
of the row's median time, and before / after (above 1: the after build is faster); then
the geometric mean and the smallest ratio, the two numbers a refactor that must not slow
anything down is held to (a geometric mean of at least 0.98, no row below 0.95).

    python3 bench/reports/ab_compare.py --before base_1.json base_2.json --after new_1.json new_2.json \
        [--label "decode, same call"]

Rows are keyed as bench/reports/results.py (the one reader of these files) names them: the
stage and the shape, times in us.
"""
import argparse
import math
import statistics

from results import load  # bench/reports/results.py


def medians(path):
    """{row: median time in us} of one benchmark JSON file."""
    return {r["name"]: r["median_us"] for r in load(path)["rows"]}


def compare(before_files, after_files):
    """[(row, before, after, before / after)] for the rows both sides have, sorted by row."""
    before, after = {}, {}
    for files, side in ((before_files, before), (after_files, after)):
        for path in files:
            for row, t in medians(path).items():
                side.setdefault(row, []).append(t)
    rows = []
    for row in sorted(set(before) & set(after)):
        b, a = statistics.median(before[row]), statistics.median(after[row])
        rows.append((row, b, a, b / a))
    return rows


def summary(rows):
    """(geometric mean of the ratios, smallest ratio)."""
    return math.exp(sum(math.log(r[3]) for r in rows) / len(rows)), min(r[3] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--before", nargs="+", required=True, help="JSON files of the build before")
    ap.add_argument("--after", nargs="+", required=True, help="JSON files of the build after")
    ap.add_argument("--label", default="", help="a title for the table")
    args = ap.parse_args()
    rows = compare(args.before, args.after)
    if not rows:
        raise SystemExit("ab_compare.py: the two sides have no row in common")
    geo, low = summary(rows)
    print(f"{args.label}: {len(rows)} rows, geometric mean before/after {geo:.3f}, smallest {low:.3f}")
    print(f"| row | before (us) | after (us) | before / after |\n|:--|--:|--:|--:|")
    for row, b, a, r in rows:
        print(f"| {row} | {b:.2f} | {a:.2f} | {r:.3f}{' (below 0.95)' if r < 0.95 else ''} |")


if __name__ == "__main__":
    main()
