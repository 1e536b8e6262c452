"""flashstep.cuda on a GPU, against an independent float64 attention in PyTorch
(tests/python/cuda_support.py) under the validation harness's tolerances: every
attention stage through FlashInfer's wrapper classes, merge_state(s),
append_paged_kv_cache, stage 06's samplers, bad inputs, CUDA graphs, streams, DLPack and
CuPy. Skipped with a message where PyTorch, a GPU or the C library is missing.
"""
import itertools
import math

import pytest

import cuda_support as cs

WORKSPACE_BYTES = 64 << 20


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


def check_attention(torch, fsc, o, lse, refs, dtype, what):
    o_ref = torch.cat([r[0] for r in refs])
    lse_ref = torch.cat([r[1] for r in refs])
    cs.assert_close(torch, o, o_ref, fsc.tolerance(dtype, "o"), what + " o")
    cs.assert_close(torch, lse, lse_ref, fsc.tolerance(dtype, "lse"), what + " lse")


# ---- batch decode -------------------------------------------------------------------------

DECODE_STAGES = [("02_paged", ("float32", "float16", "bfloat16")),
                 ("03_split_kv", ("float32", "float16", "bfloat16")),
                 ("04_tensor_core", ("float16", "bfloat16"))]
DECODE_CASES = [(stage, dtype, layout, page, group)
                for stage, dtypes in DECODE_STAGES for dtype in dtypes
                for layout in ("NHD", "HND") for page in (1, 16) for group in (1, 4, 8)]


@pytest.mark.parametrize("stage,dtype,layout,page_size,group", DECODE_CASES)
def test_decode_matches_the_float64_oracle(torch, fsc, rng, stage, dtype, layout, page_size, group):
    g = cs.generator(torch, rng, f"decode {stage} {dtype} {layout} page {page_size} group {group}")
    hkv, d = 2, 128
    hq = hkv * group
    kv_lens = [1, 15, 16, 17, 300, int(rng.integers(1, 700))]
    pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page_size, hkv, d, dtype, layout)
    q = cs.random_rows(torch, g, len(kv_lens), hq, d, dtype)
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, stage=stage)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=getattr(torch, dtype))
    assert w.stage == stage
    o, lse = w.run(q, pool, return_lse=True)
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(len(kv_lens))]
    check_attention(torch, fsc, o, lse, refs, dtype, f"decode {stage}")


@pytest.mark.parametrize("head_dim", [64, 256])
def test_decode_default_stage_other_head_dims_and_options(torch, fsc, rng, head_dim):
    g = cs.generator(torch, rng, f"decode head_dim {head_dim}")
    kv_lens = [3, 64, 129]
    pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, 16, 1, head_dim, "bfloat16", "NHD")
    q = cs.random_rows(torch, g, 3, 4, head_dim, "bfloat16")
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    w.plan(indptr.cpu(), indices.cpu(), last.cpu(), 4, 1, head_dim, 16, q_data_type="bfloat16", sm_scale=0.3)
    assert w.stage == "03_split_kv"  # the default for a decode of GQA group <= 8 (docs/python_gpu.md)
    o, lse = w.run(q, pool, return_lse=True)
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i], sm_scale=0.3) for i in range(3)]
    check_attention(torch, fsc, o, lse, refs, "bfloat16", "decode sm_scale")
    # plan() again on the same wrapper with another composition: the new plan is used
    pool2, indptr2, indices2, last2, keys2, values2 = cs.paged_batch(torch, g, [40], 16, 1, head_dim, "bfloat16",
                                                                     "NHD")
    w.plan(indptr2, indices2, last2, 4, 1, head_dim, 16, q_data_type="bfloat16")
    q2 = cs.random_rows(torch, g, 1, 4, head_dim, "bfloat16")
    o2 = w.run(q2, pool2)
    o2_ref, _ = cs.attention_reference(torch, q2, keys2[0], values2[0])
    cs.assert_close(torch, o2, o2_ref, fsc.tolerance("bfloat16"), "decode after a second plan")


# ---- FP8 cache (FlashInfer's kv_data_type, k_scale and v_scale) ---------------------------

FP8_CASES = [(stage, kv, layout, page, group) for stage in ("02_paged", "03_split_kv", None)
             for kv in ("float8_e4m3fn", "float8_e5m2") for layout in ("NHD", "HND") for page in (1, 16)
             for group in (1, 4)]


@pytest.mark.parametrize("stage,kv_dtype,layout,page_size,group", FP8_CASES)
def test_fp8_decode_matches_the_float64_oracle(torch, fsc, rng, stage, kv_dtype, layout, page_size, group):
    """An FP8 pool through the wrapper, against float64 attention over the dequantized
    pool (k_scale * stored k, v_scale * stored v), under the harness's FP8 rows. Then
    run() with other scales (no new plan: they are launch arguments) and without (1),
    on the same plan."""
    g = cs.generator(torch, rng, f"fp8 decode {stage} {kv_dtype} {layout} page {page_size} group {group}")
    hkv, d = 2, 128
    hq = hkv * group
    q_dtype = "bfloat16" if kv_dtype == "float8_e4m3fn" else "float16"
    k_scale, v_scale = 0.5, 2.0
    kv_lens = [1, 15, 16, 17, 300, int(rng.integers(1, 700))]
    pool, indptr, indices, last, keys, values = cs.paged_fp8_batch(torch, g, kv_lens, page_size, hkv, d, kv_dtype,
                                                                   layout, k_scale, v_scale)
    q = cs.random_rows(torch, g, len(kv_lens), hq, d, q_dtype)
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, stage=stage)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=getattr(torch, q_dtype),
           kv_data_type=getattr(torch, kv_dtype))
    assert w.stage == (stage or "03_split_kv")  # the default decode stage reads FP8 too
    tol_o = fsc.tolerance(q_dtype, "o", kv_dtype=getattr(torch, kv_dtype))
    tol_lse = fsc.tolerance(q_dtype, "lse", kv_dtype=getattr(torch, kv_dtype))
    n = len(kv_lens)
    for ks, vs in ((k_scale, v_scale), (2 * k_scale, 0.25 * v_scale), (None, None)):
        o, lse = w.run(q, pool, k_scale=ks, v_scale=vs, return_lse=True)
        # this run reads stored * scale (1 when None); keys and values are stored * k_scale, v_scale
        fk, fv = (1.0 if ks is None else ks) / k_scale, (1.0 if vs is None else vs) / v_scale
        refs = [cs.attention_reference(torch, q[i:i + 1], keys[i] * fk, values[i] * fv) for i in range(n)]
        what = f"fp8 decode {w.stage} k_scale={ks} v_scale={vs}"
        cs.assert_close(torch, o, torch.cat([r[0] for r in refs]), tol_o, what + " o")
        cs.assert_close(torch, lse, torch.cat([r[1] for r in refs]), tol_lse, what + " lse")


def test_fp8_pool_through_dlpack_and_its_refusals(torch, fsc, rng):
    g = cs.generator(torch, rng, "fp8 dlpack")
    pool, indptr, indices, last, keys, values = cs.paged_fp8_batch(torch, g, [9, 40], 16, 2, 128, "float8_e4m3fn",
                                                                   "NHD", 1.0, 1.0)
    q = cs.random_rows(torch, g, 2, 8, 128, "bfloat16")
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD")
    w.plan(indptr, indices, last, 8, 2, 128, 16, q_data_type="bfloat16", kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"run: paged_kv_cache must have dtype float8_e4m3fn; it has bfloat16"):
        w.run(q, pool.bfloat16())
    with pytest.raises(ValueError, match=r"run: k_scale must be a positive finite float or None; got -1"):
        w.run(q, pool, k_scale=-1.0)
    try:
        pool.__dlpack__()
    except Exception as e:  # noqa: BLE001  (this PyTorch exports no FP8 through DLPack)
        pytest.skip(f"torch {torch.__version__} does not export float8 through DLPack: {type(e).__name__}: {e}")
    out = torch.empty(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 8, dtype=torch.float32, device="cuda")
    w.run(DLPackOnly(q), DLPackOnly(pool), out=out, lse=lse)
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(2)]
    cs.assert_close(torch, out, torch.cat([r[0] for r in refs]),
                    fsc.tolerance("bfloat16", "o", kv_dtype="float8_e4m3fn"), "fp8 decode through DLPack o")
    # a stage that reads K/V in q's dtype only refuses scales at run(): stage 07 (paged
    # decode, no FP8), where this GPU runs it (sm_90a); 05_cascade reads no FP8 either, but
    # plans from page ids, which a decode wrapper does not give it
    b = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD", stage="07_hopper")
    pool16, indptr16, indices16, last16, _, _ = cs.paged_batch(torch, g, [9, 40], 16, 2, 128, "bfloat16", "NHD")
    try:
        b.plan(indptr16, indices16, last16, 8, 2, 128, 16, q_data_type="bfloat16")
    except ValueError as e:
        if "sm_90a" not in str(e):
            raise
        pytest.skip(f"the scale refusal needs a stage without FP8 that runs here: {e}")
    with pytest.raises(ValueError, match=r"stage 07_hopper reads no FP8 cache and applies no k_scale"):
        b.run(q, pool16, k_scale=0.5)


def test_fp8_scales_under_a_cuda_graph(torch, fsc, rng):
    """The scales are arguments of each run's launch: a capture with scales the plan never
    saw records them (no re-plan), and the graph replays them."""
    g = cs.generator(torch, rng, "fp8 graph")
    kv_lens = [20, 70, 33, 1]
    pool, indptr, indices, last, keys, values = cs.paged_fp8_batch(torch, g, kv_lens, 16, 2, 128, "float8_e5m2",
                                                                   "HND", 0.25, 4.0)
    bufs = [torch.empty(64, dtype=torch.int32, device="cuda") for _ in range(3)]
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "HND", use_cuda_graph=True,
                                               paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
                                               paged_kv_last_page_len_buffer=bufs[2])
    w.plan(indptr, indices, last, 8, 2, 128, 16, q_data_type="float16", kv_data_type="float8_e5m2")
    q = cs.random_rows(torch, g, 4, 8, 128, "float16")
    out = torch.empty(4, 8, 128, dtype=torch.float16, device="cuda")
    lse = torch.empty(4, 8, dtype=torch.float32, device="cuda")
    w.run(q, pool, out=out, lse=lse)  # warm-up outside the capture, with other scales (1, 1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, pool, out=out, lse=lse, k_scale=0.25, v_scale=4.0)
    q.copy_(cs.random_rows(torch, g, 4, 8, 128, "float16"))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(4)]
    cs.assert_close(torch, out, torch.cat([r[0] for r in refs]),
                    fsc.tolerance("float16", "o", kv_dtype="float8_e5m2"), "fp8 graph replay o")
    cs.assert_close(torch, lse, torch.cat([r[1] for r in refs]),
                    fsc.tolerance("float16", "lse", kv_dtype="float8_e5m2"), "fp8 graph replay lse")


# ---- batch prefill -------------------------------------------------------------------------

PREFILL_LENGTHS = [(1, 1), (7, 30), (16, 16), (33, 100), (64, 200), (130, 131)]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout,page_size", [("NHD", 16), ("HND", 16), ("NHD", 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 4])
def test_paged_prefill_matches_the_float64_oracle(torch, fsc, rng, dtype, layout, page_size, causal, group):
    g = cs.generator(torch, rng, f"paged prefill {dtype} {layout} {page_size} {causal} {group}")
    hkv, d = 2, 128
    hq = hkv * group
    qo_lens = [qo for qo, _ in PREFILL_LENGTHS]
    kv_lens = [kv for _, kv in PREFILL_LENGTHS]
    pool, kv_indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page_size, hkv, d, dtype, layout)
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32,
                             device="cuda")
    q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
    w = fsc.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), layout)
    w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
    o, lse = w.run(q, pool, return_lse=True)
    refs = [cs.attention_reference(torch, q[int(qo_indptr[i]):int(qo_indptr[i + 1])], keys[i], values[i],
                                   causal=causal) for i in range(len(qo_lens))]
    check_attention(torch, fsc, o, lse, refs, dtype, f"paged prefill {w.stage}")



def hopper_runs_ragged():
    """Whether the registry says stage 07 runs a plain bf16 ragged prefill on this GPU."""
    import ctypes
    from flashstep import _capi
    reason = ctypes.c_char_p()
    shape = _capi.Shape()
    shape.mode, shape.storage, shape.dtype, shape.batch_size = 1, 0, 2, 1
    shape.num_qo_heads, shape.num_kv_heads, shape.head_dim, shape.window_left = 8, 2, 128, -1
    indptr = (ctypes.c_int32 * 2)(0, 4)
    shape.qo_indptr = shape.kv_indptr = ctypes.addressof(indptr)
    _capi.call("fs_stage_unsupported_reason", b"07_hopper_ragged", ctypes.byref(shape), ctypes.byref(reason))
    return not reason.value


def ragged_batch(torch, g, hq, hkv, d, dtype, d_vo=None):
    """PREFILL_LENGTHS as a ragged batch: qo_indptr, kv_indptr (device int32), q (Hq, d),
    k (Hkv, d) and v (Hkv, d_vo, default d) rows drawn from g."""
    qo_lens = [qo for qo, _ in PREFILL_LENGTHS]
    kv_lens = [kv for _, kv in PREFILL_LENGTHS]
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(kv_lens)), dtype=torch.int32, device="cuda")
    q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
    k = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
    v = cs.random_rows(torch, g, sum(kv_lens), hkv, d_vo or d, dtype)
    return qo_indptr, kv_indptr, q, k, v


def ragged_references(torch, qo_indptr, kv_indptr, q, k, v, causal):
    """The float64 oracle of every request of a ragged batch."""
    refs = []
    for i in range(len(qo_indptr) - 1):
        qs, ks = slice(int(qo_indptr[i]), int(qo_indptr[i + 1])), slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        refs.append(cs.attention_reference(torch, q[qs], k[ks], v[ks], causal=causal))
    return refs


@pytest.mark.parametrize("stage,dtype", [("04_tensor_core_ragged", "float16"), ("04_tensor_core_ragged", "bfloat16"),
                                         ("01_naive", "float32"), (None, "float32"), (None, "bfloat16")])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_prefill_matches_the_float64_oracle(torch, fsc, rng, stage, dtype, causal):
    g = cs.generator(torch, rng, f"ragged prefill {stage} {dtype} {causal}")
    hq, hkv, d = 8, 2, 128
    qo_indptr, kv_indptr, q, k, v = ragged_batch(torch, g, hq, hkv, d, dtype)
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), stage=stage)
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type=dtype)
    if stage is None:
        # the latest stage that runs the shape here: stage 07 on an sm_90a GPU, else stage 04
        assert w.stage == ("01_naive" if dtype == "float32" else
                           "07_hopper_ragged" if hopper_runs_ragged() else "04_tensor_core_ragged")
    o, lse = w.run(q, k, v, return_lse=True)
    refs = ragged_references(torch, qo_indptr, kv_indptr, q, k, v, causal)
    check_attention(torch, fsc, o, lse, refs, dtype, f"ragged prefill {w.stage}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True])
def test_mla_prefill_head_dim_vo_matches_the_float64_oracle(torch, fsc, rng, dtype, causal):
    """MLA's prefill shape (DeepSeek's naive form): q and k 192 wide, v and o 128, through the
    ragged wrapper's head_dim_vo; stage 07 runs it on an sm_90a GPU, elsewhere plan() says
    that no stage does."""
    g = cs.generator(torch, rng, f"mla prefill {dtype} {causal}")
    h, d_qk, d_vo = 16, 192, 128
    qo_indptr, kv_indptr, q, k, v = ragged_batch(torch, g, h, h, d_qk, dtype, d_vo)
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    if not hopper_runs_ragged():
        with pytest.raises(ValueError, match=r"head_dim 192 with head_dim_vo 128"):
            w.plan(qo_indptr, kv_indptr, h, h, d_qk, d_vo, causal=causal, q_data_type=dtype)
        return
    w.plan(qo_indptr, kv_indptr, h, h, d_qk, d_vo, causal=causal, q_data_type=dtype)
    assert w.stage == "07_hopper_ragged"
    o, lse = w.run(q, k, v, return_lse=True)
    assert tuple(o.shape) == (q.shape[0], h, d_vo)
    refs = ragged_references(torch, qo_indptr, kv_indptr, q, k, v, causal)
    check_attention(torch, fsc, o, lse, refs, dtype, "MLA prefill")
    with pytest.raises(ValueError, match=r"v must have shape"):
        w.run(q, k, k)  # v as wide as k: not what was planned


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_mla_paged_prefill_head_dim_vo_matches_the_float64_oracle(torch, fsc, rng, layout, page_size):
    """MLA's prefill over pages: the paged wrapper's head_dim_vo, run() given (k_cache,
    v_cache) as two pools of their own widths on one page table (FlashInfer's tuple form);
    stage 07 runs it on an sm_90a GPU, elsewhere plan() says that no stage does."""
    g = cs.generator(torch, rng, f"mla paged prefill {layout} {page_size}")
    h, d_qk, d_vo, dtype = 16, 192, 128, "bfloat16"
    qo_lens = [qo for qo, _ in PREFILL_LENGTHS]
    kv_lens = [kv for _, kv in PREFILL_LENGTHS]
    pools, kv_indptr, kv_indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page_size, h, d_qk, dtype,
                                                                      layout, head_dim_vo=d_vo)
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32, device="cuda")
    q = cs.random_rows(torch, g, sum(qo_lens), h, d_qk, dtype)
    w = fsc.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), layout)
    args = (qo_indptr, kv_indptr, kv_indices, last, h, h, d_qk, page_size)
    if not hopper_runs_ragged():
        with pytest.raises(ValueError, match=r"head_dim 192 with head_dim_vo 128"):
            w.plan(*args, head_dim_vo=d_vo, causal=True, q_data_type=dtype)
        return
    w.plan(*args, head_dim_vo=d_vo, causal=True, q_data_type=dtype)
    assert w.stage == "07_hopper"
    o, lse = w.run(q, pools, return_lse=True)
    assert tuple(o.shape) == (q.shape[0], h, d_vo)
    refs = [cs.attention_reference(torch, q[int(qo_indptr[i]):int(qo_indptr[i + 1])], keys[i], values[i],
                                   causal=True) for i in range(len(kv_lens))]
    check_attention(torch, fsc, o, lse, refs, dtype, "MLA paged prefill")
    with pytest.raises(ValueError, match=r"paged_kv_cache must be a \(k_cache, v_cache\) pair"):
        w.run(q, pools[0])
    with pytest.raises(ValueError, match=r"paged_kv_cache\[1\] must have shape"):
        w.run(q, (pools[0], pools[0]))  # V as wide as K: not what was planned


@pytest.mark.parametrize("kind", ["decode", "prefill", "ragged", "cascade"])
def test_run_without_lse_writes_the_same_output(torch, fsc, rng, kind):
    """run() without return_lse writes the lse it does not return into a scratch area of
    the workspace (where it fits): its output must equal the run that returns the lse,
    before and after a re-plan to other lengths, and leave the plan's index arrays intact
    (the same output twice); the output is the oracle's."""
    g = cs.generator(torch, rng, f"run without lse {kind}")
    hq, hkv, d, page, dtype = 8, 2, 128, 16, "bfloat16"
    w = {"decode": fsc.BatchDecodeWithPagedKVCacheWrapper, "prefill": fsc.BatchPrefillWithPagedKVCacheWrapper,
         "ragged": fsc.BatchPrefillWithRaggedKVCacheWrapper}.get(kind)
    w = w(workspace(torch)) if w else fsc.MultiLevelCascadeAttentionWrapper(2, workspace(torch))
    for kv_lens in ([1, 17, 300, int(rng.integers(1, 700))], [700, 5, 64]):
        qo_lens = [1] * len(kv_lens) if kind in ("decode", "cascade") else [max(1, n // 3) for n in kv_lens]
        qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32, device="cuda")
        q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
        if kind == "ragged":
            k = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
            v = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
            kv_indptr = torch.tensor([0] + list(itertools.accumulate(kv_lens)), dtype=torch.int32, device="cuda")
            w.plan(qo_indptr, kv_indptr, hq, hkv, d, q_data_type=dtype)
            args = (q, k, v)
            keys = [k[int(kv_indptr[i]):int(kv_indptr[i + 1])] for i in range(len(kv_lens))]
            values = [v[int(kv_indptr[i]):int(kv_indptr[i + 1])] for i in range(len(kv_lens))]
        elif kind == "cascade":
            pool, levels, keys, values = cs.cascade_batch(torch, g, qo_lens, kv_lens, 32, 0, page, hkv, d, dtype,
                                                          "NHD")
            w.plan(*levels, hq, hkv, d, page, q_data_type=dtype)
            args = (q, pool)
        else:
            pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page, hkv, d, dtype, "NHD")
            if kind == "decode":
                w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
            else:
                w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
            args = (q, pool)
        first = w.run(*args)
        o, lse = w.run(*args, return_lse=True)
        again = w.run(*args)
        torch.cuda.synchronize()
        assert torch.equal(first, o) and torch.equal(again, o), f"{kind} ({w.stage}): run() without return_lse " \
            "differs from the run that returns the lse"
        rows = [slice(int(qo_indptr[i]), int(qo_indptr[i + 1])) for i in range(len(kv_lens))]
        refs = [cs.attention_reference(torch, q[r], keys[i], values[i]) for i, r in enumerate(rows)]
        check_attention(torch, fsc, o, lse, refs, dtype, f"{kind} {w.stage} without return_lse")


@pytest.mark.parametrize("window_left,soft_cap", [(31, 0.0), (-1, 20.0), (7, 5.0)])
def test_window_and_soft_cap(torch, fsc, rng, window_left, soft_cap):
    g = cs.generator(torch, rng, f"window {window_left} cap {soft_cap}")
    hq, hkv, d = 4, 4, 64
    lens = [(5, 80), (40, 40)]
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(a for a, _ in lens)), dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(b for _, b in lens)), dtype=torch.int32, device="cuda")
    q = cs.random_rows(torch, g, int(qo_indptr[-1]), hq, d, "float16", scale=3.0)
    k = cs.random_rows(torch, g, int(kv_indptr[-1]), hkv, d, "float16", scale=3.0)
    v = cs.random_rows(torch, g, int(kv_indptr[-1]), hkv, d, "float16")
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=True, window_left=window_left, logits_soft_cap=soft_cap,
           q_data_type=torch.float16)
    o, lse = w.run(q, k, v, return_lse=True)
    refs = []
    for i in range(len(lens)):
        qs, ks = slice(int(qo_indptr[i]), int(qo_indptr[i + 1])), slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        refs.append(cs.attention_reference(torch, q[qs], k[ks], v[ks], causal=True, window_left=window_left,
                                           logits_soft_cap=soft_cap))
    check_attention(torch, fsc, o, lse, refs, "float16", f"window/soft cap {w.stage}")


# ---- cascade (stage 05) ----------------------------------------------------------------------

CASCADE_CASES = [("bfloat16", "NHD", 16, False, 0), ("float16", "HND", 16, True, 0),
                 ("bfloat16", "NHD", 1, False, 40), ("float16", "NHD", 16, True, 32)]


@pytest.mark.parametrize("dtype,layout,page_size,causal,doc", CASCADE_CASES)
def test_cascade_matches_the_float64_oracle(torch, fsc, rng, dtype, layout, page_size, causal, doc):
    g = cs.generator(torch, rng, f"cascade {dtype} {layout} {page_size} {causal} {doc}")
    hq, hkv, d = 8, 2, 128
    own = [5, 40, 17, 1, 0, 33] if not causal else [5, 40, 17, 1, 9, 33]
    qo_lens = [1] * len(own) if not causal else [3, 8, 2, 1, 9, 16]  # appended queries end each request
    pool, levels, keys, values = cs.cascade_batch(torch, g, qo_lens, own, 48, doc, page_size, hkv, d, dtype, layout)
    q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
    w = fsc.MultiLevelCascadeAttentionWrapper(len(levels[0]), workspace(torch), layout)
    w.plan(*levels, hq, hkv, d, page_size, causal=causal, q_data_type=dtype)
    assert w.stage == "05_cascade"
    o, lse = w.run(q, pool, return_lse=True)
    qo = [0] + list(itertools.accumulate(qo_lens))
    refs = [cs.attention_reference(torch, q[qo[r]:qo[r + 1]], keys[r], values[r], causal=causal)
            for r in range(len(own))]
    check_attention(torch, fsc, o, lse, refs, dtype, f"cascade {len(levels[0])} levels")
    # without return_lse, the output alone (FlashInfer's run returns o)
    assert torch.equal(w.run(q, pool), o)


# ---- CUDA graphs, streams, DLPack, CuPy -----------------------------------------------------

def test_cuda_graph_plan_outside_run_inside(torch, fsc, rng):
    g = cs.generator(torch, rng, "cuda graph")
    kv_lens = [20, 70, 33, 1]
    pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, 16, 2, 128, "bfloat16", "NHD")
    bufs = [torch.empty(64, dtype=torch.int32, device="cuda") for _ in range(3)]
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD", use_cuda_graph=True,
                                               paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
                                               paged_kv_last_page_len_buffer=bufs[2], stage="03_split_kv")
    w.plan(indptr, indices, last, 8, 2, 128, 16, q_data_type="bfloat16")
    q = cs.random_rows(torch, g, 4, 8, 128, "bfloat16")
    eager = w.run(q, pool)
    out = torch.empty_like(eager)
    lse = torch.empty(4, 8, dtype=torch.float32, device="cuda")
    w.run(q, pool, out=out, lse=lse)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, pool, out=out, lse=lse)
    q.copy_(cs.random_rows(torch, g, 4, 8, 128, "bfloat16"))  # new queries, same addresses
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(4)]
    check_attention(torch, fsc, out, lse, refs, "bfloat16", "graph replay")


def test_runs_on_the_callers_stream(torch, fsc, rng):
    g = cs.generator(torch, rng, "stream")
    v = cs.random_rows(torch, g, 300, 4, 128, "float16").view(100, 3, 4, 128)
    s = (torch.rand((100, 3, 4), generator=g, device="cuda") * 8 - 4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, lse = fsc.merge_states(v, s)
    torch.cuda.current_stream().wait_stream(side)
    o_ref, lse_ref = merge_oracle(torch, v, s)
    cs.assert_close(torch, o, o_ref, fsc.tolerance("float16"), "merge_states on a side stream")


class DLPackOnly:
    """Exposes a tensor only through DLPack, as a producer other than torch and CuPy would."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_dlpack_inputs_with_caller_outputs(torch, fsc, rng):
    g = cs.generator(torch, rng, "dlpack")
    pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, [9, 40], 16, 2, 64, "float16", "HND")
    q = cs.random_rows(torch, g, 2, 2, 64, "float16")
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(DLPackOnly(workspace(torch)), "HND")
    w.plan(indptr, indices, last, 2, 2, 64, 16, q_data_type="float16")
    with pytest.raises(ValueError, match="pass out="):
        w.run(DLPackOnly(q), DLPackOnly(pool))
    out = torch.empty(2, 2, 64, dtype=torch.float16, device="cuda")
    lse = torch.empty(2, 2, dtype=torch.float32, device="cuda")
    w.run(DLPackOnly(q), DLPackOnly(pool), out=out, lse=lse)
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(2)]
    check_attention(torch, fsc, out, lse, refs, "float16", "DLPack decode")


def test_cupy_arrays(torch, fsc, rng):
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed here")
    g = cs.generator(torch, rng, "cupy")
    v = cs.random_rows(torch, g, 60, 2, 64, "float32").view(20, 3, 2, 64)
    s = torch.rand((20, 3, 2), generator=g, device="cuda") * 6 - 3
    torch.cuda.synchronize()
    o, lse = fsc.merge_states(cupy.asarray(v), cupy.asarray(s))
    assert isinstance(o, cupy.ndarray)
    cupy.cuda.get_current_stream().synchronize()
    o_ref, lse_ref = merge_oracle(torch, v, s)
    cs.assert_close(torch, torch.as_tensor(o, device="cuda"), o_ref, fsc.tolerance("float32"), "CuPy merge_states")


# ---- merge -----------------------------------------------------------------------------------

def merge_oracle(torch, v, s):
    """float64: v (seq, n, H, D), s (seq, n, H) natural log -> (o, lse); all -inf -> (0, -inf)."""
    s64 = s.double()
    lse = torch.logsumexp(s64, dim=1)
    w = torch.exp(s64 - lse.unsqueeze(1)).nan_to_num(0.0)
    return torch.einsum("snh,snhd->shd", w, v.double()), lse


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 100])
def test_merge_state_and_merge_states(torch, fsc, rng, dtype, head_dim):
    g = cs.generator(torch, rng, f"merge {dtype} {head_dim}")
    seq, heads = 37, 4
    va = cs.random_rows(torch, g, seq, heads, head_dim, dtype)
    vb = cs.random_rows(torch, g, seq, heads, head_dim, dtype)
    sa = torch.rand((seq, heads), generator=g, device="cuda") * 20 - 10
    sb = torch.rand((seq, heads), generator=g, device="cuda") * 20 - 10
    sa[0, 0] = float("-inf")  # an empty index set on one side
    sa[1, 1] = sb[1, 1] = float("-inf")  # on both: o = 0, lse = -inf
    o, lse = fsc.merge_state(va, sa, vb, sb)
    o_ref, lse_ref = merge_oracle(torch, torch.stack([va, vb], 1), torch.stack([sa, sb], 1))
    cs.assert_close(torch, o, o_ref, fsc.tolerance(dtype), "merge_state o")
    cs.assert_close(torch, lse, lse_ref, fsc.tolerance(dtype, "lse"), "merge_state lse")
    assert torch.isneginf(lse[1, 1]) and (o[1, 1] == 0).all()
    # in place gives the same
    va2, sa2 = va.clone(), sa.clone()
    fsc.merge_state_in_place(va2, sa2, vb, sb)
    assert torch.equal(va2, o) and torch.equal(sa2, lse)
    # many states
    n = 5
    v = cs.random_rows(torch, g, seq * n, heads, head_dim, dtype).view(seq, n, heads, head_dim)
    s = torch.rand((seq, n, heads), generator=g, device="cuda") * 20 - 10
    o, lse = fsc.merge_states(v, s)
    o_ref, lse_ref = merge_oracle(torch, v, s)
    cs.assert_close(torch, o, o_ref, fsc.tolerance(dtype), "merge_states o")
    cs.assert_close(torch, lse, lse_ref, fsc.tolerance(dtype, "lse"), "merge_states lse")


def test_merge_states_is_the_attention_of_the_union(torch, fsc, rng):
    """Attention over keys split in two, merged, equals attention over all of them."""
    g = cs.generator(torch, rng, "merge union")
    q = cs.random_rows(torch, g, 3, 4, 64, "float32")
    k = cs.random_rows(torch, g, 50, 4, 64, "float32")
    v = cs.random_rows(torch, g, 50, 4, 64, "float32")
    o1, l1 = cs.attention_reference(torch, q, k[:20], v[:20])
    o2, l2 = cs.attention_reference(torch, q, k[20:], v[20:])
    o, lse = fsc.merge_state(o1.float(), l1.float(), o2.float(), l2.float())
    o_all, l_all = cs.attention_reference(torch, q, k, v)
    cs.assert_close(torch, o, o_all, fsc.tolerance("float32"), "merged o")
    cs.assert_close(torch, lse, l_all, fsc.tolerance("float32", "lse"), "merged lse")


# ---- append_paged_kv_cache ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("as_tuple", [False, True])
def test_append_paged_kv_cache(torch, fsc, rng, layout, page_size, as_tuple):
    g = cs.generator(torch, rng, f"append {layout} {page_size} {as_tuple}")
    hkv, d, dtype = 2, 64, torch.bfloat16
    old_lens, append_lens = [0, 5, 16, 31], [3, 1, 20, 16]
    new_lens = [a + b for a, b in zip(old_lens, append_lens)]
    pages = [-(-n // page_size) for n in new_lens]
    total = sum(pages) + 2
    indices = torch.randperm(total, generator=g, device="cuda").to(torch.int32)[:sum(pages)].contiguous()
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device="cuda")
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(new_lens, pages)], dtype=torch.int32, device="cuda")
    shape = (total, 2, page_size, hkv, d) if layout == "NHD" else (total, 2, hkv, page_size, d)
    pool = torch.full(shape, float("nan"), dtype=dtype, device="cuda")
    append_indptr = torch.tensor([0] + list(itertools.accumulate(append_lens)), dtype=torch.int32,
                                 device="cuda")
    nnz = int(append_indptr[-1])
    k = cs.random_rows(torch, g, nnz, hkv, d, "bfloat16")
    v = cs.random_rows(torch, g, nnz, hkv, d, "bfloat16")
    seq_lens = torch.tensor(new_lens, dtype=torch.int32, device="cuda")
    batch_indices, positions = fsc.get_batch_indices_positions(append_indptr, seq_lens, nnz)
    # the expected pool, written row by row from the definition
    expected = pool.clone()
    for r in range(nnz):
        b, p = int(batch_indices[r]), int(positions[r])
        assert old_lens[b] <= p < new_lens[b]
        page = int(indices[int(kv_indptr[b]) + p // page_size])
        if layout == "NHD":
            expected[page, 0, p % page_size], expected[page, 1, p % page_size] = k[r], v[r]
        else:
            expected[page, 0, :, p % page_size], expected[page, 1, :, p % page_size] = k[r], v[r]
    cache = (pool[:, 0], pool[:, 1]) if as_tuple else pool
    fsc.append_paged_kv_cache(k, v, batch_indices, positions, cache, indices, kv_indptr, last, kv_layout=layout)
    torch.cuda.synchronize()
    same = (pool == expected) | (torch.isnan(pool) & torch.isnan(expected))
    assert same.all(), f"{int((~same).sum())} pool elements differ from the expected append"
    # a row whose position lies beyond its request's pages is not written anywhere
    before = pool.clone()
    bad_pos = torch.tensor([pages[0] * page_size + 5], dtype=torch.int32, device="cuda")
    fsc.append_paged_kv_cache(k[:1], v[:1], batch_indices[:1], bad_pos, cache, indices, kv_indptr, last,
                              kv_layout=layout)
    torch.cuda.synchronize()
    assert ((pool == before) | (torch.isnan(pool) & torch.isnan(before))).all()


# ---- sampling -----------------------------------------------------------------------------------

def test_samplers_on_rows_with_one_possible_token(torch, fsc, rng):
    g = cs.generator(torch, rng, "one-hot sampling")
    batch, vocab = 16, 1000
    want = torch.randint(0, vocab, (batch,), generator=g, device="cuda")
    probs = torch.zeros(batch, vocab, device="cuda")
    probs[torch.arange(batch), want] = 1.0
    logits = torch.full((batch, vocab), float("-inf"), device="cuda")
    logits[torch.arange(batch), want] = 0.0
    seed = int(rng.integers(2**62))
    calls = {
        "sampling_from_probs": lambda: fsc.sampling_from_probs(probs, seed=seed),
        "sampling_from_logits": lambda: fsc.sampling_from_logits(logits, seed=seed),
        "top_k": lambda: fsc.top_k_sampling_from_probs(probs, 5, seed=seed),
        "top_p": lambda: fsc.top_p_sampling_from_probs(probs, 0.5, seed=seed),
        "min_p": lambda: fsc.min_p_sampling_from_probs(probs, 0.2, seed=seed),
        "top_k_top_p": lambda: fsc.top_k_top_p_sampling_from_probs(probs, 3, 0.9, seed=seed),
        "top_k_top_p joint": lambda: fsc.top_k_top_p_sampling_from_probs(probs, 3, 0.9, filter_apply_order="joint",
                                                                          seed=seed),
        "top_k_top_p logits": lambda: fsc.top_k_top_p_sampling_from_logits(logits, 3, 0.9, seed=seed),
        "sampling_from_logits bf16": lambda: fsc.sampling_from_logits(logits.bfloat16(), seed=seed),
        "top_k_top_p logits bf16 joint": lambda: fsc.top_k_top_p_sampling_from_logits(
            logits.bfloat16(), 3, 0.9, filter_apply_order="joint", seed=seed),
    }
    for name, call in calls.items():
        got = call()
        assert got.dtype == torch.int32 and torch.equal(got.long(), want), name


def test_top_k_1_is_argmax_and_seeds_reproduce(torch, fsc, rng):
    g = cs.generator(torch, rng, "argmax")
    probs = torch.softmax(torch.randn(64, 5000, generator=g, device="cuda"), dim=-1)
    assert torch.equal(fsc.top_k_sampling_from_probs(probs, 1, seed=3).long(), probs.argmax(-1))
    a = fsc.sampling_from_probs(probs, seed=11, offset=0)
    assert torch.equal(a, fsc.sampling_from_probs(probs, seed=11, offset=0))
    per_row_k = torch.ones(64, dtype=torch.int32, device="cuda")
    assert torch.equal(fsc.top_k_sampling_from_probs(probs, per_row_k, seed=5).long(), probs.argmax(-1))


def test_sampling_frequencies_follow_the_probabilities(torch, fsc, rng):
    probs = torch.tensor([[0.4, 0.25, 0.2, 0.1, 0.05]], device="cuda")
    n = 200_000
    indices = torch.zeros(n, dtype=torch.int32, device="cuda")
    seed = int(rng.integers(2**62))
    print(f"sampling seed {seed}")
    tokens = fsc.sampling_from_probs(probs, indices=indices, seed=seed)
    freq = torch.bincount(tokens.long(), minlength=5).double() / n
    p = probs[0].double()
    sigma = torch.sqrt(p * (1 - p) / n)
    assert ((freq - p).abs() <= 6 * sigma).all(), f"frequencies {freq.tolist()} vs {p.tolist()}"
    # top-p 0.7: the smallest head of the sorted row reaching 0.7 is {0, 1, 2} (mass 0.85)
    kept = fsc.top_p_sampling_from_probs(probs, 0.7, indices=indices, seed=seed + 1)
    assert set(torch.unique(kept).tolist()) <= {0, 1, 2}
    kept = fsc.top_k_sampling_from_probs(probs, 2, indices=indices, seed=seed + 2)
    assert set(torch.unique(kept).tolist()) == {0, 1}
    kept = fsc.min_p_sampling_from_probs(probs, 0.5, indices=indices, seed=seed + 3)  # p >= 0.2
    assert set(torch.unique(kept).tolist()) == {0, 1, 2}


def test_row_transforms_match_their_definitions(torch, fsc, rng):
    g = cs.generator(torch, rng, "transforms")
    logits = torch.randn(8, 3000, generator=g, device="cuda") * 3
    tol = fsc.tolerance("float32")
    ref = torch.softmax(logits.double() / 0.7, dim=-1)
    cs.assert_close(torch, fsc.softmax(logits, temperature=0.7), ref, tol, "softmax")
    probs = torch.softmax(logits, dim=-1)
    top = probs.double().topk(50, dim=-1)
    ref = torch.zeros_like(probs, dtype=torch.float64).scatter(-1, top.indices, top.values)
    ref /= ref.sum(-1, keepdim=True)
    cs.assert_close(torch, fsc.top_k_renorm_probs(probs, 50), ref, tol, "top_k_renorm_probs")
    masked = fsc.top_k_mask_logits(logits, 50)
    assert torch.equal(torch.isfinite(masked), ref > 0)
    sorted_p, order = probs.double().sort(dim=-1, descending=True)
    head = (sorted_p.cumsum(-1) - sorted_p) < 0.8  # entries before the mass reaches 0.8
    ref = torch.zeros_like(sorted_p).scatter(-1, order, sorted_p * head)
    ref /= ref.sum(-1, keepdim=True)
    cs.assert_close(torch, fsc.top_p_renorm_probs(probs, 0.8), ref, tol, "top_p_renorm_probs")
    # bf16 logits: the softmax of the bf16-rounded values, computed in float32
    lb = logits.bfloat16()
    cs.assert_close(torch, fsc.softmax(lb), torch.softmax(lb.double(), dim=-1), tol, "softmax bf16")
    masked_b = fsc.top_k_mask_logits(lb, 50)
    assert masked_b.dtype == torch.float32
    # bf16 rounding makes ties: every logit at or above the 50th largest is kept
    kth = lb.float().topk(50, dim=-1).values[:, -1:]
    assert torch.equal(torch.isfinite(masked_b), lb.float() >= kth)
    assert torch.equal(masked_b[torch.isfinite(masked_b)], lb.float()[lb.float() >= kth])
    # the same bf16 logits sampled many times follow their softmax
    n = 100_000
    row = lb[:1, :8].contiguous()
    tokens = fsc.sampling_from_logits(row, indices=torch.zeros(n, dtype=torch.int32, device="cuda"),
                                      seed=int(rng.integers(2**62)))
    freq = torch.bincount(tokens.long(), minlength=8).double() / n
    p = torch.softmax(row[0].double(), dim=-1)
    assert ((freq - p).abs() <= 6 * torch.sqrt(p * (1 - p) / n) + 1e-12).all(), f"{freq.tolist()} vs {p.tolist()}"


def test_chain_speculative_sampling_accepts_drafts_from_the_target(torch, fsc, rng):
    g = cs.generator(torch, rng, "speculative")
    batch, n, vocab = 4, 3, 100
    target = torch.softmax(torch.randn(batch, n + 1, vocab, generator=g, device="cuda"), dim=-1)
    draft = target[:, :n].contiguous()
    ids = torch.multinomial(draft.view(-1, vocab), 1, generator=g).view(batch, n).to(torch.int32)
    out, accepted, emitted = fsc.chain_speculative_sampling(draft, ids, target, seed=int(rng.integers(2**62)))
    assert torch.equal(out[:, :n], ids), "a draft token drawn from the target is always accepted"
    assert (out[:, n] >= 0).all() and accepted.tolist() == [n] * batch and emitted.tolist() == [n] * batch


def test_check_nan_raises_naming_the_output(torch, fsc):
    probs = torch.full((2, 10), 0.1, device="cuda")
    probs[1, 3] = float("nan")
    tokens = fsc.sampling_from_probs(probs, seed=1)
    assert tokens[1].item() == -1 and 0 <= tokens[0].item() < 10
    with pytest.raises(ValueError, match=r"sampling_from_probs: output 1 is invalid: not_finite"):
        fsc.sampling_from_probs(probs, seed=1, check_nan=True)


# ---- bad inputs, on a GPU ---------------------------------------------------------------------

def test_bad_tensors_are_refused_by_name(torch, fsc, rng):
    g = cs.generator(torch, rng, "bad inputs")
    pool, indptr, indices, last, _, _ = cs.paged_batch(torch, g, [10, 20], 16, 2, 128, "float16", "NHD")
    q = cs.random_rows(torch, g, 2, 4, 128, "float16")
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    w.plan(indptr, indices, last, 4, 2, 128, 16, q_data_type="float16")
    # page ids given on the host are read there, so run() can check them against the pool
    # (device page ids are copied as they are, as FlashInfer does)
    host_planned = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    host_planned.plan(indptr.cpu(), indices.cpu(), last.cpu(), 4, 2, 128, 16, q_data_type="float16")
    cases = {
        r"run: q must be a CUDA tensor; it is on cpu": lambda: w.run(q.cpu(), pool),
        r"run: q must have dtype float16; it has bfloat16": lambda: w.run(q.bfloat16(), pool),
        r"run: q must have shape \(2, 4, 128\); it has \(3, 4, 128\)": lambda: w.run(
            cs.random_rows(torch, g, 3, 4, 128, "float16"), pool),
        r"run: q must be contiguous": lambda: w.run(q.transpose(0, 1).contiguous().transpose(0, 1), pool),
        r"run: paged_kv_cache must have shape \(\*, 2, 16, 2, 128\)": lambda: w.run(q, pool[:, :, :8]),
        r"run: the planned indices reach page \d+; paged_kv_cache has 1 pages": lambda: host_planned.run(q, pool[:1]),
        r"run: out must have dtype float16": lambda: w.run(q, pool, out=torch.empty(2, 4, 128, device="cuda")),
        r"plan: indptr must have dtype int32; it has int64": lambda: w.plan(indptr.long(), indices, last, 4, 2, 128,
                                                                            16),
        r"plan: workspace_buffer has 16 bytes": lambda: fsc.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(16, dtype=torch.uint8, device="cuda")).plan(indptr, indices, last, 4, 2, 128, 16),
        r"top_k_sampling_from_probs: top_k must have dtype int32 or int64": lambda: fsc.top_k_sampling_from_probs(
            torch.ones(2, 5, device="cuda") / 5, torch.ones(2, dtype=torch.float32, device="cuda")),
        r"merge_state: v_b must be a CUDA tensor; it is on cpu": lambda: fsc.merge_state(
            q, torch.zeros(2, 4, device="cuda"), q.cpu(), torch.zeros(2, 4, device="cuda")),
    }
    for pattern, call in cases.items():
        with pytest.raises(ValueError, match=pattern):
            call()
    # the wrapper still works after every refusal
    assert torch.isfinite(w.run(q, pool)).all()


def test_a_bad_row_in_the_cache_pool_is_not_a_crash(torch, fsc):
    """Sampler rows with NaN, and math.inf parameters: defined outputs, no exception."""
    probs = torch.full((3, 7), 1 / 7, device="cuda")
    tokens = fsc.top_p_sampling_from_probs(probs, torch.tensor([0.5, math.nan, 1.0], device="cuda"), seed=2)
    assert tokens[1].item() == -1 and tokens[0].item() >= 0 and tokens[2].item() >= 0


# ---- stage 09's RoPE kernel, FlashInfer's flashinfer.rope names ---------------------------

def _rope_bound(torch, dtype, ref, x):
    """Per element: half an ulp of the dtype on the result plus 4 fp32 roundings of the
    pair's |a| + |b| (the kernel's cos/sin and two fp32 operations; tests/stages/test_rope_gpu.cpp
    derives it)."""
    import numpy as np
    bits = {torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}[dtype]
    return np.abs(ref) * 2.0 ** -bits + 4 * 2.0 ** -24 * 2 * np.abs(x).max() + 2.0 ** -25


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("form", ["offsets", "pos_ids", "llama31", "inplace"])
def test_rope_matches_numpy(torch, fsc, dtype, form):
    import numpy as np
    from rope_numpy import np_frequencies, np_llama31_frequencies, np_rope
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(20261127)
    nnz, hq, hk, dim = 37, 8, 2, 128
    rotary_dim, interleave = (64, True) if form in ("pos_ids", "inplace") else (128, False)
    q = (torch.rand(nnz, hq, dim, generator=gen) * 4 - 2).to(dt)
    k = (torch.rand(nnz, hk, dim, generator=gen) * 4 - 2).to(dt)
    indptr = [0, 10, 10, 30, nnz]  # an empty request
    offsets = [5, 0, 100000, 131000]
    positions = np.concatenate([np.arange(indptr[b + 1] - indptr[b]) + offsets[b] for b in range(4)])
    if form == "llama31":
        freqs = np_llama31_frequencies(rotary_dim, 8.0, 5e5, 1.0, 4.0, 8192.0)
    else:
        freqs = np_frequencies(rotary_dim, 1.0, 1e4)
    qd, kd = q.cuda(), k.cuda()
    ind = torch.tensor(indptr, dtype=torch.int32, device="cuda")
    off = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    pos = torch.tensor(positions, dtype=torch.int32, device="cuda")
    if form == "offsets":
        qo, ko = fsc.apply_rope(qd, kd, ind, off, rotary_dim=rotary_dim, interleave=interleave)
    elif form == "pos_ids":
        qo, ko = fsc.apply_rope_pos_ids(qd, kd, pos, rotary_dim=rotary_dim, interleave=interleave)
    elif form == "llama31":
        qo, ko = fsc.apply_llama31_rope(qd, kd, ind, off, rotary_dim=rotary_dim, interleave=interleave)
    else:
        assert fsc.apply_rope_pos_ids_inplace(qd, kd, pos, rotary_dim=rotary_dim, interleave=interleave) is None
        qo, ko = qd, kd
    torch.cuda.synchronize()
    for got, x in ((qo, q), (ko, k)):
        xn = x.float().numpy()
        ref = np_rope(xn, positions, freqs, interleave)
        err = np.abs(got.float().cpu().numpy() - ref)
        assert got.dtype == dt and got.shape == x.shape
        assert (err <= _rope_bound(torch, dt, ref, xn)).all(), float(err.max())


def test_rope_refuses_bad_arguments_by_name(torch, fsc):
    q = torch.zeros(4, 2, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.zeros(4, 1, 64, dtype=torch.bfloat16, device="cuda")
    pos = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="rotary_dim"):
        fsc.apply_rope_pos_ids(q, k, pos, rotary_dim=63)
    with pytest.raises(ValueError, match="rope_theta"):
        fsc.apply_rope_pos_ids(q, k, pos, rope_theta=0)
    with pytest.raises(ValueError, match="pos_ids"):
        fsc.apply_rope_pos_ids(q, k, pos[:3])
    with pytest.raises(ValueError, match="offsets"):
        fsc.apply_rope(q, k, torch.tensor([0, 4], dtype=torch.int32, device="cuda"),
                       torch.zeros(2, dtype=torch.int32, device="cuda"))


# ---- attention sinks (FlashInfer's run(sinks=)) -------------------------------------------

@pytest.mark.parametrize("dtype,layout,page_size,group", [("bfloat16", "NHD", 16, 4), ("float16", "HND", 1, 1),
                                                          ("bfloat16", "HND", 16, 8)])
def test_decode_sinks_match_the_float64_oracle(torch, fsc, rng, dtype, layout, page_size, group):
    """run(sinks=) on the default decode stage: each head's sink joins its denominator
    (stages/sinks/). An empty request gets o = 0 and lse = its sink. Without sinks the same
    plan gives plain attention again, and a stage without sinks refuses them by name."""
    g = cs.generator(torch, rng, f"sinks {dtype} {layout} page {page_size} group {group}")
    hkv, d = 2, 128
    hq = hkv * group
    kv_lens = [0, 1, 17, 300, int(rng.integers(1, 2000))]
    pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page_size, hkv, d, dtype, layout)
    q = cs.random_rows(torch, g, len(kv_lens), hq, d, dtype)
    sinks = torch.rand(hq, generator=g, device="cuda") * 10 - 2
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout)
    w.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=getattr(torch, dtype))
    assert w.stage == "03_split_kv"
    o, lse = w.run(q, pool, return_lse=True, sinks=sinks)
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i], sinks=sinks) for i in range(len(kv_lens))]
    check_attention(torch, fsc, o, lse, refs, dtype, "decode sinks")
    # an empty request: o = 0 and lse = its sink (to the lse tolerance: the kernel carries it in base 2)
    assert torch.count_nonzero(o[0]) == 0, "an empty request's output is 0"
    cs.assert_close(torch, lse[0], sinks, fsc.tolerance(dtype, "lse"), "an empty request's lse is its sink")
    o2, lse2 = w.run(q, pool, return_lse=True)  # the same plan, no sinks
    refs = [cs.attention_reference(torch, q[i:i + 1], keys[i], values[i]) for i in range(len(kv_lens))]
    check_attention(torch, fsc, o2, lse2, refs, dtype, "decode after a run with sinks")
    with pytest.raises(ValueError, match="sinks"):
        w.run(q, pool, sinks=sinks[:-1])  # one per query head
    w2 = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, stage="02_paged")
    w2.plan(indptr, indices, last, hq, hkv, d, page_size, q_data_type=getattr(torch, dtype))
    with pytest.raises(Exception, match="does not implement attention sinks"):
        w2.run(q, pool, sinks=sinks)


@pytest.mark.parametrize("storage,causal,default", [("paged", True, False), ("paged", False, False),
                                                    ("ragged", True, False), ("paged", True, True),
                                                    ("ragged", False, True)])
def test_prefill_sinks_match_the_float64_oracle(torch, fsc, rng, storage, causal, default):
    """run(sinks=) on stage 04's prefill (paged and ragged), and on the default stage (stage
    07's on a Hopper GPU): the sink joins each row's denominator once, whatever the split of
    the KV."""
    g = cs.generator(torch, rng, f"prefill sinks {storage} {causal} {default}")
    hkv, d, group, dtype = 2, 128, 4, "bfloat16"
    hq = hkv * group
    qo_lens = [qo for qo, _ in PREFILL_LENGTHS]
    kv_lens = [kv for _, kv in PREFILL_LENGTHS]
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32, device="cuda")
    q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
    sinks = torch.rand(hq, generator=g, device="cuda") * 10 - 2
    if storage == "paged":
        pool, kv_indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, 16, hkv, d, dtype, "NHD")
        w = fsc.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), "NHD",
                                                    stage=None if default else "04_tensor_core")
        w.plan(qo_indptr, kv_indptr, indices, last, hq, hkv, d, 16, causal=causal, q_data_type=dtype)
        o, lse = w.run(q, pool, return_lse=True, sinks=sinks)
    else:
        keys = [cs.random_rows(torch, g, n, hkv, d, dtype) for n in kv_lens]
        values = [cs.random_rows(torch, g, n, hkv, d, dtype) for n in kv_lens]
        kv_indptr = torch.tensor([0] + list(itertools.accumulate(kv_lens)), dtype=torch.int32, device="cuda")
        w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch),
                                                     stage=None if default else "04_tensor_core_ragged")
        w.plan(qo_indptr, kv_indptr, hq, hkv, d, causal=causal, q_data_type=dtype)
        o, lse = w.run(q, torch.cat(keys), torch.cat(values), return_lse=True, sinks=sinks)
    refs = [cs.attention_reference(torch, q[int(qo_indptr[i]):int(qo_indptr[i + 1])], keys[i], values[i],
                                   causal=causal, sinks=sinks) for i in range(len(qo_lens))]
    check_attention(torch, fsc, o, lse, refs, dtype, f"prefill sinks {w.stage}")
