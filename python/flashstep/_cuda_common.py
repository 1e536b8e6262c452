"""What the GPU wrappers of flashstep.cuda share: the dtype and layout tables, argument
checks, the device guard, the stage registry and the default stage choice (the C
library's: the rule lives once, in the stage registry, stages/registry.hpp)."""
import array
import ctypes
import math
import re

from . import _capi
from ._tensors import IndexArray, check, current_stream, device_array, empty, host_copy, index_array


_DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
_ATTENTION_DTYPES = tuple(_DTYPES)
# FP8 K/V (fs_shape.kv_dtype): PyTorch's names; q and o stay fp16/bf16.
_KV_DTYPES = {"float8_e4m3fn": 3, "float8_e5m2": 4}
_KV_DTYPE_ALIASES = {"float8_e4m3fn": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                     "float8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2"}
_DTYPE_ALIASES = {"float32": "float32", "f32": "float32", "float": "float32", "fp32": "float32",
                  "float16": "float16", "f16": "float16", "half": "float16", "fp16": "float16",
                  "bfloat16": "bfloat16", "bf16": "bfloat16"}
_LAYOUTS = {"NHD": 0, "HND": 1}
_DECODE, _PREFILL = 0, 1
_RAGGED, _PAGED = 0, 1
_ALIGN = 256


# ---- helpers ------------------------------------------------------------------------------

def _dtype_name(dtype, fn, name):
    """'float32', 'float16' or 'bfloat16' from a torch dtype, a numpy dtype or a string."""
    text = str(dtype).replace("torch.", "")
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    raise ValueError(f"{fn}: {name} must be float32, float16 or bfloat16; got {dtype!r}")


def _kv_dtype_name(dtype, fn, name):
    """K/V's element type: q's dtype name, or 'float8_e4m3fn' / 'float8_e5m2'."""
    text = str(dtype).replace("torch.", "")
    if text in _KV_DTYPE_ALIASES:
        return _KV_DTYPE_ALIASES[text]
    if text in _DTYPE_ALIASES:
        return _DTYPE_ALIASES[text]
    raise ValueError(f"{fn}: {name} must be float32, float16, bfloat16, float8_e4m3fn or float8_e5m2; got {dtype!r}")


# What each layout's pages hold, for messages: (axis 2, axis 3) of a pool
# (num_pages, 2, ., ., head_dim).
_LAYOUT_AXES = {"NHD": ("page_size", "num_kv_heads"), "HND": ("num_kv_heads", "page_size")}


def _layout(kv_layout, fn):
    """kv_layout checked: "NHD" or "HND", exactly (FlashInfer's names); an error names `fn`."""
    if kv_layout not in _LAYOUTS:
        hint = " (the names are upper case)" if isinstance(kv_layout, str) and kv_layout.upper() in _LAYOUTS else ""
        raise ValueError(f"{fn}: kv_layout must be 'NHD' or 'HND' (page pools of (num_pages, 2, page_size, "
                         f"num_kv_heads, head_dim) or (num_pages, 2, num_kv_heads, page_size, head_dim)); got "
                         f"{kv_layout!r}{hint}")
    return kv_layout


def _check_pool_layout(fn, name, shape, kv_layout, page_size, num_kv_heads, head_dim):
    """Raises a plain ValueError when a page pool's `shape` (5-D, or a 4-D k or v half) does
    not fit kv_layout's pages but does fit the other layout's: the pool was built in one
    layout and the wrapper told the other. Any other shape is left to the general check."""
    other = "HND" if kv_layout == "NHD" else "NHD"
    axes = {"NHD": (page_size, num_kv_heads), "HND": (num_kv_heads, page_size)}
    tail = tuple(shape[-3:]) if len(shape) >= 3 else ()
    if tail == axes[kv_layout] + (head_dim,) or tail != axes[other] + (head_dim,):
        return
    raise ValueError(f"{fn}: {name} looks like {other}, kv_layout says {kv_layout}: its shape {tuple(shape)} has "
                     f"{_LAYOUT_AXES[other][0]} {tail[0]} then {_LAYOUT_AXES[other][1]} {tail[1]}, where {kv_layout} "
                     f"pages are ({', '.join(_LAYOUT_AXES[kv_layout])}, head_dim) = "
                     f"({axes[kv_layout][0]}, {axes[kv_layout][1]}, {head_dim}); pass kv_layout=\"{other}\" to the "
                     f"wrapper, or lay the pool out as {kv_layout}")


def _c_int(value, fn, name):
    """`value` as the C library's int32 takes it: an integer (not a bool) in int32's range.
    Its bounds (num_qo_heads >= 1, ...) are the library's to check: it names the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
        raise ValueError(f"{fn}: {name} must be an integer; got {value!r}")
    return value


def _copy_to_host(dst, src, nbytes, stream=0):
    """Copies device memory to host memory after the work queued on `stream`."""
    _capi.call("fs_memcpy", dst, src, nbytes, ctypes.c_void_p(stream), 1)


def _ptr(a):
    return None if a is None else ctypes.c_void_p(a.ptr)


class _DeviceGuard:
    """Makes `device` current for the C calls inside, restores the previous one after."""

    def __init__(self, device):
        self.device, self.previous = device, None

    def __enter__(self):
        if self.device is not None:
            prev = ctypes.c_int()
            _capi.call("fs_set_device", self.device, ctypes.byref(prev))
            self.previous = prev.value
        return self

    def __exit__(self, *exc):
        if self.previous is not None and self.previous != self.device:
            _capi.call("fs_set_device", self.previous, None)


def _check_on_device(a, fn, name):
    """For producers that do not name a device (CUDA Array Interface), ask the driver."""
    if a.device is None and a.ptr:
        device, kind = ctypes.c_int(), ctypes.c_int()
        _capi.call("fs_pointer_device", ctypes.c_void_p(a.ptr), ctypes.byref(device), ctypes.byref(kind))
        if kind.value not in (2, 3):
            raise ValueError(f"{fn}: {name} is not CUDA device memory")
        a.device = device.value
    return a


def _aligned(arrays, fn):
    """The attention stages move q, k, v and o in 16-byte vectors: each must start on a
    16-byte boundary (every allocation does; a view with an offset may not)."""
    for a, name in arrays:
        if a.ptr % 16:
            raise ValueError(f"{fn}: {name} must start at a 16-byte aligned address; it starts at "
                             f"{a.ptr:#x} (a view with an offset? pass a copy: .clone())")


def _alloc_or_check(like, out, shape, dtype, fn, name):
    if out is None:
        return empty(like, shape, dtype, fn, name)
    check(device_array(out, fn, name), fn, name, dtypes=(dtype,), shape=shape)
    return out


# ---- the stage choice, plan()'s helpers --------------------------------------------------

# FlashInfer's attention kernel families: accepted (a FlashInfer program passes them) and
# ignored, since flashstep runs a stage (stage= picks one).
_BACKENDS = ("auto", "fa2", "fa3")
_LIBRARY_PREFIX = re.compile(r"^(plan|default_stage|fs_\w+): ")


def _check_backend(cls, backend, jit_args):
    if backend not in _BACKENDS:
        raise ValueError(f"{cls}: backend must be one of {', '.join(map(repr, _BACKENDS))} (FlashInfer's kernel "
                         f"families, accepted and ignored: flashstep runs a stage; stage= picks one); got {backend!r}")
    if jit_args is not None:
        raise ValueError(f"{cls}: jit_args (a custom FlashInfer kernel) is not supported; got "
                         f"{type(jit_args).__name__}")


def _graph_safe(stage):
    """Whether registry stage `stage` can plan for a captured CUDA graph (its launch depends
    on batch_size and the query rows only): its capabilities' cuda_graph flag."""
    return bool(_capabilities()[stage].flags & _capi.CAP_CUDA_GRAPH)


def default_stage(supporting, mode, group_size):
    """The stage plan() picks when none is asked for, among `supporting` (registry names
    in teaching order whose entry supports the batch; with use_cuda_graph=True, the
    graph-safe ones): a decode (mode 0) whose GQA group is at most 8 gets 03_split_kv;
    anything else the latest stage that supports it. None when `supporting` is empty.
    The rule is the C library's (the stage registry's default_stage_among, which plan()
    and stage 09's engine apply through default_stage)."""
    names = [str(name) for name in supporting]
    array_of_names = (ctypes.c_char_p * max(1, len(names)))(*[name.encode() for name in names])
    index = ctypes.c_int()
    _capi.call("fs_default_stage_among", array_of_names, len(names), int(mode), int(group_size),
               ctypes.byref(index))
    return names[index.value] if index.value >= 0 else None


def _renamed(fn, message):
    """A library message under the wrapper's name: 'plan: x' -> '<fn>: x'."""
    message = _LIBRARY_PREFIX.sub("", message, count=1)
    return message if message.startswith(fn) else f"{fn}: {message}"


def _host_view(a):
    """Index array `a` readable on the host: itself, or a copy of a device array (which
    waits for the caller's stream, as FlashInfer's indptr.to("cpu") does)."""
    if not a.on_device:
        return a
    return host_copy(a, lambda dst, src, nbytes, like: _copy_to_host(
        dst, src, nbytes, current_stream(device_array(like.obj, "plan", "index array"))))


def _page_locked(ptr):
    """Whether host address `ptr` is page-locked (pinned or registered) memory."""
    device, kind = ctypes.c_int(), ctypes.c_int()
    _capi.call("fs_pointer_device", ctypes.c_void_p(ptr), ctypes.byref(device), ctypes.byref(kind))
    return kind.value == 1


def _arange(n):
    values = array.array("i", range(n))
    return IndexArray(values, values.buffer_info()[0], n, False, "array")


_REGISTRY = None
_CAPABILITIES = None
_STAGE_CHOICES = {}  # shape kind -> stage: see PlanRun._choose_stage


def _registry():
    """stages(), read once: the registry does not change while the library is loaded."""
    global _REGISTRY
    if _REGISTRY is None:
        lib = _capi.load()
        table = []
        for i in range(lib.fs_stage_count()):
            name, summary, caps = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_char_p()
            _capi.call("fs_stage_info", i, ctypes.byref(name), ctypes.byref(summary), ctypes.byref(caps))
            table.append((name.value.decode(), summary.value.decode(), caps.value.decode()))
        _REGISTRY = tuple(table)
    return _REGISTRY


def _capabilities():
    """{registry name: fs_stage_caps}, read once: what each stage supports, as data."""
    global _CAPABILITIES
    if _CAPABILITIES is None:
        caps = {}
        for i, (name, _, _) in enumerate(_registry()):
            c = _capi.StageCaps()
            _capi.call("fs_stage_capabilities", i, ctypes.byref(c))
            caps[name] = c
        _CAPABILITIES = caps
    return _CAPABILITIES


def _chosen_stage(shape, device):
    """The registry's default choice for `shape` on `device` (None: the current one): the
    library's error, with every stage's reason, when no stage runs it."""
    name = ctypes.c_char_p()
    _capi.call("fs_default_stage", ctypes.byref(shape), -1 if device is None else device, ctypes.byref(name))
    return name.value.decode()


def _resolve_stage(stage, shape):
    """The registry's full name of `stage` ("02" -> "02_paged"); for an unknown name, the
    library's error, which lists the known ones."""
    for name, _, _ in _registry():
        if stage in (name, name.split("_")[0]):
            return name
    reason = ctypes.c_char_p()
    _capi.call("fs_stage_unsupported_reason", stage.encode(), ctypes.byref(shape), ctypes.byref(reason))
    raise ValueError(f"no stage named {stage!r}")


def _index(x, fn, name):
    return index_array(x, fn, name)


def _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type, data_type=None, fp8_kv=False):
    """(q's dtype, K/V's dtype) from FlashInfer's plan() arguments: q_data_type (None:
    data_type, then float16), kv_data_type (None: data_type, then q's), o_data_type (None:
    q's; it must equal q's). K/V is q's dtype, or with fp8_kv (a paged cache) an FP8 format,
    float8_e4m3fn or float8_e5m2, which the stage must read (others refuse it by name)."""
    q_given = q_data_type if q_data_type is not None else data_type if data_type is not None else "float16"
    if fp8_kv and q_data_type is None and data_type is not None and \
            _kv_dtype_name(data_type, fn, "data_type") in _KV_DTYPES:
        q_given = "float16"  # data_type is FlashInfer's K/V dtype; q then defaults to float16
    q = _dtype_name(q_given, fn, "q_data_type")
    kv_given = kv_data_type if kv_data_type is not None else data_type
    which = "kv_data_type" if kv_data_type is not None else "data_type (FlashInfer's K/V dtype)"
    kv = q if kv_given is None else _kv_dtype_name(kv_given, fn, which.split(" ")[0])
    if kv in _KV_DTYPES:
        if not fp8_kv:
            raise ValueError(f"{fn}: {which} {kv} is an FP8 format, which only a paged cache takes here")
        if q not in ("float16", "bfloat16"):
            raise ValueError(f"{fn}: an FP8 cache ({which} {kv}) needs q_data_type float16 or bfloat16; got {q}")
    elif kv != q:
        raise ValueError(f"{fn}: {which} must equal q_data_type or be an FP8 format (float8_e4m3fn, "
                         f"float8_e5m2); got {kv} and {q}")
    if o_data_type is not None and _dtype_name(o_data_type, fn, "o_data_type") != q:
        raise ValueError(f"{fn}: o_data_type must equal q_data_type (the stages write the output in q's dtype); "
                         f"got {_dtype_name(o_data_type, fn, 'o_data_type')} and {q}")
    return q, kv


def _planned_options(p, shape):
    """The options a stage planned with, as forward() compares them: causal, window_left,
    logits_soft_cap (0: off) and the resolved sm_scale."""
    p.causal, p.window_left, p.logits_soft_cap = bool(shape.causal), shape.window_left, shape.logits_soft_cap
    p.sm_scale = shape.sm_scale if shape.has_sm_scale else 1.0 / math.sqrt(shape.head_dim)


def _check_forward_options(fn, p, pos_encoding_mode, rope_scale, rope_theta, window_left, logits_soft_cap, sm_scale,
                           causal=None):
    """forward() (FlashInfer's older run) takes the attention options again, and FlashInfer
    runs with them: here they must be what plan() fixed, since the stage planned with
    them (RoPE is refused as in plan())."""
    _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta)
    given = [("window_left", window_left, p.window_left),
             ("logits_soft_cap", 0.0 if logits_soft_cap is None else float(logits_soft_cap), p.logits_soft_cap),
             ("sm_scale", 1.0 / math.sqrt(p.head_dim) if sm_scale is None else float(sm_scale), p.sm_scale)]
    if causal is not None:
        given.append(("causal", bool(causal), p.causal))
    for name, value, planned in given:
        if not (value == planned or isinstance(value, float) and math.isclose(value, planned, rel_tol=1e-6)):
            raise ValueError(f"{fn}: {name}={value!r} differs from the plan's {planned!r}; the stage planned with "
                             f"it: pass the same value to plan() and forward(), or call run()")


def _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta):
    if pos_encoding_mode not in (None, "NONE"):
        raise ValueError(f"{fn}: pos_encoding_mode must be 'NONE' (flashstep.cuda does not pass RoPE inside "
                         f"attention to the stages; apply_rope before the append); got {pos_encoding_mode!r}")
    if rope_scale is not None or rope_theta is not None:
        raise ValueError(f"{fn}: rope_scale and rope_theta are not supported (flashstep.cuda passes no RoPE inside "
                         f"attention)")


def _scale(fn, name, value):
    """k_scale / v_scale of run(): None means 1; a positive finite float (FlashInfer takes a
    Python float; a one-element tensor is read on the host)."""
    if value is None:
        return 1.0
    try:
        scale = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{fn}: {name} must be a positive finite float or None; got {value!r}") from None
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"{fn}: {name} must be a positive finite float or None; got {value!r}")
    return scale


def _unsupported_run_args(fn, args, kwargs):
    if args:
        raise ValueError(f"{fn}: takes no extra positional arguments (pass k_scale= and v_scale= by name)")
    for key, value in kwargs.items():
        if key in ("enable_pdl",) or value is None or (key in ("q_scale", "k_scale", "v_scale") and value == 1.0):
            continue
        raise ValueError(f"{fn}: argument {key}={value!r} is not supported")


def _head_dim_vo(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask):
    """head_dim_vo as the plan takes it (None: as head_dim_qk); custom masks refused. Which
    (head_dim_qk, head_dim_vo) pairs run is the registry's to say (StageInfo::head_dim_pairs)."""
    if custom_mask is not None or packed_custom_mask is not None:
        raise ValueError(f"{fn}: custom masks are not supported")
    if head_dim_vo is None or head_dim_vo == head_dim_qk:
        return None
    if isinstance(head_dim_vo, bool) or not isinstance(head_dim_vo, int) or head_dim_vo < 1:
        raise ValueError(f"{fn}: head_dim_vo must be a positive integer or None; got {head_dim_vo!r}")
    return head_dim_vo


