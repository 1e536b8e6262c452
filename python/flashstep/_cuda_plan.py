"""plan() and run() of every attention wrapper: the plan a wrapper keeps (Plan) and the
base class that makes it and launches it (PlanRun)."""
import ctypes
import math

from . import _capi
from ._cuda_common import (_ALIGN, _aligned, _alloc_or_check, _arange, _c_int, _check_backend, _check_on_device,
                           _check_pool_layout, _chosen_stage, _DeviceGuard, _DTYPES, _graph_safe, _host_view,
                           _KV_DTYPES, _layout, _LAYOUTS, _page_locked, _PAGED, _planned_options, _PREFILL,
                           _registry, _renamed, _resolve_stage, _scale, _STAGE_CHOICES, _unsupported_run_args)
from ._tensors import _TORCH_TYPES, ITEMSIZE, check, current_stream, device_array, same_device


class Plan:
    """What run() needs of the last plan: sizes, the checks' bounds, the C batch struct
    whose index pointers plan() filled (and its address, passed to the library as is),
    and the scratch lse a run() without return_lse writes into (0: none)."""

    __slots__ = ("dtype", "kv_dtype", "batch_size", "nnz_qo", "nnz_kv", "num_qo_heads", "num_kv_heads", "head_dim",
                 "head_dim_vo", "page_size", "max_page", "q_shape", "o_shape", "lse_shape", "batch", "batch_address",
                 "causal", "window_left",
                 "logits_soft_cap", "sm_scale", "lse_scratch", "torch")

    def __init__(self):
        self.max_page, self.lse_scratch, self.torch = None, 0, None

    def set_batch(self, batch):
        self.batch, self.batch_address = batch, ctypes.addressof(batch)


class _TorchPlan:
    """run()'s fast path for PyTorch tensors, made at a plan's first run(): the torch
    dtypes to compare against (a dtype object is a singleton: `is` compares it), the
    tail of the pool's or K/V's shape, and torch itself."""

    __slots__ = ("torch", "dtype", "kv_dtype", "pool_tail", "kv_shape", "v_shape", "lse_dtype", "raw_stream")

    def __init__(self, p, hnd):
        import torch
        self.torch, self.dtype, self.kv_dtype = torch, getattr(torch, p.dtype), getattr(torch, p.kv_dtype)
        page = (p.num_kv_heads, p.page_size, p.head_dim) if hnd else (p.page_size, p.num_kv_heads, p.head_dim)
        self.pool_tail = (2,) + page
        self.kv_shape = (p.nnz_kv, p.num_kv_heads, p.head_dim)
        self.v_shape = (p.nnz_kv, p.num_kv_heads, p.head_dim_vo)  # ragged v: head_dim_vo wide
        self.lse_dtype = torch.float32
        # the current stream's handle without building a torch.cuda.Stream (as current_stream)
        self.raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
            (lambda device: torch.cuda.current_stream(device).cuda_stream)


class PlanRun:
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
        self._lse_scratch = 0
        self.stage = None  # the registry name the last plan() chose

    def __del__(self):
        runner = getattr(self, "_runner", None)
        if runner is not None and _capi._lib is not None:
            _capi._lib.fs_runner_destroy(runner)

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def _shape(self, dtype, num_qo_heads, num_kv_heads, head_dim, page_size, causal, window_left,
               logits_soft_cap, sm_scale, qo_indptr, kv_indptr, last_page_len, kv_dtype=None, head_dim_vo=None):
        """The C shape of the batch (one struct per wrapper, refilled); the index arrays are
        host IndexArrays, pointed at in place. The sizes are checked for their type here and
        for their bounds by the library, which names each."""
        fn = self._fn
        s = self._c_shape
        s.mode, s.storage, s.dtype = self._mode, self._storage, _DTYPES[dtype]
        s.kv_layout = _LAYOUTS[self._kv_layout]
        s.batch_size = len(kv_indptr) - 1
        s.num_qo_heads = _c_int(num_qo_heads, fn, "num_qo_heads")
        s.num_kv_heads = _c_int(num_kv_heads, fn, "num_kv_heads")
        s.head_dim = _c_int(head_dim, fn, "head_dim")
        s.head_dim_vo = 0 if head_dim_vo is None else _c_int(head_dim_vo, fn, "head_dim_vo")
        s.page_size = _c_int(page_size, fn, "page_size") if self._storage == _PAGED else 0
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
        """The requested stage's registry name, or the registry's default choice
        (fs_default_stage); remembered per shape kind and device (the registry's rules read
        the sizes, the options and the GPU, not the lengths). Whether a requested stage runs
        the batch is checked once, by the library, when the runner sizes and plans it."""
        device = self._ws.device
        key = (stage, device, shape.mode, shape.storage, shape.dtype, shape.kv_layout, shape.num_qo_heads,
               shape.num_kv_heads, shape.head_dim, shape.head_dim_vo, shape.page_size, shape.causal,
               shape.window_left >= 0,
               shape.logits_soft_cap > 0, shape.has_sm_scale, shape.cuda_graph, shape.kv_dtype)
        chosen = _STAGE_CHOICES.get(key)
        if chosen is not None:
            return chosen
        if stage is None:
            chosen = _chosen_stage(shape, device)
        else:
            chosen = _resolve_stage(str(stage), shape)
            if shape.cuda_graph and not _graph_safe(chosen):
                safe = [name for name, _, _ in _registry() if _graph_safe(name)]
                raise ValueError(f"stage {chosen} cannot plan for a captured CUDA graph (use_cuda_graph=True): its "
                                 f"launch depends on the lengths, so a graph replayed after another plan() would run "
                                 f"a stale grid; pass stage= one of {', '.join(safe) or '(none in this build)'}, or "
                                 "leave stage unset")
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
                self._plan_on_device(shape, chosen, arrays, nnz_kv, nnz_qo)
            except ValueError as e:
                raise ValueError(_renamed(fn, str(e))) from None
        self.stage = chosen
        if self._use_cuda_graph:
            self._graph_size = (batch, nnz_qo)
        p = Plan()
        p.dtype, p.batch_size, p.nnz_qo, p.nnz_kv = dtype, batch, nnz_qo, nnz_kv
        p.kv_dtype = kv_dtype or dtype
        p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size = (shape.num_qo_heads, shape.num_kv_heads,
                                                                   shape.head_dim, shape.page_size)
        p.max_page = max_page
        p.head_dim_vo = shape.head_dim_vo or shape.head_dim
        p.q_shape, p.lse_shape = (nnz_qo, shape.num_qo_heads, shape.head_dim), (nnz_qo, shape.num_qo_heads)
        p.o_shape = p.q_shape if p.head_dim_vo == shape.head_dim else (nnz_qo, shape.num_qo_heads, p.head_dim_vo)
        _planned_options(p, shape)
        p.set_batch(self._device_batch)
        self._device_batch.v_pool = None  # a run over V's own pool sets it (_own_v_pools)
        p.lse_scratch = self._lse_scratch
        self._planned = p

    def _decode_qo_indptr(self, batch):
        cached = getattr(self, "_arange_cache", None)
        if cached is None or len(cached) != batch + 1:
            cached = self._arange_cache = _arange(batch + 1)
        return cached

    def _plan_on_device(self, shape, chosen, arrays, nnz_kv, nnz_qo):
        """Makes (or keeps) the runner of `chosen`, copies the index arrays the stage reads
        to the device and plans. `arrays`: name -> (IndexArray as given or None, its host view)."""
        ws = self._ws
        need = ctypes.c_size_t()
        if self._runner is None or self._runner_stage != chosen:
            # The new stage's runner replaces the old one once it has taken the shape (the
            # library's one check of it), so a refused plan leaves the old runner alone.
            runner = ctypes.c_void_p()
            _capi.call("fs_runner_create", chosen.encode(), ctypes.byref(runner))
            try:
                _capi.call("fs_runner_workspace_bytes", runner, ctypes.byref(shape), ctypes.byref(need))
            except Exception:
                _capi.call("fs_runner_destroy", runner)
                raise
            if self._runner is not None:
                _capi.call("fs_runner_destroy", self._runner)
            self._runner, self._runner_stage = runner, chosen
        else:
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
        # Where the workspace has room: the lse that a run() without return_lse writes (the
        # stages always write one) and nobody reads, so run() allocates o alone, as
        # FlashInfer's does. Not under use_cuda_graph: a captured run keeps its address,
        # which a later plan() needing more workspace could give to the stage.
        self._lse_scratch = 0
        lse_bytes = -(-4 * nnz_qo * shape.num_qo_heads // _ALIGN) * _ALIGN
        if not self._use_cuda_graph and 0 < lse_bytes <= end - need.value:
            end -= lse_bytes
            self._lse_scratch = ws.ptr + end
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
        o = _alloc_or_check(like, out, p.o_shape, p.dtype, fn, "out")
        lse_t = _alloc_or_check(like, lse, p.lse_shape, "float32", fn, "lse")
        return o, lse_t

    def _launch(self, like, batch, arrays):
        """One fs_runner_run on the caller's current stream, on the arrays' device."""
        device = same_device(f"{type(self).__name__}.run", arrays + [(self._ws, "workspace_buffer")])
        status = _capi._lib.fs_runner_run(self._runner, ctypes.addressof(batch), -1 if device is None else device,
                                          current_stream(like))
        if status:
            _capi.raise_status(status)

    @staticmethod
    def _torch_outputs_fit(p, t, out, lse, device):
        """Whether run()'s out= and lse= (None, or PyTorch tensors) are what the general
        path would accept: dtype, shape, row-major, on `device`, out 16-byte aligned."""
        if out is not None and not (type(out) in _TORCH_TYPES and out.dtype is t.dtype and out.shape == p.o_shape and
                                    out.is_contiguous() and not out.data_ptr() % 16 and out.get_device() == device):
            return False
        return lse is None or (type(lse) in _TORCH_TYPES and lse.dtype is t.lse_dtype and lse.shape == p.lse_shape
                               and lse.is_contiguous() and lse.get_device() == device)

    def _torch_launch(self, p, t, q, device, return_lse, out=None, lse=None):
        """The end of run()'s fast path (PyTorch tensors that passed its checks, batch
        pointers set but o and lse): takes out= and lse= or allocates o (and lse when
        asked, else the plan's scratch lse), launches, returns what run() returns."""
        if out is not None:
            o = out
        elif p.o_shape is p.q_shape:
            o = t.torch.empty_like(q)
        else:  # v and o narrower than q (head_dim_vo)
            o = t.torch.empty(p.o_shape, dtype=t.dtype, device=q.device)
        b = p.batch
        b.o = o.data_ptr()
        if lse is not None:
            b.lse = lse.data_ptr()
        elif return_lse or not p.lse_scratch:
            lse = t.torch.empty(p.lse_shape, dtype=t.lse_dtype, device=q.device)
            b.lse = lse.data_ptr()
        else:
            b.lse = p.lse_scratch
        status = _capi._lib.fs_runner_run(self._runner, p.batch_address, device, t.raw_stream(device))
        if status:
            _capi.raise_status(status)
        return (o, lse) if return_lse else o

    def _torch_plan(self, p):
        t = p.torch = _TorchPlan(p, self._kv_layout == "HND")
        return t

    def _run_paged(self, fn, q, paged_kv_cache, args, out, lse, return_lse, kwargs):
        """run() over the paged cache (decode, paged prefill, cascade)."""
        k_scale = _scale(fn, "k_scale", kwargs.pop("k_scale", None)) if kwargs else 1.0
        v_scale = _scale(fn, "v_scale", kwargs.pop("v_scale", None)) if kwargs else 1.0
        sinks = kwargs.pop("sinks", None) if kwargs else None
        if args or kwargs:
            _unsupported_run_args(fn, args, kwargs)
        p = self._planned
        if p is None:
            self._require_plan()
        p.batch.sinks = None
        # The fast path: PyTorch tensors (out= and lse= too, where given; else allocated
        # here). Each check that fails falls through to the general path below, which
        # raises with the argument's name.
        if sinks is None and type(q) in _TORCH_TYPES and type(paged_kv_cache) in _TORCH_TYPES:
            t = p.torch or self._torch_plan(p)
            pool = paged_kv_cache
            device = q.get_device()
            qp, kp = q.data_ptr(), pool.data_ptr()
            if (q.dtype is t.dtype and q.shape == p.q_shape and q.is_contiguous() and pool.dtype is t.kv_dtype and
                    pool.shape[1:] == t.pool_tail and pool.is_contiguous() and not (qp | kp) % 16 and
                    device >= 0 and device == pool.get_device() == self._ws.device and
                    (p.max_page is None or p.max_page < pool.shape[0]) and
                    (out is None and lse is None or self._torch_outputs_fit(p, t, out, lse, device))):
                b = p.batch
                b.q, b.kv_pool, b.k_scale, b.v_scale = qp, kp, k_scale, v_scale
                return self._torch_launch(p, t, q, device, return_lse, out, lse)
        qa = check(device_array(q, fn, "q"), fn, "q", dtypes=(p.dtype,), shape=p.q_shape)
        pool, num_pages, v_pool = self._paged_pool(paged_kv_cache, p, fn)
        if p.max_page is not None and p.max_page >= num_pages:
            raise ValueError(f"{fn}: the planned indices reach page {p.max_page}; paged_kv_cache has {num_pages} "
                             "pages")
        o, lse_t = self._outputs(qa, out, lse, p, fn)
        oa, la = device_array(o, fn, "out"), device_array(lse_t, fn, "lse")
        pools = [(pool, "paged_kv_cache")] if v_pool is None else [(pool, "paged_kv_cache[0]"),
                                                                    (v_pool, "paged_kv_cache[1]")]
        _aligned([(qa, "q")] + pools + [(oa, "out")], fn)
        if qa.device is None:
            for a, name in [(qa, "q")] + pools:
                _check_on_device(a, fn, name)
        arrays = [(qa, "q")] + pools + [(oa, "out"), (la, "lse")] + self._sinks(p, sinks, fn)
        b = p.batch
        b.q, b.kv_pool, b.o, b.lse = qa.ptr, pool.ptr, oa.ptr, la.ptr
        b.v_pool = None if v_pool is None else v_pool.ptr
        b.k_scale, b.v_scale = k_scale, v_scale
        self._launch(qa, b, arrays)
        return (o, lse_t) if return_lse else o

    @staticmethod
    def _sinks(p, sinks, fn):
        """FlashInfer's run(sinks=): one float32 logit per query head, on the arrays' device
        (stages/sinks/). Sets the batch's pointer; returns [(array, name)] for the device
        check, empty when there are none."""
        if sinks is None:
            return []
        sa = check(device_array(sinks, fn, "sinks"), fn, "sinks", dtypes=("float32",), shape=(p.lse_shape[-1],))
        p.batch.sinks = sa.ptr
        return [(sa, "sinks")]

    def _paged_pool(self, paged_kv_cache, p, fn):
        """(pool, num_pages, v_pool): the pool of a 5-D cache, or of a (k_cache, v_cache)
        tuple that is its two halves (v_pool None); with head_dim_vo planned, a (k_cache,
        v_cache) pair of two pools of their own widths (MLA's prefill)."""
        hnd = self._kv_layout == "HND"
        ps, hk, d = p.page_size, p.num_kv_heads, p.head_dim
        page = (hk, ps, d) if hnd else (ps, hk, d)
        if p.head_dim_vo != d:
            return self._own_v_pools(paged_kv_cache, p, fn, page)
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise ValueError(f"{fn}: paged_kv_cache must be one 5-D tensor or a (k_cache, v_cache) pair")
            k = device_array(paged_kv_cache[0], fn, "paged_kv_cache[0]")
            _check_pool_layout(fn, "paged_kv_cache[0]", k.shape, self._kv_layout, ps, hk, d)
            k = check(k, fn, "paged_kv_cache[0]", dtypes=(p.kv_dtype,), shape=(None,) + page, contiguous=False)
            v = check(device_array(paged_kv_cache[1], fn, "paged_kv_cache[1]"), fn, "paged_kv_cache[1]",
                      dtypes=(p.kv_dtype,), shape=k.shape, contiguous=False)
            inner = ps * hk * d
            want = (2 * inner, page[1] * page[2], page[2], 1)
            if k.strides != want or v.strides != want or v.ptr - k.ptr != inner * ITEMSIZE[p.kv_dtype]:
                raise ValueError(f"{fn}: the stages read one pool (num_pages, 2, ...): a (k_cache, v_cache) pair "
                                 "is accepted only as pool[:, 0] and pool[:, 1] of one contiguous tensor")
            return k, k.shape[0], None
        pool = device_array(paged_kv_cache, fn, "paged_kv_cache")
        _check_pool_layout(fn, "paged_kv_cache", pool.shape, self._kv_layout, ps, hk, d)
        pool = check(pool, fn, "paged_kv_cache", dtypes=(p.kv_dtype,), shape=(None, 2) + page)
        return pool, pool.shape[0], None

    def _own_v_pools(self, paged_kv_cache, p, fn, page):
        """head_dim_vo planned: paged_kv_cache is (k_cache, v_cache), each contiguous and its
        own pool, k_cache's pages head_dim wide and v_cache's head_dim_vo, the same number of
        pages (the stages' DeviceBatch::v_pool)."""
        if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
            raise ValueError(f"{fn}: head_dim_vo {p.head_dim_vo} was planned: paged_kv_cache must be a (k_cache, "
                             f"v_cache) pair, k_cache's last dimension {p.head_dim} and v_cache's {p.head_dim_vo}")
        k = check(device_array(paged_kv_cache[0], fn, "paged_kv_cache[0]"), fn, "paged_kv_cache[0]",
                  dtypes=(p.kv_dtype,), shape=(None,) + page)
        v_page = page[:2] + (p.head_dim_vo,)
        v = check(device_array(paged_kv_cache[1], fn, "paged_kv_cache[1]"), fn, "paged_kv_cache[1]",
                  dtypes=(p.kv_dtype,), shape=(k.shape[0],) + v_page)
        return k, k.shape[0], v

    def run_return_lse(self, *args, **kwargs):
        """run(..., return_lse=True): FlashInfer's name for it."""
        return self.run(*args, return_lse=True, **kwargs)

    forward_return_lse = run_return_lse
