"""flashstep.cuda on any machine: it imports without a GPU, finds (or clearly fails to
find) its C library, and refuses bad arguments with a ValueError naming the argument
before anything reaches the GPU. The GPU runs are in test_cuda_gpu.py and
test_cuda_flashinfer.py.

The fakes below carry a __cuda_array_interface__ whose pointer is never dereferenced:
every check they trigger happens on the host, before any CUDA call.
"""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import flashstep.cuda as fsc
from flashstep import _capi


class FakeCuda:
    """A device array as CuPy or Numba would describe it (no memory behind it)."""

    def __init__(self, shape, typestr="<f2", strides=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (1 << 40, False),
                                         "strides": strides, "version": 3}


def library_or_skip():
    try:
        return _capi.load()
    except fsc.LibraryNotFound as e:
        pytest.skip(f"libflashstep_capi.so is not built here (a build without CUDA): {str(e).splitlines()[0]}")


def raises(match, fn, *args, **kwargs):
    with pytest.raises(ValueError, match=match):
        fn(*args, **kwargs)


def test_imports_without_touching_the_gpu():
    # A fresh interpreter: importing must not load the library or need a device.
    code = "import flashstep.cuda as c, flashstep._capi as k; assert k._lib is None; print('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "ok"


def test_every_public_name_is_importable_from_flashstep_cuda():
    # The wrappers live in one module per family; flashstep.cuda is where users import them.
    for name in fsc.__all__:
        assert getattr(fsc, name, None) is not None, f"flashstep.cuda.{name} is missing"
    families = {"BatchDecodeWithPagedKVCacheWrapper": "_cuda_decode", "BatchPrefillWithPagedKVCacheWrapper":
                "_cuda_prefill", "BatchPrefillWithRaggedKVCacheWrapper": "_cuda_prefill",
                "MultiLevelCascadeAttentionWrapper": "_cuda_cascade", "top_p_sampling_from_probs": "_cuda_sampling",
                "merge_states": "_cuda_merge", "apply_rope": "_cuda_rope", "append_paged_kv_cache": "_cuda_paged_kv"}
    for name, module in families.items():
        assert getattr(fsc, name).__module__ == f"flashstep.{module}", f"{name} is defined in the wrong module"
    from flashstep._cuda_plan import PlanRun
    assert all(issubclass(getattr(fsc, n), PlanRun) for n in families if n.endswith("Wrapper"))


def test_a_missing_library_names_every_place_tried(tmp_path):
    missing = tmp_path / "nowhere" / "libflashstep_capi.so"
    code = ("import flashstep.cuda as c\n"
            "try:\n    c.stages()\nexcept c.LibraryNotFound as e:\n    print(e)\nelse:\n    print('loaded')\n")
    env = dict(os.environ, FLASHSTEP_CAPI=str(missing))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "cannot load the C library libflashstep_capi.so" in run.stdout
    assert f"{missing} (no such file)" in run.stdout
    assert "FLASHSTEP_CAPI" in run.stdout and "gpu-build.sh" in run.stdout


def test_a_file_that_is_not_a_library_is_named(tmp_path):
    bogus = tmp_path / "libflashstep_capi.so"
    bogus.write_text("not an ELF file")
    code = "import flashstep.cuda as c\ntry:\n    c.stages()\nexcept c.LibraryNotFound as e:\n    print(e)\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, FLASHSTEP_CAPI=str(bogus)))
    assert str(bogus) in run.stdout and "no such file" not in run.stdout.split(str(bogus))[1].splitlines()[0]


def test_host_arrays_are_refused_by_name():
    host = np.zeros((2, 4, 64), np.float16)
    raises(r"merge_state: v_a must be a CUDA array; it is in host memory", fsc.merge_state, host, None, None, None)
    raises(r"merge_states: v must be a CUDA array", fsc.merge_states, np.zeros((2, 2, 4, 64), np.float32), None)
    raises(r"sampling_from_probs: probs must be a CUDA array", fsc.sampling_from_probs, np.ones((2, 8), np.float32))
    raises(r"BatchDecodeWithPagedKVCacheWrapper: workspace_buffer must be a CUDA array",
           fsc.BatchDecodeWithPagedKVCacheWrapper, np.zeros(1024, np.uint8))
    raises(r"softmax: logits must be a CUDA tensor .*got list", fsc.softmax, [[1.0, 2.0]])
    # logits are read as float32 or bfloat16, probabilities as float32; other float dtypes
    # are converted first (as FlashInfer's .float()), which needs PyTorch or CuPy
    raises(r"sampling_from_probs: probs has dtype float16; flashstep converts it to float32 only for PyTorch and "
           r"CuPy arrays", fsc.sampling_from_probs, FakeCuda((2, 10), "<f2"))
    raises(r"sampling_from_logits: logits has dtype float16; flashstep converts it", fsc.sampling_from_logits,
           FakeCuda((2, 10), "<f2"))
    raises(r"sampling_from_probs: probs must have dtype float32 or float16 or bfloat16 or float64; it has int32",
           fsc.sampling_from_probs, FakeCuda((2, 10), "<i4"))
    raises(r"merge_state: v_a is required", fsc.merge_state, None, None, None, None)


def test_dtype_shape_and_strides_are_checked_before_the_gpu():
    v = FakeCuda((5, 4, 64))
    raises(r"merge_state: s_a must have dtype float32; it has float16", fsc.merge_state, v, FakeCuda((5, 4)), v,
           FakeCuda((5, 4), "<f4"))
    raises(r"merge_state: s_a must have shape \(5, 4\); it has \(5, 3\)", fsc.merge_state, v,
           FakeCuda((5, 3), "<f4"), v, FakeCuda((5, 4), "<f4"))
    raises(r"merge_state: v_b must have dtype float16; it has float32", fsc.merge_state, v, FakeCuda((5, 4), "<f4"),
           FakeCuda((5, 4, 64), "<f4"), FakeCuda((5, 4), "<f4"))
    transposed = FakeCuda((5, 4, 64), "<f2", strides=(2 * 64, 2 * 5 * 64, 2))
    raises(r"merge_state: v_a must be contiguous", fsc.merge_state, transposed, FakeCuda((5, 4), "<f4"), v,
           FakeCuda((5, 4), "<f4"))
    raises(r"merge_states: v must have shape \(\*, \*, \*, \*\)", fsc.merge_states, v, FakeCuda((5, 4), "<f4"))
    raises(r"sampling_from_probs: probs has dtype float16; flashstep converts", fsc.sampling_from_probs,
           FakeCuda((3, 100)))
    raises(r"has element type '<c8'", fsc.softmax, FakeCuda((3, 100), "<c8"))


def test_attention_inputs_must_be_16_byte_aligned():
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    fsc_plan_without_gpu(w)
    q = FakeCuda((4, 8, 128))
    shifted = FakeCuda((4, 8, 128))
    shifted.__cuda_array_interface__["data"] = ((1 << 40) + 2, False)  # one fp16 element in
    kv = FakeCuda((9, 8, 128))
    out = FakeCuda((4, 8, 128))
    lse = FakeCuda((4, 8), "<f4")
    raises(r"run: q must start at a 16-byte aligned address; it starts at 0x10000000002", w.run, shifted, kv, kv,
           out=out, lse=lse)
    raises(r"run: out must start at a 16-byte aligned address", w.run, q, kv, kv, out=shifted, lse=lse)


def fsc_plan_without_gpu(w):
    """Gives `w` the plan plan() would make, without the device copies a GPU would need."""
    p = fsc._Plan()
    p.dtype, p.batch_size, p.nnz_qo, p.nnz_kv = "float16", 1, 4, 9
    p.num_qo_heads, p.num_kv_heads, p.head_dim, p.page_size, p.max_page = 8, 8, 128, 0, None
    p.q_shape, p.lse_shape, p.batch = (4, 8, 128), (4, 8), _capi.Batch()
    p.head_dim_vo, p.o_shape = 128, p.q_shape
    w._planned = p


def test_append_paged_kv_cache_checks_every_argument():
    k = FakeCuda((6, 2, 64))
    idx = FakeCuda((6,), "<i4")
    pool = FakeCuda((10, 2, 16, 2, 64))
    table = (FakeCuda((4,), "<i4"), FakeCuda((3,), "<i4"), FakeCuda((2,), "<i4"))
    fn = fsc.append_paged_kv_cache
    raises(r"append_paged_kv_cache: batch_indices must have dtype int32; it has int64", fn, k, k,
           FakeCuda((6,), "<i8"), idx, pool, *table)
    raises(r"append_paged_kv_cache: positions must have shape \(6\)", fn, k, k, idx, FakeCuda((5,), "<i4"), pool,
           *table)
    raises(r"append_paged_kv_cache: append_value must have dtype float16", fn, k, FakeCuda((6, 2, 64), "<f4"), idx,
           idx, pool, *table)
    raises(r"append_paged_kv_cache: kv_last_page_len must have shape \(2\)", fn, k, k, idx, idx, pool, table[0],
           table[1], FakeCuda((3,), "<i4"))
    raises(r"append_paged_kv_cache: paged_kv_cache has 4 kv heads, append_key 2", fn, k, k, idx, idx,
           FakeCuda((10, 2, 16, 4, 64)), *table)
    raises(r"append_paged_kv_cache: kv_layout must be 'NHD' or 'HND'", fn, k, k, idx, idx, pool, *table,
           kv_layout="NDH")
    raises(r"append_paged_kv_cache: append_key must have contiguous heads and dims", fn,
           FakeCuda((6, 2, 64), "<f2", strides=(2 * 128, 2, 2 * 2)), k, idx, idx, pool, *table)


def test_plan_arguments_are_checked_on_the_host():
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    plan = w.plan
    ok = ([0, 1, 3], [0, 1, 2], [5, 16], 8, 2, 128, 16)
    raises(r"plan: indptr must have dtype int32; it has int64", plan, np.array(ok[0], np.int64), *ok[1:])
    raises(r"plan: q_data_type must be float32, float16 or bfloat16; got 'int8'", plan, *ok, q_data_type="int8")
    raises(r"plan: pos_encoding_mode must be 'NONE'", plan, *ok, pos_encoding_mode="ROPE_LLAMA")
    raises(r"plan: kv_data_type must equal q_data_type", plan, *ok, q_data_type="float16", kv_data_type="float32")
    raises(r"plan: last_page_len must have batch_size = 2 entries; it has 1", plan, ok[0], ok[1], [5], *ok[3:])
    raises(r"plan: kv_indices has 2 entries; kv_indptr\[-1\] = 3 pages are needed", plan, ok[0], [0, 1], *ok[2:])
    raises(r"plan: kv_indices must be >= 0", plan, ok[0], [0, -1, 2], *ok[2:])
    raises(r"plan: num_kv_heads must be an integer; got 2.5", plan, *ok[:4], 2.5, *ok[5:])
    raises(r"plan: sm_scale must be a positive finite number or None; got -1", plan, *ok, sm_scale=-1)
    raises(r"plan: window_left must be an integer >= -1", plan, *ok, window_left=-2)
    raises(r"BatchDecodeWithPagedKVCacheWrapper: use_cuda_graph=True needs fixed index buffers: pass "
           r"paged_kv_indptr_buffer",
           fsc.BatchDecodeWithPagedKVCacheWrapper, FakeCuda((1 << 20,), "|u1"), "NHD", True)
    raises(r"BatchDecodeWithPagedKVCacheWrapper: kv_layout must be 'NHD' or 'HND'",
           fsc.BatchDecodeWithPagedKVCacheWrapper, FakeCuda((1 << 20,), "|u1"), "NDH")
    with pytest.raises(ValueError, match=r"run: call plan\(\) first"):
        w.run(FakeCuda((2, 8, 128)), FakeCuda((10, 2, 16, 2, 128)))
    r = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    # head_dim_vo: both prefill wrappers pass a positive one on (the registry says which
    # pairs run: MLA's 192/128 on stage 07; over pages run() then takes a (k_cache, v_cache)
    # pair of the two widths)
    raises(r"plan: head_dim_vo must be a positive integer or None; got 0", r.plan, [0, 4], [0, 9], 8, 8, 128, 0)
    raises(r"plan: head_dim_vo must be a positive integer or None; got 64.0", r.plan, [0, 4], [0, 9], 8, 8, 128,
           64.0)
    pw = fsc.BatchPrefillWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(r"plan: head_dim_vo must be a positive integer or None; got 0", pw.plan, [0, 4], [0, 1], [0], [4], 8, 8,
           192, 16, head_dim_vo=0)
    raises(r"plan: custom masks are not supported", r.plan, [0, 4], [0, 9], 8, 8, 128, custom_mask=object())
    raises(r"plan: qo_indptr has 3 entries, kv_indptr 2", r.plan, [0, 4, 5], [0, 9], 8, 8, 128)


def test_cascade_plan_arguments_are_checked():
    raises(r"MultiLevelCascadeAttentionWrapper: num_levels must be an integer in 1..8; got 0",
           fsc.MultiLevelCascadeAttentionWrapper, 0, FakeCuda((1 << 20,), "|u1"))
    w = fsc.MultiLevelCascadeAttentionWrapper(2, FakeCuda((1 << 20,), "|u1"))
    levels = ([[0, 3], [0, 1, 2, 3]], [[0, 2], [0, 1, 1, 2]], [[7, 8], [1, 2]], [[16], [5, 0, 9]])
    ok = (8, 2, 128, 16)
    raises(r"plan: qo_indptr_arr must be a list of num_levels = 2 int32 arrays", w.plan, levels[0][:1],
           *levels[1:], *ok)
    raises(r"plan: window_left must be -1", w.plan, *levels, *ok, window_left=4)
    raises(r"plan: level 1: qo_indptr and paged_kv_indptr need num_groups \+ 1", w.plan, levels[0],
           [[0, 2], [0, 1, 2]], *levels[2:], *ok)
    raises(r"plan: level 0: paged_kv_indices needs kv_indptr\[-1\] = 2 page ids >= 0", w.plan, *levels[:2],
           [[7, -8], [1, 2]], levels[3], *ok)
    library_or_skip()
    # a group must start where a request's queries start
    raises(r"level 0: qo_indptr\[1\] = 1 does not fall on a request's first query", w.plan,
           [[0, 1, 4], [0, 2, 4]], [[0, 1, 2], [0, 1, 2]], [[7, 8], [1, 2]], [[16, 16], [5, 9]], *ok)


def test_the_library_checks_what_only_it_knows():
    library_or_skip()
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    ok = ([0, 1, 3], [0, 1, 2], [5, 16], 8, 2, 128, 16)
    raises(r"^BatchDecodeWithPagedKVCacheWrapper.plan: kv_last_page_len\[1\] = 17 must be in 1..page_size", w.plan,
           *ok[:2], [5, 17], *ok[3:])
    raises(r"plan: kv_indptr must be non-decreasing", w.plan, [0, 3, 1], ok[1], *ok[2:])
    # the sizes' bounds, each named (the wrappers check only their type)
    raises(r"^BatchDecodeWithPagedKVCacheWrapper.plan: num_kv_heads must be >= 1, got 0", w.plan, *ok[:4], 0,
           *ok[5:])
    raises(r"^BatchDecodeWithPagedKVCacheWrapper.plan: page_size must be >= 1, got 0", w.plan, *ok[:6], 0)
    # the default choice: every stage's reason (05_cascade, asked for by name only, is left out)
    raises(r"plan: no stage runs decode paged f16 .*head_dim=96.*:\n  01_naive: .*ragged.*\n  02_paged: 02_paged is "
           r"not built for head_dim 96", w.plan, *ok[:5], 96, 16)
    # a stage asked for: the library checks it once, as it sizes and plans the runner
    raises(r"plan: stage 01_naive cannot run this batch \(decode paged .*\): 01_naive reads ragged KV, not paged",
           w.plan, *ok, stage="01_naive")
    raises(r"find_stage: no stage named \"09\" \(known: 01_naive, ", w.plan, *ok, stage="09")
    # every field of the shape reaches the library where C expects it (the struct's layout)
    raises(r"stage 02_paged cannot run this batch \(.*\): 02_paged does not implement logits_soft_cap", w.plan, *ok,
           logits_soft_cap=5.0, stage="02")
    raises(r"stage 03_split_kv cannot run this batch \(.*\): 03_split_kv does not implement window_left", w.plan,
           *ok,
           window_left=3, stage="03_split_kv")
    raises(r"02_paged supports GQA groups up to 8", w.plan, ok[0], ok[1], ok[2], 32, 2, 128, 16, stage="02_paged")
    raises(r"02_paged supports page_size 1..64", w.plan, ok[0], ok[1], [5, 100], 8, 2, 128, 128, stage="02_paged")
    raises(r"04_tensor_core is not built for dtype f32", w.plan, *ok, q_data_type="float32", stage="04_tensor_core")
    h = fsc.BatchPrefillWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"), "HND")
    raises(r"01_naive reads ragged KV, not paged", h.plan, [0, 2, 5], *ok[:3], 8, 2, 128, 16, stage="01_naive")
    r = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(r"01_naive is not built for dtype bf16", r.plan, [0, 4], [0, 9], 8, 8, 128, q_data_type="bfloat16",
           stage="01_naive")


def test_fp8_cache_arguments():
    """kv_data_type float8_e4m3fn / float8_e5m2 (FlashInfer's FP8 cache): taken by the
    paged wrappers, refused by name where a stage or wrapper cannot read it."""
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    ok = ([0, 1, 3], [0, 1, 2], [5, 16], 8, 2, 128, 16)
    raises(r"plan: an FP8 cache \(kv_data_type float8_e4m3fn\) needs q_data_type float16 or bfloat16; got float32",
           w.plan, *ok, q_data_type="float32", kv_data_type="float8_e4m3fn")
    raises(r"plan: kv_data_type must be float32, float16, bfloat16, float8_e4m3fn or float8_e5m2; got 'float8_e4m3'",
           w.plan, *ok, kv_data_type="float8_e4m3")
    r = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(r"plan: kv_data_type float8_e5m2 is an FP8 format, which only a paged cache takes here", r.plan, [0, 4],
           [0, 9], 8, 8, 128, q_data_type="bfloat16", kv_data_type="float8_e5m2")
    library_or_skip()
    # the stages that read K/V in q's dtype only refuse an FP8 cache with their reason
    raises(r"stage 05_cascade cannot run this batch \(.*\): 05_cascade reads K/V in q's dtype only, not e4m3",
           w.plan, *ok, q_data_type="bfloat16", kv_data_type="float8_e4m3fn", stage="05_cascade")
    p = fsc.BatchPrefillWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(r"stage 07_hopper cannot run this batch \(.*\): 07_hopper reads K/V in q's dtype only, not e5m2", p.plan,
           [0, 2, 5], *ok[:3], 8, 2, 128, 16, q_data_type="float16", kv_data_type="float8_e5m2", stage="07_hopper")
    c = fsc.MultiLevelCascadeAttentionWrapper(2, FakeCuda((1 << 20,), "|u1"))
    levels = ([[0, 2], [0, 1, 2]], [[0, 1], [0, 1, 2]], [[7], [1, 2]], [[16], [5, 9]])
    raises(r"05_cascade reads K/V in q's dtype only, not e4m3", c.plan, *levels, 8, 2, 128, 16,
           q_data_type="bfloat16", kv_data_type="float8_e4m3fn")
    # the harness's FP8 rows: K/V in FP8 is its own row, not bf16's; f32 queries have none
    bf16 = fsc.tolerance("bfloat16", "o")
    e4m3 = fsc.tolerance("bfloat16", "o", kv_dtype="float8_e4m3fn")
    assert fsc.tolerance("bfloat16", "o", kv_dtype="bfloat16") == bf16
    assert len(e4m3) == 3 and all(x > 0 for x in e4m3)
    raises(r"no tolerance row for dtype f32 with K/V in e5m2", fsc.tolerance, "float32", "o", kv_dtype="e5m2")
    raises(r"tolerance: kv_dtype must be float32, float16, bfloat16, float8_e4m3fn or float8_e5m2", fsc.tolerance,
           "bfloat16", "o", kv_dtype="int8")


def test_stages_are_the_registry_in_teaching_order():
    library_or_skip()
    names = [name for name, _, _ in fsc.stages()]
    assert names == sorted(names) and names[0] == "01_naive"
    assert {"02_paged", "03_split_kv", "04_tensor_core", "04_tensor_core_ragged"} <= set(names)
    for name, summary, caps in fsc.stages():
        assert summary and ("paged" in caps or "ragged" in caps), name


def test_tolerances_are_the_harness_table():
    library_or_skip()
    # stages/harness/compare.cpp: bf16 outputs are rounded to 2^-8 relative, fp32 to 2^-24.
    atol_bf16, rtol_bf16, _ = fsc.tolerance("bfloat16")
    atol_f32, rtol_f32, _ = fsc.tolerance("float32")
    assert rtol_bf16 > 2.0 ** -8 > rtol_f32 > 2.0 ** -24
    assert atol_bf16 > atol_f32 > 0
    assert fsc.tolerance("float16", "lse")[2] > 0


def test_without_a_gpu_the_failure_is_a_runtime_error_that_says_so():
    library_or_skip()
    usable, why = fsc.available()
    if usable:
        pytest.skip("a CUDA device is present: test_cuda_gpu.py covers this machine")
    assert why  # e.g. "CUDA driver version is insufficient" or "no CUDA-capable device"
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    with pytest.raises(RuntimeError, match="CUDA|cuda"):
        w.plan([0, 4], [0, 9], 8, 8, 128)


def test_torch_cpu_tensors_are_refused_by_name():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    q = torch.zeros(2, 4, 64, dtype=torch.float16)
    raises(r"merge_state: v_a must be a CUDA tensor; it is on cpu", fsc.merge_state, q, None, None, None)
    raises(r"top_p_sampling_from_probs: probs must be a CUDA tensor; it is on cpu", fsc.top_p_sampling_from_probs,
           torch.ones(2, 5), 0.5)
    w = fsc.BatchPrefillWithRaggedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(r"plan: qo_indptr must have dtype int32; it has int64", w.plan, torch.tensor([0, 4]), [0, 9], 8, 8, 128)
    raises(r"plan: kv_indptr must be one-dimensional", w.plan, [0, 4], torch.zeros(1, 2, dtype=torch.int32), 8, 8, 128)
    raises(r"plan: q_data_type must be float32, float16 or bfloat16; got torch.int8", w.plan, [0, 4], [0, 9], 8, 8,
           128, q_data_type=torch.int8)


def test_get_batch_indices_positions():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    append_indptr = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    seq_lens = torch.tensor([3, 10, 5], dtype=torch.int32)  # after the append
    batch_indices, positions = fsc.get_batch_indices_positions(append_indptr, seq_lens, 9)
    assert batch_indices.tolist() == [0, 0, 0, 1, 2, 2, 2, 2, 2]
    assert positions.tolist() == [0, 1, 2, 9, 0, 1, 2, 3, 4]
    assert batch_indices.dtype == positions.dtype == torch.int32
    raises(r"get_batch_indices_positions: seq_lens must be an int32 torch tensor", fsc.get_batch_indices_positions,
           append_indptr, seq_lens.long(), 9)


def test_sampler_parameters_reach_the_library_intact():
    """Stage 06 checks scalar parameters on the host before any launch, so bad values
    come back named without a GPU; this also pins fs_sampling_params' layout. Fake device
    pointers are used, so it runs only where no GPU could be reached by a launch."""
    import ctypes
    library_or_skip()
    if fsc.available()[0]:
        pytest.skip("a CUDA device is present: fake pointers must not reach a kernel there")
    fake = ctypes.c_void_p(1 << 40)

    def sample(op, **fields):
        p = _capi.SamplingParams(top_k=1, top_p=1.0, min_p=0.0, temperature=1.0)
        for k, v in fields.items():
            setattr(p, k, v)
        _capi.call("fs_sample", op.encode(), fake, 4, 100, ctypes.byref(p), None, 4, 0, 0, fake, None, None,
                   None, 0, None)

    raises(r"top_k must be >= 1, but top_k = 0", sample, "top_k_sampling_from_probs", top_k=0)
    raises(r"top_p must be in \(0, 1\], but top_p = 1.5", sample, "top_p_sampling_from_probs", top_p=1.5)
    raises(r"min_p must be in \[0, 1\], but min_p = 2", sample, "min_p_sampling_from_probs", min_p=2.0)
    raises(r"top_p must be in \(0, 1\]", sample, "top_k_top_p_sampling_from_probs", top_k=3, top_p=0.0,
           filter_apply_order=1)
    raises(r"no sampler named \"nope\"", sample, "nope")
    with pytest.raises(RuntimeError, match="CUDA"):  # good arguments: the launch is what fails here
        sample("top_p_sampling_from_probs", top_p=0.5)


def test_the_default_stage_rule():
    """default_stage() is the stage registry's rule, asked through the C library over any
    list of names (docs/python_gpu.md); plan() asks the registry for its choice directly."""
    library_or_skip()
    decode, prefill = 0, 1
    every = ["02_paged", "03_split_kv", "04_tensor_core"]
    assert fsc.default_stage(every, decode, 1) == "03_split_kv"
    assert fsc.default_stage(every, decode, 8) == "03_split_kv"
    assert fsc.default_stage(every, decode, 16) == "04_tensor_core"  # past the decode stages' groups
    assert fsc.default_stage(["02_paged", "04_tensor_core"], decode, 4) == "04_tensor_core"
    assert fsc.default_stage(["04_tensor_core", "04_tensor_core_ragged"], prefill, 4) == "04_tensor_core_ragged"
    assert fsc.default_stage(every, prefill, 4) == "04_tensor_core"
    assert fsc.default_stage([], decode, 4) is None


def _stage_runs(name, shape):
    reason = ctypes.c_char_p()
    _capi.call("fs_stage_unsupported_reason", name.encode(), ctypes.byref(shape), ctypes.byref(reason))
    return not reason.value


def test_the_default_stage_of_each_wrapper():
    """The registry's answers put through the rule, for the shapes docs/python_gpu.md lists."""
    library_or_skip()
    cases = [(fsc.BatchDecodeWithPagedKVCacheWrapper, "bfloat16", 32, 8, "03_split_kv"),
             (fsc.BatchDecodeWithPagedKVCacheWrapper, "float32", 8, 1, "03_split_kv"),
             (fsc.BatchDecodeWithPagedKVCacheWrapper, "float16", 32, 2, "04_tensor_core"),
             (fsc.BatchPrefillWithPagedKVCacheWrapper, "bfloat16", 32, 8, "04_tensor_core"),
             (fsc.BatchPrefillWithRaggedKVCacheWrapper, "float16", 32, 8, "04_tensor_core_ragged"),
             (fsc.BatchPrefillWithRaggedKVCacheWrapper, "bfloat16", 32, 8, "07_hopper_ragged"),
             (fsc.BatchPrefillWithRaggedKVCacheWrapper, "float32", 32, 8, "01_naive")]
    indptr, last = fsc.index_array([0, 1, 3], "t", "indptr"), fsc.index_array([5, 16], "t", "last")
    qo = fsc.index_array([0, 1, 2], "t", "qo")
    for graph in (False, True):
        for cls, dtype, hq, hkv, want in cases:
            bufs = {}
            if graph:
                names = {"BatchDecodeWithPagedKVCacheWrapper": ("paged_kv_indptr_buffer", "paged_kv_indices_buffer",
                                                                "paged_kv_last_page_len_buffer"),
                         "BatchPrefillWithPagedKVCacheWrapper": ("qo_indptr_buf", "paged_kv_indptr_buf",
                                                                 "paged_kv_indices_buf", "paged_kv_last_page_len_buf"),
                         "BatchPrefillWithRaggedKVCacheWrapper": ("qo_indptr_buf", "kv_indptr_buf")}[cls.__name__]
                bufs = {name: FakeCuda((64,), "<i4") for name in names}
            w = cls(FakeCuda((1 << 20,), "|u1"), use_cuda_graph=graph, **bufs)
            shape = w._shape(dtype, hq, hkv, 128, 16, False, -1, None, None, qo, indptr,
                             last if w._storage == 1 else None)
            chosen = w._choose_stage(shape, None)
            expected = want
            if want.startswith("07") or (want == "04_tensor_core_ragged" and not graph):
                # the latest stage that runs it: stage 07 where the registry says this GPU
                # runs it (sm_90a), never under a graph (its grid follows the lengths)
                hopper = _stage_runs("07_hopper_ragged", shape)
                expected = "07_hopper_ragged" if hopper and not graph else "04_tensor_core_ragged"
            if cls is fsc.BatchPrefillWithPagedKVCacheWrapper or want == "04_tensor_core":
                # (a decode past group 8 too: stage 07 takes large-group decode)
                expected = "07_hopper" if _stage_runs("07_hopper", shape) and not graph else "04_tensor_core"
            assert chosen == expected, (cls.__name__, dtype, hq, hkv, graph, chosen)


def test_which_stages_claim_graph_safety():
    """The stages whose launch depends on batch_size and the query rows only; stage 05's
    cascade has its own wrapper and refuses a re-plan its captured graph cannot replay."""
    library_or_skip()
    caps = {name: c for name, _, c in fsc.stages()}
    for name in ("01_naive", "02_paged", "03_split_kv", "04_tensor_core", "04_tensor_core_ragged"):
        assert fsc._graph_safe(name), f"{name} does not claim cuda_graph in its capabilities: {caps[name]}"
        assert "cuda_graph" in caps[name], f"{name}'s capabilities in words do not name cuda_graph: {caps[name]}"


def test_graph_mode_refuses_a_stage_that_is_not_graph_safe():
    library_or_skip()
    unsafe = [name for name, _, _ in fsc.stages() if not fsc._graph_safe(name)]
    if not unsafe:
        pytest.skip("every stage of this build claims graph safety")
    bufs = [FakeCuda((64,), "<i4") for _ in range(3)]
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"), "NHD", True, False, *bufs)
    for name in unsafe:
        raises(rf"plan: stage {name} cannot plan for a captured CUDA graph \(use_cuda_graph=True\)", w.plan,
               [0, 1, 3], [0, 1, 2], [5, 16], 8, 2, 128, 16, stage=name)


def test_index_arrays_are_read_in_place():
    from flashstep._tensors import index_array
    a = np.array([0, 3, 7, 7], np.int32)
    ia = index_array(a, "f", "indptr")
    assert ia.ptr == a.ctypes.data and not ia.on_device and len(ia) == 4 and ia[-1] == 7
    assert ia.min_max(3) == (0, 7)
    import array
    b = array.array("i", [4, -2, 9])
    ib = index_array(b, "f", "indices")
    assert ib.ptr == b.buffer_info()[0] and ib.min_max(3) == (-2, 9) and ib[1] == -2
    assert list(index_array(range(5), "f", "x").obj) == [0, 1, 2, 3, 4]
    strided = np.arange(10, dtype=np.int32)[::2]
    assert [index_array(strided, "f", "x")[i] for i in range(5)] == [0, 2, 4, 6, 8]
    raises(r"f: x must have dtype int32; it has int64", index_array, np.zeros(3, np.int64), "f", "x")
    raises(r"f: x must be one-dimensional; it has shape \(1, 2\)", index_array, np.zeros((1, 2), np.int32), "f",
           "x")
    raises(r"f: x has values outside int32", index_array, [0, 2**31], "f", "x")
    raises(r"f: x must be a one-dimensional int32 array; got list", index_array, [[0, 1]], "f", "x")
    raises(r"f: x must hold int32; it is an array.array of typecode 'q'", index_array, array.array("q", [1]), "f",
           "x")
    raises(r"f: x is required", index_array, None, "f", "x")


def test_flashinfer_arguments_are_taken_or_refused_by_name():
    ws = FakeCuda((1 << 20,), "|u1")
    for backend in ("auto", "fa2", "fa3"):
        fsc.BatchDecodeWithPagedKVCacheWrapper(ws, backend=backend)
    raises(r"BatchPrefillWithPagedKVCacheWrapper: backend must be one of 'auto', 'fa2', 'fa3'",
           fsc.BatchPrefillWithPagedKVCacheWrapper, ws, backend="trtllm-gen")
    raises(r"BatchPrefillWithRaggedKVCacheWrapper: jit_args \(a custom FlashInfer kernel\) is not supported",
           fsc.BatchPrefillWithRaggedKVCacheWrapper, ws, jit_args=["x"])
    raises(r"BatchPrefillWithRaggedKVCacheWrapper: kv_layout must be 'NHD' for ragged K/V",
           fsc.BatchPrefillWithRaggedKVCacheWrapper, ws, "HND")
    w = fsc.BatchDecodeWithPagedKVCacheWrapper(ws)
    ok = ([0, 1, 3], [0, 1, 2], [5, 16], 8, 2, 128, 16)
    # FlashInfer's order after page_size: ..., q_data_type, kv_data_type, o_data_type, data_type
    raises(r"plan: o_data_type must equal q_data_type .*got float32 and bfloat16", w.plan, *ok, "NONE", -1, None,
           "bfloat16", "bfloat16", "float32")
    raises(r"plan: data_type \(FlashInfer's K/V dtype\) must equal q_data_type .*got bfloat16 and float16", w.plan,
           *ok, data_type="bfloat16")
    raises(r"CUDAGraphBatchDecodeWithPagedKVCacheWrapper: indptr_buffer must be a CUDA",
           fsc.CUDAGraphBatchDecodeWithPagedKVCacheWrapper, ws, [0], [0], [0])
    g = fsc.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, *[FakeCuda((8,), "<i4") for _ in range(3)])
    assert g.is_cuda_graph_enabled
    raises(r"sampling_from_probs: seed must be an integer in \[0, 2\^64\) or None; got ndarray \(a tensor seed",
           fsc.sampling_from_probs, FakeCuda((2, 8), "<f4"), seed=np.zeros(2, np.int64))
