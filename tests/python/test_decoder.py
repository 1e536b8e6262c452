"""The tiny decoder from Python: a numpy transcription of the course's equations, the
three generation modes, the memory numbers by hand, seeded sampling, bad input."""
import numpy as np
import pytest

import flashstep

MODES = ["recompute", "contiguous_kv_cache", "paged_kv_cache"]


def np_rotate(x, rope_theta, interleave):
    """RoPE on (n, heads, hd) rows at positions 0..n-1, pairs as complex numbers."""
    n, _, hd = x.shape
    angle = np.arange(n)[:, None] * rope_theta ** (-np.arange(0, hd, 2) / hd)[None, :]
    turn = np.exp(1j * angle)[:, None, :]
    out = x.copy()
    if interleave:
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * turn
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
    else:
        z = (x[..., : hd // 2] + 1j * x[..., hd // 2:]) * turn
        out[..., : hd // 2], out[..., hd // 2:] = z.real, z.imag
    return out


def np_next_token_logits(model, tokens, num_layers, num_qo_heads, num_kv_heads, rope=None):
    """X = E[tokens] + sinusoidal positions; per layer causal multi-head attention
    (GQA), W_O, residual; logits = X[-1] W_vocab. rope=(theta, interleave): X = E[tokens],
    and Q and K rotated per layer instead."""
    emb = model.embedding
    n, d = len(tokens), emb.shape[1]
    pos = np.arange(n)[:, None]
    j = np.arange(d)[None, :]
    angle = pos / 10000.0 ** ((j - j % 2) / d)
    x = emb[np.array(tokens)] + (0 if rope else np.where(j % 2 == 0, np.sin(angle), np.cos(angle)))
    hd = d // num_qo_heads
    group = num_qo_heads // num_kv_heads
    mask = np.tril(np.ones((n, n), bool))
    for layer in range(num_layers):
        w = model.layer_weights(layer)
        q = (x @ w["w_q"]).reshape(n, num_qo_heads, hd)
        k = (x @ w["w_k"]).reshape(n, num_kv_heads, hd)
        if rope:
            q, k = np_rotate(q, *rope), np_rotate(k, *rope)
        k = np.repeat(k, group, axis=1)
        v = np.repeat((x @ w["w_v"]).reshape(n, num_kv_heads, hd), group, axis=1)
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd)
        s = np.where(mask[None], s, -np.inf)
        a = np.exp(s - s.max(axis=2, keepdims=True))
        a /= a.sum(axis=2, keepdims=True)
        z = np.einsum("hij,jhd->ihd", a, v).reshape(n, num_qo_heads * hd)
        x = x + (z @ w["w_o"] if w["w_o"] is not None else z)
    return x[-1] @ model.w_vocab


@pytest.mark.parametrize("layers,qo,kv,proj", [(2, 4, 2, True), (1, 2, 2, False), (3, 4, 1, True)])
def test_forward_is_the_courses_equations(rng, layers, qo, kv, proj):
    seed = int(rng.integers(2**63))
    model = flashstep.TinyDecoder(num_layers=layers, num_qo_heads=qo, num_kv_heads=kv, output_projection=proj,
                                  weight_seed=seed)
    tokens = rng.integers(0, 256, int(rng.integers(1, 15)))
    np.testing.assert_allclose(model.next_token_logits(tokens),
                               np_next_token_logits(model, tokens, layers, qo, kv), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("theta,interleave", [(1e4, False), (5e5, True)])
def test_rope_forward_and_modes(rng, theta, interleave):
    seed = int(rng.integers(2**63))
    model = flashstep.TinyDecoder(num_layers=2, num_qo_heads=4, num_kv_heads=2, weight_seed=seed,
                                  position_encoding="rope", rope_theta=theta, rope_interleave=interleave)
    tokens = rng.integers(0, 256, 11)
    np.testing.assert_allclose(model.next_token_logits(tokens),
                               np_next_token_logits(model, tokens, 2, 4, 2, rope=(theta, interleave)),
                               rtol=1e-10, atol=1e-10)
    prompts = ["The cat sat", "The cat ran fast"]
    runs = [model.generate(prompts, mode=m, max_new_tokens=5, record_logits=True) for m in MODES]
    for r in range(len(prompts)):
        for run in runs[1:]:
            np.testing.assert_array_equal(run.requests[r].generated_tokens, runs[0].requests[r].generated_tokens)
            np.testing.assert_allclose(run.requests[r].step_logits, runs[0].requests[r].step_logits, atol=1e-10)
    with pytest.raises(ValueError, match="position_encoding"):
        flashstep.TinyDecoder(position_encoding="alibi")


def test_three_modes_generate_the_same_tokens(rng):
    model = flashstep.TinyDecoder(weight_seed=int(rng.integers(2**63)))
    base = "".join(chr(c) for c in rng.integers(32, 127, 9))
    prompts = [base + "xyz", base + "hello", base[:3], "unrelated!"]
    runs = [model.generate(prompts, mode=m, max_new_tokens=6, page_size=3, record_logits=True) for m in MODES]
    for r in range(len(prompts)):
        for run in runs[1:]:
            np.testing.assert_array_equal(run.requests[r].generated_tokens, runs[0].requests[r].generated_tokens)
            np.testing.assert_allclose(run.requests[r].step_logits, runs[0].requests[r].step_logits, atol=1e-10)
        logits = runs[0].requests[r].step_logits
        np.testing.assert_array_equal(runs[0].requests[r].generated_tokens, logits.argmax(axis=1))
        assert runs[0].requests[r].generated_bytes == bytes(runs[0].requests[r].generated_tokens.astype(np.uint8))
    # The second prompt reuses base (3 whole pages); base[:3] matches on 2 tokens, under a page.
    assert runs[2].memory.prefix_tokens_reused == 9


def test_worked_example_prompts_memory_numbers():
    demo = flashstep.tiny_decoder_demo()
    assert demo.tokens_agree
    recompute, contiguous, paged = demo.runs
    per_token = 2 * 2 * 8 * 2 * 2  # K and V, 2 kv heads, head_dim 8, 2 layers, fp16
    # "The cat sat" + 7 and "The cat ran fast" + 7 tokens held; page_size 4; "The cat " shared.
    assert paged.memory.prefix_tokens_reused == 8
    assert paged.memory.shared_pages == 2
    assert paged.memory.pages_used == 5 + 6 - 2
    assert paged.memory.kv_bytes_kept == 9 * 4 * per_token
    assert contiguous.memory.kv_bytes_kept == (18 + 23) * per_token
    assert recompute.memory.kv_bytes_kept == 0
    assert paged.memory.contiguous_preallocated_bytes == (11 + 8 + 16 + 8) * per_token
    assert [r.prompt for r in paged.requests] == ["The cat sat", "The cat ran fast"]


def test_sampling_is_seeded_and_reproducible(rng):
    model = flashstep.TinyDecoder()
    seed = int(rng.integers(2**62))
    kw = dict(max_new_tokens=10, temperature=1.3, seed=seed)
    a = model.generate(["The cat sat", "Hello"], mode="paged_kv_cache", **kw)
    b = model.generate(["The cat sat", "Hello"], mode="contiguous_kv_cache", **kw)
    for x, y in zip(a.requests, b.requests):
        np.testing.assert_array_equal(x.generated_tokens, y.generated_tokens)
    c = model.generate(["The cat sat", "Hello"], mode="paged_kv_cache", **{**kw, "seed": seed + 99})
    assert any(not np.array_equal(x.generated_tokens, y.generated_tokens) for x, y in zip(a.requests, c.requests))
    greedy = model.generate(["The cat sat"], max_new_tokens=10)
    top1 = model.generate(["The cat sat"], max_new_tokens=10, temperature=2.0, top_k=1, seed=seed)
    np.testing.assert_array_equal(greedy.requests[0].generated_tokens, top1.requests[0].generated_tokens)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda m: m.generate([]), "prompts"),
        (lambda m: m.generate([""]), "prompts[0] is empty"),
        (lambda m: m.generate(["a"], mode="paged"), "mode must be"),
        (lambda m: m.generate(["a"], temperature=-1.0), "temperature"),
        (lambda m: m.generate(["a"], page_size=0), "page_size"),
        (lambda m: m.generate(["The cat sat"], num_pages=1), "too small"),
        (lambda m: m.layer_weights(5), "layer 5"),
        (lambda m: flashstep.TinyDecoder(d_model=30), "d_model (30)"),
    ],
)
def test_bad_input_raises_value_error(call, fragment):
    with pytest.raises(ValueError, match=None) as e:
        call(flashstep.TinyDecoder())
    assert fragment in str(e.value)
