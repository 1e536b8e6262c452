"""What the GPU suites of flashstep.cuda share: skipping cleanly where there is no GPU,
random batches with a printed seed, an independent float64 attention in PyTorch (the
oracle: it shares no code with the stages), and the harness's comparison rule.

Run seeds come from FLASHSTEP_SEED (tests/python/conftest.py prints it); each test
derives its own from the run seed and its name, and prints it.
"""
import itertools
import math
import os

import pytest


def torch_cuda_or_skip():
    """torch, where it imports and sees a CUDA device, and the library loads; else skip
    (or fail, under FLASHSTEP_REQUIRE_GPU=1: scripts/gpu-python.sh sets it, so that a GPU
    machine where nothing could run does not pass by skipping everything)."""
    def unavailable(why):
        if os.environ.get("FLASHSTEP_REQUIRE_GPU") == "1":
            pytest.fail(f"FLASHSTEP_REQUIRE_GPU=1 but {why}")
        pytest.skip(f"GPU test skipped: {why}")
    try:
        import torch
    except ImportError:
        unavailable("PyTorch is not installed here (the GPU machine has it)")
    if not torch.cuda.is_available():
        unavailable("PyTorch sees no CUDA device")
    import flashstep.cuda as fsc
    usable, why = fsc.available()
    if not usable:
        unavailable(f"flashstep.cuda cannot run here: {why.splitlines()[0]}")
    return torch

def flashinfer_or_skip(*submodules):
    """FlashInfer (and `submodules`, e.g. "flashinfer.mla") where they import, its version
    printed; else skip the peer's cross-checks, saying why. The GPU must be usable first."""
    torch_cuda_or_skip()
    try:
        import importlib

        import flashinfer
        for name in submodules:
            importlib.import_module(name)
    except Exception as e:  # noqa: BLE001  (any import failure means: no peer here)
        pytest.skip(f"FlashInfer cross-check skipped: flashinfer does not import here ({type(e).__name__}: {e})")
    print(f"FlashInfer {getattr(flashinfer, '__version__', '?')}")
    return flashinfer



def generator(torch, rng, name):
    """A CUDA torch.Generator seeded from the numpy rng fixture (whose seed is printed)."""
    seed = int(rng.integers(2**62))
    print(f"torch seed for {name}: {seed}")
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def torch_dtype(torch, name):
    return getattr(torch, name)


def paged_batch(torch, g, kv_lens, page_size, num_kv_heads, head_dim, dtype, layout, spare_pages=3,
                head_dim_vo=None):
    """A paged pool holding len(kv_lens) requests on shuffled pages, NaN in every slot no
    request owns. Returns (pool, kv_indptr, kv_indices, last_page_len, keys, values), the
    last two lists of (kv_len, Hkv, D) float64 tensors per request. With head_dim_vo (MLA's
    prefill) the pool is a (k_cache, v_cache) pair of two pools on the same page table,
    (num_pages, page_size, Hkv, D) and (..., head_dim_vo) NHD, (num_pages, Hkv, page_size,
    ...) HND, and the values are head_dim_vo wide."""
    pages = [max(1, -(-n // page_size)) if n > 0 else 0 for n in kv_lens]
    total = sum(pages) + spare_pages
    order = torch.randperm(total, generator=g, device="cuda").to(torch.int32)
    kv_indices = order[:sum(pages)].contiguous()
    kv_indptr = torch.tensor([0] + list(itertools.accumulate(pages)), dtype=torch.int32, device="cuda")
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)],
                        dtype=torch.int32, device="cuda")
    d_vo = head_dim_vo or head_dim
    nan = dict(dtype=getattr(torch, dtype), device="cuda")
    if head_dim_vo is None:
        shape = (total, 2, page_size, num_kv_heads, head_dim) if layout == "NHD" else \
            (total, 2, num_kv_heads, page_size, head_dim)
        pool = torch.full(shape, float("nan"), **nan)
        k_pool, v_pool = pool[:, 0], pool[:, 1]
    else:
        page = (page_size, num_kv_heads) if layout == "NHD" else (num_kv_heads, page_size)
        k_pool = torch.full((total,) + page + (head_dim,), float("nan"), **nan)
        v_pool = torch.full((total,) + page + (d_vo,), float("nan"), **nan)
        pool = (k_pool, v_pool)
    keys, values = [], []
    for i, n in enumerate(kv_lens):
        k = (torch.rand((n, num_kv_heads, head_dim), generator=g, device="cuda") * 2 - 1).to(k_pool.dtype)
        v = (torch.rand((n, num_kv_heads, d_vo), generator=g, device="cuda") * 2 - 1).to(k_pool.dtype)
        t = torch.arange(n, device="cuda")
        page = kv_indices[int(kv_indptr[i]) + t // page_size].long()
        slot = t % page_size
        if layout == "NHD":
            k_pool[page, slot], v_pool[page, slot] = k, v
        else:  # advanced indices around a slice: the indexed dims come first, (n, Hkv, D)
            k_pool[page, :, slot], v_pool[page, :, slot] = k, v
        keys.append(k.double())
        values.append(v.double())
    return pool, kv_indptr, kv_indices, last, keys, values


def paged_fp8_batch(torch, g, kv_lens, page_size, num_kv_heads, head_dim, kv_dtype, layout, k_scale, v_scale,
                    spare_pages=3, fill=float("nan")):
    """paged_batch with an FP8 pool (kv_dtype "float8_e4m3fn" or "float8_e5m2") holding
    K/V as FlashInfer's scale convention stores them: k / k_scale and v / v_scale rounded to
    the format. The keys and values returned are the stored values dequantized in float64
    (times k_scale and v_scale): what an exact attention over the cache reads. Slots no
    request owns hold `fill` (NaN by default)."""
    pool32, indptr, indices, last, keys, values = paged_batch(torch, g, kv_lens, page_size, num_kv_heads, head_dim,
                                                              "float32", layout, spare_pages)
    fp8 = getattr(torch, kv_dtype)
    stored = pool32.double()
    stored[:, 0] /= k_scale
    stored[:, 1] /= v_scale
    stored = stored.to(fp8).float()  # NaN stays NaN in both formats
    if fill == fill:
        stored = stored.nan_to_num(fill)
    pool = stored.to(fp8)
    # the same rounding, request by request, for the oracle: k_scale * fp8(k / k_scale)
    keys = [(k / k_scale).to(fp8).double() * k_scale for k in keys]
    values = [(v / v_scale).to(fp8).double() * v_scale for v in values]
    return pool, indptr, indices, last, keys, values


def random_rows(torch, g, rows, heads, head_dim, dtype, scale=1.0):
    """(rows, heads, head_dim) uniform in [-scale, scale), rounded to dtype."""
    x = (torch.rand((rows, heads, head_dim), generator=g, device="cuda") * 2 - 1) * scale
    return x.to(getattr(torch, dtype))


def attention_reference(torch, q, k, v, causal=False, sm_scale=None, window_left=-1, logits_soft_cap=0.0,
                        sinks=None):
    """One request, float64: q (qo_len, Hq, D), k and v (kv_len, Hkv, D) -> o (qo_len, Hq,
    D), lse (qo_len, Hq), natural log. The conventions of ARCHITECTURE.md: causal aligned
    bottom-right, window keeps the last window_left + 1 keys, GQA head h reads h // group.
    sinks (Hq): one more logit per head in the denominator, with no value: a column
    appended to the scores and dropped from the weights."""
    q = q.double()
    qo_len, hq, d = q.shape
    kv_len, hkv, _ = k.shape
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    kx = k.double().repeat_interleave(group, dim=1)  # (kv_len, Hq, D)
    vx = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kx) * scale
    if logits_soft_cap > 0:
        s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
    i = torch.arange(qo_len, device=q.device).view(-1, 1)
    j = torch.arange(kv_len, device=q.device).view(1, -1)
    last_visible = i + (kv_len - qo_len) if causal else torch.full_like(i, kv_len - 1)
    visible = j <= last_visible
    if window_left >= 0:
        visible &= j >= last_visible - window_left
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:  # (Hq, qo_len, kv_len + 1), the sink column last
        column = sinks.double().view(hq, 1, 1).expand(hq, qo_len, 1)
        lse = torch.logsumexp(torch.cat([s, column], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)  # (Hq, qo_len)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    o = torch.einsum("hqk,khd->qhd", p, vx).contiguous()
    return o, lse.transpose(0, 1).contiguous()


def assert_close(torch, out, ref, tol, what, factor=1.0, seed_note=""):
    """The harness's rule: every element within atol + rtol * |ref| and ||out - ref|| <=
    norm * ||ref||, tolerances (atol, rtol, norm) times `factor`. -inf must match -inf;
    NaN never passes. A failure lists the first five mismatches by index."""
    atol, rtol, norm = (t * factor for t in tol)
    out, ref = out.double(), ref.double()
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    both_neg_inf = torch.isneginf(out) & torch.isneginf(ref)
    err = (out - ref).abs().masked_fill(both_neg_inf, 0.0)
    bound = atol + rtol * ref.abs().masked_fill(both_neg_inf, 0.0)
    finite = torch.isfinite(ref)
    bad = ~(err <= bound) | (~finite & (out != ref))  # NaN compares false; +-inf must match exactly
    num = torch.linalg.vector_norm((out - ref)[finite]).item()
    den = torch.linalg.vector_norm(ref[finite]).item()
    ratio = num / den if den > 0 else num
    if bad.any() or not ratio <= norm:
        idx = bad.nonzero()[:5].tolist()
        lines = [f"  at {tuple(i)}: got {out[tuple(i)].item():.6g}, want {ref[tuple(i)].item():.6g}" for i in idx]
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements outside atol {atol:g} + rtol "
                             f"{rtol:g}, norm ratio {ratio:.3g} (bound {norm:g}) {seed_note}\n" + "\n".join(lines))


def cascade_batch(torch, g, qo_lens, own_lens, prefix, doc, page_size, num_kv_heads, head_dim, dtype, layout):
    """A batch whose requests share a prefix of `prefix` tokens (whole pages), then, with
    doc > 0, a document of `doc` tokens shared by each half of the batch, then their own
    keys. Returns (pool, levels, keys, values): levels is FlashInfer's multi-level form,
    four lists (qo_indptr, kv_indptr, kv_indices, kv_last_page_len) of int32 CUDA tensors
    per level; keys and values hold each request's whole (kv_len, Hkv, D) float64 rows."""
    n = len(own_lens)
    half = n // 2
    shared = [prefix] + ([doc, doc] if doc else [])
    pool, kv_indptr, idx, last, k, v = paged_batch(torch, g, shared + list(own_lens), page_size, num_kv_heads,
                                                   head_dim, dtype, layout)
    kv_indptr, idx, last = kv_indptr.tolist(), idx.tolist(), last.tolist()

    def pages(i):
        return idx[kv_indptr[i]:kv_indptr[i + 1]]

    qo = [0] + list(itertools.accumulate(qo_lens))
    levels = [([0, qo[-1]], [0, len(pages(0))], pages(0), [page_size])]
    if doc:
        a, b = pages(1), pages(2)
        levels.append(([0, qo[half], qo[-1]], [0, len(a), len(a) + len(b)], a + b, [page_size, page_size]))
    first_own = len(shared)
    own = [pages(first_own + r) for r in range(n)]
    levels.append((qo, [0] + list(itertools.accumulate(len(p) for p in own)), sum(own, []) or [0],
                   [last[first_own + r] for r in range(n)]))
    as_cuda = [[torch.tensor(x, dtype=torch.int32, device="cuda") for x in level] for level in levels]
    arrays = [[level[i] for level in as_cuda] for i in range(4)]
    keys, values = [], []
    for r in range(n):
        parts = [0] + ([1 if r < half else 2] if doc else []) + [first_own + r]
        keys.append(torch.cat([k[i] for i in parts]))
        values.append(torch.cat([v[i] for i in parts]))
    return pool, arrays, keys, values
