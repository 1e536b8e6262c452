"""Multi-head latent attention (MLA) on the GPU, the absorbed form of stages/10_mla/:
FlashInfer's BatchMLAPagedAttentionWrapper in its flat-metadata form (plan() takes
qo_indptr, kv_indptr, kv_indices and kv_len_arr; run() takes q_nope, q_pe, ckv_cache and
kpe_cache)."""
import ctypes
import math
import re

from . import _capi
from ._cuda_common import (_ALIGN, _aligned, _alloc_or_check, _c_int, _check_on_device, _DeviceGuard, _DTYPES,
                           _dtype_name, _host_view, _index, _kv_dtype_name, _KV_DTYPES, _page_locked)
from ._tensors import check, current_stream, device_array, same_device

_CLS = "BatchMLAPagedAttentionWrapper"
_LOG2E = 1.0 / math.log(2.0)
# FlashInfer's policy and its backends of this wrapper's flat form: accepted and ignored
# (flashstep runs its own MLA kernel).
_BACKENDS = ("auto", "fa2", "fa3")
_WORKSPACE_DTYPES = ("uint8", "int8", "float32", "float16", "bfloat16", "int32", "int64")
# The library's messages name its own function and its field kv_len; the wrapper's name
# them as FlashInfer does (the method, kv_len_arr).
_LIBRARY_PREFIX = re.compile(r"^(plan|run|fs_mla_\w+|MlaRunner::\w+): ")
_KV_LEN_FIELD = re.compile(r"\bkv_len(?=\[| must)")
# num_pages when the ids stay on the device: int32's largest value, a bound plan() cannot tighten.
_INT32_PAGES = 2**31 - 1


def _renamed(fn, message):
    return f"{fn}: " + _KV_LEN_FIELD.sub("kv_len_arr", _LIBRARY_PREFIX.sub("", message, count=1))


class _MlaPlan:
    """What run() needs of the last plan: the sizes its checks compare against, the largest
    page id when plan() read the ids (None when they stayed on the device), and the C
    batch struct whose kv_indices plan() set (with its address, passed as is)."""

    __slots__ = ("dtype", "nnz_qo", "num_heads", "head_dim_ckv", "head_dim_kpe", "page_size", "max_page", "batch",
                 "batch_address")


class BatchMLAPagedAttentionWrapper:
    """MLA decode and causal append over a paged latent cache: FlashInfer's wrapper of the
    same name (https://docs.flashinfer.ai/api/mla.html), on stages/10_mla/'s kernel. Every
    query head of a request attends to the request's latents ``c`` and rotary keys
    ``k_pe``, the absorbed form of stages/10_mla/README.md::

        s = sm_scale (q_nope . c + q_pe . k_pe),   o = softmax(s) c

    q_nope is the absorbed query (W_UK folded in, head_dim_ckv = 512 wide), q_pe the rotary
    part (head_dim_kpe = 64); o is the latent output (apply W_UV after). With ``causal``
    query i of a request sees keys 0 .. i + kv_len - qo_len (bottom-right aligned, as
    FlashInfer's); a request of kv_len 0 gets o = 0 and lse = -inf. fp16/bf16, 1..128
    heads, any page size.

    plan() reads the index arrays on the host (device arrays are copied back, which waits
    for the caller's stream), plans on the host and copies the schedule, and kv_indices,
    into the workspace; run() only launches, on the caller's current stream.

    The lse (``return_lse=True``) is FlashInfer's: base 2, or the natural log with
    ``return_lse_base_on_e=True``. The kernel writes the natural log and run() converts
    it with one multiply by log2(e) in the caller's framework (PyTorch or CuPy).

    ``use_cuda_graph=True``: pass the fixed ``kv_indices`` buffer (int32, as long as the
    plan's pages; qo_indptr, kv_indptr and kv_len_arr buffers, when given, are filled
    too, as FlashInfer fills them). The wrapper then plans once: run() captured in a
    graph after that plan replays its launch, whose grid follows the plan's lengths, so a
    second plan() is refused (make one wrapper per captured graph, as FlashInfer asks of
    its backends that cannot re-plan under a graph). Without it, run() can still be
    captured; a later plan() then invalidates the graph.

    Differences from FlashInfer, each refused by name: q_nope, q_pe and both pools must
    be contiguous (no views of one combined (..., 576) cache), no FP8 cache, no
    profiler, none of the CUTLASS backend's run() arguments (kv_len, page_table,
    o_scale), and plan()'s index arrays must have exactly batch_size + 1 (indptr) and
    batch_size (kv_len_arr) entries. ``backend`` "auto", "fa2" and "fa3" are accepted and
    ignored; ``query=`` and ``kv_cache=`` are taken as (q_nope, q_pe) and (ckv_cache,
    kpe_cache) pairs.
    """

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        self._runner = None
        if backend not in _BACKENDS:
            raise ValueError(f"{_CLS}: backend must be one of 'auto', 'fa2', 'fa3' (FlashInfer's kernel families, "
                             f"accepted and ignored: flashstep runs its own MLA kernel); got {backend!r}")
        self._ws = check(device_array(float_workspace_buffer, _CLS, "float_workspace_buffer"), _CLS,
                         "float_workspace_buffer", dtypes=_WORKSPACE_DTYPES)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._fixed = {}  # index array -> its fixed device buffer (use_cuda_graph only, as FlashInfer's)
        if self._use_cuda_graph:
            if kv_indices is None:
                raise ValueError(f"{_CLS}: use_cuda_graph=True needs the fixed kv_indices buffer (an int32 CUDA "
                                 "tensor as long as the plan's pages): run() reads the page ids there, the address "
                                 "a captured graph keeps")
            for name, buf in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                              ("kv_len_arr", kv_len_arr)):
                if buf is not None:
                    self._fixed[name] = check(device_array(buf, _CLS, name), _CLS, name, dtypes=("int32",),
                                              shape=(None,))
        self._planned = None
        self._graph_planned = False

    def __del__(self):
        runner = getattr(self, "_runner", None)
        if runner is not None and _capi._lib is not None:
            _capi._lib.fs_mla_runner_destroy(runner)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        """Plans a batch: qo_indptr (batch_size + 1) over the query rows, kv_indptr
        (batch_size + 1) and kv_indices (kv_indptr[-1]) the page table shared by both
        pools, kv_len_arr (batch_size) each request's keys; int32, host or device.
        head_dim_ckv and head_dim_kpe: 512 and 64 (the widths the kernel is built for).
        sm_scale is required: 1/sqrt of the query/key head dim before absorption
        (1/sqrt(192) for DeepSeek-V3). q_data_type and kv_data_type: one of float16,
        bfloat16."""
        fn = f"{_CLS}.plan"
        if self._graph_planned:
            raise RuntimeError(f"{fn}: use_cuda_graph=True: this wrapper has planned once, and a graph captured "
                               "after that plan replays its launch (its grid follows the lengths): make one wrapper "
                               "(and workspace) per captured graph")
        self._planned = None  # a plan() that fails leaves no plan to run
        if use_profiler:
            raise ValueError(f"{fn}: use_profiler=True (FlashInfer's kernel profiler) is not supported")
        dtype = _dtype_name(q_data_type, fn, "q_data_type")
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"{fn}: q_data_type must be float16 or bfloat16 (the MLA kernel runs on tensor "
                             f"cores); got {dtype}")
        kv_dtype = _kv_dtype_name(kv_data_type, fn, "kv_data_type")
        if kv_dtype != dtype:
            fp8 = "; an FP8 latent cache is not supported" if kv_dtype in _KV_DTYPES else ""
            raise ValueError(f"{fn}: kv_data_type must equal q_data_type{fp8}; got {kv_dtype} and {dtype}")
        if sm_scale is None:
            raise ValueError(f"{fn}: sm_scale is required: 1/sqrt of the query/key head dim before absorption "
                             "(1/sqrt(192) for DeepSeek-V3), which the latent widths do not tell")
        try:
            scale = float(sm_scale)
        except (TypeError, ValueError):
            raise ValueError(f"{fn}: sm_scale must be a number; got {sm_scale!r}") from None
        lens = _host_view(_index(kv_len_arr, fn, "kv_len_arr"))
        batch = len(lens)
        if batch < 1:
            raise ValueError(f"{fn}: kv_len_arr must hold one length per request (batch_size >= 1); it is empty")
        qo_host = _host_view(_index(qo_indptr, fn, "qo_indptr"))
        kv_host = _host_view(_index(kv_indptr, fn, "kv_indptr"))
        for name, a in (("qo_indptr", qo_host), ("kv_indptr", kv_host)):
            if len(a) != batch + 1:
                raise ValueError(f"{fn}: {name} has {len(a)} entries; kv_len_arr has {batch} requests, so it needs "
                                 f"batch_size + 1 = {batch + 1}")
        indices = _index(kv_indices, fn, "kv_indices")
        nnz_qo, nnz_kv = qo_host[batch], kv_host[batch]
        if len(indices) < nnz_kv:
            raise ValueError(f"{fn}: kv_indices has {len(indices)} entries; kv_indptr[-1] = {nnz_kv} pages are needed")
        max_page = None  # unknown: device-resident page ids are not read on the host
        if not indices.on_device:
            max_page = -1
            if nnz_kv > 0:
                low, max_page = indices.min_max(nnz_kv)
                if low < 0:
                    raise ValueError(f"{fn}: kv_indices must be >= 0 (it holds {low})")
        s = _capi.MlaShape()
        s.dtype, s.batch_size = _DTYPES[dtype], batch
        s.num_heads = _c_int(num_heads, fn, "num_heads")
        s.head_dim_ckv = _c_int(head_dim_ckv, fn, "head_dim_ckv")
        s.head_dim_kpe = _c_int(head_dim_kpe, fn, "head_dim_kpe")
        s.page_size = _c_int(page_size, fn, "page_size")
        # FlashInfer's plan() does not see the pools: num_pages is a bound the page ids
        # respect (the largest id + 1 where plan() reads them, else int32's), and run()
        # holds the pools to it where it is known.
        s.num_pages = _INT32_PAGES if max_page is None else max(1, max_page + 1)
        s.causal, s.sm_scale = int(bool(causal)), scale
        s.qo_indptr, s.kv_indptr, s.kv_len = qo_host.ptr, kv_host.ptr, lens.ptr
        with _DeviceGuard(self._ws.device):
            try:
                kv_indices_ptr = self._plan_on_device(s, indices, nnz_kv, {"qo_indptr": qo_host,
                                                                           "kv_indptr": kv_host,
                                                                           "kv_len_arr": lens})
            except ValueError as e:
                raise ValueError(_renamed(fn, str(e))) from None
        p = _MlaPlan()
        p.dtype, p.nnz_qo, p.num_heads = dtype, nnz_qo, s.num_heads
        p.head_dim_ckv, p.head_dim_kpe, p.page_size, p.max_page = s.head_dim_ckv, s.head_dim_kpe, s.page_size, max_page
        p.batch = _capi.MlaBatch()
        p.batch.kv_indices = kv_indices_ptr
        p.batch_address = ctypes.addressof(p.batch)
        self._planned = p
        self._graph_planned = self._use_cuda_graph

    def _plan_on_device(self, shape, indices, nnz_kv, host_arrays):
        """Sizes the workspace (the library's one check of the shape), copies kv_indices to
        where run() reads it (the end of the workspace, or the fixed buffer), fills the
        other fixed buffers, and plans. Returns the device address of the page ids."""
        ws = self._ws
        if self._runner is None:
            runner = ctypes.c_void_p()
            _capi.call("fs_mla_runner_create", ctypes.byref(runner))
            self._runner = runner
        need = ctypes.c_size_t()
        _capi.call("fs_mla_workspace_bytes", self._runner, ctypes.byref(shape), ctypes.byref(need))
        # The kernel's schedule and split states start the workspace; the page ids end it
        # (FlashInfer keeps its copies in its workspace too).
        end = ws.nbytes // _ALIGN * _ALIGN
        fixed = self._fixed.get("kv_indices")
        if fixed is not None:
            if fixed.numel < nnz_kv:
                raise ValueError(f"the kv_indices buffer holds {fixed.numel} entries; this plan needs {nnz_kv}")
            indices_ptr = fixed.ptr
        else:
            end -= max(1, -(-4 * nnz_kv // _ALIGN)) * _ALIGN
            indices_ptr = ws.ptr + end
        if need.value > end:
            needed = -(-need.value // _ALIGN) * _ALIGN + ws.nbytes // _ALIGN * _ALIGN - end
            raise ValueError(f"float_workspace_buffer has {ws.nbytes} bytes; this plan needs {needed} ({need.value} "
                             "for the MLA kernel's schedule and split states, the rest for kv_indices): pass a "
                             "workspace of at least that")
        copies = [(indices_ptr, indices, nnz_kv)]
        for name, host in host_arrays.items():
            buf = self._fixed.get(name)
            if buf is not None:
                if buf.numel < len(host):
                    raise ValueError(f"the {name} buffer holds {buf.numel} entries; this plan needs {len(host)}")
                copies.append((buf.ptr, host, len(host)))
        stream = ctypes.c_void_p(current_stream(ws))
        for dst, source, count in copies:
            src = source.ptr
            if not count or src == dst:
                continue
            if not source.on_device and _page_locked(src):
                # A page-locked source would be read when the stream reaches the copy, after
                # plan() returns: copy it to ordinary memory, which the copy reads at once.
                staged = (ctypes.c_int32 * count)()
                ctypes.memmove(staged, src, 4 * count)
                src = ctypes.addressof(staged)
            _capi.call("fs_memcpy", ctypes.c_void_p(dst), ctypes.c_void_p(src), 4 * count, stream, 0)
        _capi.call("fs_mla_plan", self._runner, ctypes.byref(shape), ctypes.c_void_p(ws.ptr), need.value, stream)
        return indices_ptr

    def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *,
            query=None, kv_cache=None):
        """q_nope (nnz_qo, num_heads, head_dim_ckv), q_pe (nnz_qo, num_heads,
        head_dim_kpe), ckv_cache (num_pages, page_size, head_dim_ckv) and kpe_cache
        (num_pages, page_size, head_dim_kpe), contiguous, of the planned dtype -> o
        (nnz_qo, num_heads, head_dim_ckv), or (o, lse) with return_lse: lse (nnz_qo,
        num_heads) float32, base 2, or the natural log with return_lse_base_on_e. out= and
        lse= are written and returned as given (lse= is written also without
        return_lse)."""
        fn = f"{_CLS}.run"
        q_nope, q_pe = self._pair(fn, "query", query, ("q_nope", q_nope), ("q_pe", q_pe))
        ckv_cache, kpe_cache = self._pair(fn, "kv_cache", kv_cache, ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache))
        for name, value, why in (("profiler_buffer", profiler_buffer, "FlashInfer's kernel profiler"),
                                 ("kv_len", kv_len, "FlashInfer's CUTLASS backend's metadata; the plan's is used"),
                                 ("page_table", page_table, "FlashInfer's CUTLASS backend's metadata; the plan's is "
                                                            "used"),
                                 ("o_scale", o_scale, "an FP8 output scale")):
            if value is not None:
                raise ValueError(f"{fn}: {name} ({why}) is not supported; pass None")
        p = self._planned
        if p is None:
            raise ValueError(f"{fn}: call plan() first")
        rows = (p.nnz_qo, p.num_heads)
        qn = check(device_array(q_nope, fn, "q_nope"), fn, "q_nope", dtypes=(p.dtype,), shape=rows + (p.head_dim_ckv,))
        qp = check(device_array(q_pe, fn, "q_pe"), fn, "q_pe", dtypes=(p.dtype,), shape=rows + (p.head_dim_kpe,))
        ckv = self._pool(fn, "ckv_cache", ckv_cache, p, "head_dim_ckv", p.head_dim_ckv)
        kpe = self._pool(fn, "kpe_cache", kpe_cache, p, "head_dim_kpe", p.head_dim_kpe)
        num_pages = ckv.shape[0]
        if kpe.shape[0] != num_pages:
            raise ValueError(f"{fn}: kpe_cache has {kpe.shape[0]} pages, ckv_cache {num_pages}: the two pools share "
                             "one page table, so they must hold as many pages")
        if p.max_page is not None and p.max_page >= num_pages:
            raise ValueError(f"{fn}: the planned kv_indices reach page {p.max_page}; ckv_cache and kpe_cache have "
                             f"{num_pages} pages")
        o = _alloc_or_check(qn, out, rows + (p.head_dim_ckv,), p.dtype, fn, "out")
        oa = device_array(o, fn, "out")
        arrays = [(qn, "q_nope"), (qp, "q_pe"), (ckv, "ckv_cache"), (kpe, "kpe_cache"), (oa, "out")]
        _aligned(arrays, fn)
        lse_t = la = None
        if return_lse or lse is not None:
            lse_t = _alloc_or_check(qn, lse, rows, "float32", fn, "lse")
            la = device_array(lse_t, fn, "lse")
            arrays.append((la, "lse"))
            if not return_lse_base_on_e and la.kind not in ("torch", "cupy"):
                raise ValueError(f"{fn}: the base-2 lse (FlashInfer's default) is converted from the kernel's natural "
                                 "log in PyTorch or CuPy, and lse is neither: pass return_lse_base_on_e=True for the "
                                 "natural log")
        if qn.device is None:
            for a, name in arrays:
                _check_on_device(a, fn, name)
        same_device(fn, arrays + [(self._ws, "float_workspace_buffer")])
        b = p.batch
        b.q_nope, b.q_pe, b.ckv_pages, b.kpe_pages, b.o = qn.ptr, qp.ptr, ckv.ptr, kpe.ptr, oa.ptr
        b.lse = la.ptr if la is not None else None
        status = _capi._lib.fs_mla_run(self._runner, p.batch_address, current_stream(qn))
        if status:
            try:
                _capi.raise_status(status)
            except ValueError as e:
                raise ValueError(_renamed(fn, str(e))) from None
        if lse_t is not None and not return_lse_base_on_e:
            lse_t *= _LOG2E  # in place, on the caller's stream: log2(x) = ln(x) log2(e); -inf stays -inf
        return (o, lse_t) if return_lse else o

    @staticmethod
    def _pair(fn, name, value, first, second):
        """FlashInfer's structural form, query=(q_nope, q_pe) or kv_cache=(ckv_cache,
        kpe_cache), or the two tensors given apart."""
        if value is None:
            return first[1], second[1]
        if first[1] is not None or second[1] is not None:
            raise ValueError(f"{fn}: pass either {name}= or {first[0]} and {second[0]}, not both")
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise ValueError(f"{fn}: {name} must be a pair ({first[0]}, {second[0]}); a packed tensor (the two "
                             f"joined on the last axis) is not supported; got {type(value).__name__}")
        return value[0], value[1]

    @staticmethod
    def _pool(fn, name, pool, p, width_name, width):
        """A latent or rotary-key pool of the planned page size and width, contiguous."""
        a = device_array(pool, fn, name)
        if len(a.shape) != 3 or a.shape[1:] != (p.page_size, width):
            raise ValueError(f"{fn}: {name} must have shape (num_pages, page_size, {width_name}) = (*, {p.page_size}, "
                             f"{width}) as planned; it has {a.shape}")
        if not a.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous; its strides are {a.strides} elements for shape "
                             f"{a.shape} (the kernel reads each pool as its own array, not as a view of one "
                             "combined (..., head_dim_ckv + head_dim_kpe) cache)")
        return check(a, fn, name, dtypes=(p.dtype,))
