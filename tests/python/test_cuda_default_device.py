"""flashstep.cuda where PyTorch's default device is the GPU (torch.set_default_device,
as engines set it): every sampler with no generator, a CPU generator and a CUDA
generator; every attention wrapper's plan() and run() with index arrays that land on the
GPU and with host ones; and the calls an engine makes on their fast paths (run(out=),
samplers with a seed) against the general path on the same inputs. Skipped with a
message where PyTorch, a GPU or the C library is missing.
"""
import itertools

import numpy as np
import pytest

import cuda_support as cs

WORKSPACE_BYTES = 64 << 20


@pytest.fixture
def cuda_default(torch):
    """torch.set_default_device("cuda") for the test, the previous default after it."""
    previous = torch.get_default_device()
    torch.set_default_device("cuda")
    yield
    torch.set_default_device(previous)


def make_generator(torch, kind, seed):
    if kind is None:
        torch.cuda.manual_seed(seed)  # the default CUDA generator, which the samplers read
        return None
    g = torch.Generator(device=kind)
    g.manual_seed(seed)
    return g


def samplers(fsc, probs, logits, generator):
    """Every sampler of flashstep.cuda, called as FlashInfer's users call it."""
    kw = {"generator": generator}
    return {
        "sampling_from_probs": lambda: fsc.sampling_from_probs(probs, **kw),
        "sampling_from_logits": lambda: fsc.sampling_from_logits(logits, **kw),
        "top_k_sampling_from_probs": lambda: fsc.top_k_sampling_from_probs(probs, 20, **kw),
        "top_p_sampling_from_probs": lambda: fsc.top_p_sampling_from_probs(probs, 0.9, **kw),
        "min_p_sampling_from_probs": lambda: fsc.min_p_sampling_from_probs(probs, 0.05, **kw),
        "top_k_top_p_sampling_from_probs": lambda: fsc.top_k_top_p_sampling_from_probs(probs, 20, 0.9, **kw),
        "top_k_top_p_sampling_from_probs joint": lambda: fsc.top_k_top_p_sampling_from_probs(
            probs, 20, 0.9, filter_apply_order="joint", **kw),
        "top_k_top_p_sampling_from_logits": lambda: fsc.top_k_top_p_sampling_from_logits(logits, 20, 0.9, **kw),
        "top_k_top_p_sampling_from_logits bf16": lambda: fsc.top_k_top_p_sampling_from_logits(
            logits.bfloat16(), 20, 0.9, **kw),
    }


@pytest.mark.parametrize("generator_device", [None, "cpu", "cuda"])
def test_every_sampler_under_a_cuda_default_device(torch, fsc, rng, cuda_default, generator_device):
    seed = int(rng.integers(2**62))
    print(f"torch seed {seed}, generator {generator_device or 'the default CUDA one'}")
    for batch, vocab in ((19, 32000), (99, 32000), (3, 1000)):
        logits = torch.randn(batch, vocab) * 3  # on the GPU: the default device
        assert logits.is_cuda
        probs = torch.softmax(logits, -1)
        first = {}
        for repeat in range(2):  # the same seed draws the same tokens
            calls = samplers(fsc, probs, logits, make_generator(torch, generator_device, seed))
            for name, call in calls.items():
                tokens = call()
                assert tokens.is_cuda and tokens.dtype == torch.int32 and tokens.shape == (batch,), name
                assert bool(((tokens >= 0) & (tokens < vocab)).all()), f"{name}: {tokens}"
                assert bool((probs.gather(1, tokens.long()[:, None]) > 0).all()), f"{name}: a token of mass 0"
                if repeat == 0:
                    first[name] = tokens
                else:
                    assert torch.equal(first[name], tokens), f"{name}: the same generator seed drew other tokens"
    # chain speculative sampling draws from the generator too
    draft = torch.softmax(torch.randn(4, 3, 500), -1)
    target = torch.softmax(torch.randn(4, 4, 500), -1)
    ids = torch.multinomial(draft.reshape(-1, 500), 1).reshape(4, 3).int()
    out, accepted, emitted = fsc.chain_speculative_sampling(draft, ids, target,
                                                            generator=make_generator(torch, generator_device, seed))
    assert out.is_cuda and out.shape == (4, 4) and accepted.shape == (4,) and emitted.shape == (4,)


def test_flashinfer_default_device_case(torch, fsc, cuda_default):
    """FlashInfer's own test_sampling_with_default_device_cuda, in our words: vocab 32000,
    batch 19 and 99, top_k_top_p_sampling_from_logits with no generator."""
    for batch in (19, 99):
        logits = torch.randn(batch, 32000)
        tokens = fsc.top_k_top_p_sampling_from_logits(logits, 100, 0.9)
        torch.cuda.synchronize()
        assert tokens.shape == (batch,) and bool(((tokens >= 0) & (tokens < 32000)).all())


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("kind", ["decode", "prefill", "ragged", "cascade"])
@pytest.mark.parametrize("index_device", ["cuda", "cpu"])
def test_every_wrapper_under_a_cuda_default_device(torch, fsc, rng, cuda_default, kind, index_device):
    g = cs.generator(torch, rng, f"default device {kind}")
    hq, hkv, d, page, dtype = 8, 2, 128, 16, "bfloat16"
    kv_lens = [1, 17, 300, int(rng.integers(1, 700))]
    qo_lens = [1] * len(kv_lens) if kind in ("decode", "cascade") else [max(1, n // 3) for n in kv_lens]
    on = lambda t: t.to(index_device)  # noqa: E731
    # torch.tensor without a device: on the GPU under this default device
    qo_indptr = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32)
    q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
    if kind == "ragged":
        w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
        k = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
        v = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
        kv_indptr = torch.tensor([0] + list(itertools.accumulate(kv_lens)), dtype=torch.int32)
        w.plan(on(qo_indptr), on(kv_indptr), hq, hkv, d, causal=True, q_data_type=dtype)
        args = (q, k, v)
        keys = [k[int(kv_indptr[i]):int(kv_indptr[i + 1])] for i in range(len(kv_lens))]
        values = [v[int(kv_indptr[i]):int(kv_indptr[i + 1])] for i in range(len(kv_lens))]
        causal = True
    elif kind == "cascade":
        w = fsc.MultiLevelCascadeAttentionWrapper(2, workspace(torch))
        pool, levels, keys, values = cs.cascade_batch(torch, g, qo_lens, kv_lens, 32, 0, page, hkv, d, dtype, "NHD")
        w.plan(*[[on(a) for a in level] for level in levels], hq, hkv, d, page, q_data_type=dtype)
        args = (q, pool)
        causal = False
    else:
        pool, indptr, indices, last, keys, values = cs.paged_batch(torch, g, kv_lens, page, hkv, d, dtype, "NHD")
        if kind == "decode":
            w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
            w.plan(on(indptr), on(indices), on(last), hq, hkv, d, page, q_data_type=dtype)
            causal = False
        else:
            w = fsc.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
            w.plan(on(qo_indptr), on(indptr), on(indices), on(last), hq, hkv, d, page, causal=True,
                   q_data_type=dtype)
            causal = True
        args = (q, pool)
    o, lse = w.run(*args, return_lse=True)
    rows = [slice(int(qo_indptr[i]), int(qo_indptr[i + 1])) for i in range(len(kv_lens))]
    refs = [cs.attention_reference(torch, q[r], keys[i], values[i], causal=causal) for i, r in enumerate(rows)]
    cs.assert_close(torch, o, torch.cat([r[0] for r in refs]), fsc.tolerance(dtype, "o"), f"{kind} {w.stage} o")
    cs.assert_close(torch, lse, torch.cat([r[1] for r in refs]), fsc.tolerance(dtype, "lse"), f"{kind} lse")


def test_merge_state_under_a_cuda_default_device(torch, fsc, rng, cuda_default):
    g = cs.generator(torch, rng, "merge default device")
    v_a, v_b = (torch.randn(5, 4, 64, generator=g, device="cuda").half() for _ in range(2))
    s_a, s_b = (torch.randn(5, 4, generator=g, device="cuda") for _ in range(2))
    v, s = fsc.merge_state(v_a, s_a, v_b, s_b)
    s_want = torch.logaddexp(s_a, s_b)
    v_want = v_a.float() * torch.exp(s_a - s_want)[..., None] + v_b.float() * torch.exp(s_b - s_want)[..., None]
    assert torch.allclose(s, s_want, atol=1e-5) and torch.allclose(v.float(), v_want, atol=2e-3)


# ---- the fast paths against the general path ---------------------------------------------


def test_sampler_fast_path_draws_the_general_paths_tokens(torch, fsc, rng):
    """A contiguous tensor with Python-number parameters takes the fast path; the same call
    with indices = arange(batch) (output i reads row i) or a numpy float parameter takes
    the general one. Same seed and offset: the same tokens, the same status."""
    seed, offset = int(rng.integers(2**63)), int(rng.integers(1000))
    print(f"seed {seed} offset {offset}")
    g = cs.generator(torch, rng, "fast path")
    for batch, vocab in ((1, 32000), (7, 128256), (64, 1000)):
        logits = torch.randn(batch, vocab, generator=g, device="cuda") * 4
        probs = torch.softmax(logits, -1)
        idx = torch.arange(batch, dtype=torch.int32, device="cuda")
        kw = {"seed": seed, "offset": offset}
        pairs = {
            "sampling_from_probs": (lambda: fsc.sampling_from_probs(probs, **kw),
                                    lambda: fsc.sampling_from_probs(probs, indices=idx, **kw)),
            "sampling_from_logits": (lambda: fsc.sampling_from_logits(logits, **kw),
                                     lambda: fsc.sampling_from_logits(logits, indices=idx, **kw)),
            "sampling_from_logits bf16": (lambda: fsc.sampling_from_logits(logits.bfloat16(), **kw),
                                          lambda: fsc.sampling_from_logits(logits.bfloat16(), indices=idx, **kw)),
            "top_k": (lambda: fsc.top_k_sampling_from_probs(probs, 40, **kw),
                      lambda: fsc.top_k_sampling_from_probs(probs, 40, indices=idx, **kw)),
            "top_p": (lambda: fsc.top_p_sampling_from_probs(probs, 0.8, **kw),
                      lambda: fsc.top_p_sampling_from_probs(probs, np.float64(0.8), **kw)),
            "min_p": (lambda: fsc.min_p_sampling_from_probs(probs, 0.1, **kw),
                      lambda: fsc.min_p_sampling_from_probs(probs, np.float64(0.1), **kw)),
            "top_k_top_p": (lambda: fsc.top_k_top_p_sampling_from_probs(probs, 40, 0.8, **kw),
                            lambda: fsc.top_k_top_p_sampling_from_probs(probs, 40, np.float64(0.8), **kw)),
            "top_k_top_p joint": (
                lambda: fsc.top_k_top_p_sampling_from_probs(probs, 40, 0.8, filter_apply_order="joint", **kw),
                lambda: fsc.top_k_top_p_sampling_from_probs(probs, 40, 0.8, filter_apply_order="joint",
                                                            indices=idx, **kw)),
            "top_k_top_p logits": (
                lambda: fsc.top_k_top_p_sampling_from_logits(logits, 40, 0.8, **kw),
                lambda: fsc.top_k_top_p_sampling_from_logits(logits, 40, 0.8, indices=idx, **kw)),
        }
        for name, (fast, general) in pairs.items():
            a, b = fast(), general()
            assert torch.equal(a, b), f"{name} batch {batch} vocab {vocab}: fast path {a} != general path {b}"
        s_fast, status_fast = fsc.top_p_sampling_from_probs(probs, 0.8, return_status=True, **kw)
        s_gen, status_gen = fsc.top_p_sampling_from_probs(probs, 0.8, indices=idx, return_status=True, **kw)
        assert torch.equal(s_fast, s_gen) and torch.equal(status_fast, status_gen)
        assert bool((status_fast == 0).all())
    # bad parameters on the fast path are refused by name, as on the general one
    with pytest.raises(ValueError, match="top_p"):
        fsc.top_p_sampling_from_probs(probs, 1.5, seed=1)
    with pytest.raises(ValueError, match="seed"):
        fsc.top_p_sampling_from_probs(probs, 0.5, seed=-1)


@pytest.mark.parametrize("kind", ["decode", "ragged"])
def test_run_with_out_and_lse_on_the_fast_path(torch, fsc, rng, kind):
    """run(q, ..., out=o) (the engine's call) writes o in place and returns it; with lse=
    and return_lse it writes both; the values equal run() without them. Bad out= and lse=
    are refused by name, as on the general path."""
    g = cs.generator(torch, rng, f"run out= {kind}")
    hq, hkv, d, page, dtype = 32, 8, 128, 16, "bfloat16"
    kv_lens = [256, 1, 900]
    if kind == "decode":
        w = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
        pool, indptr, indices, last, _, _ = cs.paged_batch(torch, g, kv_lens, page, hkv, d, dtype, "NHD")
        w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=dtype)
        q = cs.random_rows(torch, g, len(kv_lens), hq, d, dtype)
        args = (q, pool)
    else:
        w = fsc.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
        qo_lens = [3, 1, 40]
        qo = torch.tensor([0] + list(itertools.accumulate(qo_lens)), dtype=torch.int32, device="cuda")
        kv = torch.tensor([0] + list(itertools.accumulate(kv_lens)), dtype=torch.int32, device="cuda")
        w.plan(qo, kv, hq, hkv, d, causal=True, q_data_type=dtype)
        q = cs.random_rows(torch, g, sum(qo_lens), hq, d, dtype)
        k = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
        v = cs.random_rows(torch, g, sum(kv_lens), hkv, d, dtype)
        args = (q, k, v)
    want_o, want_lse = w.run(*args, return_lse=True)
    o = torch.full_like(q, float("nan"))
    got = w.run(*args, out=o)
    assert got is o and torch.equal(o, want_o)
    o2 = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], hq), float("nan"), dtype=torch.float32, device="cuda")
    got_o, got_lse = w.run(*args, out=o2, lse=lse, return_lse=True)
    assert got_o is o2 and got_lse is lse and torch.equal(o2, want_o) and torch.equal(lse, want_lse)
    with pytest.raises(ValueError, match="out"):
        w.run(*args, out=torch.empty(q.shape[0] + 1, hq, d, dtype=q.dtype, device="cuda"))
    with pytest.raises(ValueError, match="out"):
        w.run(*args, out=torch.empty_like(q, dtype=torch.float16))
    with pytest.raises(ValueError, match="lse"):
        w.run(*args, lse=torch.empty(q.shape[0], hq + 1, dtype=torch.float32, device="cuda"))


def test_a_cuda_generator_gives_its_state_and_moves_on(torch, fsc, rng):
    """A CUDA generator's (seed, offset) is its Philox key and offset as its state tensor
    holds them; the call advances the offset by the words a call may use (1 << 16), and
    draws what an explicit seed and offset draw."""
    g = torch.Generator(device="cuda")
    g.manual_seed(int(rng.integers(2**62)))
    probs = torch.softmax(torch.randn(9, 5000, generator=g, device="cuda"), -1)
    for call in (lambda **kw: fsc.top_p_sampling_from_probs(probs, 0.8, **kw),
                 lambda **kw: fsc.sampling_from_logits(probs.log(), **kw)):
        state = g.get_state().view(torch.int64)
        seed, offset = int(state[0]) % 2**64, int(state[1])
        drawn = call(generator=g)
        after = g.get_state().view(torch.int64)
        assert int(after[0]) % 2**64 == seed and int(after[1]) == offset + (1 << 16)
        assert torch.equal(drawn, call(seed=seed, offset=offset))
