"""bench/reports/engine_report.py on small hand-made results files of `flashstep serve --json`
(the fields bench/serve/serve_results.cpp writes; tests/engine/test_step_floor.cpp checks
the writer), CPU only: the chapter's sections take every number from the files, the
speed-ups and the walkthrough's rebased arrays are the ones worked out by hand in the
comments, --check tells a stale section, and a file that is not stage 09's is refused."""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("FLASHSTEP_SOURCE_DIR",
                        os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
SCRIPT = os.path.join(SOURCE, "bench", "reports", "engine_report.py")
COLUMNS = ["step", "decodes", "prefills", "tokens", "kv_flat", "kv_unique", "graph_batch", "graph_launches",
           "wall_us", "host_us", "embed_us", "projection_us", "attention_us", "logits_us", "sampling_us", "total_us",
           "floor_us", "decode_stage", "prefill_stage"]
CHAPTER = """# Stage 09

<!-- engine step:begin -->
<!-- engine step:end -->

text between

<!-- engine results:begin -->
<!-- engine results:end -->
"""


def config(**over):
    c = {"requests": 64, "seed": 0, "arrivals_per_step": 1000, "min_prompt": 256, "max_prompt": 256,
         "min_new": 128, "max_new": 128, "shared_prefix_len": 0, "shared_prefixes": 0, "shared_fraction": 0,
         "first_request_alone": False, "d_model": 1024, "layers": 4, "qo_heads": 8, "kv_heads": 2,
         "vocab_size": 256, "position_encoding": "rope", "dtype": "f16", "page_size": 16, "num_pages": 1536,
         "max_running": 64, "budget": 16384, "prefix_sharing": True, "cascade": False, "cuda_graphs": False,
         "sampling": "greedy", "temperature": 1, "top_k": 0, "top_p": 1, "decode_stage": "", "prefill_stage": ""}
    c.update(over)
    return c


def variant(name, tokens_per_s=1000.0, peak=10, allocated=12, steps=None, launch_floor=None):
    return {"name": name, "cuda_graphs": name.endswith("graphs"), "prefix_sharing": "no_sharing" not in name,
            "cascade": "cascade" in name, "steps": 4, "tokens": 256, "seconds": 256 / tokens_per_s,
            "tokens_per_s": tokens_per_s, "peak_pages": peak, "pages_allocated": allocated,
            "kv_bytes_peak": peak * 16 * 4096, "kv_bytes_allocated": allocated * 16 * 4096,
            "launch_floor_us": launch_floor, "steps_recorded": steps or []}


def summary(name, wall, floor=None, steps=3, flat=None, unique=None, split=None):
    s = {"variant": name, "batch": 64, "decode_steps": steps, "wall_us": wall, "floor_us": floor,
         "ratio": None if floor is None else wall / floor, "ratio_max": None, "kv_bytes_flat": flat,
         "kv_bytes_unique": unique}
    for k, v in zip(("host_us", "embed_us", "projection_us", "attention_us", "logits_us", "sampling_us", "total_us"),
                    split or [None] * 7):
        s[k] = v
    return s


def results(what, cfg, variants, summaries, targets=(), shown=None):
    return {"format": "flashstep results 1", "stage": "09_engine", "what": what, "device": "GPU X",
            "commit": "abc1234", "tree": "clean", "command": f"flashstep serve --what {what}",
            "date": "2026-11-27T09:00:00Z", "note": None,
            "ceilings": {"read_ceiling_GB/s": 3000, "launch_floor_1_us": 2.5}, "read_buffer_bytes": 1 << 30,
            "config": cfg, "model_bytes": {"weight_bytes_per_decode_step": 21626880, "kv_bytes_per_token_slot": 4096,
                                           "page_size": 16, "goal_batch": 64},
            "step_columns": COLUMNS, "variants": variants, "summary": summaries,
            "rows": [{"name": f"09_engine/{what}_{v['name']}/step_mean", "impl": "09_engine",
                      "shape": f"{what}_{v['name']}", "median_us": 100.0, "unit": "us"} for v in variants],
            "targets": list(targets), "shown_step": shown}


def write(tmp_path):
    folder = tmp_path / "docs" / "results" / "09_engine"
    folder.mkdir(parents=True)
    (tmp_path / "stages" / "09_engine").mkdir(parents=True)
    (tmp_path / "stages" / "09_engine" / "README.md").write_text(CHAPTER)
    step = dict(zip(COLUMNS, [1, 64, 0, 64, 20000, 20000, 64, 40, 150.0, 10.0, 2.0, 40.0, 50.0, 5.0, 8.0, 140.0, 100.0,
                              "03_split_kv", ""]))
    decode = results(
        "decode64", config(),
        [variant("eager", 2000.0, steps=[[0, 0, 64, 16384, 0, 0, 0, 0, 900.0] + [None] * 8 + ["", "07_hopper"]]),
         variant("graphs", 4000.0, steps=[[step[c] for c in COLUMNS]], launch_floor=60.0)],
        # graphs: 150 us a step over a floor of 100: 1.5x; its split sums to 115 of 140 with events
        [summary("eager", 300.0, 100.0, split=[30, 2, 90, 60, 5, 8, 290]),
         summary("graphs", 150.0, 100.0, flat=81920000, unique=81920000, split=[10, 2, 40, 50, 5, 8, 140])],
        targets=[{"what": "decode step at batch 64 with CUDA graphs: time / floor (median over the steps)",
                  "ratio": 1.5, "goal": "<= 1.5", "met": True},
                 {"what": "host metadata and plan at batch 64 with CUDA graphs: share of the step (means)",
                  "ratio": 10 / 140, "goal": "<= 0.10", "met": True}])
    # median steps, eager / graphs: cascade 200 / 150, sharing 300 / 250, none 800 / 700
    names = ["sharing_cascade", "sharing", "no_sharing"]
    walls = {"sharing_cascade": (200.0, 150.0), "sharing": (300.0, 250.0), "no_sharing": (800.0, 700.0)}
    prefix = results(
        "prefix2048", config(shared_prefix_len=2048, shared_prefixes=1, shared_fraction=1, min_prompt=16,
                             max_prompt=64, first_request_alone=True, budget=2112),
        [variant(n, peak=815 if n != "no_sharing" else 8748) for n in names] +
        [variant(n + "_graphs", peak=815 if n != "no_sharing" else 8748) for n in names],
        [summary(n, walls[n][0], flat=1 << 30, unique=(1 << 30) if n == "no_sharing" else 1 << 26) for n in names] +
        [summary(n + "_graphs", walls[n][1]) for n in names])
    arrivals = results("arrivals", config(arrivals_per_step=8, min_prompt=16, max_prompt=128, min_new=16, max_new=64,
                                          shared_prefix_len=64, shared_prefixes=2, shared_fraction=0.75,
                                          budget=2048),
                       [variant("eager", 3000.0, peak=100, allocated=150), variant("graphs", 6000.0)], [])
    # step 4: decodes r0 r1 (rows 0, 1), prefills r2 r3 (rows 2, 3)
    shown = {"step": 4, "arrays": "step 4: 2 decodes + 2 prefill chunks\nqo_indptr [0 1 2 7 10]\n",
             "num_decodes": 2, "qo_indptr": [0, 1, 2, 7, 10], "kv_indptr": [0, 3, 6, 9, 12],
             "kv_indices": [0, 1, 2, 0, 1, 3, 0, 1, 4, 0, 1, 5], "kv_last_page_len": [12, 9, 5, 3],
             "decode_stage": "05_cascade", "prefill_stage": "07_hopper", "graph_batch": 0, "group_size": 4,
             "shared_pages": 2, "cascade_option": True, "sampled_requests": [0, 1, 2, 3],
             "sampled_tokens": [72, 105, 0, 124]}
    walk = results("walkthrough", config(requests=6, arrivals_per_step=1, min_prompt=3, max_prompt=10, min_new=4,
                                         max_new=8, shared_prefix_len=32, shared_prefixes=1, shared_fraction=1,
                                         budget=64, cascade=True),
                   [variant("eager"), variant("graphs")], [], shown=shown)
    paths = []
    for name, data in (("decode64", decode), ("prefix2048", prefix), ("arrivals", arrivals), ("walkthrough", walk)):
        path = folder / f"gpu_{name}_2026-11-27_abc1234.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))
    return paths


def report(tmp_path, paths, *extra):
    return subprocess.run([sys.executable, SCRIPT, "--repo", str(tmp_path), "--results", *paths, *extra],
                          capture_output=True, text=True)


def test_sections_take_every_number_from_the_files(tmp_path):
    paths = write(tmp_path)
    r = report(tmp_path, paths)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (tmp_path / "stages" / "09_engine" / "README.md").read_text()
    results = text.split("<!-- engine results:begin -->")[1].split("<!-- engine results:end -->")[0]
    step = text.split("<!-- engine step:begin -->")[1].split("<!-- engine step:end -->")[0]
    assert "text between" in text  # what lies outside the markers is kept
    # provenance, the ceilings, the goals as the file judged them
    assert "`docs/results/09_engine/gpu_decode64_2026-11-27_abc1234.json`: GPU X, commit `abc1234`" in results
    assert "read ceiling 3,000 GB/s, launch floor of one kernel 2.50 us" in results
    assert "| decode step at batch 64 with CUDA graphs: time / floor (median over the steps) | 1.500 | <= 1.5 | yes |" \
        in results
    assert "| host metadata and plan at batch 64 with CUDA graphs: share of the step (means) | 0.071 | <= 0.10 | yes |" \
        in results
    # the decode table: tokens/s, steps, median, floor, x floor, the six phases, the total
    assert "| graphs | 4,000 | 3 | 150 | 100 | 1.50x | 10.0 | 2.00 | 40.0 | 50.0 | 5.00 | 8.00 | 140 |" in results
    assert "| eager | 2,000 | 3 | 300 | 100 | 3.00x | 30.0 | 2.00 | 90.0 | 60.0 | 5.00 | 8.00 | 290 |" in results
    # the floor in its parts: 21,626,880 + 81,920,000 bytes at 3000 GB/s = 34.5 us; launch floor 60 us
    assert "20.6 MiB of weights and 78.1 MiB of K/V" in results
    assert "take 34.5 us; the launch floor of its graph's kernels and the sampler's is 60.0 us" in results
    # prefix sharing: speed-ups over no sharing 800/200 = 4.00x, 800/300 = 2.67x; graphs 700/150 = 4.67x,
    # 700/250 = 2.80x; K/V read 1024 MiB by the rows, 64 MiB of distinct pages; 815 pages = 815 x 64 KiB
    assert "| sharing + cascade | 815 | 50.9 | 12 | 1,024 / 64.0 | 3 | 200 | 150 | 4.00x | 4.67x |" in results
    assert "| sharing | 815 | 50.9 | 12 | 1,024 / 64.0 | 3 | 300 | 250 | 2.67x | 2.80x |" in results
    assert "| no sharing | 8748 | 547 | 12 | 1,024 / 1,024 | 3 | 800 | 700 | 1.00x | 1.00x |" in results
    assert "1,000 arrivals a step (Poisson): all of them prefilled in the first step" in results
    assert "all opening with one shared prefix of 2048 tokens" in results
    assert "the first alone at step 0 and the others at step 1" in results
    # continuous batching: 256 tokens at 3000 tokens/s over 4 steps = 21,333 us a step; 100 pages = 6.25 MiB
    assert "| eager | 4 | 256 | 3,000 | 21,333 | 100 | 6.25 | 150 | 9.38 |" in results
    # the walkthrough: the arrays as printed, the decode call's arrays, the prefill call's rebased
    # (qo_indptr [2 7 10] - 2, kv_indptr [6 9 12] - 6, its pages from kv_indptr[2] = 6 on)
    assert "step 4: 2 decodes + 2 prefill chunks\nqo_indptr [0 1 2 7 10]\n```" in step
    assert ("the decode call, rows 0..1: `qo_indptr` [0 1 2], `kv_indptr` [0 3 6], `kv_indices` [0 1 2 0 1 3], "
            "`kv_last_page_len` [12 9] -> `05_cascade`: the decode rows read 2 pages in common") in step
    assert ("the prefill call, rows 2..3, its arrays rebased to start at 0: `qo_indptr` [0 5 8], `kv_indptr` "
            "[0 3 6], `kv_indices` [0 1 4 0 1 5], `kv_last_page_len` [5 3] -> `07_hopper`: default_stage()") in step
    assert "over pages of 16, head_dim 128" in step
    assert "eagerly, kernel after kernel (a step with prefill rows is never a graph)" in step
    assert "(`--cascade`, the run without CUDA graphs)" in step
    # 72 'H', 105 'i', 0 and 124 ('|', which would break a table) as bytes
    assert "r0 -> 72 ('H'), r1 -> 105 ('i'), r2 -> 0 (byte 0), r3 -> 124 (byte 124)" in step


def test_check_tells_a_stale_section(tmp_path):
    paths = write(tmp_path)
    assert report(tmp_path, paths).returncode == 0
    r = report(tmp_path, paths, "--check")
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr
    chapter = tmp_path / "stages" / "09_engine" / "README.md"
    chapter.write_text(chapter.read_text().replace("| graphs | 4,000 |", "| graphs | 4,001 |"))
    r = report(tmp_path, paths, "--check")
    assert r.returncode == 1 and "stale" in r.stdout


def test_a_file_that_is_not_stage_09s_is_refused(tmp_path):
    paths = write(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "flashstep results 1", "rows": [], "stage": "06_sampling"}))
    r = report(tmp_path, [str(other)])
    assert r.returncode == 2 and "not a results file of flashstep serve --json" in r.stderr
    r = report(tmp_path, [paths[0], paths[0]])
    assert r.returncode == 2 and "a second results file of the workload 'decode64'" in r.stderr
