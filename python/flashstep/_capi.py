"""Loading libflashstep_capi.so (the C interface to the CUDA stages, capi/) with ctypes.

The library is looked for, in order, at:
1. ``$FLASHSTEP_CAPI`` (the path of the .so, or a folder holding it); when it is set,
   nowhere else;
2. the package's own folder, where ``pip install .`` puts it (a package that pip built
   without it, where no nvcc was found, says so);
3. ``<build>/bin/`` of the build tree this package was copied into
   (``<build>/python/flashstep/`` -> ``<build>/bin/libflashstep_capi.so``);
4. ``build-gpu/bin/`` and ``build/bin/`` beside the source folder ``python/``.

Nothing is loaded until a GPU function is first called, so ``import flashstep.cuda``
works on any machine; a missing library is reported then, naming every place tried.
"""
import ctypes
import os

LIB_NAME = "libflashstep_capi.so"
ENV_VAR = "FLASHSTEP_CAPI"
BAD_ARGUMENT = 1


class LibraryNotFound(RuntimeError):
    """The C library could not be found or loaded."""


class _Shape(ctypes.Structure):
    """fs_shape of flashstep_capi.h, field for field."""
    _fields_ = [
        ("mode", ctypes.c_int32), ("storage", ctypes.c_int32), ("dtype", ctypes.c_int32),
        ("kv_layout", ctypes.c_int32), ("batch_size", ctypes.c_int32),
        ("num_qo_heads", ctypes.c_int32), ("num_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32), ("page_size", ctypes.c_int32), ("causal", ctypes.c_int32),
        ("num_pages", ctypes.c_int64), ("window_left", ctypes.c_int32),
        ("has_sm_scale", ctypes.c_int32), ("sm_scale", ctypes.c_double),
        ("logits_soft_cap", ctypes.c_double),
        ("qo_indptr", ctypes.c_void_p), ("kv_indptr", ctypes.c_void_p),
        ("kv_last_page_len", ctypes.c_void_p),
        ("cuda_graph", ctypes.c_int32), ("kv_dtype", ctypes.c_int32), ("head_dim_vo", ctypes.c_int32),
    ]


class _StageCaps(ctypes.Structure):
    """fs_stage_caps of flashstep_capi.h: a stage's capabilities as data."""
    _fields_ = [
        ("modes", ctypes.c_uint32), ("storage", ctypes.c_int32), ("dtypes", ctypes.c_uint32),
        ("kv_dtypes", ctypes.c_uint32), ("kv_layouts", ctypes.c_uint32), ("max_page_size", ctypes.c_int32),
        ("max_group_size", ctypes.c_int32), ("flags", ctypes.c_uint32), ("num_head_dims", ctypes.c_int32),
        ("head_dims", ctypes.c_int32 * 8),
    ]


# fs_stage_caps.flags
(CAP_CAUSAL, CAP_WINDOW_LEFT, CAP_LOGITS_SOFT_CAP, CAP_HOST_PAGE_TABLE, CAP_CUDA_GRAPH, CAP_ROPE_LLAMA,
 CAP_SINKS) = (1 << i for i in range(7))


class _Batch(ctypes.Structure):
    """fs_batch of flashstep_capi.h."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q", "qo_indptr", "kv_indptr", "kv_pool", "kv_indices", "kv_last_page_len", "k", "v", "o", "lse")] + [
        ("k_scale", ctypes.c_double), ("v_scale", ctypes.c_double), ("sinks", ctypes.c_void_p),
        ("v_pool", ctypes.c_void_p)]


class _MlaShape(ctypes.Structure):
    """fs_mla_shape of flashstep_capi.h: an MLA batch (stages/10_mla/)."""
    _fields_ = [
        ("dtype", ctypes.c_int32), ("batch_size", ctypes.c_int32), ("num_heads", ctypes.c_int32),
        ("head_dim_ckv", ctypes.c_int32), ("head_dim_kpe", ctypes.c_int32), ("page_size", ctypes.c_int32),
        ("num_pages", ctypes.c_int64), ("causal", ctypes.c_int32), ("sm_scale", ctypes.c_double),
        ("qo_indptr", ctypes.c_void_p), ("kv_indptr", ctypes.c_void_p), ("kv_len", ctypes.c_void_p),
    ]


class _MlaBatch(ctypes.Structure):
    """fs_mla_batch of flashstep_capi.h."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "q_nope", "q_pe", "ckv_pages", "kpe_pages", "kv_indices", "o", "lse")]


class _SamplingParams(ctypes.Structure):
    """fs_sampling_params of flashstep_capi.h."""
    _fields_ = [
        ("top_k", ctypes.c_int64), ("top_k_arr", ctypes.c_void_p),
        ("top_p", ctypes.c_double), ("top_p_arr", ctypes.c_void_p),
        ("min_p", ctypes.c_double), ("min_p_arr", ctypes.c_void_p),
        ("temperature", ctypes.c_double), ("temperature_arr", ctypes.c_void_p),
        ("filter_apply_order", ctypes.c_int32), ("input_dtype", ctypes.c_int32),
    ]


Shape, Batch, SamplingParams, StageCaps = _Shape, _Batch, _SamplingParams, _StageCaps
MlaShape, MlaBatch = _MlaShape, _MlaBatch

_P = ctypes.c_void_p
_I = ctypes.c_int
_I64 = ctypes.c_int64
_U64 = ctypes.c_uint64
_D = ctypes.c_double
_S = ctypes.c_char_p
_SIZE = ctypes.c_size_t
_PP = ctypes.POINTER(ctypes.c_char_p)

# Argument types of every exported function (flashstep_capi.h is the source of truth).
_SIGNATURES = {
    "fs_version": [],
    "fs_stage_count": [],
    "fs_stage_info": [_I, _PP, _PP, _PP],
    "fs_stage_capabilities": [_I, ctypes.POINTER(_StageCaps)],
    "fs_stage_unsupported_reason": [_S, ctypes.POINTER(_Shape), _PP],
    "fs_default_stage": [ctypes.POINTER(_Shape), _I, _PP],
    "fs_default_stage_among": [ctypes.POINTER(ctypes.c_char_p), _I, _I, _I, ctypes.POINTER(_I)],
    "fs_tolerance": [_I, _I, _I, ctypes.POINTER(_D), ctypes.POINTER(_D), ctypes.POINTER(_D)],
    "fs_runner_create": [_S, ctypes.POINTER(_P)],
    "fs_runner_destroy": [_P],
    "fs_runner_workspace_bytes": [_P, ctypes.POINTER(_Shape), ctypes.POINTER(_SIZE)],
    "fs_runner_plan": [_P, ctypes.POINTER(_Shape), _P, _SIZE, _P],
    "fs_runner_run": [_P, _P, _I, _P],
    "fs_cascade_plan": [_P, ctypes.POINTER(_Shape), _I, _P, _P, _P, _P, _P, _P, _SIZE, ctypes.POINTER(_SIZE), _P],
    "fs_mla_unsupported_reason": [ctypes.POINTER(_MlaShape), _I, _PP],
    "fs_mla_runner_create": [ctypes.POINTER(_P)],
    "fs_mla_runner_destroy": [_P],
    "fs_mla_workspace_bytes": [_P, ctypes.POINTER(_MlaShape), ctypes.POINTER(_SIZE)],
    "fs_mla_plan": [_P, ctypes.POINTER(_MlaShape), _P, _SIZE, _P],
    "fs_mla_run": [_P, _P, _P],
    "fs_merge_state": [_I, _P, _P, _P, _P, _I64, _I64, _I64, _P, _P, _P],
    "fs_merge_states": [_I, _P, _P, _I64, _I64, _I64, _I64, _P, _P, _P],
    "fs_append_paged_kv_cache": [_I, _I, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _I64, _I, _I, _I, _I,
                                 _I64, _P, _P, _I, ctypes.c_double, ctypes.c_double, _P, _P],
    "fs_sampling_workspace_bytes": [_S, _I64, _I64, _I64, _I, ctypes.POINTER(_SIZE)],
    "fs_sample": [_S, _P, _I64, _I64, ctypes.POINTER(_SamplingParams), _P, _I64, _U64, _U64, _P, _P, _P,
                  _P, _SIZE, _P],
    "fs_row_transform": [_S, _P, _I64, _I64, ctypes.POINTER(_SamplingParams), _P, _P, _P],
    "fs_chain_speculative_sampling": [_P, _P, _P, _I64, _I64, _I64, _P, _P, _P, _P, _U64, _U64, _P],
    "fs_sampling_status_name": [_I, _PP],
    "fs_memcpy": [_P, _P, _SIZE, _P, _I],
    "fs_pointer_device": [_P, ctypes.POINTER(_I), ctypes.POINTER(_I)],
    "fs_set_device": [_I, ctypes.POINTER(_I)],
    "fs_stream_synchronize": [_P],
}
EXPECTED_VERSION = 11

_lib = None


def candidates():
    """Where the library is looked for, in order: $FLASHSTEP_CAPI when it is set (then
    nowhere else: a path asked for is not second-guessed); else the package's own folder,
    where `pip install .` puts it; else the build folders (see the module docstring).
    A package that pip built without the library says why (LibraryNotFound)."""
    import sys  # here, so that this function alone holds the search

    env = os.environ.get(ENV_VAR)
    if env:
        return [os.path.join(env, LIB_NAME) if os.path.isdir(env) else env]
    here = os.path.dirname(os.path.abspath(__file__))
    # The package's folders: this file's, and, in an editable install (pip install -e .),
    # the one in site-packages that holds the compiled files.
    folders = [here]
    for folder in getattr(sys.modules.get(__package__), "__path__", []):
        if os.path.abspath(folder) not in folders:
            folders.append(os.path.abspath(folder))
    found = [os.path.join(folder, LIB_NAME) for folder in folders]
    if os.path.exists(os.path.join(here, "_build_info.py")) and not any(map(os.path.exists, found)):
        # Installed by pip (not editable): no build folder to look in.
        from . import _build_info
        raise LibraryNotFound(
            f"flashstep.cuda: this flashstep package has no {LIB_NAME}: {_build_info.WHY_NO_CAPI}. "
            "Install it again where nvcc is on PATH (python3 -m pip install . in the source folder), "
            f"or set {ENV_VAR} to a {LIB_NAME} built elsewhere (scripts/gpu-build.sh builds one).")
    source_root = os.path.normpath(os.path.join(here, "..", ".."))
    found.append(os.path.join(source_root, "bin", LIB_NAME))
    for build in ("build-gpu", "build"):
        found.append(os.path.join(source_root, build, "bin", LIB_NAME))
    return found


def load():
    """The loaded library (loaded once); raises LibraryNotFound naming every path tried."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in candidates():
        if not os.path.exists(path):
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        # The version first: a library of another version may lack a function named below.
        lib.fs_version.argtypes, lib.fs_version.restype = [], ctypes.c_int
        if lib.fs_version() != EXPECTED_VERSION:
            raise LibraryNotFound(f"{path} has C interface version {lib.fs_version()}, this module "
                                  f"needs {EXPECTED_VERSION}: rebuild the library")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        lib.fs_last_error.argtypes = []
        lib.fs_last_error.restype = ctypes.c_char_p
        _lib = lib
        return lib
    raise LibraryNotFound(
        "flashstep.cuda: cannot load the C library " + LIB_NAME + "; tried:\n  " + "\n  ".join(tried) +
        f"\nBuild it (scripts/gpu-build.sh builds it into build-gpu/bin/) or set {ENV_VAR} to its path.")


def call(name, *args):
    """Calls fs_<name>; a refused argument raises ValueError, anything else RuntimeError,
    each with the library's message."""
    status = getattr(load(), name)(*args)
    if status != 0:
        raise_status(status)


def raise_status(status):
    """Raises for a non-zero status of the last call on this thread: ValueError for a
    refused argument, RuntimeError for anything else, with the library's message. For
    callers that keep a function of the library and call it directly (run()'s hot path)."""
    message = (_lib.fs_last_error() or b"").decode("utf-8", "replace")
    raise (ValueError if status == BAD_ARGUMENT else RuntimeError)(message)
