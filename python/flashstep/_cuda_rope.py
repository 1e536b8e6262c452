"""Stage 09's RoPE kernel under FlashInfer's flashinfer.rope functions
(https://docs.flashinfer.ai/api/rope.html); the math is the reference's
(flashstep/reference/rope.hpp), the kernel stage 09's (rope_kernel.cuh)."""
import ctypes

from . import _capi
from ._cuda_common import (_ATTENTION_DTYPES, _DTYPES, _DeviceGuard, _check_on_device, _ptr)
from ._tensors import check, current_stream, device_array, empty, same_device


def _rope(fn, q, k, inplace, positions, rotary_dim, interleave, rope_scale, rope_theta, llama31=None):
    """positions: ("pos_ids", array) or ("offsets", indptr, offsets)."""
    qa = check(device_array(q, fn, "q"), fn, "q", dtypes=_ATTENTION_DTYPES, shape=(None, None, None))
    nnz, hq, dim = qa.shape
    ka = check(device_array(k, fn, "k"), fn, "k", dtypes=(qa.dtype,), shape=(nnz, None, dim))
    rotary_dim = dim if rotary_dim is None else rotary_dim
    if not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool) or rotary_dim < 2 or rotary_dim % 2 or \
            rotary_dim > dim:
        raise ValueError(f"{fn}: rotary_dim must be an even int in 2..head_dim ({dim}); got {rotary_dim!r}")
    for name, v in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 or v == float("inf"):
            raise ValueError(f"{fn}: {name} must be a positive finite number; got {v!r}")
    arrays = [(qa, "q"), (ka, "k")]
    pos = ind = off = None
    batch = 0
    if positions[0] == "pos_ids":
        pos = check(device_array(positions[1], fn, "pos_ids"), fn, "pos_ids", dtypes=("int32",), shape=(nnz,))
        arrays.append((pos, "pos_ids"))
    else:
        ind = check(device_array(positions[1], fn, "indptr"), fn, "indptr", dtypes=("int32",), shape=(None,))
        batch = ind.shape[0] - 1
        if batch < 1:
            raise ValueError(f"{fn}: indptr must have batch_size + 1 >= 2 entries")
        off = check(device_array(positions[2], fn, "offsets"), fn, "offsets", dtypes=("int32",), shape=(batch,))
        arrays += [(ind, "indptr"), (off, "offsets")]
    for a, name in arrays:
        _check_on_device(a, fn, name)
    if inplace:
        q_out, k_out, qo, ko = None, None, qa, ka
    else:
        q_out, k_out = empty(qa, qa.shape, qa.dtype, fn, "q_rope"), empty(qa, ka.shape, ka.dtype, fn, "k_rope")
        qo, ko = device_array(q_out, fn, "q_rope"), device_array(k_out, fn, "k_rope")
    low, high, old = llama31 if llama31 is not None else (1.0, 4.0, 8192.0)
    null = ctypes.c_void_p(0)
    with _DeviceGuard(same_device(fn, arrays)):
        _capi.call("fs_apply_rope", _DTYPES[qa.dtype], _ptr(qa), _ptr(ka), _ptr(qo), _ptr(ko), nnz, hq, ka.shape[1],
                   dim, rotary_dim, int(bool(interleave)), _ptr(pos) if pos is not None else null,
                   _ptr(ind) if ind is not None else null, _ptr(off) if off is not None else null, batch,
                   ctypes.c_double(rope_scale), ctypes.c_double(rope_theta), int(llama31 is not None),
                   ctypes.c_double(low), ctypes.c_double(high), ctypes.c_double(old),
                   ctypes.c_void_p(current_stream(qa)))
    return None if inplace else (q_out, k_out)


def apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """RoPE on q (nnz, num_q_heads, head_dim) and k (nnz, num_k_heads, head_dim) of a ragged
    batch: row t of request b (indptr[b] <= t < indptr[b + 1]) sits at position offsets[b] +
    t - indptr[b]. Returns (q_rope, k_rope); FlashInfer's apply_rope."""
    return _rope("apply_rope", q, k, False, ("offsets", indptr, offsets), rotary_dim, interleave, rope_scale,
                 rope_theta)


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """apply_rope into q and k."""
    return _rope("apply_rope_inplace", q, k, True, ("offsets", indptr, offsets), rotary_dim, interleave, rope_scale,
                 rope_theta)


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """RoPE with each row's position given: pos_ids (nnz) int32. Returns (q_rope, k_rope)."""
    return _rope("apply_rope_pos_ids", q, k, False, ("pos_ids", pos_ids), rotary_dim, interleave, rope_scale,
                 rope_theta)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """apply_rope_pos_ids into q and k."""
    return _rope("apply_rope_pos_ids_inplace", q, k, True, ("pos_ids", pos_ids), rotary_dim, interleave, rope_scale,
                 rope_theta)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=5e5,
                       low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_rope with Llama 3.1's frequencies (FlashInfer's apply_llama31_rope)."""
    return _rope("apply_llama31_rope", q, k, False, ("offsets", indptr, offsets), rotary_dim, interleave, rope_scale,
                 rope_theta, (low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8,
                               rope_theta=5e5, low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope into q and k."""
    return _rope("apply_llama31_rope_inplace", q, k, True, ("offsets", indptr, offsets), rotary_dim, interleave,
                 rope_scale, rope_theta, (low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=5e5,
                               low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_rope_pos_ids with Llama 3.1's frequencies."""
    return _rope("apply_llama31_rope_pos_ids", q, k, False, ("pos_ids", pos_ids), rotary_dim, interleave, rope_scale,
                 rope_theta, (low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8,
                                       rope_theta=5e5, low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope_pos_ids into q and k."""
    return _rope("apply_llama31_rope_pos_ids_inplace", q, k, True, ("pos_ids", pos_ids), rotary_dim, interleave,
                 rope_scale, rope_theta, (low_freq_factor, high_freq_factor, old_context_len))
