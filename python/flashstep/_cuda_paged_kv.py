"""Writing into the paged KV cache: FlashInfer's append_paged_kv_cache and get_batch_indices_positions."""
import ctypes

from . import _capi
from ._cuda_common import (_ATTENTION_DTYPES, _check_on_device, _DeviceGuard, _DTYPES, _KV_DTYPES, _layout, _LAYOUTS,
                           _ptr, _scale)
from ._tensors import ITEMSIZE, check, current_stream, device_array, same_device


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices,
                          kv_indptr, kv_last_page_len, kv_layout="NHD", k_scale=None, v_scale=None):
    """Writes row r of append_key / append_value (nnz, num_kv_heads, head_dim) at position
    positions[r] of request batch_indices[r]: page kv_indices[kv_indptr[b] + p //
    page_size], slot p % page_size. The page table must already include the new tokens
    (kv_last_page_len, (batch_size), is checked for its shape only). paged_kv_cache is one
    5-D pool or a (k_cache, v_cache) pair of 4-D caches. A row whose request, position or
    page falls outside the table is not written (FlashInfer does not check).

    Rows of the cache's dtype are copied (FlashInfer's append). float16/bfloat16 rows into
    a float8_e4m3fn / float8_e5m2 cache are quantized on write: x is stored as the FP8
    value nearest to x / k_scale (keys) or x / v_scale (values), ties to even, saturating
    (None: 1; the scales run() then reads back). FlashInfer has no such conversion: it
    takes rows already in the cache's dtype."""
    fn = "append_paged_kv_cache"
    layout = _layout(kv_layout, fn)
    k = check(device_array(append_key, fn, "append_key"), fn, "append_key",
              dtypes=_ATTENTION_DTYPES + tuple(_KV_DTYPES), shape=(None, None, None), contiguous=False)
    # The cache's dtype: the rows', or FP8 for 16-bit rows (quantize on write).
    cache_dtypes = (k.dtype,) + (tuple(_KV_DTYPES) if k.dtype in ("float16", "bfloat16") else ())
    nnz, heads, dim = k.shape
    v = check(device_array(append_value, fn, "append_value"), fn, "append_value", dtypes=(k.dtype,), shape=k.shape,
              contiguous=False)
    for a, name in ((k, "append_key"), (v, "append_value")):
        if a.strides[1:] != (dim, 1):
            raise ValueError(f"{fn}: {name} must have contiguous heads and dims (strides (*, {dim}, 1)); "
                             f"it has {a.strides}")
    bi = check(device_array(batch_indices, fn, "batch_indices"), fn, "batch_indices", dtypes=("int32",), shape=(nnz,))
    pos = check(device_array(positions, fn, "positions"), fn, "positions", dtypes=("int32",), shape=(nnz,))
    ip = check(device_array(kv_indptr, fn, "kv_indptr"), fn, "kv_indptr", dtypes=("int32",), shape=(None,))
    batch = ip.shape[0] - 1
    if batch < 0:
        raise ValueError(f"{fn}: kv_indptr must have batch_size + 1 >= 1 entries")
    ind = check(device_array(kv_indices, fn, "kv_indices"), fn, "kv_indices", dtypes=("int32",), shape=(None,))
    check(device_array(kv_last_page_len, fn, "kv_last_page_len"), fn, "kv_last_page_len", dtypes=("int32",),
          shape=(batch,))
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"{fn}: paged_kv_cache must be one 5-D tensor or a (k_cache, v_cache) pair")
        kc = check(device_array(paged_kv_cache[0], fn, "paged_kv_cache[0]"), fn, "paged_kv_cache[0]",
                   dtypes=cache_dtypes, shape=(None, None, None, dim), contiguous=False)
        vc = check(device_array(paged_kv_cache[1], fn, "paged_kv_cache[1]"), fn, "paged_kv_cache[1]",
                   dtypes=(kc.dtype,), shape=kc.shape, contiguous=False)
        cache_dtype = kc.dtype
        num_pages, page_size = kc.shape[0], (kc.shape[1] if layout == "NHD" else kc.shape[2])
        inner = kc.shape[1] * kc.shape[2] * dim
        if kc.strides != vc.strides or kc.strides[1:] != (kc.shape[2] * dim, dim, 1):
            raise ValueError(f"{fn}: k_cache and v_cache must be pages of contiguous (page_size, heads, dim) "
                             f"blocks with equal strides; they have {kc.strides} and {vc.strides}")
        k_ptr, v_ptr, page_stride = kc.ptr, vc.ptr, kc.strides[0]
        cache_heads = kc.shape[2] if layout == "NHD" else kc.shape[1]
        cache_arrays = [(kc, "paged_kv_cache[0]"), (vc, "paged_kv_cache[1]")]
    else:
        pool = check(device_array(paged_kv_cache, fn, "paged_kv_cache"), fn, "paged_kv_cache", dtypes=cache_dtypes,
                     shape=(None, 2, None, None, dim))
        cache_dtype = pool.dtype
        num_pages = pool.shape[0]
        page_size = pool.shape[2] if layout == "NHD" else pool.shape[3]
        cache_heads = pool.shape[3] if layout == "NHD" else pool.shape[2]
        inner = pool.shape[2] * pool.shape[3] * dim
        k_ptr, v_ptr, page_stride = pool.ptr, pool.ptr + inner * ITEMSIZE[cache_dtype], 2 * inner
        cache_arrays = [(pool, "paged_kv_cache")]
    if cache_heads != heads:
        page_axes = (cache_arrays[0][0].shape[-3], cache_arrays[0][0].shape[-2])  # (page_size, heads) in NHD
        if page_axes[0 if layout == "NHD" else 1] == heads:  # the heads sit where the other layout has them
            other = "HND" if layout == "NHD" else "NHD"
            raise ValueError(f"{fn}: paged_kv_cache looks like {other}, kv_layout says {layout}: append_key's "
                             f"{heads} kv heads are on the cache's {other} heads axis (shape "
                             f"{tuple(cache_arrays[0][0].shape)}); pass kv_layout=\"{other}\"")
        raise ValueError(f"{fn}: paged_kv_cache has {cache_heads} kv heads, append_key {heads}")
    arrays = [(k, "append_key"), (v, "append_value"), (bi, "batch_indices"), (pos, "positions"),
              (ind, "kv_indices"), (ip, "kv_indptr")] + cache_arrays
    for a, name in arrays:
        _check_on_device(a, fn, name)
    with _DeviceGuard(same_device(fn, arrays)):
        codes = {**_DTYPES, **_KV_DTYPES}
        _capi.call("fs_append_paged_kv_cache", codes[k.dtype], codes[cache_dtype], _ptr(k), _ptr(v), k.strides[0],
                   v.strides[0], nnz, _ptr(bi), _ptr(pos), ctypes.c_void_p(k_ptr), ctypes.c_void_p(v_ptr),
                   page_stride, _LAYOUTS[layout], heads, dim, page_size, num_pages, _ptr(ind), _ptr(ip), batch,
                   _scale(fn, "k_scale", k_scale), _scale(fn, "v_scale", v_scale), None,
                   ctypes.c_void_p(current_stream(k)))


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """For append_paged_kv_cache: the request of each appended row and its position in
    that request's KV after the append (the last append_len of seq_lens positions).
    append_indptr (batch_size + 1) and seq_lens (batch_size) are int32 torch tensors."""
    import torch
    fn = "get_batch_indices_positions"
    for t, name in ((append_indptr, "append_indptr"), (seq_lens, "seq_lens")):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise ValueError(f"{fn}: {name} must be an int32 torch tensor")
    append_len = append_indptr[1:] - append_indptr[:-1]
    batch_indices = torch.repeat_interleave(torch.arange(len(append_len), device=append_indptr.device,
                                                         dtype=torch.int32), append_len.long(), output_size=nnz)
    row = torch.arange(nnz, device=append_indptr.device, dtype=torch.int32)
    start = (seq_lens - append_len).to(torch.int32)
    positions = row - append_indptr[:-1][batch_indices.long()] + start[batch_indices.long()]
    return batch_indices, positions.to(torch.int32)
