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
    assert f"{len(prompts)} x {longest} = {len(prompts) * longest} rows" in r.out, r


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
