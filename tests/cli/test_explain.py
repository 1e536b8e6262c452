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
