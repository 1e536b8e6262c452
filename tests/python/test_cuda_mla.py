"""flashstep.cuda's BatchMLAPagedAttentionWrapper (stages/10_mla/ through capi's fs_mla_*).

Without a GPU: the wrapper's argument checks, which all happen on the host, and the C
structs' layout against capi/flashstep_capi.h. On a GPU: decode and causal append over a
shuffled paged latent cache (pages of 1, 16 and 64, NaN in every slot no request owns,
16 and 128 heads, an empty request and rows that see no key), against the absorbed form
written directly in float64 PyTorch from stages/10_mla/README.md's equations, under the
harness's tolerances; outputs poisoned with NaN first; the lse in both bases; a CUDA
graph; the library's refusals; and, where `import flashinfer` works, FlashInfer's own
wrapper of the same name (backend fa2, and fa3 on sm_90) on the same tensors.
Seeds are printed (tests/python/conftest.py; FLASHSTEP_SEED reproduces a run).
"""
import ctypes
import math
import os
import re

import numpy as np
import pytest

import cuda_support as cs
import flashstep.cuda as fsc
from flashstep import _capi
from flashstep._cuda_mla import _MlaPlan
from test_cuda_arguments import FakeCuda, library_or_skip, raises

CKV, KPE = 512, 64
SM_SCALE = 1.0 / math.sqrt(192.0)  # DeepSeek-V3: query/key head dim 128 + 64 before absorption
LN2 = math.log(2.0)
HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "capi", "flashstep_capi.h")
W = "BatchMLAPagedAttentionWrapper"


# ---- without a GPU ----------------------------------------------------------------------

def test_the_wrapper_is_public_and_lives_in_its_module():
    assert "BatchMLAPagedAttentionWrapper" in fsc.__all__
    assert fsc.BatchMLAPagedAttentionWrapper.__module__ == "flashstep._cuda_mla"


def _header_fields(struct):
    """[(C type, name)] of `typedef struct <struct> { ... } <struct>;` in the header."""
    text = open(HEADER).read()
    body = re.search(r"typedef struct " + struct + r" \{(.*?)\} " + struct + ";", text, re.S).group(1)
    fields = []
    for line in body.splitlines():
        code = line.split("///")[0].strip()
        if code:
            m = re.match(r"(.+?)\s*(\w+);$", code)
            fields.append((m.group(1).replace(" *", "*").strip(), m.group(2)))
    return fields


def test_the_c_structs_and_version_are_the_headers():
    """_capi's ctypes structs field for field (name, type, order) and the interface
    version, read from capi/flashstep_capi.h: a change on one side only fails here."""
    ctype = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "double": ctypes.c_double}
    for struct, cls in (("fs_mla_shape", _capi.MlaShape), ("fs_mla_batch", _capi.MlaBatch)):
        want = [(name, ctypes.c_void_p if kind.endswith("*") else ctype[kind]) for kind, name in _header_fields(struct)]
        assert [(n, t) for n, t in cls._fields_] == want, struct
    version = re.search(r"#define FLASHSTEP_CAPI_VERSION (\d+)", open(HEADER).read()).group(1)
    assert _capi.EXPECTED_VERSION == int(version)
    header = open(HEADER).read()
    for name in _capi._SIGNATURES:
        assert re.search(r"FS_API int " + name + r"\(", header), f"{name} is not declared in the header"


def test_constructor_arguments():
    ws = FakeCuda((1 << 20,), "|u1")
    for backend in ("auto", "fa2", "fa3"):
        assert not fsc.BatchMLAPagedAttentionWrapper(ws, backend=backend).is_cuda_graph_enabled
    raises(rf"^{W}: backend must be one of 'auto', 'fa2', 'fa3' .*got 'cutlass'", fsc.BatchMLAPagedAttentionWrapper,
           ws, backend="cutlass")
    raises(rf"^{W}: float_workspace_buffer must be a CUDA array", fsc.BatchMLAPagedAttentionWrapper,
           np.zeros(64, np.uint8))
    raises(rf"^{W}: use_cuda_graph=True needs the fixed kv_indices buffer", fsc.BatchMLAPagedAttentionWrapper, ws,
           True)
    raises(rf"^{W}: kv_indices must have dtype int32; it has int64", fsc.BatchMLAPagedAttentionWrapper, ws, True,
           kv_indices=FakeCuda((64,), "<i8"))
    g = fsc.BatchMLAPagedAttentionWrapper(ws, True, FakeCuda((5,), "<i4"), FakeCuda((5,), "<i4"),
                                          FakeCuda((64,), "<i4"), FakeCuda((4,), "<i4"))
    assert g.is_cuda_graph_enabled


# qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
# causal, sm_scale, q_data_type, kv_data_type: three requests, the last empty
PLAN = ([0, 1, 2, 3], [0, 1, 3, 3], [4, 7, 2], [9, 20, 0], 16, CKV, KPE, 16, False, SM_SCALE, "bfloat16", "bfloat16")


def plan_with(**changes):
    names = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv", "head_dim_kpe",
             "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type")
    args = dict(zip(names, PLAN))
    args.update(changes)
    return args


def test_plan_arguments_are_checked_on_the_host():
    w = fsc.BatchMLAPagedAttentionWrapper(FakeCuda((1 << 20,), "|u1"))
    p = rf"^{W}\.plan: "
    raises(p + "q_data_type must be float16 or bfloat16 .*got float32", w.plan, **plan_with(q_data_type="float32"))
    raises(p + "kv_data_type must equal q_data_type; an FP8 latent cache is not supported; got float8_e4m3fn",
           w.plan, **plan_with(kv_data_type="float8_e4m3fn"))
    raises(p + "kv_data_type must equal q_data_type; got float16 and bfloat16", w.plan,
           **plan_with(kv_data_type="float16"))
    raises(p + "sm_scale is required", w.plan, **plan_with(sm_scale=None))
    raises(p + "sm_scale must be a number; got 'x'", w.plan, **plan_with(sm_scale="x"))
    raises(p + r"use_profiler=True \(FlashInfer's kernel profiler\) is not supported", w.plan, **plan_with(),
           use_profiler=True)
    raises(p + "kv_len_arr must hold one length per request", w.plan, **plan_with(kv_len_arr=[]))
    raises(p + r"qo_indptr has 3 entries; kv_len_arr has 3 requests, so it needs batch_size \+ 1 = 4", w.plan,
           **plan_with(qo_indptr=[0, 1, 2]))
    raises(p + r"kv_indptr has 5 entries", w.plan, **plan_with(kv_indptr=[0, 1, 3, 3, 3]))
    raises(p + r"kv_indices has 2 entries; kv_indptr\[-1\] = 3 pages are needed", w.plan,
           **plan_with(kv_indices=[4, 7]))
    raises(p + r"kv_indices must be >= 0 \(it holds -7\)", w.plan, **plan_with(kv_indices=[4, -7, 2]))
    raises(p + "num_heads must be an integer; got 16.0", w.plan, **plan_with(num_heads=16.0))
    raises(p + "page_size must be an integer; got None", w.plan, **plan_with(page_size=None))
    raises(p + "qo_indptr must have dtype int32; it has int64", w.plan,
           **plan_with(qo_indptr=np.array([0, 1, 2, 3], np.int64)))
    raises(rf"^{W}\.run: call plan\(\) first", w.run, FakeCuda((3, 16, CKV)), FakeCuda((3, 16, KPE)),
           FakeCuda((10, 16, CKV)), FakeCuda((10, 16, KPE)))


def test_the_library_reads_the_shape_where_c_expects_it():
    """sm_scale is checked by the library before anything touches a device (so also
    without a GPU): its message carries the value, which it can only have read at
    fs_mla_shape's own offset."""
    library_or_skip()
    w = fsc.BatchMLAPagedAttentionWrapper(FakeCuda((1 << 20,), "|u1"))
    raises(rf"^{W}\.plan: sm_scale must be a positive finite number .*got -1\.5", w.plan,
           **plan_with(sm_scale=-1.5))


def planned_without_gpu(w, max_page=None, nnz_qo=3, heads=16, page_size=16):
    """Gives `w` the plan plan() would make (float16: the fakes' CUDA Array Interface has
    no bfloat16), without the CUDA calls a real plan makes."""
    p = _MlaPlan()
    p.dtype, p.nnz_qo, p.num_heads, p.head_dim_ckv, p.head_dim_kpe = "float16", nnz_qo, heads, CKV, KPE
    p.page_size, p.max_page = page_size, max_page
    p.batch = _capi.MlaBatch()
    p.batch_address = ctypes.addressof(p.batch)
    w._planned = p
    return w


def _shifted(shape):
    """A fake device array one fp16 element past a 16-byte boundary (a view with an offset)."""
    a = FakeCuda(shape)
    a.__cuda_array_interface__["data"] = ((1 << 40) + 2, False)
    return a


def test_run_arguments_are_checked_on_the_host():
    w = planned_without_gpu(fsc.BatchMLAPagedAttentionWrapper(FakeCuda((1 << 20,), "|u1")), max_page=12)
    qn, qp = FakeCuda((3, 16, CKV)), FakeCuda((3, 16, KPE))
    ckv, kpe = FakeCuda((13, 16, CKV)), FakeCuda((13, 16, KPE))
    out, lse = FakeCuda((3, 16, CKV)), FakeCuda((3, 16), "<f4")
    p = rf"^{W}\.run: "
    raises(p + "q_nope must have dtype float16; it has float32", w.run, FakeCuda((3, 16, CKV), "<f4"), qp, ckv, kpe)
    raises(p + r"q_nope must have shape \(3, 16, 512\); it has \(2, 16, 512\)", w.run, FakeCuda((2, 16, CKV)), qp,
           ckv, kpe)
    raises(p + r"q_pe must have shape \(3, 16, 64\); it has \(3, 16, 32\)", w.run, qn, FakeCuda((3, 16, 32)), ckv,
           kpe)
    raises(p + r"q_pe must be contiguous", w.run, qn, FakeCuda((3, 16, KPE), "<f2", strides=(2 * KPE, 2 * 3 * KPE, 2)),
           ckv, kpe)
    # a pool that disagrees with the plan is named, not read
    raises(p + r"ckv_cache must have shape \(num_pages, page_size, head_dim_ckv\) = \(\*, 16, 512\) as planned; it "
           r"has \(13, 64, 512\)", w.run, qn, qp, FakeCuda((13, 64, CKV)), kpe)
    raises(p + r"kpe_cache must have shape \(num_pages, page_size, head_dim_kpe\) = \(\*, 16, 64\) as planned; it "
           r"has \(13, 16, 128\)", w.run, qn, qp, ckv, FakeCuda((13, 16, 128)))
    raises(p + r"ckv_cache must have shape .* it has \(13, 16, 1, 512\)", w.run, qn, qp, FakeCuda((13, 16, 1, CKV)),
           kpe)
    raises(p + "kpe_cache has 12 pages, ckv_cache 13", w.run, qn, qp, ckv, FakeCuda((12, 16, KPE)))
    raises(p + "the planned kv_indices reach page 12; ckv_cache and kpe_cache have 12 pages", w.run, qn, qp,
           FakeCuda((12, 16, CKV)), FakeCuda((12, 16, KPE)))
    raises(p + "ckv_cache must have dtype float16; it has float32", w.run, qn, qp, FakeCuda((13, 16, CKV), "<f4"), kpe)
    # a view of one combined (..., 576) cache, as some engines keep it
    combined = (2 * 16 * (CKV + KPE), 2 * (CKV + KPE), 2)
    raises(p + r"ckv_cache must be contiguous; .*not as a view of one combined", w.run, qn, qp,
           FakeCuda((13, 16, CKV), "<f2", strides=combined), kpe)
    raises(p + r"out must have shape \(3, 16, 512\)", w.run, qn, qp, ckv, kpe, out=FakeCuda((3, 16, KPE)))
    raises(p + r"lse must have dtype float32; it has float16", w.run, qn, qp, ckv, kpe, out=out,
           lse=FakeCuda((3, 16)))
    raises(p + r"the inputs are neither PyTorch nor CuPy arrays, so out cannot be allocated here", w.run, qn, qp,
           ckv, kpe)
    raises(p + "out must start at a 16-byte aligned address", w.run, qn, qp, ckv, kpe, out=_shifted((3, 16, CKV)))
    raises(p + "q_pe must start at a 16-byte aligned address", w.run, qn, _shifted((3, 16, KPE)), ckv, kpe, out=out)
    # the base-2 lse is a multiply in the caller's framework: none here
    raises(p + r"the base-2 lse \(FlashInfer's default\) .* pass return_lse_base_on_e=True", w.run, qn, qp, ckv, kpe,
           out=out, lse=lse)
    raises(p + r"the base-2 lse", w.run, qn, qp, ckv, kpe, out=out, lse=lse, return_lse=True)
    # FlashInfer's arguments that other backends take
    raises(p + r"kv_len \(FlashInfer's CUTLASS backend's metadata; the plan's is used\) is not supported", w.run, qn,
           qp, ckv, kpe, kv_len=FakeCuda((3,), "<i4"))
    raises(p + r"page_table \(.*\) is not supported", w.run, qn, qp, ckv, kpe, page_table=FakeCuda((3, 4), "<i4"))
    raises(p + r"profiler_buffer \(FlashInfer's kernel profiler\) is not supported", w.run, qn, qp, ckv, kpe,
           profiler_buffer=FakeCuda((8,), "<i8"))
    raises(p + r"o_scale \(an FP8 output scale\) is not supported", w.run, qn, qp, ckv, kpe, o_scale=1.0)
    # FlashInfer's structural form: split pairs only
    raises(p + "pass either query= or q_nope and q_pe, not both", w.run, qn, query=(qn, qp), kv_cache=(ckv, kpe))
    raises(p + r"query must be a pair \(q_nope, q_pe\); a packed tensor .* is not supported", w.run,
           query=FakeCuda((3, 16, CKV + KPE)), kv_cache=(ckv, kpe))
    raises(p + r"kv_cache must be a pair \(ckv_cache, kpe_cache\)", w.run, query=(qn, qp),
           kv_cache=FakeCuda((13, 16, CKV + KPE)))
    raises(p + r"kpe_cache has 12 pages", w.run, query=(qn, qp), kv_cache=(ckv, FakeCuda((12, 16, KPE))))


# ---- on a GPU ---------------------------------------------------------------------------

def workspace(torch, nbytes=64 << 20):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def latent_batch(torch, g, kv_lens, page_size, dtype, spare_pages=3):
    """Both pools of len(kv_lens) requests on shuffled pages, NaN in every slot no request
    owns: (ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_len, latents, rotary keys), the
    index arrays int32 on the GPU, the last two lists of each request's (kv_len, width)
    float64 rows as stored."""
    pages = [-(-n // page_size) for n in kv_lens]
    total = sum(pages) + spare_pages
    order = torch.randperm(total, generator=g, device="cuda").to(torch.int32)
    kv_indices = order[:sum(pages)].contiguous()
    kv_indptr = torch.tensor(np.cumsum([0] + pages).tolist(), dtype=torch.int32, device="cuda")
    dt = getattr(torch, dtype)
    ckv = torch.full((total, page_size, CKV), float("nan"), dtype=dt, device="cuda")
    kpe = torch.full((total, page_size, KPE), float("nan"), dtype=dt, device="cuda")
    latents, rope = [], []
    for i, n in enumerate(kv_lens):
        c = (torch.rand((n, CKV), generator=g, device="cuda") * 2 - 1).to(dt)
        k = (torch.rand((n, KPE), generator=g, device="cuda") * 2 - 1).to(dt)
        t = torch.arange(n, device="cuda")
        page = kv_indices[int(kv_indptr[i]) + t // page_size].long()
        ckv[page, t % page_size], kpe[page, t % page_size] = c, k
        latents.append(c.double())
        rope.append(k.double())
    kv_len = torch.tensor(kv_lens, dtype=torch.int32, device="cuda")
    return ckv, kpe, kv_indptr, kv_indices, kv_len, latents, rope


def mla_reference(torch, q_nope, q_pe, c, k_pe, sm_scale, causal):
    """One request in float64, the absorbed form of stages/10_mla/README.md: q_nope (qo, H,
    512), q_pe (qo, H, 64), c (kv, 512), k_pe (kv, 64) -> o (qo, H, 512), lse (qo, H),
    natural log. s = sm_scale (q_nope . c + q_pe . k_pe), causal aligned bottom-right
    (query i sees keys j <= i + kv - qo), o = softmax(s) c; a row that sees no key gets
    o = 0 and lse = -inf."""
    qo, heads, _ = q_nope.shape
    kv = c.shape[0]
    if kv == 0:
        return (torch.zeros((qo, heads, CKV), dtype=torch.float64, device=c.device),
                torch.full((qo, heads), float("-inf"), dtype=torch.float64, device=c.device))
    s = (torch.einsum("qhd,kd->hqk", q_nope.double(), c) + torch.einsum("qhd,kd->hqk", q_pe.double(), k_pe)) * sm_scale
    if causal:
        i = torch.arange(qo, device=c.device).view(-1, 1)
        j = torch.arange(kv, device=c.device).view(1, -1)
        s = s.masked_fill(j > i + (kv - qo), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (H, qo)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    return torch.einsum("hqk,kd->qhd", p, c).contiguous(), lse.transpose(0, 1).contiguous()


def mla_batch(torch, g, qo_lens, kv_lens, num_heads, page_size, dtype):
    """Queries and caches of one batch: a dict of everything plan() and run() take, plus
    the oracle's per-request inputs."""
    ckv, kpe, kv_indptr, kv_indices, kv_len, latents, rope = latent_batch(torch, g, kv_lens, page_size, dtype)
    qo_indptr = torch.tensor(np.cumsum([0] + list(qo_lens)).tolist(), dtype=torch.int32, device="cuda")
    nnz = int(sum(qo_lens))
    return dict(ckv=ckv, kpe=kpe, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len, qo_indptr=qo_indptr,
                q_nope=cs.random_rows(torch, g, nnz, num_heads, CKV, dtype),
                q_pe=cs.random_rows(torch, g, nnz, num_heads, KPE, dtype), latents=latents, rope=rope,
                qo_lens=list(qo_lens), num_heads=num_heads, page_size=page_size, dtype=dtype)


def reference_of(torch, b, causal, q_nope=None, q_pe=None):
    q_nope = b["q_nope"] if q_nope is None else q_nope
    q_pe = b["q_pe"] if q_pe is None else q_pe
    qo = b["qo_indptr"].tolist()
    refs = [mla_reference(torch, q_nope[qo[i]:qo[i + 1]], q_pe[qo[i]:qo[i + 1]], b["latents"][i], b["rope"][i],
                          SM_SCALE, causal) for i in range(len(b["latents"]))]
    return torch.cat([r[0] for r in refs]), torch.cat([r[1] for r in refs])


def plan(torch, w, b, causal, host=False):
    arrays = [b[k] for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len")]
    if host:
        arrays = [a.cpu() for a in arrays]
    dt = getattr(torch, b["dtype"])
    w.plan(*arrays, b["num_heads"], CKV, KPE, b["page_size"], causal, SM_SCALE, dt, dt)


# (mode, page_size, num_heads, dtype): decode (one query a request) and causal append
# over every page size and both head counts in bf16; fp16 and a non-causal append once each
GPU_CASES = ([(mode, page, heads, "bfloat16") for mode in ("decode", "causal") for page in (1, 16, 64)
              for heads in (16, 128)] + [("decode", 16, 16, "float16"), ("causal", 64, 128, "float16"),
                                         ("append", 16, 16, "bfloat16")])


@pytest.mark.parametrize("mode,page_size,num_heads,dtype", GPU_CASES)
def test_matches_the_float64_oracle(torch, fsc, rng, mode, page_size, num_heads, dtype):
    g = cs.generator(torch, rng, f"mla {mode} page {page_size} heads {num_heads} {dtype}")
    causal = mode == "causal"
    if mode == "decode":
        # lengths across the 32-key tile and the pages; request 3 is empty (o = 0, lse = -inf)
        qo_lens, kv_lens = [1] * 6, [1, 31, 33, 0, 300, int(rng.integers(1, 700))]
    else:
        # request 3 is empty; request 4 has fewer keys than queries (causal: its first row sees none)
        qo_lens, kv_lens = [4, 9, 2, 1, 3, int(rng.integers(1, 9))], [4, 200, 65, 0, 2, int(rng.integers(9, 600))]
    b = mla_batch(torch, g, qo_lens, kv_lens, num_heads, page_size, dtype)
    w = fsc.BatchMLAPagedAttentionWrapper(workspace(torch))
    plan(torch, w, b, causal, host=page_size == 16)  # index arrays on the host for some cases, on the GPU for others
    o_ref, lse_ref = reference_of(torch, b, causal)
    nnz = sum(qo_lens)
    tol_o, tol_lse = fsc.tolerance(dtype, "o"), fsc.tolerance(dtype, "lse")
    what = f"mla {mode} page {page_size} heads {num_heads} {dtype}"
    # poisoned outputs: a row the kernel does not write stays NaN and fails
    out = torch.full((nnz, num_heads, CKV), float("nan"), dtype=getattr(torch, dtype), device="cuda")
    lse = torch.full((nnz, num_heads), float("nan"), dtype=torch.float32, device="cuda")
    o, l_e = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], out=out, lse=lse, return_lse=True,
                   return_lse_base_on_e=True)
    assert o is out and l_e is lse
    cs.assert_close(torch, o, o_ref, tol_o, what + " o")
    cs.assert_close(torch, l_e, lse_ref, tol_lse, what + " lse (natural log)")
    empty = slice(sum(qo_lens[:3]), sum(qo_lens[:4]))  # request 3: kv_len 0
    assert torch.all(o[empty] == 0) and torch.all(torch.isneginf(l_e[empty])), "empty request: o = 0, lse = -inf"
    # FlashInfer's default base: 2, and run() allocating o and lse
    o2, l_2 = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"], return_lse=True)
    cs.assert_close(torch, o2, o_ref, tol_o, what + " o (allocated)")
    cs.assert_close(torch, l_2.double() * LN2, lse_ref, tol_lse, what + " lse (base 2, times ln 2)")
    o3 = w.run(b["q_nope"], b["q_pe"], b["ckv"], b["kpe"])  # no lse: o alone
    assert isinstance(o3, torch.Tensor)
    cs.assert_close(torch, o3, o_ref, tol_o, what + " o (no lse)")


def test_replans_and_the_structural_form(torch, fsc, rng):
    """One wrapper planned twice (another batch composition) runs the new plan; query=
    and kv_cache= pairs are FlashInfer's other spelling of the same call."""
    g = cs.generator(torch, rng, "mla re-plan")
    w = fsc.BatchMLAPagedAttentionWrapper(workspace(torch))
    for qo_lens, kv_lens, causal in (([1, 1], [70, 5], False), ([3, 2, 1], [40, 2, 900], True)):
        b = mla_batch(torch, g, qo_lens, kv_lens, 16, 16, "bfloat16")
        plan(torch, w, b, causal)
        o, lse = w.run(query=(b["q_nope"], b["q_pe"]), kv_cache=(b["ckv"], b["kpe"]), return_lse=True,
                       return_lse_base_on_e=True)
        o_ref, lse_ref = reference_of(torch, b, causal)
        cs.assert_close(torch, o, o_ref, fsc.tolerance("bfloat16", "o"), f"mla re-plan {kv_lens} o")
        cs.assert_close(torch, lse, lse_ref, fsc.tolerance("bfloat16", "lse"), f"mla re-plan {kv_lens} lse")


def test_captured_in_a_cuda_graph(torch, fsc, rng):
    """use_cuda_graph=True: plan once into the fixed kv_indices buffer, capture run()
    (the lse's base-2 multiply included), write new queries, replay; a second plan() is
    refused (the captured grid follows the first plan's lengths)."""
    g = cs.generator(torch, rng, "mla graph")
    b = mla_batch(torch, g, [1, 1, 1], [40, 0, 300], 16, 16, "bfloat16")
    buf = torch.full((64,), -1, dtype=torch.int32, device="cuda")
    w = fsc.BatchMLAPagedAttentionWrapper(workspace(torch), use_cuda_graph=True, kv_indices=buf)
    plan(torch, w, b, False)
    n = int(b["kv_indptr"][-1])
    assert torch.equal(buf[:n], b["kv_indices"]), "plan() fills the fixed kv_indices buffer"
    q_nope, q_pe = b["q_nope"].clone(), b["q_pe"].clone()
    out = torch.empty_like(q_nope)
    lse = torch.empty((3, 16), dtype=torch.float32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        w.run(q_nope, q_pe, b["ckv"], b["kpe"], out=out, lse=lse, return_lse=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, b["ckv"], b["kpe"], out=out, lse=lse, return_lse=True)
    new_nope = cs.random_rows(torch, g, 3, 16, CKV, "bfloat16")
    new_pe = cs.random_rows(torch, g, 3, 16, KPE, "bfloat16")
    q_nope.copy_(new_nope)
    q_pe.copy_(new_pe)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    o_ref, lse_ref = reference_of(torch, b, False, new_nope, new_pe)
    cs.assert_close(torch, out, o_ref, fsc.tolerance("bfloat16", "o"), "mla graph replay o")
    cs.assert_close(torch, lse.double() * LN2, lse_ref, fsc.tolerance("bfloat16", "lse"), "mla graph replay lse")
    with pytest.raises(RuntimeError, match=rf"{W}\.plan: use_cuda_graph=True: this wrapper has planned once"):
        plan(torch, w, b, False)


def test_the_library_refuses_what_the_kernel_cannot_run(torch, fsc):
    """The shape's bounds are the library's (stages/10_mla/mla.hpp's unsupported_reason),
    each field named under the wrapper's name and FlashInfer's argument names; a
    workspace too small is refused saying what the plan needs."""
    w = fsc.BatchMLAPagedAttentionWrapper(workspace(torch, 1 << 20))
    p = rf"^{W}\.plan: "
    raises(p + r"head_dim_ckv must be 512", w.plan, **plan_with(head_dim_ckv=256))
    raises(p + r"head_dim_kpe must be 64", w.plan, **plan_with(head_dim_kpe=32))
    raises(p + r"num_heads must be in 1\.\.128", w.plan, **plan_with(num_heads=129))
    raises(p + r"num_heads must be in 1\.\.128", w.plan, **plan_with(num_heads=0))
    raises(p + r"page_size must be >= 1", w.plan, **plan_with(page_size=0))
    raises(p + r"kv_len_arr\[1\] = 40 does not fit", w.plan, **plan_with(kv_len_arr=[9, 40, 0]))
    raises(p + r"kv_len_arr\[1\] = 10 leaves its last page empty", w.plan, **plan_with(kv_len_arr=[9, 10, 0]))
    raises(p + r"kv_len_arr\[2\] must be >= 0", w.plan, **plan_with(kv_len_arr=[9, 20, -1]))
    raises(p + r"kv_indptr must not decrease", w.plan, **plan_with(kv_indptr=[0, 1, 0, 3]))
    raises(p + r"qo_indptr\[0\] must be 0", w.plan, **plan_with(qo_indptr=[1, 1, 2, 3]))
    small = fsc.BatchMLAPagedAttentionWrapper(workspace(torch, 256))
    raises(p + r"float_workspace_buffer has 256 bytes; this plan needs \d+", small.plan, **plan_with())
    # a refused plan leaves none to run
    with pytest.raises(ValueError, match=r"run: call plan\(\) first"):
        small.run(None, None, None, None)


# ---- against FlashInfer -----------------------------------------------------------------

@pytest.fixture(scope="module")
def flashinfer():
    return cs.flashinfer_or_skip("flashinfer.mla")


FLASHINFER_CASES = [(backend, mode, page, heads) for backend in ("fa2", "fa3")
                    for mode, page, heads in (("decode", 16, 16), ("decode", 1, 128), ("causal", 64, 16),
                                              ("causal", 16, 128))]


@pytest.mark.parametrize("backend,mode,page_size,num_heads", FLASHINFER_CASES)
def test_against_flashinfer(torch, fsc, flashinfer, rng, backend, mode, page_size, num_heads):
    """The same tensors through FlashInfer's BatchMLAPagedAttentionWrapper (the flat
    plan() and the q_nope/q_pe/ckv_cache/kpe_cache run()), lse in both of FlashInfer's
    bases. FlashInfer is not held to the harness's table: its own distance from the float64
    oracle is measured on these tensors, and ours may differ from it by that distance plus
    the table's (the triangle inequality), while ours stays within the table of the oracle.
    No empty requests: those are the oracle's to check."""
    if backend == "fa3" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashInfer's fa3 MLA backend needs sm_90")
    g = cs.generator(torch, rng, f"mla vs FlashInfer {backend} {mode} page {page_size} heads {num_heads}")
    causal = mode == "causal"
    if causal:
        qo_lens, kv_lens = [4, 9, 2, 1], [4, 200, 65, int(rng.integers(9, 600))]
    else:
        qo_lens, kv_lens = [1] * 5, [1, 31, 33, 300, int(rng.integers(1, 700))]
    b = mla_batch(torch, g, qo_lens, kv_lens, num_heads, page_size, "bfloat16")
    b["ckv"], b["kpe"] = b["ckv"].nan_to_num(0.0), b["kpe"].nan_to_num(0.0)  # FlashInfer may read a whole page
    args = (b["q_nope"], b["q_pe"], b["ckv"], b["kpe"])

    def theirs(base_e):
        fi = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace(torch, 128 << 20), backend=backend)
        fi.plan(qo_indptr=b["qo_indptr"], kv_indptr=b["kv_indptr"], kv_indices=b["kv_indices"],
                kv_len_arr=b["kv_len"], num_heads=num_heads, head_dim_ckv=CKV, head_dim_kpe=KPE,
                page_size=page_size, causal=causal, sm_scale=SM_SCALE, q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16)
        return fi.run(q_nope=args[0], q_pe=args[1], ckv_cache=args[2], kpe_cache=args[3], return_lse=True,
                      return_lse_base_on_e=base_e)

    w = fsc.BatchMLAPagedAttentionWrapper(workspace(torch), backend=backend)
    plan(torch, w, b, causal)
    tol_o, tol_lse = fsc.tolerance("bfloat16", "o"), fsc.tolerance("bfloat16", "lse")
    what = f"mla {mode} page {page_size} heads {num_heads} vs FlashInfer {backend}"
    o_ref, lse_ref = reference_of(torch, b, causal)

    def widened(tol, theirs_, oracle):
        """tol with FlashInfer's own error on these tensors added: (atol + max |theirs -
        oracle|, rtol, norm + ||theirs - oracle|| / ||oracle||)."""
        finite = torch.isfinite(oracle)
        diff = (theirs_.double() - oracle.double())[finite]
        rel = (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(oracle.double()[finite])).item()
        return (tol[0] + diff.abs().max().item(), tol[1], tol[2] + rel)

    for base_e in (False, True):
        try:
            o_fi, lse_fi = theirs(base_e)
        except Exception as e:  # noqa: BLE001  (a case FlashInfer itself refuses is not ours)
            pytest.skip(f"FlashInfer refused {what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        o, lse = w.run(*args, return_lse=True, return_lse_base_on_e=base_e)
        to_e = 1.0 if base_e else LN2  # compare in natural-log units, the tolerance's
        base = "e" if base_e else "2"
        lse_e, lse_fi_e = lse.double() * to_e, lse_fi.double() * to_e
        cs.assert_close(torch, o, o_ref, tol_o, f"{what}: ours vs the oracle, o")
        cs.assert_close(torch, lse_e, lse_ref, tol_lse, f"{what}: ours vs the oracle, lse (base {base})")
        print(f"{what} (base {base}): FlashInfer's largest distance from the oracle: o "
              f"{(o_fi.double() - o_ref.double()).abs().max().item():.3g}, lse "
              f"{(lse_fi_e - lse_ref.double()).abs().max().item():.3g}")
        cs.assert_close(torch, o, o_fi, widened(tol_o, o_fi, o_ref), f"{what} o")
        cs.assert_close(torch, lse_e, lse_fi_e, widened(tol_lse, lse_fi_e, lse_ref), f"{what} lse (base {base})")
