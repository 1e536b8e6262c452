"""Batch prefill over a paged or a ragged KV cache: FlashInfer's prefill wrappers."""
from ._cuda_plan import PlanRun
from ._cuda_common import (_aligned, _check_forward_options, _check_on_device, _head_dim_vo, _index, _no_rope, _PAGED,
                           _plan_dtypes, _PREFILL, _RAGGED, _unsupported_run_args)
from ._tensors import _TORCH_TYPES, check, device_array


class BatchPrefillWithPagedKVCacheWrapper(PlanRun):
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
        # head_dim_vo other than head_dim_qk (MLA's prefill): run() then takes a (k_cache,
        # v_cache) pair of the two widths, each its own pool
        head_dim_vo = _head_dim_vo(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask)
        dtype, kv_dtype = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type, fp8_kv=True)
        self._plan(dtype, _index(qo_indptr, fn, "qo_indptr"), _index(paged_kv_indptr, fn, "paged_kv_indptr"),
                   _index(paged_kv_indices, fn, "paged_kv_indices"),
                   _index(paged_kv_last_page_len, fn, "paged_kv_last_page_len"), stage, kv_dtype=kv_dtype,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk, page_size=page_size,
                   causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                   head_dim_vo=head_dim_vo)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr[-1], num_qo_heads, head_dim) -> o of the same shape (and lse,
        natural log, when return_lse)."""
        return self._run_paged("BatchPrefillWithPagedKVCacheWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                rope_theta=None, *, return_lse=False):
        """FlashInfer's older run(): the plan's options, RoPE refused."""
        fn = "BatchPrefillWithPagedKVCacheWrapper.forward"
        p = self._require_plan()
        _check_forward_options(fn, p, pos_encoding_mode, rope_scale, rope_theta, window_left, logits_soft_cap,
                               sm_scale, causal)
        return self._run_paged(fn, q, paged_kv_cache, (), None, None, return_lse,
                          {"k_scale": k_scale, "v_scale": v_scale})

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, return_lse=True, **kwargs)


class BatchPrefillWithRaggedKVCacheWrapper(PlanRun):
    """Batch prefill attention over ragged (contiguous) K/V: FlashInfer's wrapper of the
    same name. Default stage: the latest in teaching order that supports the shape
    (04_tensor_core_ragged for fp16/bf16, 01_naive for fp32); ``stage=`` picks one.
    kv_layout must be "NHD" (k and v (nnz_kv, num_kv_heads, head_dim)); FlashInfer's
    "HND" ragged K/V is refused. head_dim_vo (v's and o's width) may differ from
    head_dim_qk where a stage is built for the pair: MLA's prefill, 192 and 128, on stage
    07 (Hopper). use_cuda_graph=True: as the paged prefill wrapper, with the fixed
    qo_indptr_buf and kv_indptr_buf."""

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
        head_dim_vo = _head_dim_vo(fn, head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask)
        dtype, _ = _plan_dtypes(fn, q_data_type, kv_data_type, o_data_type)
        self._plan(dtype, _index(qo_indptr, fn, "qo_indptr"), _index(kv_indptr, fn, "kv_indptr"), None, None, stage,
                   num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim_qk, page_size=1,
                   causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                   head_dim_vo=head_dim_vo)

    begin_forward = plan

    def run(self, q, k, v, *args, out=None, lse=None, return_lse=False, **kwargs):
        """q (qo_indptr[-1], Hq, D), k (kv_indptr[-1], Hkv, D) and v (kv_indptr[-1], Hkv, D_vo)
        -> o (qo_indptr[-1], Hq, D_vo) (and lse, natural log); D_vo = D unless planned otherwise."""
        return self._run("BatchPrefillWithRaggedKVCacheWrapper.run", q, k, v, args, out, lse, return_lse, kwargs)

    def _run(self, fn, q, k, v, args, out, lse, return_lse, kwargs):
        sinks = kwargs.pop("sinks", None) if kwargs else None
        if args or kwargs:
            _unsupported_run_args(fn, args, kwargs)
        p = self._require_plan()
        p.batch.sinks = None
        # The fast path for PyTorch tensors (PlanRun._run_paged says how it falls through).
        if sinks is None and type(q) in _TORCH_TYPES and type(k) in _TORCH_TYPES and type(v) in _TORCH_TYPES:
            t = p.torch or self._torch_plan(p)
            device = q.get_device()
            qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
            if (q.dtype is t.dtype and k.dtype is t.dtype and v.dtype is t.dtype and q.shape == p.q_shape and
                    k.shape == t.kv_shape and v.shape == t.v_shape and q.is_contiguous() and k.is_contiguous() and
                    v.is_contiguous() and not (qp | kp | vp) % 16 and device >= 0 and
                    device == k.get_device() == v.get_device() == self._ws.device and
                    (out is None and lse is None or self._torch_outputs_fit(p, t, out, lse, device))):
                b = p.batch
                b.q, b.k, b.v = qp, kp, vp
                return self._torch_launch(p, t, q, device, return_lse, out, lse)
        qa = check(device_array(q, fn, "q"), fn, "q", dtypes=(p.dtype,), shape=p.q_shape)
        kv_shape = (p.nnz_kv, p.num_kv_heads, p.head_dim)
        ka = check(device_array(k, fn, "k"), fn, "k", dtypes=(p.dtype,), shape=kv_shape)
        va = check(device_array(v, fn, "v"), fn, "v", dtypes=(p.dtype,), shape=kv_shape[:2] + (p.head_dim_vo,))
        o, lse_t = self._outputs(qa, out, lse, p, fn)
        oa, la = device_array(o, fn, "out"), device_array(lse_t, fn, "lse")
        _aligned([(qa, "q"), (ka, "k"), (va, "v"), (oa, "out")], fn)
        if qa.device is None:
            for a, name in ((qa, "q"), (ka, "k"), (va, "v")):
                _check_on_device(a, fn, name)
        arrays = [(qa, "q"), (ka, "k"), (va, "v"), (oa, "out"), (la, "lse")] + self._sinks(p, sinks, fn)
        b = p.batch
        b.q, b.k, b.v, b.o, b.lse = qa.ptr, ka.ptr, va.ptr, oa.ptr, la.ptr
        self._launch(qa, b, arrays)
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
