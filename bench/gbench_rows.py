"""Reading Google Benchmark JSON the one way every flashstep script does.

A benchmark row is named, e.g., "02_paged/b16_kv4096_p16/min_time:0.050/repeats:5/
manual_time_median"; every report keys rows by the part before Google Benchmark's
run options and aggregate suffix ("02_paged/b16_kv4096_p16"), and the benchmark
policy reports medians only.
"""
import json


def base_name(row):
    """A row's name without Google Benchmark's suffixes: "02_paged/b16_kv4096_p16/
    min_time:0.050/repeats:5/manual_time_median" -> "02_paged/b16_kv4096_p16"."""
    name = row.get("run_name") or row["name"]
    aggregate = row.get("aggregate_name") or "median"
    if name.endswith("_" + aggregate):
        name = name[:-len(aggregate) - 1]
    return "/".join(x for x in name.split("/") if ":" not in x and x != "manual_time")


def load_medians(path):
    """(the whole JSON, {base_name: median row}) of one results file."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = {base_name(b): b for b in data["benchmarks"] if b.get("aggregate_name") == "median"}
    return data, rows
