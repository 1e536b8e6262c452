"""flashstep.cuda.append_paged_kv_cache into an FP8 cache (quantize on write), on the GPU.

Every float16 / bfloat16 bit pattern is appended into float8_e4m3fn and float8_e5m2 pools
under several k_scale / v_scale, and each stored byte is compared with an independent
float64 encoder written here in numpy (x / scale in float64, rounded to the format's grid
with ties to even, saturating at its largest finite value), bit for bit; NaN inputs must
give a NaN pattern. Where the scale is a power of two the quotient is exact, and PyTorch's
own cast (after a clamp: it does not saturate) must agree too. FP8 rows into a cache of
their own format are copied, as FlashInfer's append does, and bad arguments are refused by
name.
"""
import itertools
import math

import numpy as np
import pytest

import cuda_support as cs

# format -> (fraction bits, smallest normal exponent, largest finite)
FORMATS = {"float8_e4m3fn": (3, -6, 448.0), "float8_e5m2": (2, -14, 57344.0)}


def encode(torch, x, fmt, scale):
    """The stored bytes for float64 values x (numpy), and where x / scale is NaN."""
    codes = torch.arange(256, dtype=torch.uint8).view(getattr(torch, fmt)).double().numpy()
    return encode_with(codes, x, fmt, scale)


def encode_with(codes, x, fmt, scale):
    """The FP8 value nearest x / scale, ties to even, |.| capped at the largest finite
    value, as its byte (codes: the values of the 256 patterns), and where x / scale is NaN.
    Independent of the kernel and of PyTorch's cast: the value is rounded here, and only its
    byte is looked up."""
    mbits, emin, vmax = FORMATS[fmt]
    q = x / scale
    a = np.abs(q)
    _, ex = np.frexp(np.where(np.isfinite(a), a, 1.0))  # a = m 2^ex, m in [0.5, 1): exponent ex - 1
    e = np.maximum(ex - 1, emin).astype(np.float64)
    ulp = np.exp2(e - mbits)
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.round(np.where(np.isfinite(a), a, vmax) / ulp) * ulp  # np.round: ties to even
    r = np.minimum(r, vmax)
    by_value = {v: b for b, v in enumerate(codes) if b < 128 and math.isfinite(v)}
    out = np.array([by_value[v] for v in r.ravel().tolist()], dtype=np.uint8).reshape(r.shape)
    out |= (np.signbit(q).astype(np.uint8) << 7)
    return out, np.isnan(q)


def table(torch, g, lengths, page_size):
    """Requests appended from empty: (bi, pos, kv_indices, kv_indptr, last, num_pages),
    pages shuffled with three spare."""
    pages = [-(-n // page_size) for n in lengths]
    total = sum(pages) + 3
    indices = torch.randperm(total, generator=g, device="cuda").to(torch.int32)[:sum(pages)].contiguous()
    indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device="cuda")
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lengths, pages)], dtype=torch.int32, device="cuda")
    bi = torch.cat([torch.full((n,), b, dtype=torch.int32) for b, n in enumerate(lengths)]).cuda()
    pos = torch.cat([torch.arange(n, dtype=torch.int32) for n in lengths]).cuda()
    return bi, pos, indices, indptr, last, total


def every_pattern_rows(torch, g, dtype, heads, dim):
    """(rows, heads, dim) holding every 16-bit pattern of dtype once, shuffled."""
    n = 65536
    rows = n // (heads * dim)
    bits = torch.randperm(n, generator=g, device="cuda").to(torch.int32)
    bits = torch.where(bits >= 32768, bits - 65536, bits).to(torch.int16)
    return bits.view(getattr(torch, dtype)).view(rows, heads, dim)


def gather_slots(torch, pool, bi, pos, indices, indptr, page_size, layout, kv):
    """The (nnz, heads, dim) bytes the append wrote for K (kv 0) or V (kv 1)."""
    page = indices[(indptr[bi.long()] + pos // page_size).long()].long()
    slot = (pos % page_size).long()
    raw = pool.view(torch.uint8)
    return raw[page, kv, slot] if layout == "NHD" else raw[page, kv, :, slot]


@pytest.mark.parametrize("row_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kv_dtype", list(FORMATS))
@pytest.mark.parametrize("layout,page_size", [("NHD", 16), ("HND", 16), ("NHD", 1), ("HND", 1)])
def test_every_16bit_pattern_quantizes_as_the_float64_encoder(torch, fsc, rng, row_dtype, kv_dtype, layout,
                                                              page_size):
    g = cs.generator(torch, rng, f"fp8 append {row_dtype} {kv_dtype} {layout} {page_size}")
    heads, dim = 4, 128
    k = every_pattern_rows(torch, g, row_dtype, heads, dim)
    v = every_pattern_rows(torch, g, row_dtype, heads, dim)
    nnz = k.shape[0]
    bi, pos, indices, indptr, last, total = table(torch, g, [37, 1, nnz - 38], page_size)
    shape = (total, 2, page_size, heads, dim) if layout == "NHD" else (total, 2, heads, page_size, dim)
    kd = k.double().cpu().numpy()
    vd = v.double().cpu().numpy()
    for k_scale, v_scale in [(None, None), (0.25, 8.0), (1 / 200, 0.0123), (3.7, 1 / 3)]:
        pool = torch.full(shape, 0x5a, dtype=torch.uint8, device="cuda").view(getattr(torch, kv_dtype))
        fsc.append_paged_kv_cache(k, v, bi, pos, pool, indices, indptr, last, kv_layout=layout, k_scale=k_scale,
                                  v_scale=v_scale)
        torch.cuda.synchronize()
        for kv, x, scale in ((0, kd, k_scale), (1, vd, v_scale)):
            got = gather_slots(torch, pool, bi, pos, indices, indptr, page_size, layout, kv).cpu().numpy()
            want, nan = encode(torch, x, kv_dtype, 1.0 if scale is None else scale)
            got_nan = np.isnan(torch.from_numpy(got.copy()).view(getattr(torch, kv_dtype)).double().numpy())
            bad = np.where(nan, ~got_nan, got != want)
            assert not bad.any(), (
                f"{int(bad.sum())} of {bad.size} {'KV'[kv]} bytes differ from the float64 encoder "
                f"(scale {scale}); first at {np.argwhere(bad)[0].tolist()}: got {got[bad][0]:#04x}, "
                f"want {want[bad][0]:#04x} for x = {x[bad][0]!r}")
            if scale is None or math.log2(scale).is_integer():  # exact quotient: PyTorch's cast agrees
                mbits, emin, vmax = FORMATS[kv_dtype]
                q = torch.from_numpy(x / (1.0 if scale is None else scale)).clamp(-vmax, vmax)
                theirs = q.to(getattr(torch, kv_dtype)).view(torch.uint8).numpy()
                assert not np.where(nan, False, theirs != got).any(), "PyTorch's cast disagrees"
        written = torch.zeros(shape[:4], dtype=torch.bool, device="cuda")  # (page, kv, slot or head, ...)
        page = indices[(indptr[bi.long()] + pos // page_size).long()].long()
        slot = (pos % page_size).long()
        if layout == "NHD":
            written[page, :, slot] = True
        else:
            written[page, :, :, slot] = True
        untouched = pool.view(torch.uint8)[~written]
        assert bool((untouched == 0x5a).all()), "bytes outside the appended slots changed"


def test_separate_k_and_v_caches_and_fp8_rows(torch, fsc, rng):
    """A (k_cache, v_cache) pair takes quantized rows too; FP8 rows into a cache of their
    own format are copied byte for byte (FlashInfer's append of rows quantized beforehand)."""
    g = cs.generator(torch, rng, "fp8 append pair")
    heads, dim, page_size = 2, 64, 16
    bi, pos, indices, indptr, last, total = table(torch, g, [20, 45], page_size)
    nnz = bi.shape[0]
    k = cs.random_rows(torch, g, nnz, heads, dim, "bfloat16", scale=3.0)
    v = cs.random_rows(torch, g, nnz, heads, dim, "bfloat16", scale=3.0)
    kc = torch.zeros((total, page_size, heads, dim), dtype=torch.float8_e5m2, device="cuda")
    vc = torch.zeros_like(kc)
    fsc.append_paged_kv_cache(k, v, bi, pos, (kc, vc), indices, indptr, last, k_scale=0.5, v_scale=0.75)
    pool = torch.stack([kc, vc], dim=1)
    for kv, x, scale in ((0, k, 0.5), (1, v, 0.75)):
        got = gather_slots(torch, pool, bi, pos, indices, indptr, page_size, "NHD", kv).cpu().numpy()
        want, _ = encode(torch, x.double().cpu().numpy(), "float8_e5m2", scale)
        assert np.array_equal(got, want)
    # FP8 rows: copied
    k8 = torch.randint(0, 256, (nnz, heads, dim), generator=g, device="cuda", dtype=torch.uint8)
    v8 = torch.randint(0, 256, (nnz, heads, dim), generator=g, device="cuda", dtype=torch.uint8)
    pool8 = torch.zeros((total, 2, page_size, heads, dim), dtype=torch.float8_e4m3fn, device="cuda")
    fsc.append_paged_kv_cache(k8.view(torch.float8_e4m3fn), v8.view(torch.float8_e4m3fn), bi, pos, pool8, indices,
                              indptr, last)
    for kv, x in ((0, k8), (1, v8)):
        got = gather_slots(torch, pool8, bi, pos, indices, indptr, page_size, "NHD", kv)
        assert torch.equal(got, x)


def test_bad_fp8_append_arguments_are_refused_by_name(torch, fsc, rng):
    g = cs.generator(torch, rng, "fp8 append refusals")
    heads, dim, page_size = 2, 64, 16
    bi, pos, indices, indptr, last, total = table(torch, g, [5], page_size)
    k = cs.random_rows(torch, g, 5, heads, dim, "bfloat16")
    pool8 = torch.zeros((total, 2, page_size, heads, dim), dtype=torch.float8_e4m3fn, device="cuda")
    pool16 = torch.zeros((total, 2, page_size, heads, dim), dtype=torch.bfloat16, device="cuda")
    args = (bi, pos)
    table_args = (indices, indptr, last)
    fn = fsc.append_paged_kv_cache
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"k_scale must be a positive finite float or None; got"):
            fn(k, k, *args, pool8, *table_args, k_scale=bad)
        with pytest.raises(ValueError, match=r"v_scale must be a positive finite float or None; got"):
            fn(k, k, *args, pool8, *table_args, v_scale=bad)
    with pytest.raises(ValueError, match=r"append_paged_kv_cache: k_scale must be a positive finite float or None; "
                                         r"got 'half'"):
        fn(k, k, *args, pool8, *table_args, k_scale="half")
    with pytest.raises(ValueError, match=r"k_scale and v_scale apply only when f16/bf16 rows are quantized"):
        fn(k, k, *args, pool16, *table_args, k_scale=0.5)
    k32 = k.float()
    with pytest.raises(ValueError, match=r"append_paged_kv_cache: paged_kv_cache must have dtype float32; "
                                         r"it has float8_e4m3fn"):
        fn(k32, k32, *args, pool8, *table_args)
    kh = k.half()
    with pytest.raises(ValueError, match=r"append_paged_kv_cache: paged_kv_cache must have dtype float16 or "
                                         r"float8_e4m3fn or float8_e5m2; it has bfloat16"):
        fn(kh, kh, *args, pool16, *table_args)
    k8 = k.to(torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"append_paged_kv_cache: paged_kv_cache must have dtype float8_e5m2; "
                                         r"it has float8_e4m3fn"):
        fn(k8, k8, *args, pool8, *table_args)
    with pytest.raises(ValueError, match=r"append_paged_kv_cache: append_value must have dtype bfloat16; "
                                         r"it has float8_e5m2"):
        fn(k, k8, *args, pool8, *table_args)
    assert bool((pool8.view(torch.uint8) == 0).all()), "a refused call wrote into the pool"
