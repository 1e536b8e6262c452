"""MLA from Python (the reference's mla.hpp, FlashInfer's argument names), against numpy
written from DeepSeek-V2's equations (section 2.1): the naive form builds every head's
keys and values, the absorbed form attends to the shared latents; both agree with numpy,
and the paged call with the per-request one."""
import numpy as np
import pytest

import flashstep

RANK, ROPE, NOPE, VO = 32, 8, 12, 10


def np_attention(q, k, v, scale, causal):
    """Softmax attention of one head: q (n, d), k (m, d), v (m, dv); bottom-right causal."""
    s = scale * q @ k.T
    n, m = s.shape
    if causal:
        s = np.where(np.arange(m)[None, :] <= np.arange(n)[:, None] + (m - n), s, -np.inf)
    mx = s.max(axis=1, keepdims=True)
    p = np.exp(s - mx)
    return (p @ v) / p.sum(axis=1, keepdims=True), (mx[:, 0] + np.log(p.sum(axis=1)))


@pytest.mark.parametrize("causal,qo_len", [(False, 1), (True, 4)])
def test_naive_and_absorbed_match_numpy(rng, causal, qo_len):
    heads, kv_len = 3, 23
    q_nope = rng.standard_normal((qo_len, heads, NOPE))
    q_pe = rng.standard_normal((qo_len, heads, ROPE))
    ckv, kpe = rng.standard_normal((kv_len, RANK)), rng.standard_normal((kv_len, ROPE))
    w_uk, w_uv = 0.3 * rng.standard_normal((heads, NOPE, RANK)), 0.3 * rng.standard_normal((heads, VO, RANK))
    scale = 1 / np.sqrt(NOPE + ROPE)
    o, lse = flashstep.mla_naive(q_nope, q_pe, ckv, kpe, w_uk, w_uv, causal=causal, return_lse=True)
    for h in range(heads):  # the naive form in numpy: per-head keys and values
        k = np.concatenate([ckv @ w_uk[h].T, kpe], axis=1)
        want_o, want_lse = np_attention(np.concatenate([q_nope[:, h], q_pe[:, h]], axis=1), k, ckv @ w_uv[h].T,
                                        scale, causal)
        np.testing.assert_allclose(o[:, h], want_o, rtol=0, atol=1e-11)
        np.testing.assert_allclose(lse[:, h], want_lse, rtol=0, atol=1e-11)
    q_lat = flashstep.mla_absorb_query(q_nope, w_uk)
    np.testing.assert_allclose(q_lat, np.einsum("ihe,hed->ihd", q_nope, w_uk), rtol=0, atol=1e-12)
    o_lat, lse_lat = flashstep.mla_attention(q_lat, q_pe, ckv, kpe, sm_scale=scale, causal=causal, return_lse=True)
    np.testing.assert_allclose(flashstep.mla_project_output(o_lat, w_uv), o, rtol=0, atol=1e-11)
    np.testing.assert_allclose(lse_lat, lse, rtol=0, atol=1e-11)


def test_paged_matches_per_request(rng):
    heads, page = 2, 4
    lens, qo = [9, 0, 13], [1, 1, 1]
    ckv = [rng.standard_normal((n, RANK)) for n in lens]
    kpe = [rng.standard_normal((n, ROPE)) for n in lens]
    pages = [(n + page - 1) // page for n in lens]
    order = rng.permutation(sum(pages) + 2).astype(np.int32)
    ckv_cache = np.full((len(order), page, RANK), np.nan)
    kpe_cache = np.full((len(order), page, ROPE), np.nan)
    kv_indptr, kv_indices = [0], []
    for b, n in enumerate(lens):
        ids = order[kv_indptr[-1]:kv_indptr[-1] + pages[b]]
        for t in range(n):
            ckv_cache[ids[t // page], t % page] = ckv[b][t]
            kpe_cache[ids[t // page], t % page] = kpe[b][t]
        kv_indices += list(ids)
        kv_indptr.append(kv_indptr[-1] + pages[b])
    qo_indptr = np.cumsum([0] + qo).astype(np.int32)
    q_lat = rng.standard_normal((qo_indptr[-1], heads, RANK))
    q_pe = rng.standard_normal((qo_indptr[-1], heads, ROPE))
    scale = 1 / np.sqrt(NOPE + ROPE)
    o, lse = flashstep.batch_mla_paged_attention(q_lat, q_pe, qo_indptr, ckv_cache, kpe_cache, kv_indptr,
                                                 kv_indices, lens, sm_scale=scale, return_lse=True)
    for b in range(len(lens)):
        sl = slice(qo_indptr[b], qo_indptr[b + 1])
        want_o, want_lse = flashstep.mla_attention(q_lat[sl], q_pe[sl], ckv[b], kpe[b], sm_scale=scale,
                                                   return_lse=True)
        np.testing.assert_array_equal(o[sl], want_o)
        np.testing.assert_array_equal(lse[sl], want_lse)
    assert np.all(lse[1] == -np.inf) and np.all(o[1] == 0)  # the empty request


def test_absorbed_form_asks_for_the_scale(rng):
    q_lat, q_pe = rng.standard_normal((1, 2, RANK)), rng.standard_normal((1, 2, ROPE))
    ckv, kpe = rng.standard_normal((5, RANK)), rng.standard_normal((5, ROPE))
    with pytest.raises(ValueError, match="mla_attention: sm_scale is required"):
        flashstep.mla_attention(q_lat, q_pe, ckv, kpe)
