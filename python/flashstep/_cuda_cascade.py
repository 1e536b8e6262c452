"""Cascade attention in levels (stage 05): FlashInfer's MultiLevelCascadeAttentionWrapper."""
import ctypes

from . import _capi
from ._cuda_plan import Plan, PlanRun
from ._cuda_common import (_DeviceGuard, _host_view, _index, _no_rope, _PAGED, _plan_dtypes, _planned_options, _PREFILL,
                           _renamed)
from ._tensors import current_stream


class MultiLevelCascadeAttentionWrapper(PlanRun):
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
        p = Plan()
        p.dtype, p.batch_size, p.nnz_qo, p.nnz_kv = dtype, batch, nnz_qo, kv[last][batch]
        p.kv_dtype = kv_dtype
        p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size = (shape.num_qo_heads, shape.num_kv_heads,
                                                                   shape.head_dim, shape.page_size)
        p.max_page = max_page
        p.q_shape, p.lse_shape = (nnz_qo, shape.num_qo_heads, shape.head_dim), (nnz_qo, shape.num_qo_heads)
        p.head_dim_vo, p.o_shape = shape.head_dim, p.q_shape
        _planned_options(p, shape)
        p.set_batch(_capi.Batch())  # the stage keeps its index arrays in its workspace
        self._planned = p

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr_arr[-1][-1], num_qo_heads, head_dim) -> o of the same shape (and lse,
        natural log, when return_lse)."""
        return self._run_paged("MultiLevelCascadeAttentionWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    forward = run
