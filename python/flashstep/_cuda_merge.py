"""The merge of attention states: FlashInfer's merge_state, merge_state_in_place and merge_states."""
import ctypes

from . import _capi
from ._cuda_common import (_ATTENTION_DTYPES, _DTYPES, _DeviceGuard, _check_on_device, _ptr)
from ._tensors import check, current_stream, device_array, empty, same_device


def merge_state(v_a, s_a, v_b, s_b):
    """Merges the attention states of two index sets: v_a, v_b (seq_len, num_heads,
    head_dim), s_a, s_b (seq_len, num_heads) float32 -> (v, s). s is the natural-log
    lse (FlashInfer's merge_state takes and returns base 2: pass s * log2(e) to it)."""
    fn = "merge_state"
    a = check(device_array(v_a, fn, "v_a"), fn, "v_a", dtypes=_ATTENTION_DTYPES, shape=(None, None, None))
    seq, heads, dim = a.shape
    sa = check(device_array(s_a, fn, "s_a"), fn, "s_a", dtypes=("float32",), shape=(seq, heads))
    b = check(device_array(v_b, fn, "v_b"), fn, "v_b", dtypes=(a.dtype,), shape=a.shape)
    sb = check(device_array(s_b, fn, "s_b"), fn, "s_b", dtypes=("float32",), shape=(seq, heads))
    v_out, s_out = empty(a, a.shape, a.dtype, fn, "v"), empty(a, (seq, heads), "float32", fn, "s")
    _merge_two(fn, a, sa, b, sb, device_array(v_out, fn, "v"), device_array(s_out, fn, "s"))
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """merge_state into (v, s), in place. mask is not supported (pass None)."""
    fn = "merge_state_in_place"
    if mask is not None:
        raise ValueError(f"{fn}: mask is not supported")
    a = check(device_array(v, fn, "v"), fn, "v", dtypes=_ATTENTION_DTYPES, shape=(None, None, None))
    seq, heads, dim = a.shape
    sa = check(device_array(s, fn, "s"), fn, "s", dtypes=("float32",), shape=(seq, heads))
    b = check(device_array(v_other, fn, "v_other"), fn, "v_other", dtypes=(a.dtype,), shape=a.shape)
    sb = check(device_array(s_other, fn, "s_other"), fn, "s_other", dtypes=("float32",), shape=(seq, heads))
    _merge_two(fn, a, sa, b, sb, a, sa)


def _merge_two(fn, a, sa, b, sb, vo, so):
    arrays = [(a, "v_a"), (sa, "s_a"), (b, "v_b"), (sb, "s_b")]
    for x, name in arrays:
        _check_on_device(x, fn, name)
    with _DeviceGuard(same_device(fn, arrays)):
        _capi.call("fs_merge_state", _DTYPES[a.dtype], _ptr(a), _ptr(sa), _ptr(b), _ptr(sb), a.shape[0], a.shape[1],
                   a.shape[2], _ptr(vo), _ptr(so), ctypes.c_void_p(current_stream(a)))


def merge_states(v, s):
    """Merges num_states states per row: v (seq_len, num_states, num_heads, head_dim), s
    (seq_len, num_states, num_heads) float32, natural-log lse -> (v (seq_len, num_heads,
    head_dim), s (seq_len, num_heads)). FlashInfer's merge_states uses base 2."""
    fn = "merge_states"
    a = check(device_array(v, fn, "v"), fn, "v", dtypes=_ATTENTION_DTYPES, shape=(None, None, None, None))
    seq, n, heads, dim = a.shape
    sa = check(device_array(s, fn, "s"), fn, "s", dtypes=("float32",), shape=(seq, n, heads))
    _check_on_device(a, fn, "v")
    _check_on_device(sa, fn, "s")
    v_out, s_out = empty(a, (seq, heads, dim), a.dtype, fn, "v"), empty(a, (seq, heads), "float32", fn, "s")
    vo, so = device_array(v_out, fn, "v"), device_array(s_out, fn, "s")
    with _DeviceGuard(same_device(fn, [(a, "v"), (sa, "s")])):
        _capi.call("fs_merge_states", _DTYPES[a.dtype], _ptr(a), _ptr(sa), seq, n, heads, dim, _ptr(vo), _ptr(so),
                   ctypes.c_void_p(current_stream(a)))
    return v_out, s_out
