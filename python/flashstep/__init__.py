"""flashstep: the CPU reference of an LLM attention engine, from Python.

Names and argument order follow FlashInfer (``flashinfer.single_decode_with_kv_cache``
and friends). Inputs may be float32 or float64 numpy arrays; the reference computes
in double and every result is a float64 array. Bad input raises ``ValueError`` whose
message names the function and the argument.

Import from a build tree with ``PYTHONPATH=build/python python3 -c "import flashstep"``.
"""
from ._flashstep import *  # noqa: F401,F403
from ._flashstep import __doc__ as _ext_doc  # noqa: F401

__all__ = [name for name in dir() if not name.startswith("_")]
