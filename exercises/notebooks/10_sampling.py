# Solution of notebook 10's "your turn": which tokens top-p sampling keeps.
import numpy as np


def my_top_p_keep(probs, top_p):
    # keep token i iff the mass of the tokens strictly more likely than it is below top_p
    above = np.array([probs[probs > p].sum() for p in probs])
    return (above < top_p * probs.sum()) & (probs > 0)
