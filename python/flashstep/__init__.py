"""flashstep: the CPU reference of an LLM attention engine, from Python.

Names and argument order follow FlashInfer (``flashinfer.single_decode_with_kv_cache``
and friends). Inputs may be float32 or float64 numpy arrays; the reference computes
in double and every result is a float64 array. A bad argument raises a short
``ValueError`` (a value out of its range) or ``TypeError`` (a value of the wrong type)
whose message names the function and the argument, e.g.
``sampling_from_probs: seed must be an integer in [0, 18446744073709551615], got -1``.
``sm_scale=None`` (the default) means 1/sqrt(head_dim).

Install it with ``python3 -m pip install .`` from the source folder (into a venv, conda or
pyenv Python), or import it from a CMake build tree with
``PYTHONPATH=build/python /usr/bin/python3 -c "import flashstep"``.

The CUDA stages, on PyTorch or CuPy tensors under FlashInfer's wrapper classes, are the
submodule ``flashstep.cuda`` (pure Python over the C library libflashstep_capi.so, which
``pip install .`` puts in this package where nvcc is found). It
imports without the compiled CPU module, so ``PYTHONPATH=python`` from a source checkout
is enough on a GPU machine whose Python the CPU module was not built for.
"""
import importlib.util as _util

try:
    from . import _flashstep
except ImportError:
    if _util.find_spec(__name__ + "._flashstep") is not None:
        raise  # built but broken: say so, as before
    # No compiled CPU module for this Python (e.g. a source checkout on a GPU machine):
    # flashstep.cuda still imports; the reference's names say why they are absent.
    _flashstep = None

    def __getattr__(name):
        raise AttributeError(
            f"flashstep.{name}: the CPU reference module (_flashstep) is not built for this Python; build it "
            "with the README's commands, or use flashstep.cuda for the GPU stages")

    from ._compare import Comparison, compare, tolerance  # noqa: F401,E402  (numpy only)

    __all__ = ["compare", "Comparison", "tolerance"]
else:
    from . import _arguments

    _arguments.install(_flashstep)

    from ._flashstep import *  # noqa: F401,F403,E402
    from ._flashstep import __doc__ as _ext_doc  # noqa: F401,E402

    # A kernel's output against the reference's, under the validation harness's rule and table.
    from ._compare import Comparison, compare, tolerance  # noqa: F401,E402

    __all__ = [name for name in dir() if not name.startswith("_")]
