"""RoPE in numpy, written from the public formulas (no flashstep code): the rotate-half
form x * cos + rotate_half(x) * sin, and the interleaved form as complex multiplication of
(x[2i] + i x[2i+1]) by exp(i p theta_i) (RoFormer, arXiv 2104.09864, eq. 13-15); Llama
3.1's frequencies by its piecewise rule on the wavelength. Shared by test_rope.py (the
reference) and test_cuda_gpu.py (stage 09's kernel)."""
import math

import numpy as np


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
