"""flashstep's CUDA stages from Python, under FlashInfer's names and argument order.

    import torch, flashstep.cuda as fsc
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    decode = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    decode.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads,
                head_dim, page_size, q_data_type=torch.bfloat16)
    o, lse = decode.run(q, paged_kv_cache, return_lse=True)

The classes mirror FlashInfer's wrappers (https://docs.flashinfer.ai): plan() once per
batch composition on the host, run() per layer on the caller's current CUDA stream.
Tensors may come from PyTorch, CuPy, or anything with ``__cuda_array_interface__`` or
``__dlpack__``; outputs are allocated in the caller's framework (PyTorch or CuPy), or
passed as ``out=`` / ``lse=``. A tensor on the wrong device (a CPU tensor included), of
the wrong dtype, shape or strides, or an index array that is not int32, raises
ValueError naming the argument before any kernel runs.

Which stage runs: every wrapper takes ``stage=`` (a registry name such as "02_paged",
or its number, "02"); by default plan() applies ``default_stage()`` to the stages whose
registry entry supports the planned shape: a decode with a GQA group of at most 8 gets
03_split_kv, anything else the latest such stage in teaching order (``stages()`` lists
them with what each supports, ``plan()`` records the choice in ``.stage``). With
``use_cuda_graph=True`` only stages that can plan for a captured graph are considered,
and a graph captured after one plan() replays correctly after any later plan() of the
same batch size (docs/python_gpu.md, "CUDA graphs").

plan() reads index arrays in place (CPU tensors, numpy arrays, array.array, or device
arrays) and copies what the stage reads to the device in one copy per array; it may be
called while the previous run() is still in flight.

Differences from FlashInfer, each on purpose:
- every log-sum-exp returned or taken (``return_lse=True``, merge_state) is the natural
  log; FlashInfer's is base 2 (``lse_flashinfer = lse / ln 2``);
- no RoPE inside attention (``pos_encoding_mode`` must be "NONE"), no custom masks, and
  head_dim_vo equals head_dim_qk;
- the paged cache is one pool ``(num_pages, 2, page_size, Hkv, D)`` (NHD) or
  ``(num_pages, 2, Hkv, page_size, D)`` (HND); a ``(k_cache, v_cache)`` tuple is accepted
  by attention only when it is the two halves of such a pool;
- the samplers draw from the Philox stream of stage 06 and the CPU reference (``seed``,
  ``offset``), so a token matches the reference's draw for draw, not FlashInfer's; with
  no seed, the key comes from torch's generator, as FlashInfer's does;
- the rest (``backend=``, ``jit_args=``, dtypes, ``forward()``, graph sizes, samplers'
  conversions) is in docs/python_gpu.md's table of differences.

The library is libflashstep_capi.so (capi/ in the repository), found through
``$FLASHSTEP_CAPI`` or the build tree; see ``flashstep._capi``.
"""
import array
import ctypes
import math
import random
import re

from . import _capi
from ._capi import LibraryNotFound  # noqa: F401  (part of the module's interface)
from ._tensors import (ITEMSIZE, IndexArray, check, current_stream, device_array, empty, host_copy, index_array,
                       same_device)

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper",
    "merge_state", "merge_state_in_place", "merge_states", "append_paged_kv_cache",
    "get_batch_indices_positions", "sampling_from_probs", "sampling_from_logits",
    "top_k_sampling_from_probs", "top_p_sampling_from_probs", "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits", "softmax",
    "top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits", "chain_speculative_sampling",
    "apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_llama31_rope",
    "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace",
    "stages", "default_stage", "index_array", "tolerance", "available", "LibraryNotFound",
]

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


def available():
    """(True, "") when the library loads and a CUDA device is usable; else (False, why)."""
    try:
        _capi.load()
        _capi.call("fs_set_device", 0, None)
    except (LibraryNotFound, RuntimeError, ValueError) as e:
        return False, str(e)
    return True, ""


def stages():
    """The attention stages of the registry, in teaching order: a list of
    (name, summary, capabilities) tuples. A stage that can plan for a captured CUDA graph
    names cuda_graph in its capabilities."""
    return list(_registry())


def tolerance(dtype, which="o", kv_dtype=None):
    """The validation harness's tolerances (atol, rtol, norm) for q/o in `dtype`
    ("float16", ...), K/V in `kv_dtype` (None: `dtype`; torch.float8_e4m3fn or
    float8_e5m2 for an FP8 cache) and `which` ("o" or "lse"): stages/harness/compare.cpp's
    table."""
    if which not in ("o", "lse"):
        raise ValueError(f"tolerance: which must be 'o' or 'lse'; got {which!r}")
    q = _dtype_name(dtype, "tolerance", "dtype")
    kv = 0 if kv_dtype is None else _KV_DTYPES.get(_kv_dtype_name(kv_dtype, "tolerance", "kv_dtype"), 0)
    atol, rtol, norm = ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
    _capi.call("fs_tolerance", _DTYPES[q], kv, 0 if which == "o" else 1, ctypes.byref(atol), ctypes.byref(rtol),
               ctypes.byref(norm))
    return atol.value, rtol.value, norm.value


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


def _layout(kv_layout, fn):
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"{fn}: kv_layout must be 'NHD' or 'HND'; got {kv_layout!r}")
    return kv_layout


def _positive_int(value, fn, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{fn}: {name} must be an integer >= {minimum}; got {value!r}")
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


# ---- plan / run wrappers --------------------------------------------------------------------

# FlashInfer's attention kernel families: accepted (a FlashInfer program passes them) and
# ignored, since flashstep runs a stage (stage= picks one).
_BACKENDS = ("auto", "fa2", "fa3")
# The decode stage: it splits long requests so that every SM streams keys and prices stage
# 02's kernel against the split (its chapter's cost model). Stage 04's tensor-core tile
# computes 16 query rows per kv head where a decode of GQA group g has g, so for g <= 8
# it only adds work on a memory-bound step.
_DECODE_STAGE, _DECODE_STAGE_MAX_GROUP = "03_split_kv", 8
_LIBRARY_PREFIX = re.compile(r"^(plan|fs_\w+): ")


def _check_backend(cls, backend, jit_args):
    if backend not in _BACKENDS:
        raise ValueError(f"{cls}: backend must be one of {', '.join(map(repr, _BACKENDS))} (FlashInfer's kernel "
                         f"families, accepted and ignored: flashstep runs a stage; stage= picks one); got {backend!r}")
    if jit_args is not None:
        raise ValueError(f"{cls}: jit_args (a custom FlashInfer kernel) is not supported; got "
                         f"{type(jit_args).__name__}")


def _graph_safe(capabilities):
    """Whether a registry entry can plan for a captured CUDA graph (its launch depends on
    batch_size and the query rows only): its capabilities name cuda_graph."""
    return re.search(r"\bcuda_graph\b", capabilities) is not None


def _plans_from_page_ids(capabilities):
    """Stage 05 plans from which pages requests share: it has a wrapper of its own."""
    return "plans from the host page table" in capabilities


def default_stage(supporting, mode, group_size):
    """The stage plan() picks when none is asked for, among `supporting` (registry names
    in teaching order whose entry supports the batch; with use_cuda_graph=True, the
    graph-safe ones): a decode (mode 0) whose GQA group is at most 8 gets 03_split_kv;
    anything else the latest stage that supports it. None when `supporting` is empty."""
    if mode == _DECODE and group_size <= _DECODE_STAGE_MAX_GROUP and _DECODE_STAGE in supporting:
        return _DECODE_STAGE
    return supporting[-1] if supporting else None


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


class _Plan:
    """What run() needs of the last plan: sizes, the checks' bounds, the C batch struct
    whose index pointers plan() filled, and the library function to call."""

    __slots__ = ("dtype", "kv_dtype", "batch_size", "nnz_qo", "nnz_kv", "num_qo_heads", "num_kv_heads", "head_dim",
                 "page_size", "max_page", "q_shape", "lse_shape", "batch", "causal", "window_left",
                 "logits_soft_cap", "sm_scale")


class _PlanRun:
    """What the wrappers share: the workspace, the choice of stage, the runner, the device
    copies of the index arrays, and the call into the C library.

    plan() reads the host index arrays in place (their buffers, never Python lists) and
    copies each array the stage reads on the device with one cudaMemcpyAsync on the
    caller's stream: host to device from the caller's memory, device to device when the
    array is already on the GPU. Nothing is staged in page-locked memory of plan()'s own:
    a copy from ordinary memory has read its source when it returns, so the caller may
    rewrite its arrays, and plan() again, while an earlier run() is still in flight (a
    page-locked source is first copied to ordinary memory for that reason)."""

    _mode = _PREFILL
    _storage = _PAGED

    def __init__(self, workspace_buffer, kv_layout, use_cuda_graph, stage, fixed_buffers, backend="auto",
                 jit_args=None):
        cls = type(self).__name__
        self._fn = cls + ".plan"
        _check_backend(cls, backend, jit_args)
        self._ws = check(device_array(workspace_buffer, cls, "workspace_buffer"), cls, "workspace_buffer",
                         dtypes=("uint8", "int8", "float32", "float16", "bfloat16", "int32", "int64"))
        self._kv_layout = _layout(kv_layout, cls)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._fixed = {}  # index array -> its fixed device buffer
        for name, (arg, buf) in fixed_buffers.items():
            if buf is None and self._use_cuda_graph:
                raise ValueError(f"{cls}: use_cuda_graph=True needs fixed index buffers: pass {arg} (an int32 CUDA "
                                 f"tensor as long as the largest batch's {name})")
            if buf is not None:
                self._fixed[name] = check(device_array(buf, cls, arg), cls, arg, dtypes=("int32",), shape=(None,))
        self._stage_request = stage
        self._runner = None
        self._runner_stage = None
        self._planned = None
        self._graph_size = None  # (batch_size, query rows) of the first plan, under use_cuda_graph
        self._c_shape = _capi.Shape()
        self.stage = None  # the registry name the last plan() chose

    def __del__(self):
        runner = getattr(self, "_runner", None)
        if runner is not None and _capi._lib is not None:
            _capi._lib.fs_runner_destroy(runner)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def _shape(self, dtype, num_qo_heads, num_kv_heads, head_dim, page_size, causal, window_left,
               logits_soft_cap, sm_scale, qo_indptr, kv_indptr, last_page_len, kv_dtype=None):
        """The C shape of the batch (one struct per wrapper, refilled); the index arrays are
        host IndexArrays, pointed at in place."""
        fn = self._fn
        s = self._c_shape
        s.mode, s.storage, s.dtype = self._mode, self._storage, _DTYPES[dtype]
        s.kv_layout = _LAYOUTS[self._kv_layout]
        s.batch_size = len(kv_indptr) - 1
        s.num_qo_heads = _positive_int(num_qo_heads, fn, "num_qo_heads")
        s.num_kv_heads = _positive_int(num_kv_heads, fn, "num_kv_heads")
        s.head_dim = _positive_int(head_dim, fn, "head_dim")
        s.page_size = _positive_int(page_size, fn, "page_size") if self._storage == _PAGED else 0
        s.causal = int(bool(causal))
        if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
            raise ValueError(f"{fn}: window_left must be an integer >= -1; got {window_left!r}")
        s.window_left = window_left
        cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
        if not (math.isfinite(cap) and cap >= 0):
            raise ValueError(f"{fn}: logits_soft_cap must be None, 0 or a positive number; got {logits_soft_cap!r}")
        s.logits_soft_cap = cap
        s.has_sm_scale, s.sm_scale = 0, 0.0
        if sm_scale is not None:
            scale = float(sm_scale)
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"{fn}: sm_scale must be a positive finite number or None; got {sm_scale!r}")
            s.has_sm_scale, s.sm_scale = 1, scale
        s.num_pages = 0
        s.qo_indptr, s.kv_indptr = qo_indptr.ptr, kv_indptr.ptr
        s.kv_last_page_len = last_page_len.ptr if last_page_len is not None else None
        s.cuda_graph = int(self._use_cuda_graph)
        s.kv_dtype = _KV_DTYPES.get(kv_dtype, 0)
        return s

    def _choose_stage(self, shape, stage):
        """The requested stage (checked), or default_stage()'s choice; remembered per shape
        kind (the registry's rules read the sizes and options, not the lengths)."""
        key = (stage, shape.mode, shape.storage, shape.dtype, shape.kv_layout, shape.num_qo_heads,
               shape.num_kv_heads, shape.head_dim, shape.page_size, shape.causal, shape.window_left >= 0,
               shape.logits_soft_cap > 0, shape.has_sm_scale, shape.cuda_graph, shape.kv_dtype)
        chosen = _STAGE_CHOICES.get(key)
        if chosen is not None:
            return chosen
        reason = ctypes.c_char_p()
        graph = bool(shape.cuda_graph)
        table = _registry()
        if stage is not None:
            chosen = _resolve_stage(str(stage), shape)
            caps = next(c for name, _, c in table if name == chosen)
            if graph and not _graph_safe(caps):
                safe = [name for name, _, c in table if _graph_safe(c)]
                raise ValueError(f"stage {chosen} cannot plan for a captured CUDA graph (use_cuda_graph=True): its "
                                 f"launch depends on the lengths, so a graph replayed after another plan() would run "
                                 f"a stale grid; pass stage= one of {', '.join(safe) or '(none in this build)'}, or "
                                 "leave stage unset")
            _capi.call("fs_stage_unsupported_reason", chosen.encode(), ctypes.byref(shape), ctypes.byref(reason))
            if reason.value:
                raise ValueError(f"stage {stage} cannot run this batch: {reason.value.decode()}")
            if _plans_from_page_ids(caps):
                return chosen  # its answer depends on the page ids: not remembered
        else:
            supporting, reasons = [], []
            for name, _, caps in table:
                if _plans_from_page_ids(caps):
                    continue
                if graph and not _graph_safe(caps):
                    reasons.append(f"{name}: cannot plan for a captured CUDA graph (use_cuda_graph=True)")
                    continue
                _capi.call("fs_stage_unsupported_reason", name.encode(), ctypes.byref(shape), ctypes.byref(reason))
                if reason.value:
                    reasons.append(f"{name}: {reason.value.decode()}")
                else:
                    supporting.append(name)
            chosen = default_stage(supporting, shape.mode, shape.num_qo_heads // shape.num_kv_heads)
            if chosen is None:
                raise ValueError("no stage supports this batch:\n  " + "\n  ".join(reasons))
        _STAGE_CHOICES[key] = chosen
        return chosen

    def _plan(self, dtype, qo_indptr, kv_indptr, kv_indices, last_page_len, stage, kv_dtype=None, **shape_args):
        """plan() of every wrapper but the cascade: the index arguments are IndexArrays
        (host or device; qo_indptr None for decode)."""
        fn = self._fn
        self._planned = None  # a plan() that fails leaves no plan to run
        kv_host = _host_view(kv_indptr)
        if len(kv_host) < 2:
            raise ValueError(f"{fn}: kv_indptr must have batch_size + 1 >= 2 entries; it has {len(kv_host)}")
        batch = len(kv_host) - 1
        qo_host = _host_view(qo_indptr) if qo_indptr is not None else self._decode_qo_indptr(batch)
        if len(qo_host) != batch + 1:
            raise ValueError(f"{fn}: qo_indptr has {len(qo_host)} entries, kv_indptr {batch + 1}: they must match")
        lpl_host = None
        if last_page_len is not None:
            lpl_host = _host_view(last_page_len)
            if len(lpl_host) != batch:
                raise ValueError(f"{fn}: last_page_len must have batch_size = {batch} entries; it has {len(lpl_host)}")
        nnz_qo, nnz_kv = qo_host[batch], kv_host[batch]
        max_page = None  # unknown: device-resident page ids are not read on the host
        if kv_indices is not None:
            if len(kv_indices) < nnz_kv:
                raise ValueError(f"{fn}: kv_indices has {len(kv_indices)} entries; kv_indptr[-1] = {nnz_kv} pages are "
                                 "needed")
            max_page = -1
            if not kv_indices.on_device and nnz_kv > 0:
                low, max_page = kv_indices.min_max(nnz_kv)
                if low < 0:
                    raise ValueError(f"{fn}: kv_indices must be >= 0 (it holds {low})")
        if self._use_cuda_graph and self._graph_size not in (None, (batch, nnz_qo)):
            rows = self._mode == _PREFILL
            was = f"batch_size {self._graph_size[0]}" + (f" and {self._graph_size[1]} query rows" if rows else "")
            now = f"batch_size {batch}" + (f" and {nnz_qo} query rows" if rows else "")
            raise ValueError(f"{fn}: use_cuda_graph=True: this wrapper's first plan() fixed {was}; this plan has "
                             f"{now}. A captured graph replays the launch it was captured with: make one wrapper "
                             "(and workspace) per graph size, and pad the query rows to it as FlashInfer's graph "
                             "mode does")
        shape = self._shape(dtype, qo_indptr=qo_host, kv_indptr=kv_host, last_page_len=lpl_host, kv_dtype=kv_dtype,
                            **shape_args)
        try:
            chosen = self._choose_stage(shape, stage if stage is not None else self._stage_request)
        except ValueError as e:
            raise ValueError(_renamed(fn, str(e))) from None
        ws = self._ws
        with _DeviceGuard(ws.device):
            try:
                arrays = {"qo_indptr": (qo_indptr, qo_host), "kv_indptr": (kv_indptr, kv_host),
                          "kv_indices": (kv_indices, None), "kv_last_page_len": (last_page_len, lpl_host)}
                self._plan_on_device(shape, chosen, arrays, nnz_kv)
            except ValueError as e:
                raise ValueError(_renamed(fn, str(e))) from None
        self.stage = chosen
        if self._use_cuda_graph:
            self._graph_size = (batch, nnz_qo)
        p = _Plan()
        p.dtype, p.batch_size, p.nnz_qo, p.nnz_kv = dtype, batch, nnz_qo, nnz_kv
        p.kv_dtype = kv_dtype or dtype
        p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size = (shape.num_qo_heads, shape.num_kv_heads,
                                                                   shape.head_dim, shape.page_size)
        p.max_page = max_page
        p.q_shape, p.lse_shape = (nnz_qo, shape.num_qo_heads, shape.head_dim), (nnz_qo, shape.num_qo_heads)
        _planned_options(p, shape)
        p.batch = self._device_batch
        self._planned = p

    def _decode_qo_indptr(self, batch):
        cached = getattr(self, "_arange_cache", None)
        if cached is None or len(cached) != batch + 1:
            cached = self._arange_cache = _arange(batch + 1)
        return cached

    def _plan_on_device(self, shape, chosen, arrays, nnz_kv):
        """Makes (or keeps) the runner of `chosen`, copies the index arrays the stage reads
        to the device and plans. `arrays`: name -> (IndexArray as given or None, its host view)."""
        ws = self._ws
        if self._runner is None or self._runner_stage != chosen:
            if self._runner is not None:
                _capi.call("fs_runner_destroy", self._runner)
                self._runner = None
            runner = ctypes.c_void_p()
            _capi.call("fs_runner_create", chosen.encode(), ctypes.byref(runner))
            self._runner, self._runner_stage = runner, chosen
        need = ctypes.c_size_t()
        _capi.call("fs_runner_workspace_bytes", self._runner, ctypes.byref(shape), ctypes.byref(need))
        # The stage's own bytes start the workspace; the device copies of the index arrays
        # that no fixed buffer was given for end it (FlashInfer keeps such copies in its
        # workspace too). Counted from the end, their addresses depend only on their
        # lengths, so a CUDA graph captured after one plan reads the next plan's arrays
        # (the same batch size, the fixed buffers holding the variable-length kv_indices).
        end, device, copies = ws.nbytes // _ALIGN * _ALIGN, {}, []
        for name, (given, host) in arrays.items():
            if given is None and host is None:
                continue
            count = nnz_kv if name == "kv_indices" else len(host)
            source = given if given is not None and (given.on_device or host is None) else host
            fixed = self._fixed.get(name)
            if fixed is not None:
                if fixed.numel < count:
                    raise ValueError(f"{name} buffer holds {fixed.numel} entries, this plan needs {count}")
                device[name] = fixed.ptr
            else:
                end -= max(1, -(-4 * count // _ALIGN)) * _ALIGN
                device[name] = ws.ptr + end
            if count and source.ptr != device[name]:
                copies.append((device[name], source, count))
        if need.value > end:
            needed = need.value + ws.nbytes // _ALIGN * _ALIGN - end
            raise ValueError(f"workspace_buffer has {ws.nbytes} bytes; this plan needs {needed} ({need.value} for "
                             f"stage {chosen}, the rest for the index arrays): pass a workspace of at least that")
        stream = ctypes.c_void_p(current_stream(ws))
        for dst, source, count in copies:
            src = source.ptr
            if not source.on_device and _page_locked(src):
                # A page-locked source would be read when the stream reaches the copy, after
                # plan() returns: copy it to ordinary memory, which the copy reads at once.
                staged = (ctypes.c_int32 * count)()
                ctypes.memmove(staged, src, 4 * count)
                source, src = staged, ctypes.addressof(staged)
            _capi.call("fs_memcpy", ctypes.c_void_p(dst), ctypes.c_void_p(src), 4 * count, stream, 0)
        _capi.call("fs_runner_plan", self._runner, ctypes.byref(shape), ctypes.c_void_p(ws.ptr), need.value, stream)
        b = _capi.Batch()
        b.qo_indptr, b.kv_indptr = device.get("qo_indptr"), device.get("kv_indptr")
        b.kv_indices, b.kv_last_page_len = device.get("kv_indices"), device.get("kv_last_page_len")
        self._device_batch = b

    def _require_plan(self):
        if self._planned is None:
            raise ValueError(f"{type(self).__name__}.run: call plan() first")
        return self._planned

    def _outputs(self, like, out, lse, p, fn):
        o = _alloc_or_check(like, out, p.q_shape, p.dtype, fn, "out")
        lse_t = _alloc_or_check(like, lse, p.lse_shape, "float32", fn, "lse")
        return o, lse_t

    def _launch(self, like, batch, arrays):
        """One fs_runner_run on the caller's current stream (the hot path: the library
        function is called directly)."""
        device = same_device(f"{type(self).__name__}.run", arrays + [(self._ws, "workspace_buffer")])
        with _DeviceGuard(device):
            status = _capi._lib.fs_runner_run(self._runner, ctypes.byref(batch),
                                              ctypes.c_void_p(current_stream(like)))
        if status:
            _capi.raise_status(status)

    def _paged_pool(self, paged_kv_cache, p, fn):
        """The pool pointer of a 5-D cache, or of a (k_cache, v_cache) tuple that is its two halves."""
        hnd = self._kv_layout == "HND"
        ps, hk, d = p.page_size, p.num_kv_heads, p.head_dim
        page = (hk, ps, d) if hnd else (ps, hk, d)
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise ValueError(f"{fn}: paged_kv_cache must be one 5-D tensor or a (k_cache, v_cache) pair")
            k = check(device_array(paged_kv_cache[0], fn, "paged_kv_cache[0]"), fn, "paged_kv_cache[0]",
                      dtypes=(p.kv_dtype,), shape=(None,) + page, contiguous=False)
            v = check(device_array(paged_kv_cache[1], fn, "paged_kv_cache[1]"), fn, "paged_kv_cache[1]",
                      dtypes=(p.kv_dtype,), shape=k.shape, contiguous=False)
            inner = ps * hk * d
            want = (2 * inner, page[1] * page[2], page[2], 1)
            if k.strides != want or v.strides != want or v.ptr - k.ptr != inner * ITEMSIZE[p.kv_dtype]:
                raise ValueError(f"{fn}: the stages read one pool (num_pages, 2, ...): a (k_cache, v_cache) pair "
                                 "is accepted only as pool[:, 0] and pool[:, 1] of one contiguous tensor")
            return k, k.shape[0]
        pool = check(device_array(paged_kv_cache, fn, "paged_kv_cache"), fn, "paged_kv_cache",
                     dtypes=(p.kv_dtype,), shape=(None, 2) + page)
        return pool, pool.shape[0]

    def run_return_lse(self, *args, **kwargs):
        """run(..., return_lse=True): FlashInfer's name for it."""
        return self.run(*args, return_lse=True, **kwargs)

    forward_return_lse = run_return_lse


_REGISTRY = None
_STAGE_CHOICES = {}  # shape kind -> stage: see _PlanRun._choose_stage


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


class BatchDecodeWithPagedKVCacheWrapper(_PlanRun):
    """Batch decode (one query per request) over a paged KV cache: FlashInfer's wrapper of
    the same name. plan() once per batch, run() per layer.

    Default stage (``stage=`` here or in plan() picks another): 03_split_kv when the GQA
    group (num_qo_heads / num_kv_heads) is at most 8, the decode stage: it splits long
    requests across the SMs and takes stage 02's kernel where a split does not pay;
    otherwise the latest stage that supports the shape (04_tensor_core, fp16/bf16).
    ``use_tensor_cores`` and ``backend`` are accepted for FlashInfer's signature and
    ignored: the stage decides.

    use_cuda_graph=True: pass the three fixed int32 buffers; plan() outside the graph,
    run() inside (run only launches kernels). Only stages that can plan for a captured
    graph are chosen (or accepted as ``stage=``), and the first plan() fixes the batch
    size: a graph captured after it stays valid for every later plan() of that batch
    size, whatever the lengths and page ids; another batch size is refused.
    """

    _mode, _storage = _DECODE, _PAGED

    def __init__(self, workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, *, stage=None):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, stage, {
            "kv_indptr": ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
            "kv_indices": ("paged_kv_indices_buffer", paged_kv_indices_buffer),
            "kv_last_page_len": ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)}, backend, jit_args)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
             non_blocking=True, *, stage=None):
        """Plans a decode batch. indptr (batch_size + 1), indices (indptr[-1]) and
        last_page_len (batch_size) are int32 (host or device; read in place, copied to the
        device in one copy each). sm_scale None means 1/sqrt(head_dim); logits_soft_cap
        None or 0 is off. q, the cache and the output share one dtype: q_data_type;
        kv_data_type (or data_type, FlashInfer's K/V dtype) and o_data_type, when given,
        must equal it."""
        fn = self._fn
        _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta)
        dtype, kv_dtype = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type, data_type, fp8_kv=True)
        self._plan(dtype, None, _index(indptr, fn, "indptr"), _index(indices, fn, "indices"),
                   _index(last_page_len, fn, "last_page_len"), stage, kv_dtype=kv_dtype,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                   causal=False, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs):
        """Decode attention: q (batch_size, num_qo_heads, head_dim) -> o of the same shape
        (and lse (batch_size, num_qo_heads), natural log, when return_lse)."""
        return _paged_run(self, "BatchDecodeWithPagedKVCacheWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, *,
                return_lse=False):
        """FlashInfer's older run(): the plan's options, RoPE refused."""
        fn = "BatchDecodeWithPagedKVCacheWrapper.forward"
        _check_forward_options(fn, self._require_plan(), pos_encoding_mode, rope_scale, rope_theta, window_left,
                               logits_soft_cap, sm_scale)
        return _paged_run(self, fn, q, paged_kv_cache, (), None, None, return_lse,
                          {"q_scale": q_scale, "k_scale": k_scale, "v_scale": v_scale})

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, return_lse=True, **kwargs)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's name for the decode wrapper in CUDA-graph mode: the three fixed
    index buffers come right after the workspace."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout="NHD",
                 use_tensor_cores=False, *, stage=None):
        _PlanRun.__init__(self, workspace_buffer, kv_layout, True, stage, {
            "kv_indptr": ("indptr_buffer", indptr_buffer), "kv_indices": ("indices_buffer", indices_buffer),
            "kv_last_page_len": ("last_page_len_buffer", last_page_len_buffer)})


def _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta):
    if pos_encoding_mode not in (None, "NONE"):
        raise ValueError(f"{fn}: pos_encoding_mode must be 'NONE' (flashstep applies no RoPE inside attention); "
                         f"got {pos_encoding_mode!r}")
    if rope_scale is not None or rope_theta is not None:
        raise ValueError(f"{fn}: rope_scale and rope_theta are not supported (no RoPE inside attention)")


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


def _paged_run(self, fn, q, paged_kv_cache, args, out, lse, return_lse, kwargs):
    k_scale = _scale(fn, "k_scale", kwargs.pop("k_scale", None)) if kwargs else 1.0
    v_scale = _scale(fn, "v_scale", kwargs.pop("v_scale", None)) if kwargs else 1.0
    if args or kwargs:
        _unsupported_run_args(fn, args, kwargs)
    p = self._planned
    if p is None:
        self._require_plan()
    qa = check(device_array(q, fn, "q"), fn, "q", dtypes=(p.dtype,), shape=p.q_shape)
    pool, num_pages = self._paged_pool(paged_kv_cache, p, fn)
    if p.max_page is not None and p.max_page >= num_pages:
        raise ValueError(f"{fn}: the planned indices reach page {p.max_page}; paged_kv_cache has {num_pages} pages")
    o, lse_t = self._outputs(qa, out, lse, p, fn)
    oa, la = device_array(o, fn, "out"), device_array(lse_t, fn, "lse")
    _aligned([(qa, "q"), (pool, "paged_kv_cache"), (oa, "out")], fn)
    if qa.device is None:
        for a, name in ((qa, "q"), (pool, "paged_kv_cache")):
            _check_on_device(a, fn, name)
    b = p.batch
    b.q, b.kv_pool, b.o, b.lse = qa.ptr, pool.ptr, oa.ptr, la.ptr
    b.k_scale, b.v_scale = k_scale, v_scale
    self._launch(qa, b, [(qa, "q"), (pool, "paged_kv_cache"), (oa, "out"), (la, "lse")])
    return (o, lse_t) if return_lse else o


class BatchPrefillWithPagedKVCacheWrapper(_PlanRun):
    """Batch prefill/append attention over a paged KV cache: FlashInfer's wrapper of the
    same name. Default stage: the latest in teaching order that supports the shape (today
    04_tensor_core, fp16/bf16); ``stage=`` picks one. The causal mask is aligned
    bottom-right, as FlashInfer's.

    use_cuda_graph=True: pass the four fixed int32 buffers. The first plan() fixes the
    batch size and the total query rows (pad them to the graph's size, as with
    FlashInfer's graph mode); a captured graph stays valid for every later plan() of
    that size, whatever the lengths; another size is refused."""

    _mode, _storage = _PREFILL, _PAGED

    def __init__(self, workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, *, stage=None):
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise ValueError("BatchPrefillWithPagedKVCacheWrapper: custom masks are not supported")
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, stage, {
            "qo_indptr": ("qo_indptr_buf", qo_indptr_buf), "kv_indptr": ("paged_kv_indptr_buf", paged_kv_indptr_buf),
            "kv_indices": ("paged_kv_indices_buf", paged_kv_indices_buf),
            "kv_last_page_len": ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf)}, backend, jit_args)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, *, stage=None):
        """Plans a prefill batch: qo_indptr (batch_size + 1) over the query rows, the page
        table (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len), int32, host or
        device."""
        fn = self._fn
        _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta)
        _same_head_dims(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask)
        dtype, kv_dtype = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type, fp8_kv=True)
        self._plan(dtype, _index(qo_indptr, fn, "qo_indptr"), _index(paged_kv_indptr, fn, "paged_kv_indptr"),
                   _index(paged_kv_indices, fn, "paged_kv_indices"),
                   _index(paged_kv_last_page_len, fn, "paged_kv_last_page_len"), stage, kv_dtype=kv_dtype,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk, page_size=page_size,
                   causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr[-1], num_qo_heads, head_dim) -> o of the same shape (and lse,
        natural log, when return_lse)."""
        return _paged_run(self, "BatchPrefillWithPagedKVCacheWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                rope_theta=None, *, return_lse=False):
        """FlashInfer's older run(): the plan's options, RoPE refused."""
        fn = "BatchPrefillWithPagedKVCacheWrapper.forward"
        p = self._require_plan()
        _check_forward_options(fn, p, pos_encoding_mode, rope_scale, rope_theta, window_left, logits_soft_cap,
                               sm_scale, causal)
        return _paged_run(self, fn, q, paged_kv_cache, (), None, None, return_lse,
                          {"k_scale": k_scale, "v_scale": v_scale})

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, return_lse=True, **kwargs)


def _same_head_dims(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask):
    if head_dim_vo is not None and head_dim_vo != head_dim_qk:
        raise ValueError(f"{fn}: head_dim_vo must equal head_dim_qk; got {head_dim_vo} and {head_dim_qk}")
    if custom_mask is not None or packed_custom_mask is not None:
        raise ValueError(f"{fn}: custom masks are not supported")


class BatchPrefillWithRaggedKVCacheWrapper(_PlanRun):
    """Batch prefill attention over ragged (contiguous) K/V: FlashInfer's wrapper of the
    same name. Default stage: the latest in teaching order that supports the shape
    (04_tensor_core_ragged for fp16/bf16, 01_naive for fp32); ``stage=`` picks one.
    kv_layout must be "NHD" (k and v (nnz_kv, num_kv_heads, head_dim)); FlashInfer's
    "HND" ragged K/V is refused. use_cuda_graph=True: as the paged prefill wrapper, with
    the fixed qo_indptr_buf and kv_indptr_buf."""

    _mode, _storage = _PREFILL, _RAGGED

    def __init__(self, workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, *,
                 stage=None):
        cls = "BatchPrefillWithRaggedKVCacheWrapper"
        if kv_layout != "NHD":
            raise ValueError(f"{cls}: kv_layout must be 'NHD' for ragged K/V (k, v of shape (nnz_kv, num_kv_heads, "
                             f"head_dim)); the stages do not read FlashInfer's HND ragged layout; got {kv_layout!r}")
        if custom_mask_buf is not None or mask_indptr_buf is not None:
            raise ValueError(f"{cls}: custom masks are not supported")
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph, stage,
                         {"qo_indptr": ("qo_indptr_buf", qo_indptr_buf), "kv_indptr": ("kv_indptr_buf", kv_indptr_buf)},
                         backend, jit_args)

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, *,
             stage=None):
        """Plans a prefill batch over ragged K/V: qo_indptr and kv_indptr (batch_size + 1), int32."""
        fn = self._fn
        _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta)
        _same_head_dims(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask)
        dtype, _ = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type)
        self._plan(dtype, _index(qo_indptr, fn, "qo_indptr"), _index(kv_indptr, fn, "kv_indptr"), None, None, stage,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk, page_size=1,
                   causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)

    begin_forward = plan

    def run(self, q, k, v, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr[-1], Hq, D), k and v (kv_indptr[-1], Hkv, D) -> o (and lse, natural log)."""
        return self._run("BatchPrefillWithRaggedKVCacheWrapper.run", q, k, v, args, out, lse, return_lse, kwargs)

    def _run(self, fn, q, k, v, args, out, lse, return_lse, kwargs):
        if args or kwargs:
            _unsupported_run_args(fn, args, kwargs)
        p = self._require_plan()
        qa = check(device_array(q, fn, "q"), fn, "q", dtypes=(p.dtype,), shape=p.q_shape)
        kv_shape = (p.nnz_kv, p.num_kv_heads, p.head_dim)
        ka = check(device_array(k, fn, "k"), fn, "k", dtypes=(p.dtype,), shape=kv_shape)
        va = check(device_array(v, fn, "v"), fn, "v", dtypes=(p.dtype,), shape=kv_shape)
        o, lse_t = self._outputs(qa, out, lse, p, fn)
        oa, la = device_array(o, fn, "out"), device_array(lse_t, fn, "lse")
        _aligned([(qa, "q"), (ka, "k"), (va, "v"), (oa, "out")], fn)
        if qa.device is None:
            for a, name in ((qa, "q"), (ka, "k"), (va, "v")):
                _check_on_device(a, fn, name)
        b = p.batch
        b.q, b.k, b.v, b.o, b.lse = qa.ptr, ka.ptr, va.ptr, oa.ptr, la.ptr
        self._launch(qa, b, [(qa, "q"), (ka, "k"), (va, "v"), (oa, "out"), (la, "lse")])
        return (o, lse_t) if return_lse else o

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, *, return_lse=False):
        """FlashInfer's older run(): the plan's options, RoPE refused."""
        fn = "BatchPrefillWithRaggedKVCacheWrapper.forward"
        p = self._require_plan()
        _check_forward_options(fn, p, pos_encoding_mode, rope_scale, rope_theta, window_left, logits_soft_cap,
                               sm_scale, causal)
        return self._run(fn, q, k, v, (), None, None, return_lse, {})

    def forward_return_lse(self, q, k, v, *args, **kwargs):
        return self.forward(q, k, v, *args, return_lse=True, **kwargs)


class MultiLevelCascadeAttentionWrapper(_PlanRun):
    """Cascade attention over a paged KV cache in levels: FlashInfer's wrapper of the same
    name, on stage 05 (05_cascade). Level 0 holds the pages the most requests share; a
    level's qo_indptr groups requests (all queries of a group form one tall tile that
    reads the group's pages once); the last level holds each request's own pages. Every
    level runs stage 04's tensor-core kernel into fp32 partial states, which one kernel
    merges exactly. fp16/bf16, head_dim 64/128/256. ``causal`` masks the last level only
    (the shared levels lie before every query). The LSE (``return_lse``) is natural log;
    FlashInfer's is base 2.

    plan() copies every level's arrays into the workspace (it reads them on the host:
    device arrays are copied back first). use_cuda_graph=True: the plan is made for a
    captured graph, the first plan() fixes the batch size and query rows, and a later
    plan() whose launch the captured graph cannot replay is refused by the stage."""

    _mode, _storage = _PREFILL, _PAGED

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None, paged_kv_indices_buf_arr=None,
                 paged_kv_last_page_len_buf_arr=None):
        cls = "MultiLevelCascadeAttentionWrapper"
        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or not 1 <= num_levels <= 8:
            raise ValueError(f"{cls}: num_levels must be an integer in 1..8; got {num_levels!r}")
        # The stage keeps its own copies of the level arrays in the workspace: FlashInfer's
        # fixed index buffers are accepted and not needed.
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, "05_cascade", {})
        self._num_levels = num_levels

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
             num_qo_heads, num_kv_heads, head_dim, page_size, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None):
        """Plans the levels: four lists of num_levels int32 arrays (qo_indptr, kv_indptr,
        kv_indices, kv_last_page_len per level), the last level one group per request."""
        fn = self._fn
        self._planned = None
        _no_rope(fn, pos_encoding_mode, rope_scale, rope_theta)
        if window_left != -1:
            raise ValueError(f"{fn}: window_left must be -1 (a sliding window needs key positions, which the "
                             "shared levels do not carry)")
        dtype, kv_dtype = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type, fp8_kv=True)
        arrays = {}
        for name, value in (("qo_indptr_arr", qo_indptr_arr), ("paged_kv_indptr_arr", paged_kv_indptr_arr),
                            ("paged_kv_indices_arr", paged_kv_indices_arr),
                            ("paged_kv_last_page_len", paged_kv_last_page_len)):
            if not isinstance(value, (list, tuple)) or len(value) != self._num_levels:
                raise ValueError(f"{fn}: {name} must be a list of num_levels = {self._num_levels} int32 arrays")
            arrays[name] = [_host_view(_index(a, fn, f"{name}[{l}]")) for l, a in enumerate(value)]
        qo, kv, idx, lpl = (arrays[k] for k in ("qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr",
                                                "paged_kv_last_page_len"))
        groups, max_page = [], -1
        for l in range(self._num_levels):
            g = len(kv[l]) - 1
            if g < 1 or len(qo[l]) != g + 1 or len(lpl[l]) != g:
                raise ValueError(f"{fn}: level {l}: qo_indptr and paged_kv_indptr need num_groups + 1 >= 2 entries "
                                 f"and kv_last_page_len num_groups (got {len(qo[l])}, {len(kv[l])}, {len(lpl[l])})")
            pages = kv[l][g]
            low = 0
            if len(idx[l]) >= pages > 0:
                low, high = idx[l].min_max(pages)
                max_page = max(max_page, high)
            if len(idx[l]) < pages or low < 0:
                raise ValueError(f"{fn}: level {l}: paged_kv_indices needs kv_indptr[-1] = {pages} page ids >= 0")
            groups.append(g)
        last = self._num_levels - 1
        batch, nnz_qo = groups[last], qo[last][groups[last]]
        if self._use_cuda_graph and self._graph_size not in (None, (batch, nnz_qo)):
            raise ValueError(f"{fn}: use_cuda_graph=True: this wrapper's first plan() fixed batch_size "
                             f"{self._graph_size[0]} and {self._graph_size[1]} query rows; this plan has {batch} and "
                             f"{nnz_qo}: make one wrapper (and workspace) per graph size")
        shape = self._shape(dtype, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                            page_size=page_size, causal=causal, window_left=-1, logits_soft_cap=logits_soft_cap,
                            sm_scale=sm_scale, qo_indptr=qo[last], kv_indptr=kv[last], last_page_len=lpl[last],
                            kv_dtype=kv_dtype)
        levels = [(ctypes.c_void_p * self._num_levels)(*[a.ptr for a in level]) for level in (qo, kv, idx, lpl)]
        num_groups = (ctypes.c_int32 * self._num_levels)(*groups)
        ws = self._ws
        with _DeviceGuard(ws.device):
            try:
                if self._runner is None:
                    runner = ctypes.c_void_p()
                    _capi.call("fs_runner_create", b"05_cascade", ctypes.byref(runner))
                    self._runner, self._runner_stage = runner, "05_cascade"
                # One call sizes and plans: the stage prepares the plan once, and sets `need`
                # also when it refuses a workspace that is too small.
                need = ctypes.c_size_t()
                try:
                    _capi.call("fs_cascade_plan", self._runner, ctypes.byref(shape), self._num_levels, num_groups,
                               *levels, ctypes.c_void_p(ws.ptr), ws.nbytes, ctypes.byref(need),
                               ctypes.c_void_p(current_stream(ws)))
                except ValueError:
                    if need.value > ws.nbytes:
                        raise ValueError(f"workspace_buffer has {ws.nbytes} bytes; this plan needs {need.value}: "
                                         "pass a workspace of at least that") from None
                    raise
            except ValueError as e:
                raise ValueError(_renamed(fn, str(e))) from None
        self.stage = "05_cascade"
        if self._use_cuda_graph:
            self._graph_size = (batch, nnz_qo)
        p = _Plan()
        p.dtype, p.batch_size, p.nnz_qo, p.nnz_kv = dtype, batch, nnz_qo, kv[last][batch]
        p.kv_dtype = kv_dtype
        p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size = (shape.num_qo_heads, shape.num_kv_heads,
                                                                   shape.head_dim, shape.page_size)
        p.max_page = max_page
        p.q_shape, p.lse_shape = (nnz_qo, shape.num_qo_heads, shape.head_dim), (nnz_qo, shape.num_qo_heads)
        _planned_options(p, shape)
        p.batch = _capi.Batch()  # the stage keeps its index arrays in its workspace
        self._planned = p

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr_arr[-1][-1], num_qo_heads, head_dim) -> o of the same shape (and lse,
        natural log, when return_lse)."""
        return _paged_run(self, "MultiLevelCascadeAttentionWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    forward = run


# ---- the merge of attention states ------------------------------------------------------------

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


# ---- the paged KV cache ------------------------------------------------------------------------

# ---- stage 09: RoPE, FlashInfer's flashinfer.rope functions --------------------------------
# https://docs.flashinfer.ai/api/rope.html; the math is the reference's
# (flashstep/reference/rope.hpp), the kernel stage 09's (rope_kernel.cuh).


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


# ---- stage 06: sampling --------------------------------------------------------------------

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
        state = generator.get_state()
        seed, offset = (int(v) for v in state.view(torch.int64))
        generator.set_state(torch.tensor([seed, offset + _GENERATOR_WORDS_PER_CALL], dtype=torch.int64).view(
            torch.uint8))
        return seed % 2**64, offset
    return int(torch.randint(0, 2**62, (1,), generator=generator).item()), 0


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


def _sample(op, fn, data, name, indices, top_k=None, top_p=None, min_p=None, order="top_k_first",
            seed=None, offset=None, generator=None, check_nan=False, return_status=False, return_valid=False):
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
    if check_nan:
        _raise_on_status(fn, status)
    if given_idx is not None and given_idx.dtype != "int32":
        samples = _converted(device_array(samples, fn, "samples"), fn, "samples", given_idx.dtype).obj
    out = (samples,) + ((status == 0,) if return_valid else ()) + ((status,) if return_status else ())
    return out if len(out) > 1 else samples


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
