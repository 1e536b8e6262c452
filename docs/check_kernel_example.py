"""A kernel's output checked against the reference, the way the validation harness checks a stage.

"The kernel" here is attention written with numpy in float32 that stores its output in
bf16, the way a GPU kernel would; swap in your own. The docs page "Check your kernel
against the reference" shows this file and its output (captured while the docs are built).

    PYTHONPATH=build/python python3 docs/check_kernel_example.py
"""
import numpy as np

import flashstep


def to_bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), kept in a float32 array: the
    values a bf16 tensor holds (numpy has no bfloat16 type)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def my_attention(q, k, v, qo_indptr, kv_indptr, causal_from_bottom=True):
    """Ragged causal GQA attention in float32, output rounded to bf16: "your kernel"."""
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    o = np.zeros(q.shape, np.float32)
    for r in range(len(qo_indptr) - 1):
        qs, ks = slice(qo_indptr[r], qo_indptr[r + 1]), slice(kv_indptr[r], kv_indptr[r + 1])
        qo_len, kv_len = qs.stop - qs.start, ks.stop - ks.start
        for h in range(heads):
            kh = h // (heads // kv_heads)  # GQA: query head h reads kv head h / group
            s = q[qs, h] @ k[ks, kh].T / np.float32(np.sqrt(dim))
            shift = kv_len - qo_len if causal_from_bottom else 0  # flashstep and FlashInfer: bottom-right
            seen = np.arange(kv_len)[None, :] <= np.arange(qo_len)[:, None] + shift
            s = np.where(seen, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            o[qs, h] = (p / p.sum(axis=1, keepdims=True)) @ v[ks, kh]
    return to_bf16(o)


rng = np.random.default_rng(7)
qo_indptr, kv_indptr = np.array([0, 5, 8], np.int32), np.array([0, 9, 15], np.int32)  # 2 requests
q = to_bf16(rng.standard_normal((8, 4, 64)))  # (tokens, num_qo_heads, head_dim), bf16 values
k = to_bf16(rng.standard_normal((15, 2, 64)))  # (kv tokens, num_kv_heads, head_dim)
v = to_bf16(rng.standard_normal((15, 2, 64)))

# The reference, in double, on the very bf16 values the kernel read.
ref = flashstep.batch_prefill_with_ragged_kv_cache(q, qo_indptr, k, v, kv_indptr, causal=True)

if not hasattr(flashstep, "tolerance_table"):
    print("This build's module has no tolerance table (it was built without the CUDA toolkit);")
    print("flashstep.compare needs atol=, rtol= and norm= here.")
    raise SystemExit(0)

print("The harness's tolerances for a bf16 output:", flashstep.tolerance("bfloat16"))
print()
print("1. The kernel as written:")
print(flashstep.compare(my_attention(q, k, v, qo_indptr, kv_indptr), ref, dtype="bfloat16", qo_indptr=qo_indptr))
print()
print("2. The same kernel with the causal mask aligned top-left (PyTorch SDPA's is_causal):")
report = flashstep.compare(my_attention(q, k, v, qo_indptr, kv_indptr, causal_from_bottom=False), ref,
                           dtype="bfloat16", qo_indptr=qo_indptr)
print(report)
print()
print("first mismatch at index", report.first_mismatch.index, "of o, shape", ref.shape)
