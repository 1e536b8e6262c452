"""The Python module: FlashInfer names and keywords, numpy in/out, ValueError on bad input.

Expected values come from numpy formulas written here, not from the module.
"""
import math

import numpy as np
import pytest

import flashstep


def np_attention(q, k, v, causal=False, sm_scale=None, window_left=-1, cap=None):
    """Plain numpy attention for one request: q (qo, Hq, D), k/v (kv, Hk, D)."""
    qo_len, hq, d = q.shape
    kv_len, hk, _ = k.shape
    sm_scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    k_rep = np.repeat(k, hq // hk, axis=1)
    v_rep = np.repeat(v, hq // hk, axis=1)
    s = np.einsum("ihd,jhd->hij", q, k_rep) * sm_scale
    if cap:
        s = cap * np.tanh(s / cap)
    i = np.arange(qo_len)[:, None] + (kv_len - qo_len)
    j = np.arange(kv_len)[None, :]
    visible = np.ones((qo_len, kv_len), bool)
    if causal:
        visible &= j <= i
    if window_left >= 0:
        visible &= j >= i - window_left
    s = np.where(visible[None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = (m[..., 0] + np.log(p.sum(-1))).transpose(1, 0)
    o = np.einsum("hij,jhd->ihd", p / p.sum(-1, keepdims=True), v_rep)
    return o, lse


def test_worked_example():
    k = np.array([[1, 0], [0, 1], [1, 1]], np.float32)[:, None, :]
    v = np.array([[1, 1], [2, 0], [0, 1]], np.float32)[:, None, :]
    o, lse = flashstep.single_decode_with_kv_cache(
        np.array([[1, 1]], np.float32), k, v, sm_scale=1.0, return_lse=True)
    assert o.dtype == np.float64
    e = math.e
    np.testing.assert_allclose(o[0], [3 / (2 + e), (1 + e) / (2 + e)], rtol=1e-14)
    np.testing.assert_allclose(lse[0], math.log(2 * e + e * e), rtol=1e-14)
    assert np.all(np.abs(o[0] - [0.63, 0.79]) < 0.01)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_prefill_matches_numpy(rng, dtype):
    q = rng.standard_normal((6, 8, 16)).astype(dtype)
    k = rng.standard_normal((20, 2, 16)).astype(dtype)
    v = rng.standard_normal((20, 2, 16)).astype(dtype)
    for causal, window, cap in [(False, -1, None), (True, -1, None), (True, 4, 2.5), (False, 3, None)]:
        o, lse = flashstep.single_prefill_with_kv_cache(
            q, k, v, causal=causal, window_left=window, logits_soft_cap=cap, return_lse=True)
        o_ref, lse_ref = np_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                      causal, None, window, cap)
        np.testing.assert_allclose(o, o_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse, lse_ref, rtol=1e-10, atol=1e-12)
    # HND gives the same numbers.
    o_hnd = flashstep.single_prefill_with_kv_cache(
        q, k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy(), causal=True, kv_layout="HND")
    o_nhd = flashstep.single_prefill_with_kv_cache(q, k, v, causal=True)
    np.testing.assert_array_equal(o_hnd, o_nhd)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_decode_and_prefill_match_numpy(rng, layout):
    page_size, hk, hq, d = 5, 2, 14, 8  # GQA group 7
    kv_lens = [1, 5, 6, 13]
    qo_lens = [1, 3, 2, 4]
    num_pages = sum(-(-n // page_size) for n in kv_lens) + 2
    order = rng.permutation(num_pages).astype(np.int32)
    pool = rng.standard_normal((num_pages, 2, page_size, hk, d))
    kv_indptr, kv_indices, last, ks, vs = [0], [], [], [], []
    nxt = 0
    for n in kv_lens:
        pages = -(-n // page_size)
        kv_indices += list(order[nxt:nxt + pages])
        nxt += pages
        kv_indptr.append(len(kv_indices))
        last.append(n - (pages - 1) * page_size)
        tok = pool[kv_indices[kv_indptr[-2]:kv_indptr[-1]]]  # (pages, 2, page, hk, d)
        ks.append(tok[:, 0].reshape(-1, hk, d)[:n])
        vs.append(tok[:, 1].reshape(-1, hk, d)[:n])
    cache = pool if layout == "NHD" else pool.transpose(0, 1, 3, 2, 4).copy()
    qo_indptr = np.cumsum([0] + qo_lens).astype(np.int32)
    q = rng.standard_normal((qo_indptr[-1], hq, d))
    o, lse = flashstep.batch_prefill_with_paged_kv_cache(
        q, qo_indptr, cache, np.array(kv_indptr, np.int32), np.array(kv_indices, np.int32),
        np.array(last, np.int32), causal=True, kv_layout=layout, return_lse=True)
    for b in range(len(kv_lens)):
        o_ref, lse_ref = np_attention(q[qo_indptr[b]:qo_indptr[b + 1]], ks[b], vs[b], causal=True)
        np.testing.assert_allclose(o[qo_indptr[b]:qo_indptr[b + 1]], o_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[qo_indptr[b]:qo_indptr[b + 1]], lse_ref, rtol=1e-10, atol=1e-12)
    # Decode with the (k_cache, v_cache) tuple form.
    qd = rng.standard_normal((len(kv_lens), hq, d)).astype(np.float32)
    od = flashstep.batch_decode_with_paged_kv_cache(
        qd, (cache[:, 0], cache[:, 1]), kv_indptr, kv_indices, last, kv_layout=layout)
    for b in range(len(kv_lens)):
        o_ref, _ = np_attention(qd[b:b + 1].astype(np.float64), ks[b], vs[b])
        np.testing.assert_allclose(od[b], o_ref[0], rtol=1e-10, atol=1e-12)


def test_ragged_and_merge(rng):
    q = rng.standard_normal((5, 4, 8))
    k = rng.standard_normal((9, 4, 8))
    v = rng.standard_normal((9, 4, 8))
    o, lse = flashstep.batch_prefill_with_ragged_kv_cache(
        q, np.array([0, 2, 5]), k, v, np.array([0, 4, 9]), return_lse=True)
    o_ref, lse_ref = np_attention(q[2:], k[4:], v[4:])
    np.testing.assert_allclose(o[2:], o_ref, rtol=1e-10, atol=1e-12)
    # Split request 1's keys, merge: the whole.
    oa, sa = flashstep.single_prefill_with_kv_cache(q[2:], k[4:6], v[4:6], return_lse=True)
    ob, sb = flashstep.single_prefill_with_kv_cache(q[2:], k[6:], v[6:], return_lse=True)
    om, sm = flashstep.merge_state(oa, sa, ob, sb)
    np.testing.assert_allclose(om, o_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sm, lse_ref, rtol=1e-10, atol=1e-12)
    om2, sm2 = flashstep.merge_states(np.stack([oa, ob], 1), np.stack([sa, sb], 1))
    np.testing.assert_allclose(om2, om, rtol=1e-13)
    np.testing.assert_allclose(sm2, sm, rtol=1e-13)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_head_dim_vo_differs_from_head_dim(rng, layout):
    """MLA's prefill shape scaled down: q and k 24 wide, v 16; o is v's width and the
    default scale is 1/sqrt(24), q's head_dim (numpy's attention as the oracle)."""
    q = rng.standard_normal((7, 4, 24))
    k = rng.standard_normal((13, 2, 24))
    v = rng.standard_normal((13, 2, 16))
    kv = (lambda t: t.transpose(1, 0, 2).copy()) if layout == "HND" else (lambda t: t)
    o, lse = flashstep.batch_prefill_with_ragged_kv_cache(
        q, np.array([0, 3, 7]), kv(k), kv(v), np.array([0, 5, 13]), causal=True, kv_layout=layout, return_lse=True)
    assert o.shape == (7, 4, 16)
    for (q0, q1), (k0, k1) in [((0, 3), (0, 5)), ((3, 7), (5, 13))]:
        o_ref, lse_ref = np_attention(q[q0:q1], k[k0:k1], v[k0:k1], causal=True)
        np.testing.assert_allclose(o[q0:q1], o_ref, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lse[q0:q1], lse_ref, rtol=1e-10, atol=1e-12)
    o1 = flashstep.single_prefill_with_kv_cache(q[3:], kv(k[5:]), kv(v[5:]), causal=True, kv_layout=layout)
    np.testing.assert_array_equal(o1, o[3:])
    od = flashstep.single_decode_with_kv_cache(q[6], kv(k[5:]), kv(v[5:]), kv_layout=layout)
    np.testing.assert_allclose(od, o[6], rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="k and v must have the same shape but for the last dimension"):
        flashstep.single_prefill_with_kv_cache(q, k, v[:, :1])


def test_paged_prefill_with_a_narrower_v_cache(rng):
    """(k_cache, v_cache) with v narrower (MLA's prefill shape): the paged call equals the
    ragged one on the same rows; NHD, pages of 4, shuffled."""
    k_rows, v_rows = rng.standard_normal((13, 2, 24)), rng.standard_normal((13, 2, 16))
    q = rng.standard_normal((7, 4, 24))
    kv_indptr_rows, qo_indptr = np.array([0, 5, 13]), np.array([0, 3, 7])
    pages = [2, 0, 4, 1]  # request 0: pages 2, 0 (5 rows); request 1: pages 4, 1 (8 rows)
    k_cache, v_cache = np.full((5, 4, 2, 24), np.nan), np.full((5, 4, 2, 16), np.nan)
    for row, (page, slot) in enumerate([(2, 0), (2, 1), (2, 2), (2, 3), (0, 0)] +
                                       [(4, s) for s in range(4)] + [(1, s) for s in range(4)]):
        k_cache[page, slot], v_cache[page, slot] = k_rows[row], v_rows[row]
    o, lse = flashstep.batch_prefill_with_paged_kv_cache(
        q, qo_indptr, (k_cache, v_cache), np.array([0, 2, 4]), np.array(pages), np.array([1, 4]), causal=True,
        return_lse=True)
    o_r, lse_r = flashstep.batch_prefill_with_ragged_kv_cache(q, qo_indptr, k_rows, v_rows, kv_indptr_rows,
                                                              causal=True, return_lse=True)
    assert o.shape == (7, 4, 16)
    np.testing.assert_array_equal(o, o_r)
    np.testing.assert_array_equal(lse, lse_r)
    with pytest.raises(ValueError, match="same shape but for the last dimension"):
        flashstep.batch_prefill_with_paged_kv_cache(q, qo_indptr, (k_cache, v_cache[:, :, :1]), np.array([0, 2, 4]),
                                                    np.array(pages), np.array([1, 4]))


def test_append_paged_kv_cache_in_place(rng):
    pool = np.full((4, 2, 2, 1, 3), np.nan, np.float32)
    k_new = rng.standard_normal((3, 1, 3)).astype(np.float32)
    v_new = rng.standard_normal((3, 1, 3)).astype(np.float32)
    b, p = flashstep.get_batch_indices_positions(np.array([0, 3], np.int32), np.array([3], np.int32), 3)
    np.testing.assert_array_equal(p, [0, 1, 2])
    flashstep.append_paged_kv_cache(k_new, v_new, b, p, pool, np.array([2, 0], np.int32),
                                    np.array([0, 2], np.int32), np.array([1], np.int32))
    np.testing.assert_array_equal(pool[2, 0, :, 0], k_new[:2, 0])
    np.testing.assert_array_equal(pool[0, 1, 0, 0], v_new[2, 0])
    k, v = flashstep.gather_paged_kv(pool, [0, 2], [2, 0], [1], 0)
    np.testing.assert_allclose(k, k_new, rtol=1e-7)


@pytest.mark.parametrize("call, fragment", [
    (lambda: flashstep.single_decode_with_kv_cache(np.ones((4, 8)), np.ones((5, 3, 8)), np.ones((5, 3, 8))),
     "num_qo_heads (4) must be a multiple of num_kv_heads (3)"),
    (lambda: flashstep.single_decode_with_kv_cache(np.ones((4, 8), np.int64), np.ones((5, 2, 8)), np.ones((5, 2, 8))),
     "q must be float32 or float64"),
    (lambda: flashstep.single_prefill_with_kv_cache(np.full((2, 4, 8), np.nan), np.ones((5, 2, 8)), np.ones((5, 2, 8))),
     "q must be finite"),
    (lambda: flashstep.single_prefill_with_kv_cache(np.ones((2, 4, 8)), np.ones((5, 2, 8)), np.ones((5, 2, 8)), kv_layout="XYZ"),
     "kv_layout"),
    (lambda: flashstep.batch_decode_with_paged_kv_cache(np.ones((1, 2, 4)), np.ones((3, 2, 2, 2, 4)), [1, 2], [0], [1]),
     "kv_indptr[0] must be 0"),
    (lambda: flashstep.batch_decode_with_paged_kv_cache(np.ones((1, 2, 4)), np.ones((3, 2, 2, 2, 4)), [0, 1], [3], [1]),
     "kv_indices[0] = 3"),
    (lambda: flashstep.batch_decode_with_paged_kv_cache(np.ones((1, 2, 4)), np.ones((3, 2, 2, 2, 4)), [0, 1], [0], [3]),
     "kv_last_page_len[0] = 3"),
    (lambda: flashstep.batch_decode_with_paged_kv_cache(np.ones((1, 2, 4)), np.ones((3, 2, 2, 2, 4)), [0, 1.5], [0], [1]),
     "kv_indptr must hold integers"),
    (lambda: flashstep.merge_state(np.ones((2, 3, 4)), np.ones((2, 3)), np.ones((2, 3, 4)), np.ones((3, 3))),
     "s_b must have shape (2, 3)"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, fragment):
    with pytest.raises(ValueError) as err:
        call()
    assert fragment in str(err.value)
