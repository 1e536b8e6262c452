"""Stage 06's samplers and row transforms under FlashInfer's flashinfer.sampling names."""
import ctypes
import random

from . import _capi
from ._cuda_common import (_DeviceGuard, _check_on_device, _copy_to_host, _ptr)
from ._tensors import _TORCH_TYPES, check, current_stream, device_array, empty, same_device


# Stream words each call takes from a torch generator (its Philox offset advances by this):
# an output's rejection rounds read offset + round, far fewer than this.
_GENERATOR_WORDS_PER_CALL = 1 << 16


def _seed_offset(seed, offset, generator, fn, like=None):
    """The Philox key and offset: given; or read from a torch generator (`generator`, else
    the default CUDA generator of `like`'s device when `like` is a torch tensor), as
    FlashInfer does, so that torch.manual_seed() makes the draws reproducible; or fresh
    from Python's random where no torch tensor is involved."""
    _seed_types(seed, offset, fn)
    if seed is None:
        if generator is None and like is not None and like.kind == "torch":
            import torch
            generator = torch.cuda.default_generators[like.device]
        if generator is not None:
            seed, drawn = _from_generator(generator)
            offset = drawn if offset is None else offset
        else:
            seed = random.getrandbits(63)
    if offset is None:
        offset = 0
    for value, name in ((seed, "seed"), (offset, "offset")):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise ValueError(f"{fn}: {name} must be an integer in [0, 2^64); got {value!r}")
    return seed, offset


def _seed_types(seed, offset, fn):
    for value, name in ((seed, "seed"), (offset, "offset")):
        if value is not None and not isinstance(value, int):
            raise ValueError(f"{fn}: {name} must be an integer in [0, 2^64) or None; got {type(value).__name__} "
                             "(a tensor seed, FlashInfer's form for graph capture, is not supported: the library "
                             "takes the key by value)")


def _from_generator(generator):
    """(key, offset) from a torch generator, advancing it. A CUDA generator's state is its
    Philox (seed, offset): read and moved on the host, no kernel, no wait. Another kind
    (a CPU generator) gives one draw."""
    import torch
    if generator.device.type == "cuda":
        if hasattr(generator, "get_offset"):
            # The same two numbers read without a state tensor (PyTorch >= 2.2): initial_seed()
            # is the Philox key, get_offset() its offset.
            seed, offset = generator.initial_seed(), generator.get_offset()
            generator.set_offset(offset + _GENERATOR_WORDS_PER_CALL)
            return seed % 2**64, offset
        state = generator.get_state()
        seed, offset = (int(v) for v in state.view(torch.int64))
        # A generator's state is a CPU byte tensor whatever its device: built on the CPU
        # explicitly, since torch.set_default_device("cuda") would put it on the GPU.
        generator.set_state(torch.tensor([seed, offset + _GENERATOR_WORDS_PER_CALL], dtype=torch.int64,
                                         device="cpu").view(torch.uint8))
        return seed % 2**64, offset
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device).item()), 0


def _converted(a, fn, name, dtype):
    """Device array `a` converted to `dtype` in its framework (FlashInfer's .float() /
    .int()), as a DeviceArray of the new array; PyTorch and CuPy only."""
    if a.kind == "torch":
        import torch
        x = a.obj.to(getattr(torch, dtype))
    elif a.kind == "cupy":
        x = a.obj.astype(dtype)
    else:
        raise ValueError(f"{fn}: {name} has dtype {a.dtype}; flashstep converts it to {dtype} only for PyTorch and "
                         f"CuPy arrays: pass {dtype}")
    return device_array(x, fn, name)


_FLOATS = ("float32", "float16", "bfloat16", "float64")


def _rows(x, fn, name):
    """The (rows, vocab) input of a sampler or transform. Logits are read as float32 or
    bfloat16 (bfloat16 computed in float32 inside); probabilities as float32. Any other
    float dtype is converted to float32 first, as FlashInfer does."""
    native = ("float32", "bfloat16") if name == "logits" else ("float32",)
    a = check(device_array(x, fn, name), fn, name, dtypes=_FLOATS, shape=(None, None))
    if a.dtype not in native:
        a = _converted(a, fn, name, "float32")
    return _check_on_device(a, fn, name)


def _input_dtype(rows):
    """fs_sampling_params.input_dtype of a row array: 0 (float32) or 2 (bfloat16)."""
    return 2 if rows.dtype == "bfloat16" else 0


def _param(value, fn, name, dtype, batch, like, params, field, keep):
    """A sampler parameter: a Python number for every output, or a device array of one per
    output (converted to `dtype` when it has another, and kept alive in `keep`)."""
    if value is None:
        return
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        setattr(params, field, value)
        return
    allowed = ("int32", "int64") if dtype == "int32" else _FLOATS
    a = check(device_array(value, fn, name), fn, name, dtypes=allowed, shape=(batch,))
    same_device(fn, [(like, "probs"), (a, name)])
    if a.dtype != dtype:
        a = _converted(a, fn, name, dtype)
    keep.append(a)
    setattr(params, field + "_arr", a.ptr)


_FAST = {}  # (name, dtype code, rows, vocab, parameters) -> (name bytes, workspace bytes, params, its pointer)
_FAST_LIMIT = 256  # entries kept; an engine calls a few shapes and parameter values
_TORCH = []  # torch and the dtypes the fast path compares with, once imported


def _torch_sample(op, fn, data, name, top_k, top_p, min_p, order, seed, offset, generator, with_status):
    """The sampler's fast path for the call an engine makes: a contiguous PyTorch tensor of
    rows read as they are (float32, or bfloat16 logits), one output per row, Python
    numbers for the parameters. Returns (samples, status or None), or None where any of
    that does not hold (the general path then checks, converts and names what is wrong).
    It does what the general path does, less the general checks: the workspace size and
    the C parameters made once per shape and values (and kept), one allocation a result,
    the device made current only where it is not."""
    if not _TORCH:
        import torch
        _TORCH.extend((torch, torch.float32, torch.bfloat16, torch.int32, torch.uint8))
    torch, f32, bf16, i32, u8 = _TORCH
    for value in (top_k, top_p, min_p):
        if value is not None and type(value) is not int and type(value) is not float:
            return None
    dtype = data.dtype
    if dtype is f32:
        input_dtype = 0
    elif dtype is bf16 and name == "logits":
        input_dtype = 2
    else:
        return None
    device = data.get_device()
    if device < 0 or data.dim() != 2 or not data.is_contiguous():
        return None
    batch, vocab = data.shape
    key = (op, input_dtype, batch, vocab, order, top_k, top_p, min_p)
    entry = _FAST.get(key)
    if entry is None:
        order_code = 0 if order == "top_k_first" else 1
        size = ctypes.c_size_t()
        _capi.call("fs_sampling_workspace_bytes", op.encode(), batch, batch, vocab, order_code, ctypes.byref(size))
        params = _capi.SamplingParams(top_k=top_k or 0, top_p=1.0 if top_p is None else top_p, min_p=min_p or 0.0,
                                      temperature=1.0, filter_apply_order=order_code, input_dtype=input_dtype)
        if len(_FAST) >= _FAST_LIMIT:
            _FAST.clear()
        entry = _FAST[key] = (op.encode(), size.value, params, ctypes.byref(params))
    name_bytes, need, _, params_ref = entry
    if type(seed) is not int or not 0 <= seed < 2**64 or (offset is not None and (
            type(offset) is not int or not 0 <= offset < 2**64)):
        seed, offset = _seed_offset(seed, offset, generator, fn, _TorchRows(data, device))
    elif offset is None:
        offset = 0
    samples = torch.empty(batch, dtype=i32, device=device)
    status = torch.empty(batch, dtype=i32, device=device) if with_status else None
    workspace = torch.empty(need, dtype=u8, device=device) if need else None
    args = (name_bytes, data.data_ptr(), batch, vocab, params_ref, None, batch, seed, offset, samples.data_ptr(),
            None, status.data_ptr() if with_status else None, workspace.data_ptr() if need else None, need,
            torch._C._cuda_getCurrentRawStream(device))
    if torch._C._cuda_getDevice() == device:
        code = _capi._lib.fs_sample(*args)
    else:
        with _DeviceGuard(device):
            code = _capi._lib.fs_sample(*args)
    if code:
        _capi.raise_status(code)
    return samples, status


class _TorchRows:
    """What _seed_offset reads of the rows: their framework and device."""
    kind = "torch"

    def __init__(self, obj, device):
        self.obj, self.device = obj, device


def _sample(op, fn, data, name, indices, top_k=None, top_p=None, min_p=None, order="top_k_first",
            seed=None, offset=None, generator=None, check_nan=False, return_status=False, return_valid=False):
    if indices is None and type(data) in _TORCH_TYPES and (order == "top_k_first" or order == "joint"):
        fast = _torch_sample(op, fn, data, name, top_k, top_p, min_p, order, seed, offset, generator,
                             check_nan or return_status or return_valid)
        if fast is not None:
            return _sampled(fn, *fast, check_nan, return_valid, return_status)
    _seed_types(seed, offset, fn)
    rows = _rows(data, fn, name)
    idx = given_idx = None
    batch = rows.shape[0]
    if indices is not None:
        given_idx = check(device_array(indices, fn, "indices"), fn, "indices", dtypes=("int32", "int64"),
                          shape=(None,))
        idx = given_idx if given_idx.dtype == "int32" else _converted(given_idx, fn, "indices", "int32")
        batch = idx.shape[0]
    params = _capi.SamplingParams()
    params.top_k, params.top_p, params.min_p, params.temperature = 0, 1.0, 0.0, 1.0
    if order not in ("top_k_first", "joint"):
        raise ValueError(f"{fn}: filter_apply_order must be 'top_k_first' or 'joint'; got {order!r}")
    params.filter_apply_order = 0 if order == "top_k_first" else 1
    params.input_dtype = _input_dtype(rows)
    keep = []
    _param(top_k, fn, "top_k", "int32", batch, rows, params, "top_k", keep)
    _param(top_p, fn, "top_p", "float32", batch, rows, params, "top_p", keep)
    _param(min_p, fn, "min_p", "float32", batch, rows, params, "min_p", keep)
    seed, offset = _seed_offset(seed, offset, generator, fn, rows)
    samples = empty(rows, (batch,), "int32", fn, "samples")
    status = empty(rows, (batch,), "int32", fn, "status")
    need = ctypes.c_size_t()
    _capi.call("fs_sampling_workspace_bytes", op.encode(), rows.shape[0], batch, rows.shape[1],
               params.filter_apply_order, ctypes.byref(need))
    workspace = empty(rows, (max(need.value, 1),), "uint8", fn, "workspace") if need.value else None
    ws = device_array(workspace, fn, "workspace") if workspace is not None else None
    with _DeviceGuard(rows.device):
        _capi.call("fs_sample", op.encode(), _ptr(rows), rows.shape[0], rows.shape[1], ctypes.byref(params),
                   _ptr(idx), batch, seed, offset, _ptr(device_array(samples, fn, "samples")), None,
                   _ptr(device_array(status, fn, "status")), _ptr(ws), need.value,
                   ctypes.c_void_p(current_stream(rows)))
    if given_idx is not None and given_idx.dtype != "int32":
        samples = _converted(device_array(samples, fn, "samples"), fn, "samples", given_idx.dtype).obj
    return _sampled(fn, samples, status, check_nan, return_valid, return_status)


def _sampled(fn, samples, status, check_nan, return_valid, return_status):
    """What a sampler returns: the samples, with (status == 0) and the status where asked;
    with check_nan, raises first for an output that is not ok (a device sync)."""
    if check_nan:
        _raise_on_status(fn, status)
    if not (return_valid or return_status):
        return samples
    return (samples,) + ((status == 0,) if return_valid else ()) + ((status,) if return_status else ())


def _raise_on_status(fn, status):
    """Reads the status array (a device sync) and raises for the first output not ok."""
    a = device_array(status, fn, "status")
    buf = (ctypes.c_int32 * a.numel)()
    _copy_to_host(ctypes.addressof(buf), a.ptr, a.nbytes, current_stream(a))
    for i, code in enumerate(buf):
        if code != 0:
            name = ctypes.c_char_p()
            _capi.call("fs_sampling_status_name", code, ctypes.byref(name))
            raise ValueError(f"{fn}: output {i} is invalid: {name.value.decode()}")


def sampling_from_probs(probs, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                        offset=None, return_valid=False, return_status=False):
    """One token per output drawn from probs (batch, vocab) float32 (row indices[i] for
    output i). Stage 06's rejection sampler on the Philox stream (seed, offset) shared with
    the CPU reference; FlashInfer's tokens for the same seed differ (another stream).
    An invalid row gives token -1; check_nan=True raises instead (a sync)."""
    return _sample("sampling_from_probs", "sampling_from_probs", probs, "probs", indices, seed=seed, offset=offset,
                   generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def sampling_from_logits(logits, indices=None, deterministic=True, generator=None, check_nan=False, seed=None,
                         offset=None, return_valid=False, return_status=False):
    """softmax(logits), then sampling_from_probs, in one kernel; logits float32 or
    bfloat16."""
    return _sample("sampling_from_logits", "sampling_from_logits", logits, "logits", indices, seed=seed,
                   offset=offset, generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def top_k_sampling_from_probs(probs, top_k, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None, return_valid=False, return_status=False):
    """Top-k sampling by rejection (no sort); top_k an int or an int32 array (batch)."""
    return _sample("top_k_sampling_from_probs", "top_k_sampling_from_probs", probs, "probs", indices, top_k=top_k,
                   seed=seed, offset=offset, generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def top_p_sampling_from_probs(probs, top_p, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None, return_valid=False, return_status=False):
    """Top-p sampling by rejection; top_p a float in (0, 1] or a float32 array (batch)."""
    return _sample("top_p_sampling_from_probs", "top_p_sampling_from_probs", probs, "probs", indices, top_p=top_p,
                   seed=seed, offset=offset, generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def min_p_sampling_from_probs(probs, min_p, indices=None, deterministic=True, generator=None, check_nan=False,
                              seed=None, offset=None, return_valid=False, return_status=False):
    """Min-p sampling: one draw among the entries p >= min_p * max(p)."""
    return _sample("min_p_sampling_from_probs", "min_p_sampling_from_probs", probs, "probs", indices, min_p=min_p,
                   seed=seed, offset=offset, generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                    deterministic=True, generator=None, check_nan=False, seed=None, offset=None,
                                    return_valid=False, return_status=False):
    """Top-k and top-p: "top_k_first" renormalizes the top-k, then samples top-p from it;
    "joint" tests both rules on the original row in one rejection loop."""
    return _sample("top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_probs", probs, "probs", indices,
                   top_k=top_k, top_p=top_p, order=filter_apply_order, seed=seed, offset=offset, generator=generator,
                   check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, filter_apply_order="top_k_first",
                                     deterministic=True, generator=None, check_nan=False, seed=None, offset=None,
                                     return_valid=False, return_status=False):
    """top_k_top_p_sampling_from_probs from logits (softmax first; top_k_first masks logits first)."""
    return _sample("top_k_top_p_sampling_from_logits", "top_k_top_p_sampling_from_logits", logits, "logits",
                   indices, top_k=top_k, top_p=top_p, order=filter_apply_order, seed=seed, offset=offset,
                   generator=generator, check_nan=check_nan,
                   return_valid=return_valid, return_status=return_status)


def _transform(op, fn, data, name, top_k=None, top_p=None, temperature=None):
    rows = _rows(data, fn, name)
    params = _capi.SamplingParams()
    params.top_k, params.top_p, params.min_p, params.temperature = 0, 1.0, 0.0, 1.0
    params.input_dtype = _input_dtype(rows)
    keep = []
    _param(top_k, fn, "top_k", "int32", rows.shape[0], rows, params, "top_k", keep)
    _param(top_p, fn, "top_p", "float32", rows.shape[0], rows, params, "top_p", keep)
    _param(temperature, fn, "temperature", "float32", rows.shape[0], rows, params, "temperature", keep)
    out = empty(rows, rows.shape, "float32", fn, "out")
    with _DeviceGuard(rows.device):
        _capi.call("fs_row_transform", op.encode(), _ptr(rows), rows.shape[0], rows.shape[1], ctypes.byref(params),
                   _ptr(device_array(out, fn, "out")), None, ctypes.c_void_p(current_stream(rows)))
    return out


def softmax(logits, temperature=None, enable_pdl=None):
    """Softmax of logits / temperature per row; logits float32 or bfloat16 (float16 is
    converted to float32 first), the result float32; temperature a float or an array
    (rows); None means 1."""
    return _transform("softmax", "softmax", logits, "logits", temperature=temperature)


def top_k_renorm_probs(probs, top_k):
    """Keeps each row's top-k (ties kept), zeroes the rest, renormalizes. fp16/bf16
    probabilities are computed in float32 and returned in their own dtype, as
    FlashInfer's are."""
    fn = "top_k_renorm_probs"
    a = check(device_array(probs, fn, "probs"), fn, "probs", dtypes=_FLOATS, shape=(None, None))
    out = _transform("top_k_renorm_probs", fn, probs, "probs", top_k=top_k)
    if a.dtype in ("float16", "bfloat16"):
        out = _converted(device_array(out, fn, "probs"), fn, "probs", a.dtype).obj
    return out


def top_p_renorm_probs(probs, top_p):
    """Keeps each row's top-p head, zeroes the rest, renormalizes; float32 out (other
    float inputs converted first, as FlashInfer does)."""
    return _transform("top_p_renorm_probs", "top_p_renorm_probs", probs, "probs", top_p=top_p)


def top_k_mask_logits(logits, top_k):
    """Keeps each row's top-k logits (ties kept), sets the rest to -inf; logits float32
    or bfloat16 (float16 converted), the result float32."""
    return _transform("top_k_mask_logits", "top_k_mask_logits", logits, "logits", top_k=top_k)


def chain_speculative_sampling(draft_probs, draft_token_ids, target_probs, maybe_output_accepted_token_num=None,
                               maybe_output_emitted_draft_token_num=None, deterministic=True, generator=None,
                               seed=None, offset=None):
    """Chain speculative sampling: draft_probs (batch, n, vocab), draft_token_ids (batch,
    n) int32, target_probs (batch, n + 1, vocab) -> (output_token_ids (batch, n + 1), -1
    padded; accepted token counts (batch); emitted draft token counts (batch)). The two
    maybe_output_* arrays, when given, have the counts added to them, as FlashInfer does."""
    fn = "chain_speculative_sampling"
    dp = check(device_array(draft_probs, fn, "draft_probs"), fn, "draft_probs", dtypes=("float32",),
               shape=(None, None, None))
    batch, n, vocab = dp.shape
    ids = check(device_array(draft_token_ids, fn, "draft_token_ids"), fn, "draft_token_ids", dtypes=("int32",),
                shape=(batch, n))
    tp = check(device_array(target_probs, fn, "target_probs"), fn, "target_probs", dtypes=("float32",),
               shape=(batch, n + 1, vocab))
    seed, offset = _seed_offset(seed, offset, generator, fn, dp)
    out = empty(dp, (batch, n + 1), "int32", fn, "output_token_ids")
    accepted = empty(dp, (batch,), "int32", fn, "accepted")
    emitted = empty(dp, (batch,), "int32", fn, "emitted")
    arrays = [(dp, "draft_probs"), (ids, "draft_token_ids"), (tp, "target_probs")]
    for a, name in arrays:
        _check_on_device(a, fn, name)
    with _DeviceGuard(same_device(fn, arrays)):
        _capi.call("fs_chain_speculative_sampling", _ptr(dp), _ptr(ids), _ptr(tp), batch, n, vocab,
                   _ptr(device_array(out, fn, "output_token_ids")), _ptr(device_array(accepted, fn, "accepted")),
                   _ptr(device_array(emitted, fn, "emitted")), None, seed, offset,
                   ctypes.c_void_p(current_stream(dp)))
    if maybe_output_accepted_token_num is not None:
        maybe_output_accepted_token_num += accepted
        accepted = maybe_output_accepted_token_num
    if maybe_output_emitted_draft_token_num is not None:
        maybe_output_emitted_draft_token_num += emitted
        emitted = maybe_output_emitted_draft_token_num
    return out, accepted, emitted
