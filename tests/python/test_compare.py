"""flashstep.compare on the CPU: a kernel's output judged against the reference's by the
validation harness's rule (every element within atol + rtol * |ref|, and ||out - ref|| <=
norm * ||ref||; NaN never passes) with the harness's own per-dtype tolerance table."""
import math

import numpy as np
import pytest

import flashstep


def table_or_skip():
    if not hasattr(flashstep, "tolerance_table"):
        pytest.skip("this build's module has no tolerance table (built without the CUDA toolkit)")
    return flashstep.tolerance_table()


def attention(rng, tokens=7, kv=11, heads=4, kv_heads=2, dim=64):
    q = rng.standard_normal((tokens, heads, dim)).astype(np.float32)
    k = rng.standard_normal((kv, kv_heads, dim)).astype(np.float32)
    v = rng.standard_normal((kv, kv_heads, dim)).astype(np.float32)
    o, lse = flashstep.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    return o, lse


def test_the_tolerances_are_the_harness_table(rng):
    rows = table_or_skip()
    f16 = next(r for r in rows if r["dtype"] == "f16" and r["kv_dtype"] == "f16")
    assert flashstep.tolerance("float16") == f16["o"]
    assert flashstep.tolerance(np.float16, "lse") == f16["lse"]
    fp8 = next(r for r in rows if r["dtype"] == "bf16" and r["kv_dtype"] == "e4m3")
    assert flashstep.tolerance("bfloat16", kv_dtype="float8_e4m3fn") == fp8["o"]
    o, _ = attention(rng)
    report = flashstep.compare(o.astype(np.float16), o)
    assert report.tolerance == f16["o"]  # taken from out's dtype


def test_the_table_agrees_with_the_c_library_where_it_loads():
    table_or_skip()
    import flashstep.cuda as fsc
    try:
        c_api = fsc.tolerance("bfloat16")
    except fsc.LibraryNotFound:
        pytest.skip("libflashstep_capi.so is not built here")
    assert flashstep.tolerance("bfloat16") == c_api


def test_a_rounded_reference_passes_and_a_perturbed_one_fails_at_its_element(rng):
    table_or_skip()
    o, _ = attention(rng)
    stored = o.astype(np.float16)
    assert flashstep.compare(stored, o).check().ok
    bad = stored.copy()
    bad[5, 3, 40] += np.float16(0.25)
    report = flashstep.compare(bad, o)
    assert not report and report.count_mismatched == 1
    assert report.first_mismatch.index == (5, 3, 40)
    assert report.first_mismatch.label == "(token 5, head 3, dim 40)"
    assert "FAIL" in str(report) and "(token 5, head 3, dim 40): got" in str(report)
    with pytest.raises(AssertionError, match=r"o: FAIL: 1 of 1792 elements outside atol"):
        report.check()


def test_nan_never_passes():
    ref = np.ones((2, 3, 4))
    out = ref.copy()
    out[1, 2, 3] = np.nan
    report = flashstep.compare(out, ref, atol=1e9, rtol=1e9, norm=1e9)
    assert not report.ok and report.first_mismatch.index == (1, 2, 3)
    assert math.isinf(report.max_abs_err) and math.isinf(report.norm_ratio)


def test_minus_inf_is_matched_only_by_minus_inf():
    lse = np.array([[0.5, -np.inf], [1.0, 2.0]])
    same = flashstep.compare(lse.copy(), lse, atol=1e-6, rtol=0, norm=1e-6, which="lse")
    assert same.ok and same.norm_ratio == 0.0
    finite = lse.copy()
    finite[0, 1] = -1e30
    report = flashstep.compare(finite, lse, atol=1e-6, rtol=0, norm=1e-6, which="lse")
    assert not report.ok and report.first_mismatch.label == "(token 0, head 1)"


def test_a_bias_on_every_element_fails_the_norm_alone():
    ref = np.full((64, 2, 8), 1.0)
    out = ref + 9e-4  # inside atol + rtol for each element, 9e-4 relative as a whole
    report = flashstep.compare(out, ref, atol=1e-3, rtol=0, norm=5e-4)
    assert report.count_mismatched == 0 and not report.ok
    assert "the error as a whole is too large" in str(report)


def test_rows_are_named_by_request_with_qo_indptr():
    ref = np.zeros((6, 2, 4))
    out = ref.copy()
    out[4, 1, 2] = 1.0
    report = flashstep.compare(out, ref, atol=1e-3, rtol=0, norm=1.0, qo_indptr=[0, 3, 6])
    assert report.first_mismatch.label == "(request 1, token 1, head 1, dim 2)"


def test_bad_arguments_are_named():
    ref = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"compare: out has shape \(3, 2\), ref has shape \(2, 3\)"):
        flashstep.compare(np.zeros((3, 2), np.float16), ref)
    with pytest.raises(ValueError, match=r"compare: out has dtype float64, which names no stored dtype; pass dtype="):
        flashstep.compare(ref, ref)
    with pytest.raises(ValueError, match=r"tolerance: dtype must be one of"):
        flashstep.tolerance("int8")


def test_torch_tensors_are_read_in_their_dtype(rng):
    torch = pytest.importorskip("torch")
    table_or_skip()
    o, _ = attention(rng)
    out = torch.from_numpy(o.astype(np.float32)).to(torch.bfloat16)
    report = flashstep.compare(out, o)
    assert report.ok and report.tolerance == flashstep.tolerance("bfloat16")
