"""`flashstep tour`: the course's story, in the course's order, ending with PASS.

Expected values are the course's printed numbers (worked out by hand), never taken from
the code under test."""
import re

import pytest

SECTIONS = ["tokens", "radix", "pages", "block-sparse", "cascade", "attention", "decoder", "gpu"]


def headings(text):
    return re.findall(r"^== (\d+)\. (.+) ==$", text, flags=re.M)


def test_tour_tells_the_story_in_order_and_passes(flashstep, seed):
    r = flashstep("tour", "--no-gpu", "--seed", str(seed))
    assert r.rc == 0, r
    assert r.out.rstrip().splitlines()[-1].startswith("PASS: "), r
    assert "MISMATCH" not in r.out, r
    found = headings(r.out)
    assert [int(n) for n, _ in found] == list(range(1, len(SECTIONS) + 1)), r
    assert f"(seed {seed})" in r.out, r
    # The worked example's numbers, computed by hand.
    assert "qo_indptr = [0, 3, 7]" in r.out, r
    assert "softmax(scores)                = [0.21, 0.21, 0.58]" in r.out, r
    assert "[0.63, 0.79]" in r.out, r
    assert "GPU part skipped: --no-gpu was given." in r.out, r
    # The cascade's merged output for "A, pos 2" is the course's exact [3, 1 + e] / (2 + e).
    assert re.search(r"A, pos 2 .* \[0\.6358, 0\.7881\]  \[0\.6358, 0\.7881\]", r.out), r
    # The course's pictures: its Br = 3 row blocks and its unique-suffix rows.
    assert "A, pos 0-2" in r.out and "B, pos 0-2" in r.out and "B, pos 3 " in r.out, r


def test_tour_gpu_section_validates_or_exits_77_saying_why(flashstep, seed):
    """Asked for the GPU part alone where it cannot run, the tour checked nothing: exit 77
    ("nothing to run here", like validate and bench) with the reason, never a PASS."""
    r = flashstep("tour", "--section", "gpu", "--seed", str(seed))
    if "GPU part skipped" in r.out:
        assert r.rc == 77, r
        assert "PASS" not in r.out, r
        assert re.search(r"GPU part skipped: (no CUDA GPU found|this build has no CUDA stages"
                         r"|no usable GPU here \(.+\))", r.out), r
        assert "InsufficientDriver" not in r.out and "driver version is insufficient" not in r.out, r
        assert r.out.rstrip().splitlines()[-1].startswith("SKIPPED: "), r
    else:  # a GPU machine: a table of every stage, then PASS
        assert re.search(r"stage\s+cases\s+max error\s+pass\s+time", r.out), r
        assert r.rc == 0, r


def test_tour_gpu_section_with_no_gpu_flag_exits_77(flashstep, seed):
    r = flashstep("tour", "--section", "gpu", "--no-gpu", "--seed", str(seed))
    assert r.rc == 77, r
    assert "GPU part skipped: --no-gpu was given." in r.out, r


def test_full_tour_passes_where_the_gpu_part_is_skipped(flashstep, seed):
    """The whole tour on a machine without a GPU still checks the CPU story: exit 0, and
    the GPU part says it was skipped."""
    r = flashstep("tour", "--seed", str(seed))
    if "GPU part skipped" in r.out:
        assert r.rc == 0, r
        assert "skipped: GPU part" in r.out, r
        assert r.out.rstrip().splitlines()[-1].startswith("PASS: "), r


@pytest.mark.parametrize("section", SECTIONS[:-1])
def test_each_section_runs_alone(flashstep, section, seed):
    r = flashstep("tour", "--no-gpu", "--section", section, "--seed", str(seed))
    assert r.rc == 0, r
    found = headings(r.out)
    assert len(found) == 1, r
    assert int(found[0][0]) == SECTIONS.index(section) + 1, r


def test_same_seed_same_output(flashstep, seed):
    a = flashstep("tour", "--no-gpu", "--seed", str(seed))
    b = flashstep("tour", "--no-gpu", "--seed", str(seed))
    assert a.out == b.out


def test_decoder_generates_the_same_tokens_three_ways_and_reuses_the_shared_prefix(flashstep, seed):
    r = flashstep("tour", "--section", "decoder", "--seed", str(seed))
    assert r.rc == 0, r
    rows = re.findall(r"^  (recompute|contiguous_kv_cache|paged_kv_cache)?\s+([AB])\s+(\".*\")", r.out, re.M)
    by_request = {}
    for _, name, text in rows:
        by_request.setdefault(name, set()).add(text)
    assert set(by_request) == {"A", "B"} and all(len(t) == 1 for t in by_request.values()), r
    # "The cat " is 8 bytes, two whole pages of 4: B's prompt reuses exactly those.
    assert "came from the radix cache instead of being computed: 8" in r.out, r
