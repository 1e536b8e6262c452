"""`flashstep explain`: the tour's views for any prompts. The expected values are
computed here, independently, from the prompts (word counts, shared prefixes)."""
import random
import re

WORDS = ["the", "cat", "sat", "ran", "dog", "fast", "on", "a", "mat", "big"]


def random_prompts(rng, n):
    base = [rng.choice(WORDS) for _ in range(rng.randint(0, 4))]  # a shared prefix, maybe empty
    return [" ".join(base + [rng.choice(WORDS) for _ in range(rng.randint(1, 5))])
            for _ in range(n)]


def test_explain_packs_the_prompts_as_the_words_say(flashstep, seed):
    rng = random.Random(seed)
    prompts = random_prompts(rng, rng.randint(1, 5))
    args = ["explain", "--seed", str(seed)]
    for p in prompts:
        args += ["--prompt", p]
    r = flashstep(*args)
    assert r.rc == 0, r
    assert r.out.rstrip().splitlines()[-1].startswith("PASS: "), r
    indptr = [0]
    for p in prompts:
        indptr.append(indptr[-1] + len(p.split()))
    assert f"qo_indptr = [{', '.join(map(str, indptr))}]" in r.out, r
    longest = max(len(p.split()) for p in prompts)
    padded = len(prompts) * longest
    assert f"{len(prompts)} x {longest} = {padded} row{'' if padded == 1 else 's'}" in r.out, r


def test_explain_names_word_ids_in_order_of_first_appearance(flashstep):
    r = flashstep("explain", "--prompt", "b a b", "--prompt", "c a", "--section", "tokens")
    assert r.rc == 0, r
    assert re.search(r"A\s+\"b a b\"\s+\[b, a, b\]\s+\[0, 1, 0\]", r.out), r
    assert re.search(r"B\s+\"c a\"\s+\[c, a\]\s+\[2, 1\]", r.out), r


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def explain(flashstep, prompts, page_size, br, seed, *sections):
    args = ["explain", "--seed", str(seed), "--page-size", str(page_size), "--br", str(br)]
    for p in prompts:
        args += ["--prompt", p]
    for s in sections:
        args += ["--section", s]
    r = flashstep(*args)
    assert r.rc == 0, r
    assert r.out.rstrip().splitlines()[-1].startswith("PASS: "), r
    return r


def test_radix_and_pages_share_exactly_the_whole_pages_of_common_prefixes(flashstep, seed):
    rng = random.Random(seed + 1)
    for _ in range(4):
        prompts = random_prompts(rng, rng.randint(2, 4))
        page_size = rng.randint(1, 3)
        r = explain(flashstep, prompts, page_size, 2, seed, "radix", "pages")
        words = [p.split() for p in prompts]
        for i, w in enumerate(words):
            # Only whole pages of an earlier request are cached; matches round down to pages.
            best = max([min(common_prefix(words[e], w), len(words[e]) // page_size * page_size)
                        for e in range(i)] + [0])
            best = best // page_size * page_size
            name = chr(ord("A") + i)
            assert re.search(rf"After request {name} \(.*\): matched {best} token", r.out), (best, r)
        pages = [-(-len(w) // page_size) for w in words]
        indptr = [0]
        for n in pages:
            indptr.append(indptr[-1] + n)
        assert f"kv_indptr        = [{', '.join(map(str, indptr))}]" in r.out, r
        last = [len(w) - (n - 1) * page_size for w, n in zip(words, pages)]
        assert f"kv_last_page_len = [{', '.join(map(str, last))}]" in r.out, r


def test_block_sparse_block_counts_follow_from_the_lengths(flashstep, seed):
    rng = random.Random(seed + 2)
    prompts = random_prompts(rng, 3)
    page_size, br = rng.randint(1, 3), rng.randint(2, 5)
    r = explain(flashstep, prompts, page_size, br, seed, "block-sparse")

    def blocks(tile):
        n = 0
        for p in prompts:
            length = len(p.split())
            for i0 in range(0, length, tile):
                last_query = min(i0 + tile, length) - 1
                n += last_query // page_size + 1  # pages covering keys 0..last_query
        return n

    counts = [int(x) for x in re.findall(r"^  (\d+) blocks; attention by walking", r.out, re.M)]
    assert counts == [blocks(1), blocks(br)], r


def columns(text):
    """Terminal columns of text, by Unicode's East Asian Width (wide and full-width = 2,
    combining marks = 0): how a terminal lays the table out."""
    import unicodedata
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def table_rows(out, header_start):
    lines = out.splitlines()
    at = next(i for i, l in enumerate(lines) if l.lstrip().startswith(header_start))
    rows = []
    for line in lines[at:]:
        if not line.strip():
            break
        rows.append(line)
    return rows


def test_tables_line_up_for_wide_characters_and_emoji(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "日本語 🙂 x", "--prompt", "ab cd e",
                  "--section", "tokens")
    assert r.rc == 0, r
    rows = table_rows(r.out, "request")
    assert len(rows) == 4, r  # header, rule, two requests
    # Every row's "ids" cell starts in the same terminal column as the header's.
    starts = [columns(row[:row.rindex("[")]) if "[" in row else columns(row[:row.index("ids")])
              for row in (rows[0], rows[2], rows[3])]
    assert len(set(starts)) == 1, (starts, r)


def test_control_characters_are_escaped_and_rows_stay_one_line(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "a\nb\tc", "--prompt", "d\x1be",
                  "--section", "tokens", "--section", "radix")
    assert r.rc == 0, r
    assert '"a\\nb\\tc"' in r.out, r
    assert "\x1b" not in r.out, r
    assert "\\x1b" in r.out, r
    rows = table_rows(r.out, "request")
    assert len(rows) == 4 and all(row.startswith("  ") for row in rows), r


def test_a_very_long_word_is_cut_with_its_length(flashstep):
    word = "w" * 5000
    r = flashstep("explain", "--seed", "1", "--prompt", word + " end", "--prompt", word)
    assert r.rc == 0, r
    assert max(len(line) for line in r.out.splitlines()) < 200, r
    assert "(5000 chars)" in r.out, r
    # The byte-level decoder would take minutes on a 5000-byte prompt: it says it skipped.
    assert "skipped: decoder (prompt A longer than 512 bytes)" in r.out, r
    assert r.out.rstrip().splitlines()[-1].startswith("PASS: "), r


def test_explain_of_only_a_skipped_section_exits_77(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "w" * 600, "--section", "decoder")
    assert r.rc == 77, r
    assert r.out.rstrip().splitlines()[-1].startswith("SKIPPED: "), r


def test_nothing_cached_is_said_as_such(flashstep):
    """Page size 1000 and 3-token prompts: no whole page is filled, so the radix cache keeps
    nothing, and the second, identical prompt matches nothing."""
    r = flashstep("explain", "--seed", "1", "--prompt", "a b c", "--prompt", "a b c",
                  "--page-size", "1000", "--section", "radix")
    assert r.rc == 0, r
    assert "cached the rest" not in r.out, r
    assert r.out.count("matched 0 tokens, cached nothing") == 2, r
    assert "The tree holds 0 pages in 1 node " in r.out, r


def test_identical_prompts_with_whole_pages_have_nothing_left_to_cache(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "a b", "--prompt", "a b",
                  "--page-size", "1", "--section", "radix")
    assert r.rc == 0, r
    assert "After request B (\"a b\"): matched 2 tokens on pages [P0, P1], nothing left to cache." in r.out, r


def test_counts_of_one_are_singular(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "hello")
    assert r.rc == 0, r
    assert not re.search(r"\b1 (pages|slots|tokens|requests|nodes|prompts|rows|blocks)\b", r.out), r
    assert "1 page = 1 slot" in r.out, r


def test_one_query_is_one_position_not_a_range(flashstep):
    r = flashstep("explain", "--seed", "1", "--prompt", "A", "--prompt", "B", "--section", "cascade")
    assert r.rc == 0, r
    assert "  A: position 0 (A)" in r.out and "  B: position 0 (B)" in r.out, r
    assert "0..0" not in r.out, r
    r = flashstep("explain", "--seed", "1", "--prompt", "x y z", "--prompt", "x w", "--section", "cascade")
    assert r.rc == 0, r
    # "x" is shared: request A's own queries are at positions 1..2, B's at position 1 alone.
    assert "  A: positions 1..2 (y z)" in r.out and "  B: position 1 (w)" in r.out, r


def test_shared_tokens_are_said_to_be_stored_once(flashstep):
    """"The cat sat" / "The cat ran fast", page size 1: 7 tokens of the requests on 5 pages;
    the 2 shared ones are stored once."""
    r = flashstep("explain", "--seed", "1", "--prompt", "The cat sat", "--prompt", "The cat ran fast",
                  "--section", "pages")
    assert r.rc == 0, r
    assert "5 pages = 5 slots; the requests' 7 tokens fill 5 of them" in r.out, r
    assert "stored once" in r.out, r


def test_numbers_read_the_same_in_tour_and_explain(flashstep):
    tour = flashstep("tour", "--no-gpu", "--seed", "3")
    expl = flashstep("explain", "--seed", "3", "--prompt", "x y", "--section", "decoder")
    assert "Sampling at temperature 0.8 " in tour.out, tour
    assert "Sampling at temperature 0.8 " in expl.out, expl
