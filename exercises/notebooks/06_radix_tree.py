# Solution of notebook 06's "your turn": the longest cached prefix, in whole pages.
import numpy as np


def my_match_length(cached, tokens, page_size):
    best = 0
    for c in cached:
        n = 0
        while n < min(len(c), len(tokens)) and c[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best // page_size * page_size  # only whole pages are cached and matched
