"""flashstep: the CPU reference of an LLM attention engine, from Python.

Names and argument order follow FlashInfer (``flashinfer.single_decode_with_kv_cache``
and friends). Inputs may be float32 or float64 numpy arrays; the reference computes
in double and every result is a float64 array. A bad argument raises a short
``ValueError`` (a value out of its range) or ``TypeError`` (a value of the wrong type)
whose message names the function and the argument, e.g.
``sampling_from_probs: seed must be an integer in [0, 18446744073709551615], got -1``.
``sm_scale=None`` (the default) means 1/sqrt(head_dim).

Import from a build tree with ``PYTHONPATH=build/python /usr/bin/python3 -c "import flashstep"``.
"""
from . import _arguments, _flashstep

_arguments.install(_flashstep)

from ._flashstep import *  # noqa: F401,F403,E402
from ._flashstep import __doc__ as _ext_doc  # noqa: F401,E402

__all__ = [name for name in dir() if not name.startswith("_")]
