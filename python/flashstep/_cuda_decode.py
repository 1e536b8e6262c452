"""Batch decode over a paged KV cache: FlashInfer's decode wrappers."""
from ._cuda_common import (_check_forward_options, _DECODE, _index, _no_rope, _PAGED, _plan_dtypes)
from ._cuda_plan import PlanRun


class BatchDecodeWithPagedKVCacheWrapper(PlanRun):
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
        return self._run_paged("BatchDecodeWithPagedKVCacheWrapper.run", q, paged_kv_cache, args, out, lse,
                          return_lse, kwargs)

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, *,
                return_lse=False):
        """FlashInfer's older run(): the plan's options, RoPE refused."""
        fn = "BatchDecodeWithPagedKVCacheWrapper.forward"
        _check_forward_options(fn, self._require_plan(), pos_encoding_mode, rope_scale, rope_theta, window_left,
                               logits_soft_cap, sm_scale)
        return self._run_paged(fn, q, paged_kv_cache, (), None, None, return_lse,
                          {"q_scale": q_scale, "k_scale": k_scale, "v_scale": v_scale})

    def forward_return_lse(self, q, paged_kv_cache, *args, **kwargs):
        return self.forward(q, paged_kv_cache, *args, return_lse=True, **kwargs)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's name for the decode wrapper in CUDA-graph mode: the three fixed
    index buffers come right after the workspace."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout="NHD",
                 use_tensor_cores=False, *, stage=None):
        PlanRun.__init__(self, workspace_buffer, kv_layout, True, stage, {
            "kv_indptr": ("indptr_buffer", indptr_buffer), "kv_indices": ("indices_buffer", indices_buffer),
            "kv_last_page_len": ("last_page_len_buffer", last_page_len_buffer)})
