# Solution of notebook 04's "your turn": pack requests back to back, with their indptr.
import numpy as np


def my_pack(tensors):
    lengths = [t.shape[0] for t in tensors]
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return np.concatenate(tensors), indptr
