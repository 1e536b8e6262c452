"""RoPE from Python (flashinfer.rope's names), against numpy written from the public
formulas (rope_numpy.py: the rotate-half form, the interleaved form as complex
multiplication, RoFormer eq. 13-15; Llama 3.1's frequencies by its piecewise rule)."""
import numpy as np
import pytest
from rope_numpy import np_frequencies, np_llama31_frequencies, np_rope

import flashstep


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 32, 8])
def test_apply_rope_pos_ids_matches_numpy(rng, interleave, rotary_dim):
    nnz, hq, hk, d = 7, 4, 2, 64
    q = rng.standard_normal((nnz, hq, d)).astype(np.float32)
    k = rng.standard_normal((nnz, hk, d)).astype(np.float32)
    pos = rng.integers(0, 5000, nnz).astype(np.int32)
    r = d if rotary_dim is None else rotary_dim
    freqs = np_frequencies(r, 2.0, 5e5)
    q_rope, k_rope = flashstep.apply_rope_pos_ids(q, k, pos, rotary_dim=rotary_dim, interleave=interleave,
                                                  rope_scale=2.0, rope_theta=5e5)
    assert q_rope.dtype == np.float64 and q_rope.shape == q.shape and k_rope.shape == k.shape
    np.testing.assert_allclose(q_rope, np_rope(q, pos, freqs, interleave), rtol=0, atol=1e-10)
    np.testing.assert_allclose(k_rope, np_rope(k, pos, freqs, interleave), rtol=0, atol=1e-10)
    np.testing.assert_array_equal(q_rope[..., r:], q[..., r:])


@pytest.mark.parametrize("interleave", [False, True])
def test_apply_rope_ragged_positions(rng, interleave):
    indptr = np.array([0, 3, 3, 8], dtype=np.int32)
    offsets = np.array([10, 4, 0], dtype=np.int32)
    pos = np.array([10, 11, 12, 0, 1, 2, 3, 4])  # offsets[b] + (t - indptr[b]), written out
    q = rng.standard_normal((8, 2, 16))
    k = rng.standard_normal((8, 1, 16))
    q_rope, k_rope = flashstep.apply_rope(q, k, indptr, offsets, interleave=interleave)
    freqs = np_frequencies(16, 1.0, 1e4)
    np.testing.assert_allclose(q_rope, np_rope(q, pos, freqs, interleave), rtol=0, atol=1e-12)
    np.testing.assert_allclose(k_rope, np_rope(k, pos, freqs, interleave), rtol=0, atol=1e-12)


@pytest.mark.parametrize("interleave", [False, True])
def test_llama31_matches_numpy(rng, interleave):
    q = rng.standard_normal((5, 2, 128))
    k = rng.standard_normal((5, 1, 128))
    pos = np.array([0, 1, 100, 9000, 70000], dtype=np.int32)
    freqs = np_llama31_frequencies(128, 8.0, 5e5, 1.0, 4.0, 8192)
    # Llama 3.1's published values leave frequencies in all three bands at head_dim 128.
    plain = np_frequencies(128, 1.0, 5e5)
    assert (freqs == plain).any() and np.isclose(freqs, plain / 8).any() and ((freqs < plain) & (freqs > plain / 8)).any()
    q_rope, k_rope = flashstep.apply_llama31_rope_pos_ids(q, k, pos, interleave=interleave)
    np.testing.assert_allclose(q_rope, np_rope(q, pos, freqs, interleave), rtol=0, atol=1e-9)
    np.testing.assert_allclose(k_rope, np_rope(k, pos, freqs, interleave), rtol=0, atol=1e-9)
    q2, k2 = flashstep.apply_llama31_rope(q, k, np.array([0, 5]), np.array([0]), interleave=interleave)
    np.testing.assert_allclose(q2, np_rope(q, np.arange(5), freqs, interleave), rtol=0, atol=1e-9)


def test_bad_arguments_raise_value_error():
    q = np.zeros((3, 2, 8))
    k = np.zeros((3, 1, 8))
    with pytest.raises(ValueError, match="apply_rope: rotary_dim must be even"):
        flashstep.apply_rope(q, k, [0, 3], [0], rotary_dim=3)
    with pytest.raises(ValueError, match=r"rotary_dim \(16\) must not exceed head_dim \(8\)"):
        flashstep.apply_rope_pos_ids(q, k, [0, 1, 2], rotary_dim=16)
    with pytest.raises(ValueError, match="rope_theta must be positive"):
        flashstep.apply_rope_pos_ids(q, k, [0, 1, 2], rope_theta=0.0)
    with pytest.raises(ValueError, match="indptr must be non-decreasing"):
        flashstep.apply_rope(q, k, [0, 2, 1, 3], [0, 0, 0])
    with pytest.raises(ValueError, match="pos_ids must have one position per row"):
        flashstep.apply_rope_pos_ids(q, k, [0, 1])
    with pytest.raises(ValueError, match="high_freq_factor"):
        flashstep.apply_llama31_rope_pos_ids(q, k, [0, 1, 2], low_freq_factor=4.0, high_freq_factor=4.0)
    with pytest.raises(ValueError, match="k dimension 0"):
        flashstep.apply_rope_pos_ids(q, np.zeros((2, 1, 8)), [0, 1, 2])
