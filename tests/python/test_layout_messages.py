"""Plain messages for the mistakes a FlashInfer user makes first, on any machine (no GPU):
a page pool in one layout passed under the other, a kv_layout spelled differently, and
flashstep.cuda.available() on a machine without an NVIDIA GPU."""
import numpy as np
import pytest

import flashstep
import flashstep.cuda as fsc
from flashstep import _capi, _cuda_common


class FakeCuda:
    """A device array as CuPy describes it; its pointer is never dereferenced."""

    def __init__(self, shape, typestr="<f2"):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (1 << 40, False),
                                         "strides": None, "version": 3}


NHD_POOL = (4, 2, 16, 2, 64)  # page_size 16, 2 kv heads, head_dim 64


def cpu_module_or_skip():
    """The CPU reference module, or a skip where this Python has only flashstep.cuda (a GPU
    machine running the source folder's python/ without the built module)."""
    if flashstep._flashstep is None:
        pytest.skip("the CPU reference module (_flashstep) is not built for this Python")


def decode_args():
    q = np.random.default_rng(0).standard_normal((2, 4, 64)).astype(np.float32)
    pool = np.zeros(NHD_POOL, np.float32)
    return q, pool, np.array([0, 2, 4], np.int32), np.arange(4, dtype=np.int32), np.array([16, 5], np.int32)


def test_reference_names_a_pool_in_the_other_layout():
    cpu_module_or_skip()
    q, pool, indptr, indices, last = decode_args()
    with pytest.raises(ValueError, match=r"^batch_decode_with_paged_kv_cache: paged_kv_cache looks like NHD, "
                                         r"kv_layout says HND: .*Pass kv_layout=\"NHD\""):
        flashstep.batch_decode_with_paged_kv_cache(q, pool, indptr, indices, last, kv_layout="HND")
    # the same pool under its own layout runs
    assert flashstep.batch_decode_with_paged_kv_cache(q, pool, indptr, indices, last).shape == (2, 4, 64)


def test_reference_kv_layout_errors_name_the_function():
    cpu_module_or_skip()
    q, pool, indptr, indices, last = decode_args()
    with pytest.raises(ValueError, match=r"^batch_decode_with_paged_kv_cache: kv_layout must be \"NHD\""):
        flashstep.batch_decode_with_paged_kv_cache(q, pool, indptr, indices, last, kv_layout="nhd")
    with pytest.raises(ValueError, match=r"^single_decode_with_kv_cache: kv_layout must be"):
        flashstep.single_decode_with_kv_cache(q[0], pool[0, 0], pool[0, 1], kv_layout="NDH")


def test_cuda_kv_layout_errors_name_the_function_and_the_pools():
    with pytest.raises(ValueError, match=r"^BatchDecodeWithPagedKVCacheWrapper: kv_layout must be 'NHD' or 'HND' "
                                         r"\(page pools of .*got 'hnd' \(the names are upper case\)"):
        fsc.BatchDecodeWithPagedKVCacheWrapper(FakeCuda((1 << 20,), "|u1"), "hnd")


def test_cuda_pool_shape_against_the_layout():
    check = _cuda_common._check_pool_layout
    # an NHD pool (page_size 16, 2 kv heads) where the wrapper was told HND
    with pytest.raises(ValueError, match=r"^run: paged_kv_cache looks like NHD, kv_layout says HND: its shape "
                                         r"\(4, 2, 16, 2, 64\) has page_size 16 then num_kv_heads 2"):
        check("run", "paged_kv_cache", NHD_POOL, "HND", 16, 2, 64)
    with pytest.raises(ValueError, match=r"looks like HND, kv_layout says NHD"):
        check("run", "paged_kv_cache[0]", (4, 2, 16, 64), "NHD", 16, 2, 64)
    check("run", "paged_kv_cache", NHD_POOL, "NHD", 16, 2, 64)  # fits: nothing to say
    check("run", "paged_kv_cache", (4, 2, 8, 8, 64), "HND", 16, 2, 64)  # fits neither: the general check's


def test_append_names_a_pool_in_the_other_layout():
    rows = FakeCuda((6, 2, 64))
    idx = FakeCuda((6,), "<i4")
    table = (FakeCuda((4,), "<i4"), FakeCuda((3,), "<i4"), FakeCuda((2,), "<i4"))
    with pytest.raises(ValueError, match=r"^append_paged_kv_cache: paged_kv_cache looks like NHD, kv_layout says "
                                         r"HND: append_key's 2 kv heads"):
        fsc.append_paged_kv_cache(rows, rows, idx, idx, FakeCuda((10, 2, 16, 2, 64)), *table, kv_layout="HND")


@pytest.mark.parametrize("message, nodes, expected", [
    ("fs_set_device: CUDA error: CUDA driver version is insufficient for CUDA runtime version", False,
     "no CUDA GPU found"),
    ("fs_set_device: CUDA error: no CUDA-capable device is detected", True, "no CUDA GPU found"),
    # a machine with an NVIDIA device node but an old driver: the runtime's words are the news
    ("fs_set_device: CUDA error: CUDA driver version is insufficient for CUDA runtime version", True,
     "fs_set_device: CUDA error: CUDA driver version is insufficient for CUDA runtime version"),
])
def test_available_says_no_cuda_gpu_found(monkeypatch, message, nodes, expected):
    def refuse(*args):
        raise RuntimeError(message)
    monkeypatch.setattr(_capi, "load", lambda: None)
    monkeypatch.setattr(_capi, "call", refuse)
    monkeypatch.setattr(fsc.os.path, "exists", lambda path: nodes and path in fsc._DEVICE_NODES)
    assert fsc.available() == (False, expected)
