# Solution of notebook 07's "your turn": which (Br x page) blocks of one request are present.
import numpy as np


def my_block_mask(qo_len, kv_len, Br, page_size, causal):
    num_pages = -(-kv_len // page_size)
    mask = np.zeros((-(-qo_len // Br), num_pages), dtype=bool)
    for i in range(qo_len):
        for j in range(kv_len):
            if not causal or j <= i + (kv_len - qo_len):  # query i sees key j
                mask[i // Br, j // page_size] = True
    return mask
