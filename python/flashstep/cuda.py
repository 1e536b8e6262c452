"""flashstep's CUDA stages from Python, under FlashInfer's names and argument order.

    import torch, flashstep.cuda as fsc
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    decode = fsc.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    decode.plan(kv_indptr, kv_indices, kv_last_page_len, num_qo_heads, num_kv_heads,
                head_dim, page_size, q_data_type=torch.bfloat16)
    o, lse = decode.run(q, paged_kv_cache, return_lse=True)

The classes mirror FlashInfer's wrappers (https://docs.flashinfer.ai): plan() once per
batch composition on the host, run() per layer on the caller's current CUDA stream.
Tensors may come from PyTorch, CuPy, or anything with ``__cuda_array_interface__`` or
``__dlpack__``; outputs are allocated in the caller's framework (PyTorch or CuPy), or
passed as ``out=`` / ``lse=``. A tensor on the wrong device (a CPU tensor included), of
the wrong dtype, shape or strides, or an index array that is not int32, raises
ValueError naming the argument before any kernel runs.

Which stage runs: every wrapper but the MLA one takes ``stage=`` (a registry name such
as "02_paged", or its number, "02"); by default plan() applies ``default_stage()``'s
rule (the stage registry's, in the C library, which stage 09's engine applies too) to
the stages whose registry entry supports the planned shape: a decode with a GQA group of
at most 8 gets 03_split_kv, anything else the latest such stage in teaching order
(``stages()`` lists them with what each supports, ``plan()`` records the choice in
``.stage``). With ``use_cuda_graph=True`` only stages that can plan for a captured graph
are considered, and a graph captured after one plan() replays correctly after any later
plan() of the same batch size (docs/python_gpu.md, "CUDA graphs").

plan() reads index arrays in place (CPU tensors, numpy arrays, array.array, or device
arrays) and copies what the stage reads to the device in one copy per array; it may be
called while the previous run() is still in flight.

Differences from FlashInfer, each on purpose:
- every log-sum-exp returned or taken (``return_lse=True``, merge_state) is the natural
  log; FlashInfer's is base 2 (``lse_flashinfer = lse / ln 2``); the one exception is
  BatchMLAPagedAttentionWrapper, whose run() names the base (``return_lse_base_on_e``)
  and so returns FlashInfer's: base 2 unless it is True;
- no RoPE inside attention (``pos_encoding_mode`` must be "NONE"), no custom masks, and
  head_dim_vo equals head_dim_qk but in ragged prefill where a stage is built for the
  pair (MLA's 192 / 128, stage 07 on an sm_90a GPU);
- the paged cache is one pool ``(num_pages, 2, page_size, Hkv, D)`` (NHD) or
  ``(num_pages, 2, Hkv, page_size, D)`` (HND); a ``(k_cache, v_cache)`` tuple is accepted
  by attention only when it is the two halves of such a pool;
- the samplers draw from the Philox stream of stage 06 and the CPU reference (``seed``,
  ``offset``), so a token matches the reference's draw for draw, not FlashInfer's; with
  no seed, the key comes from torch's generator, as FlashInfer's does;
- the rest (``backend=``, ``jit_args=``, dtypes, ``forward()``, graph sizes, samplers'
  conversions) is in docs/python_gpu.md's table of differences.

The library is libflashstep_capi.so (capi/ in the repository), found through
``$FLASHSTEP_CAPI`` or the build tree; see ``flashstep._capi``.

The code is split by wrapper family, each module private (import from here):
``_cuda_plan`` (the plan a wrapper keeps and the plan()/run() they share),
``_cuda_decode``, ``_cuda_prefill`` (paged and ragged), ``_cuda_cascade``,
``_cuda_mla`` (BatchMLAPagedAttentionWrapper, stages/10_mla/'s runner, which is not a
registry stage), ``_cuda_merge``, ``_cuda_paged_kv`` (append_paged_kv_cache), ``_cuda_rope``,
``_cuda_sampling``, and ``_cuda_common`` (dtypes, argument checks, the stage registry).
"""
import ctypes
import os

from . import _capi
from ._capi import LibraryNotFound  # noqa: F401  (part of the module's interface)
from ._cuda_cascade import MultiLevelCascadeAttentionWrapper
from ._cuda_common import _graph_safe  # noqa: F401  (the registry's graph rule, for the tests)
from ._cuda_common import _DTYPES, _KV_DTYPES, _dtype_name, _kv_dtype_name, _registry, default_stage
from ._cuda_decode import BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper
from ._cuda_merge import merge_state, merge_state_in_place, merge_states
from ._cuda_mla import BatchMLAPagedAttentionWrapper
from ._cuda_paged_kv import append_paged_kv_cache, get_batch_indices_positions
from ._cuda_plan import Plan as _Plan  # noqa: F401  (the plan a wrapper keeps, for the tests)
from ._cuda_prefill import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from ._cuda_rope import (apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
                         apply_llama31_rope_pos_ids_inplace, apply_rope, apply_rope_inplace, apply_rope_pos_ids,
                         apply_rope_pos_ids_inplace)
from ._cuda_sampling import (chain_speculative_sampling, min_p_sampling_from_probs, sampling_from_logits,
                             sampling_from_probs, softmax, top_k_mask_logits, top_k_renorm_probs,
                             top_k_sampling_from_probs, top_k_top_p_sampling_from_logits,
                             top_k_top_p_sampling_from_probs, top_p_renorm_probs, top_p_sampling_from_probs)
from ._tensors import index_array

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper", "MultiLevelCascadeAttentionWrapper", "BatchMLAPagedAttentionWrapper",
    "merge_state", "merge_state_in_place", "merge_states", "append_paged_kv_cache",
    "get_batch_indices_positions", "sampling_from_probs", "sampling_from_logits",
    "top_k_sampling_from_probs", "top_p_sampling_from_probs", "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_logits", "softmax",
    "top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits", "chain_speculative_sampling",
    "apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_llama31_rope",
    "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace",
    "stages", "default_stage", "index_array", "tolerance", "available", "LibraryNotFound",
]


def available():
    """(True, "") when the library loads and a CUDA device is usable; else (False, why).
    On a machine without an NVIDIA GPU, why is "no CUDA GPU found", as the flashstep
    command says it, rather than the runtime's "CUDA driver version is insufficient"."""
    try:
        _capi.load()
        _capi.call("fs_set_device", 0, None)
    except (LibraryNotFound, RuntimeError, ValueError) as e:
        return False, _why_unavailable(str(e))
    return True, ""


# Where the NVIDIA driver puts its device nodes: with neither, the machine has no NVIDIA GPU.
_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0")


def _why_unavailable(message):
    """The library's error, or "no CUDA GPU found" where it only means that: no device
    (cudaErrorNoDevice), or no driver (cudaErrorInsufficientDriver) on a machine without an
    NVIDIA device node, the same rule as the C++ side's gpu_available()."""
    no_device = "no CUDA-capable device" in message
    no_driver = "driver version is insufficient" in message and not any(os.path.exists(p) for p in _DEVICE_NODES)
    return "no CUDA GPU found" if no_device or no_driver else message


def stages():
    """The attention stages of the registry, in teaching order: a list of
    (name, summary, capabilities) tuples. A stage that can plan for a captured CUDA graph
    names cuda_graph in its capabilities."""
    return list(_registry())


def tolerance(dtype, which="o", kv_dtype=None):
    """The validation harness's tolerances (atol, rtol, norm) for q/o in `dtype`
    ("float16", ...), K/V in `kv_dtype` (None: `dtype`; torch.float8_e4m3fn or
    float8_e5m2 for an FP8 cache) and `which` ("o" or "lse"): stages/harness/compare.cpp's
    table."""
    if which not in ("o", "lse"):
        raise ValueError(f"tolerance: which must be 'o' or 'lse'; got {which!r}")
    q = _dtype_name(dtype, "tolerance", "dtype")
    kv = 0 if kv_dtype is None else _KV_DTYPES.get(_kv_dtype_name(kv_dtype, "tolerance", "kv_dtype"), 0)
    atol, rtol, norm = ctypes.c_double(), ctypes.c_double(), ctypes.c_double()
    _capi.call("fs_tolerance", _DTYPES[q], kv, 0 if which == "o" else 1, ctypes.byref(atol), ctypes.byref(rtol),
               ctypes.byref(norm))
    return atol.value, rtol.value, norm.value
