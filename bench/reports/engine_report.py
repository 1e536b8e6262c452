#!/usr/bin/env python3
"""Writes stage 09's measured sections from the results files of `flashstep serve --json`.

    python3 bench/reports/engine_report.py --results docs/results/09_engine/GPU_decode64_DATE_COMMIT.json \\
        docs/results/09_engine/GPU_prefix2048_DATE_COMMIT.json docs/results/09_engine/GPU_arrivals_DATE_COMMIT.json \\
        docs/results/09_engine/GPU_walkthrough_DATE_COMMIT.json [--repo .] [--check]

Each file says which workload it measured ("what"): decode64 (64 requests decoding
together: the time of a decode step against its floor, eager and with CUDA graphs, and the
goals), prefix2048 (64 requests sharing a 2048-token prefix: sharing with the cascade,
sharing alone and no sharing), arrivals (the default stream of arrivals: tokens/s, eager
and with CUDA graphs) and walkthrough (a small run whose step `shown_step` the chapter
walks through). Between `<!-- engine results:begin -->` and `<!-- engine results:end -->`
of stages/09_engine/README.md: provenance, the goals, and one table per workload; between
`<!-- engine step:begin -->` and `<!-- engine step:end -->`: the walkthrough. Every number
comes from the files; --check writes nothing and exits 1 where a section differs from what
the files generate.
"""
import os
import sys

from common import fmt, load, parser, write_section  # bench/reports/
from results import ResultsError  # bench/reports/

BEGIN, END = "<!-- engine results:begin -->", "<!-- engine results:end -->"
STEP_BEGIN, STEP_END = "<!-- engine step:begin -->", "<!-- engine step:end -->"
WHATS = ("decode64", "prefix2048", "arrivals", "walkthrough")
PHASES = ("host", "embed", "projection", "attention", "logits", "sampling")
MIB = 1 << 20


class ReportError(ValueError):
    """A results file the report cannot use; the message names it."""


def read(paths):
    """{what: run} of the files (results.py's one shape, "raw" the file as written);
    ReportError where a file is not a stage 09 results file or two measured the same workload."""
    runs = {}
    for path in paths:
        run = load(path)
        raw = run["raw"]
        if raw.get("stage") != "09_engine" or "what" not in raw or "variants" not in raw:
            raise ReportError(f"{path}: not a results file of flashstep serve --json")
        if raw["what"] in runs:
            raise ReportError(f"{path}: a second results file of the workload {raw['what']!r}")
        runs[raw["what"]] = run
    return runs


def steps_of(raw, variant):
    """The variant's steps as dicts of step_columns."""
    cols = raw["step_columns"]
    return [dict(zip(cols, s)) for s in variant["steps_recorded"]]


def summary(raw, name):
    """The file's summary of variant `name` (the decode steps at the goal's batch), or {}."""
    return next((s for s in raw["summary"] if s["variant"] == name), {})


def variant(raw, name):
    return next((v for v in raw["variants"] if v["name"] == name), None)


def us(x):
    return fmt(x) if isinstance(x, (int, float)) else "–"


def mib(x):
    return fmt(x / MIB) if isinstance(x, (int, float)) else "–"


def times(x):
    return f"{x:.2f}x" if isinstance(x, (int, float)) else "–"


def rel(path, repo):
    return os.path.relpath(path, repo).replace(os.sep, "/")


def provenance(run, repo):
    raw = run["raw"]
    c = raw["ceilings"]
    return (f"`{rel(run['path'], repo)}`: {run['device']}, commit `{run['commit']}`, {run['date']}; read ceiling "
            f"{fmt(c['read_ceiling_GB/s'])} GB/s, launch floor of one kernel {fmt(c['launch_floor_1_us'])} us "
            "(measured in the same process)")


def workload(raw):
    """The workload in words, from the file's config."""
    c = raw["config"]
    own = (f"{c['min_prompt']}" if c["min_prompt"] == c["max_prompt"] else f"{c['min_prompt']}..{c['max_prompt']}")
    new = f"{c['min_new']}" if c["min_new"] == c["max_new"] else f"{c['min_new']}..{c['max_new']}"
    parts = [f"{c['requests']} requests"]
    if c["shared_prefix_len"]:
        share = "all" if c["shared_fraction"] == 1 else f"{c['shared_fraction']:.0%}"
        parts.append(f"{share} opening with {'one' if c['shared_prefixes'] == 1 else c['shared_prefixes']} shared "
                     f"prefix{'es' if c['shared_prefixes'] > 1 else ''} of {c['shared_prefix_len']} tokens")
    parts.append(f"own prompt {own} tokens, {new} new tokens each")
    if c.get("first_request_alone"):
        parts.append("the first alone at step 0 and the others at step 1")
    else:
        first = raw["variants"][0]["steps_recorded"][:1] if raw["variants"] else []
        all_at_once = bool(first) and first[0][raw["step_columns"].index("prefills")] == c["requests"]
        parts.append(f"{fmt(c['arrivals_per_step'])} arrivals a step (Poisson)" +
                     (": all of them prefilled in the first step" if all_at_once else ""))
    words = ", ".join(parts)
    return (f"{words}; d_model {c['d_model']}, {c['layers']} layers, {c['qo_heads']}/{c['kv_heads']} heads, "
            f"{c['dtype']}, {c['position_encoding']}; pages of {c['page_size']}, a budget of {c['budget']} tokens a "
            f"step, {c['sampling']} sampling")


def goals_table(run):
    out = ["| goal | measured | target | met |", "|:--|--:|--:|:--|"]
    for t in run["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        measured = "–" if t["ratio"] is None else f"{t['ratio']:.3f}"
        out.append(f"| {t['what']} | {measured} | {t['goal']} | {met} |")
    return out


def decode_table(run):
    """Eager against CUDA graphs at the goal's batch: the step against its floor, its phases."""
    raw = run["raw"]
    batch = raw["model_bytes"]["goal_batch"]
    out = [f"| {raw['what']} | tokens/s | decode steps at batch {batch} | median step us | floor us | x floor "
           "| host | embed | projections | attention | logits | sampling | total, with events |",
           "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for v in raw["variants"]:
        s = summary(raw, v["name"])
        phases = " | ".join(us(s.get(f"{p}_us")) for p in PHASES)
        out.append(f"| {v['name']} | {us(v['tokens_per_s'])} | {s.get('decode_steps', 0)} | {us(s.get('wall_us'))} "
                   f"| {us(s.get('floor_us'))} | {times(s.get('ratio'))} | {phases} | {us(s.get('total_us'))} |")
    return out


def floor_words(run):
    """The floor of the graphs' median step, in its parts."""
    raw = run["raw"]
    g = variant(raw, "graphs")
    s = summary(raw, "graphs")
    if g is None or not s.get("floor_us"):
        return []
    read = raw["ceilings"]["read_ceiling_GB/s"]
    weights = raw["model_bytes"]["weight_bytes_per_decode_step"]
    kv = s["kv_bytes_unique"]
    return [f"The floor of a batch-{raw['model_bytes']['goal_batch']} decode step: {mib(weights)} MiB of weights "
            f"and {mib(kv)} MiB of K/V (the median step) read at {fmt(read)} GB/s take "
            f"{us((weights + kv) / (read * 1e3))} us; the launch floor of its graph's kernels and the sampler's "
            f"is {us(g['launch_floor_us'])} us (a CUDA graph of as many empty kernels): {us(s['floor_us'])} us in "
            "all. The weights may stay in the L2 from one step to the next; the floor counts them at the read "
            "ceiling all the same."]


def prefix_table(run):
    raw = run["raw"]
    out = ["| variant | pages, peak | K/V MiB, peak | pages allocated | K/V read a decode step, MiB: by the rows "
           "/ distinct pages | decode steps at batch 64 | median step us, eager | with CUDA graphs | "
           "speed-up over no sharing, eager | with graphs |",
           "|:--|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    base = {m: summary(raw, "no_sharing" + m).get("wall_us") for m in ("", "_graphs")}
    for name in ("sharing_cascade", "sharing", "no_sharing"):
        v, s, g = variant(raw, name), summary(raw, name), summary(raw, name + "_graphs")
        if v is None:
            continue
        speed = [times(b / x) if b and x else "–" for b, x in ((base[""], s.get("wall_us")),
                                                                  (base["_graphs"], g.get("wall_us")))]
        out.append(f"| {name.replace('_', ' + ' if name == 'sharing_cascade' else ' ')} | {v['peak_pages']} | "
                   f"{mib(v['kv_bytes_peak'])} | {v['pages_allocated']} | {mib(s.get('kv_bytes_flat'))} / "
                   f"{mib(s.get('kv_bytes_unique'))} | {s.get('decode_steps', 0)} | {us(s.get('wall_us'))} | "
                   f"{us(g.get('wall_us'))} | {speed[0]} | {speed[1]} |")
    return out


def stage_counts(raw, v):
    """{(decode stage, prefill stage): steps} of a variant."""
    counts = {}
    for s in steps_of(raw, v):
        key = (s["decode_stage"] or "–", s["prefill_stage"] or "–")
        counts[key] = counts.get(key, 0) + 1
    return counts


def arrivals_table(run):
    raw = run["raw"]
    out = ["| arrivals | steps | tokens | tokens/s | mean step us | pages, peak | K/V MiB, peak | "
           "pages allocated | K/V MiB allocated |", "|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for v in raw["variants"]:
        out.append(f"| {v['name']} | {v['steps']} | {v['tokens']} | {us(v['tokens_per_s'])} | "
                   f"{us(v['seconds'] * 1e6 / v['steps'] if v['steps'] else None)} | {v['peak_pages']} | "
                   f"{mib(v['kv_bytes_peak'])} | {v['pages_allocated']} | {mib(v['kv_bytes_allocated'])} |")
    return out


def section(runs, repo):
    """The results section: provenance, the goals, one table per workload measured."""
    out = []
    d = runs.get("decode64")
    if d:
        out += ["**Batch 64 decode** (" + workload(d["raw"]) + "), from " + provenance(d, repo) + ".", ""]
        out += goals_table(d) + [""]
        out += decode_table(d) + [""]
        out += ["Each step's time is run_step on the host's clock in a run without CUDA events (the metadata, "
                "both plan() calls, the kernels or the graph, the sampler, the tokens back); the phases are the "
                "mean of the same steps in a second run with CUDA events (events inside a graph are event-record "
                "nodes); \"total, with events\" is their span plus the host part. x floor is the median over the "
                "steps of each step's time over its floor."] + [""]
        out += floor_words(d) + ([""] if floor_words(d) else [])
    p = runs.get("prefix2048")
    if p:
        out += ["**Prefix sharing** (" + workload(p["raw"]) + "), from " + provenance(p, repo) + ". Decode steps at "
                "batch 64, the median over them; K/V read counts the decode rows' pages once per row and once "
                "per page:", ""]
        out += prefix_table(p) + [""]
        notes = []
        for name in ("sharing_cascade", "sharing_cascade_graphs"):
            v = variant(p["raw"], name)
            counts = stage_counts(p["raw"], v) if v is not None else {}
            if counts:
                notes.append(f"{name}: " + ", ".join(f"{n} steps decode {a} / prefill {b}"
                                                     for (a, b), n in sorted(counts.items())))
        if notes:
            out += ["Which stages ran the steps: " + "; ".join(notes) + ".", ""]
    a = runs.get("arrivals")
    if a:
        out += ["**Continuous batching** (" + workload(a["raw"]) + "), from " + provenance(a, repo) + ":", ""]
        out += arrivals_table(a) + [""]
    return "\n".join(out).rstrip("\n")


def printable(token):
    return f"'{chr(token)}'" if 33 <= token < 127 and chr(token) not in "`|" else f"byte {token}"


def why_decode(shown, config):
    stage = shown["decode_stage"]
    if not stage:
        return "no decode rows"
    if stage == "05_cascade":
        return (f"`05_cascade`: the decode rows read {shown['shared_pages']} pages in common (a cached prefix) "
                "and the run asked for the cascade where they do (`--cascade`); its planner prices the cascade "
                "against one flat pass")
    if stage == "03_split_kv" and not config["decode_stage"]:
        extra = (f" (the rows share {shown['shared_pages']} pages, but the run did not ask for the cascade)"
                 if shown["shared_pages"] and not shown["cascade_option"] else "")
        return (f"`03_split_kv`: default_stage() gives a decode whose GQA group ({shown['group_size']} query heads "
                f"per K/V head) is at most 8 to stage 03{extra}")
    return f"`{stage}`" + (" (named by --decode-stage)" if config["decode_stage"] else ", default_stage()'s choice")


def why_prefill(shown, config):
    stage = shown["prefill_stage"]
    if not stage:
        return "no prefill rows"
    if config["prefill_stage"]:
        return f"`{stage}` (named by --prefill-stage)"
    return (f"`{stage}`: default_stage() gives a prefill the latest stage in teaching order that runs it (causal, "
            f"over pages of {config['page_size']}, head_dim {config['d_model'] // config['qo_heads']}, on this GPU)")


def step_section(run, repo):
    raw = run["raw"]
    shown = raw.get("shown_step")
    if not shown:
        raise ReportError(f"{run['path']}: no shown_step (run serve with --show-step N)")
    c = raw["config"]
    nd = shown["num_decodes"]
    qo, kvp, idx, last = shown["qo_indptr"], shown["kv_indptr"], shown["kv_indices"], shown["kv_last_page_len"]
    rows = len(last)

    def arr(v):
        return "[" + " ".join(str(x) for x in v) + "]"

    options = ("`--cascade`, " if c["cascade"] else "") + ("the run with CUDA graphs" if shown["graph_batch"]
                                                           else "the run without CUDA graphs")
    out = [f"Step {shown['step']} of a run of " + workload(raw) + f" ({options}), from "
           + provenance(run, repo) + ". Command: `" + (run["command"] or "?") + "`.", "",
           f"**1. The metadata.** After admitting and scheduling, the scheduler hands the engine step "
           f"{shown['step']} as these arrays (`StepBatch::describe()`), all of it packed into one pinned buffer "
           "and copied to the GPU in one upload:", "", "```", shown["arrays"].rstrip("\n"), "```", "",
           "**2. The plan.** The engine splits the rows into two attention calls and plans each on the host, "
           "before any kernel of the step runs:", ""]
    if nd > 0:
        out.append(f"- the decode call, rows 0..{nd - 1}: `qo_indptr` {arr(qo[:nd + 1])}, `kv_indptr` "
                   f"{arr(kvp[:nd + 1])}, `kv_indices` {arr(idx[:kvp[nd]])}, `kv_last_page_len` {arr(last[:nd])} "
                   f"-> {why_decode(shown, c)};")
    if rows > nd:
        q0, p0 = qo[nd], kvp[nd]
        out.append(f"- the prefill call, rows {nd}..{rows - 1}, its arrays rebased to start at 0: `qo_indptr` "
                   f"{arr([x - q0 for x in qo[nd:]])}, `kv_indptr` {arr([x - p0 for x in kvp[nd:]])}, `kv_indices` "
                   f"{arr(idx[p0:])}, `kv_last_page_len` {arr(last[nd:])} -> {why_prefill(shown, c)}.")
    graph = (f"as the CUDA graph captured for batch {shown['graph_batch']}" if shown["graph_batch"]
             else "eagerly, kernel after kernel (a step with prefill rows is never a graph)" if rows > nd
             else "eagerly, kernel after kernel")
    out += ["", f"**3. The kernels.** The step ran {graph}: the embedding; in each of the {c['layers']} layers the "
            "Q/K/V projections on cuBLAS, RoPE, the append of the new K/V to the pages above (`append page:slot`), "
            "the two attention calls, the output projection; then the logits of the rows that sample "
            "(`sample_token_rows`).", "",
            "**4. The sampled tokens** (greedy: the argmax of each row's logits), one int32 per sampling row, the "
            "only data that comes back to the host: " +
            ", ".join(f"r{r} -> {t} ({printable(t)})" for r, t in zip(shown["sampled_requests"],
                                                                          shown["sampled_tokens"])) +
            ". The scheduler appends each to its request (the decodes' next input, or the first generated token "
            "of a prefill that reached its prompt's end)."]
    return "\n".join(out)


def main():
    ap = parser(__doc__, what="results files of flashstep serve --json (decode64, prefix2048, arrivals, "
                              "walkthrough; any of them)")
    for action in ap._actions:
        if action.dest == "results":
            action.nargs = "+"
    a = ap.parse_args()
    try:
        runs = read(a.results)
        chapter = os.path.join(a.repo, "stages", "09_engine", "README.md")
        rc = write_section(chapter, BEGIN, END, "engine_report.py", a.repo, lambda: section(runs, a.repo), a.check)
        if "walkthrough" in runs:
            rc = rc or write_section(chapter, STEP_BEGIN, STEP_END, "engine_report.py", a.repo,
                                     lambda: step_section(runs["walkthrough"], a.repo), a.check)
    except (ReportError, ResultsError) as e:
        print(f"engine_report.py: {e}", file=sys.stderr)
        return 2
    if rc == 0 and not a.check:
        print(f"wrote {os.path.relpath(chapter, a.repo)}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
