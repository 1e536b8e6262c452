"""RoPE from Python (flashinfer.rope's names), against numpy written here from the public
formulas: the rotate-half form x * cos + rotate_half(x) * sin, and the interleaved form as
complex multiplication of (x[2i] + i x[2i+1]) by exp(i p theta_i) (RoFormer, eq. 13-15);
Llama 3.1's frequencies by its piecewise rule on the wavelength."""
import math

import numpy as np
import pytest

import flashstep


def np_frequencies(rotary_dim, rope_scale, rope_theta):
    return 1.0 / (rope_theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)) / rope_scale


def np_llama31_frequencies(rotary_dim, rope_scale, rope_theta, low, high, old_context_len):
    out = []
    for f in np_frequencies(rotary_dim, 1.0, rope_theta):
        wavelen = 2 * math.pi / f
        if wavelen < old_context_len / high:
            out.append(f)
        elif wavelen > old_context_len / low:
            out.append(f / rope_scale)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / rope_scale + smooth * f)
    return np.array(out)


def np_rope(x, positions, freqs, interleave):
    """x: (nnz, heads, head_dim); the first 2 * len(freqs) dims rotated."""
    x = x.astype(np.float64)
    r = 2 * len(freqs)
    angle = np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]  # (nnz, r/2)
    out = x.copy()
    if interleave:
        z = x[..., 0:r:2] + 1j * x[..., 1:r:2]
        z = z * np.exp(1j * angle)[:, None, :]
        out[..., 0:r:2], out[..., 1:r:2] = z.real, z.imag
    else:
        cos = np.concatenate([np.cos(angle), np.cos(angle)], axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(angle), np.sin(angle)], axis=-1)[:, None, :]
        head = x[..., :r]
        rotated_half = np.concatenate([-head[..., r // 2:], head[..., : r // 2]], axis=-1)
        out[..., :r] = head * cos + rotated_half * sin
    return out


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
