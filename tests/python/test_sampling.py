"""Sampling from Python: FlashInfer's names, the Philox stream, the oracle, speculative
verification, and ValueError on bad input.

Expected values come from numpy written here or from published constants (Random123),
not from the module under test. The 10^6-draw distribution tests are in the C++
statistics suite; here a 10^5-draw check guards the binding.
"""
import math

import numpy as np
import pytest

import flashstep


def float32_row(rng, vocab, zeros=0.1):
    w = np.exp(rng.normal(0, 2, vocab))
    w[rng.random(vocab) < zeros] = 0.0
    w[0] = max(w[0], 1e-3)
    return (w / w.sum()).astype(np.float32).astype(np.float64)


def test_philox_uniform_is_random123_word_over_2_24():
    # Random123 kat_vectors, "philox4x32 10" with counter 0 and key 0.
    words = [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    got = flashstep.philox_uniform(0, 0, np.arange(4))
    np.testing.assert_array_equal(got, [(w >> 8) / 2**24 for w in words])
    u = flashstep.philox_uniform(12345, 7, np.arange(1000))
    assert u.min() >= 0.0 and u.max() < 1.0
    np.testing.assert_array_equal(u * 2**24, np.floor(u * 2**24))


def test_plain_sampling_follows_the_documented_uniforms(rng):
    p = float32_row(rng, 60)[None, :]
    seed, offset = int(rng.integers(2**63)), int(rng.integers(100))
    print("seed", seed, "offset", offset)
    samples = flashstep.sampling_from_probs(p, indices=np.zeros(300, np.int32), seed=seed, offset=offset)
    assert samples.dtype == np.int32 and samples.shape == (300,)
    cdf = np.cumsum(p[0].astype(np.longdouble))
    for i, s in enumerate(samples):
        u = flashstep.philox_uniform(seed, i, [offset])[0]
        assert s == np.argmax(cdf > u * cdf[-1]), i


def test_oracle_by_hand():
    p = np.array([[0.5, 0.25, 0.125, 0.125]])
    np.testing.assert_allclose(flashstep.sampling_target_probs(p, "top_k", top_k=2), [[2 / 3, 1 / 3, 0, 0]])
    np.testing.assert_allclose(flashstep.sampling_target_probs(p, "top_k", top_k=3), p)  # tie kept
    np.testing.assert_allclose(flashstep.sampling_target_probs(p, "top_p", top_p=0.75), [[2 / 3, 1 / 3, 0, 0]])
    np.testing.assert_allclose(flashstep.sampling_target_probs(p, "min_p", min_p=0.5), [[2 / 3, 1 / 3, 0, 0]])
    np.testing.assert_allclose(flashstep.sampling_target_probs(p, "top_k_top_p", top_k=1, top_p=0.9), [[1, 0, 0, 0]])


def np_top_k_renorm(p, k):
    kth = np.sort(p)[::-1][k - 1]
    kept = np.where(p >= kth, p, 0.0)
    return kept / kept.sum()


def test_renorm_mask_and_softmax_match_numpy(rng):
    p = float32_row(rng, 40, zeros=0.0)[None, :]
    np.testing.assert_allclose(flashstep.top_k_renorm_probs(p, 7)[0], np_top_k_renorm(p[0], 7), rtol=1e-6)
    # FlashInfer's top_k_mask_logits docstring example, k = 3.
    logits = np.array([[1.0783, 0.8008, 1.6806, 0.3559, -0.6866]])
    np.testing.assert_array_equal(flashstep.top_k_mask_logits(logits, 3), [[1.0783, 0.8008, 1.6806, -np.inf, -np.inf]])
    x = rng.normal(size=(3, 11))
    t = np.array([0.5, 1.0, 2.0])
    e = np.exp(x / t[:, None] - (x / t[:, None]).max(axis=1, keepdims=True))
    np.testing.assert_allclose(flashstep.softmax(x, t), e / e.sum(axis=1, keepdims=True), rtol=1e-13)
    np.testing.assert_allclose(flashstep.softmax(x), flashstep.softmax(x, 1.0))


def test_top_k_draws_match_the_oracle(rng):
    vocab, n = 64, 100_000
    p = float32_row(rng, vocab)[None, :]
    seed = int(rng.integers(2**63))
    samples, rounds = flashstep.top_k_sampling_from_probs(
        p, 8, indices=np.zeros(n, np.int32), seed=seed, return_rounds=True)
    target = flashstep.sampling_target_probs(p, "top_k", top_k=8)[0]
    counts = np.bincount(samples, minlength=vocab)
    assert counts[target == 0].sum() == 0  # masked and zero tokens are never drawn
    expected = target * n
    big = expected >= 50
    z = np.abs(counts[big] - expected[big]) / np.sqrt(expected[big] * (1 - target[big]))
    assert z.max() < 6, z.max()
    assert rounds.min() >= 1 and rounds.mean() < 8


def test_evaluations_params_and_indices(rng):
    probs = np.stack([float32_row(rng, 100) for _ in range(3)])
    idx = rng.integers(0, 3, 200).astype(np.int32)
    seed = int(rng.integers(2**63))
    for fn, args in [
        (flashstep.top_k_sampling_from_probs, (5,)),
        (flashstep.top_p_sampling_from_probs, (0.4,)),
        (flashstep.min_p_sampling_from_probs, (0.3,)),
        (flashstep.top_k_top_p_sampling_from_probs, (10, 0.6)),
    ]:
        a = fn(probs, *args, indices=idx, seed=seed, evaluation="per_output")
        b = fn(probs, *args, indices=idx, seed=seed, evaluation="batched")
        np.testing.assert_array_equal(a, b)
        assert np.all(probs[idx, a] > 0)
    # A per-output array equal to the scalar gives the same draws.
    k = np.full(200, 5, np.int64)
    np.testing.assert_array_equal(
        flashstep.top_k_sampling_from_probs(probs, k, indices=idx, seed=seed),
        flashstep.top_k_sampling_from_probs(probs, 5, indices=idx, seed=seed))
    joint = flashstep.top_k_top_p_sampling_from_logits(np.log(probs + 1e-30), 10, 0.6, filter_apply_order="joint")
    assert joint.shape == (3,)


def test_chain_speculative_one_hot_targets_are_exact(rng):
    b, n, vocab = 50, 3, 12
    draft = rng.random((b, n, vocab))
    draft /= draft.sum(axis=2, keepdims=True)
    wanted = rng.integers(0, vocab, (b, n + 1))
    target = np.zeros((b, n + 1, vocab))
    np.put_along_axis(target, wanted[:, :, None], 1.0, axis=2)
    drafts = np.where(rng.random((b, n)) < 0.6, wanted[:, :n], (wanted[:, :n] + 1) % vocab)
    out, accepted, emitted = flashstep.chain_speculative_sampling(draft, drafts, target, seed=int(rng.integers(2**63)))
    assert out.shape == (b, n + 1) and out.dtype == np.int32
    match = drafts == wanted[:, :n]
    for r in range(b):
        stop = int(np.argmin(match[r])) if not match[r].all() else n
        assert emitted[r] == stop and accepted[r] == match[r].sum()
        np.testing.assert_array_equal(out[r, : stop + 1], wanted[r, : stop + 1])
        assert np.all(out[r, stop + 1:] == -1)


@pytest.mark.parametrize(
    "call, fragments",
    [
        (lambda: flashstep.sampling_from_probs(np.array([[0.5, np.nan]])), ["probs[0, 1]", "NaN"]),
        (lambda: flashstep.sampling_from_probs(np.array([[0.5, -0.5]])), ["non-negative"]),
        (lambda: flashstep.sampling_from_probs(np.zeros((1, 3))), ["row 0", "sums to zero"]),
        (lambda: flashstep.sampling_from_probs(np.zeros((1, 0))), ["vocab_size >= 1"]),
        (lambda: flashstep.top_k_sampling_from_probs(np.full((1, 4), 0.25), 0), ["top_k must be >= 1"]),
        (lambda: flashstep.top_k_sampling_from_probs(np.full((1, 4), 0.25), np.array([1.5])), ["top_k", "int"]),
        (lambda: flashstep.top_p_sampling_from_probs(np.full((1, 4), 0.25), 0.0), ["top_p must be in (0, 1]"]),
        (lambda: flashstep.top_p_sampling_from_probs(np.full((1, 4), 0.25), 1.2), ["top_p", "1.2"]),
        (lambda: flashstep.min_p_sampling_from_probs(np.full((1, 4), 0.25), 2.0), ["min_p must be in [0, 1]"]),
        (lambda: flashstep.softmax(np.zeros((1, 3)), 0.0), ["temperature", "greedy"]),
        (lambda: flashstep.top_k_top_p_sampling_from_probs(np.full((1, 4), 0.25), 2, 0.5, filter_apply_order="both"),
         ["filter_apply_order"]),
        (lambda: flashstep.sampling_from_probs(np.full((1, 4), 0.25), evaluation="fast"), ["evaluation"]),
        (lambda: flashstep.sampling_from_probs(np.full((1, 4), 0.25), indices=np.array([0, 1])), ["indices[1] = 1"]),
        (lambda: flashstep.chain_speculative_sampling(np.full((1, 1, 2), 0.5), np.array([[5]]), np.full((1, 2, 2), 0.5)),
         ["draft_token_ids[0, 0] = 5"]),
    ],
)
def test_bad_input_raises_value_error(call, fragments):
    with pytest.raises(ValueError) as e:
        call()
    for f in fragments:
        assert f in str(e.value)


def test_docstrings_name_the_conventions():
    assert "philox_uniform(seed, i, offset + j)" in flashstep.top_k_sampling_from_probs.__doc__
    assert "-1" in flashstep.chain_speculative_sampling.__doc__
    assert math.isclose(flashstep.philox_uniform(0, 0, [0])[0], 0x6627E8 / 2**24)
