# Solution of notebook 05's "your turn": gather one request's K and V from its pages.
import numpy as np


def my_gather(pool, kv_indptr, kv_indices, kv_last_page_len, r):
    page_size = pool.shape[2]
    pages = kv_indices[kv_indptr[r]:kv_indptr[r + 1]]
    kv_len = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + kv_last_page_len[r]
    # token t lives in page pages[t // page_size], slot t % page_size
    t = np.arange(kv_len)
    return pool[pages[t // page_size], 0, t % page_size], pool[pages[t // page_size], 1, t % page_size]
