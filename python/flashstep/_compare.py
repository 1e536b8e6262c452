"""flashstep.compare: a kernel's output against the reference's, judged as the harness judges.

    import flashstep
    ref = flashstep.single_prefill_with_kv_cache(q, k, v, causal=True)   # float64, the reference
    report = flashstep.compare(out, ref, dtype="bfloat16")              # out: numpy or torch
    print(report)            # PASS/FAIL, errors against tolerances, the first mismatches
    assert report.ok, report

The rule is the validation harness's (stages/harness/compare.hpp, ARCHITECTURE.md
"Validation policy"): every element within atol + rtol * |ref|, and for the whole tensor
||out - ref|| <= norm * ||ref||. Both must hold; NaN never passes; a reference of -inf
(the lse of a row that sees no key) is matched only by -inf and left out of the norms.
The tolerances are the harness's per-dtype table, read from the harness itself
(flashstep.tolerance_table(), or the C library's fs_tolerance through flashstep.cuda),
never typed here.
"""
import math

# Names a dtype may be given by (a string, a numpy or torch dtype) -> the table's name.
_DTYPE_NAMES = {"float32": "float32", "f32": "float32", "fp32": "float32", "float": "float32",
                "float16": "float16", "f16": "float16", "fp16": "float16", "half": "float16",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}
_KV_DTYPE_NAMES = {"float8_e4m3fn": "float8_e4m3fn", "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
                   "float8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2"}
_SHOWN = 5  # mismatches listed, as the harness lists


def _dtype_name(dtype, name, names, fn):
    text = str(dtype).replace("torch.", "")
    if text not in names and not isinstance(dtype, str):
        import numpy as np
        try:
            text = np.dtype(dtype).name  # np.float16, np.dtype("float32")
        except TypeError:
            pass
    if text in names:
        return names[text]
    raise ValueError(f"{fn}: {name} must be one of {', '.join(sorted(set(names.values())))}; got {dtype!r}")


def _as_float64(x, name):
    """A numpy float64 copy of a numpy array, a torch tensor (any device, bfloat16 too), a
    CuPy array or anything numpy can read; the dtype it was stored in, as a name (or None)."""
    import numpy as np
    stored = None
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor: bfloat16 has no numpy form
        stored = str(x.dtype).replace("torch.", "")
        x = x.detach().cpu().double().numpy()
    elif hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # CuPy
        x = x.get()
    a = np.asarray(x)
    if stored is None:
        stored = str(a.dtype)
    if a.dtype.kind not in "fiu":
        raise TypeError(f"compare: {name} must hold real numbers; it has dtype {a.dtype}")
    return a.astype(np.float64), stored


def tolerance(dtype, which="o", kv_dtype=None, fn="tolerance"):
    """The harness's (atol, rtol, norm) for q and o in `dtype` ("float32", "float16",
    "bfloat16", or a numpy/torch dtype), K/V in `kv_dtype` (None: `dtype`; "float8_e4m3fn"
    or "float8_e5m2" for an FP8 cache) and `which` ("o" or "lse"). The numbers come from the
    harness's table (stages/harness/compare.cpp): the compiled module's copy of it where
    this build has one (flashstep.tolerance_table()), else the C library's (flashstep.cuda)."""
    if which not in ("o", "lse"):
        raise ValueError(f"{fn}: which must be 'o' or 'lse'; got {which!r}")
    q = _dtype_name(dtype, "dtype", _DTYPE_NAMES, fn)
    kv = q if kv_dtype is None else _dtype_name(kv_dtype, "kv_dtype", {**_DTYPE_NAMES, **_KV_DTYPE_NAMES}, fn)
    from . import _flashstep  # None where the compiled module is missing
    if _flashstep is not None and hasattr(_flashstep, "tolerance"):
        return tuple(_flashstep.tolerance(q, which, kv))
    why = ("the compiled module was built without the validation harness (no CUDA toolkit was found)"
           if _flashstep is not None else "the compiled module is not built for this Python")
    try:
        from . import cuda
        return cuda.tolerance(q, which, None if kv == q else kv)
    except Exception as e:  # no C library either
        raise RuntimeError(
            f"{fn}: the harness's tolerance table is not available here: {why}, and flashstep.cuda's C library "
            f"could not be asked ({str(e).splitlines()[0]}). Pass atol=, rtol= and norm= explicitly.") from None


class Mismatch:
    """One element outside atol + rtol * |ref|: its index, a label naming it, the values,
    the error and the bound it broke."""

    def __init__(self, index, label, got, expected, allowed):
        self.index, self.label, self.got, self.expected, self.allowed = index, label, got, expected, allowed
        self.abs_err = abs(got - expected) if math.isfinite(got - expected) else math.inf

    def __repr__(self):
        return (f"{self.label}: got {self.got:.6g}, expected {self.expected:.6g} "
                f"(|diff| {abs(self.got - self.expected):.3g}, allowed {self.allowed:.3g})")


class Comparison:
    """What flashstep.compare found. ``ok`` (also ``bool(report)``): every element within
    its bound and the norm-wise ratio within ``norm``. ``first_mismatch`` (None when there
    is none), ``mismatches`` (the first five), ``count_mismatched``, ``max_abs_err``,
    ``max_rel_err`` (|diff| / |ref| over elements whose ref is not 0), ``norm_ratio``
    (||out - ref|| / ||ref||) and ``tolerance`` ((atol, rtol, norm)). ``str(report)`` is
    the harness's summary; ``report.check()`` raises AssertionError with it unless ok."""

    def __init__(self, what, tolerance, count, count_mismatched, max_abs_err, max_rel_err, norm_ratio, mismatches):
        self.what, self.tolerance, self.count = what, tolerance, count
        self.count_mismatched, self.max_abs_err, self.max_rel_err = count_mismatched, max_abs_err, max_rel_err
        self.norm_ratio, self.mismatches = norm_ratio, mismatches
        self.ok = count_mismatched == 0 and norm_ratio <= tolerance[2]

    @property
    def first_mismatch(self):
        return self.mismatches[0] if self.mismatches else None

    def __bool__(self):
        return self.ok

    def check(self):
        """Raises AssertionError with the summary unless the comparison passed; returns self."""
        if not self.ok:
            raise AssertionError(str(self))
        return self

    def __str__(self):
        atol, rtol, norm = self.tolerance
        lines = [f"{self.what}: {'PASS' if self.ok else 'FAIL'}: {self.count_mismatched} of {self.count} elements "
                 f"outside atol {atol:.3g} + rtol {rtol:.3g} * |ref|",
                 f"  max |diff| {self.max_abs_err:.3g}; ||diff|| / ||ref|| {self.norm_ratio:.3g} (norm bound {norm:.3g})"]
        if self.count_mismatched == 0 and not self.ok:
            lines.append("  every element is within its bound, but the error as a whole is too large: a small bias "
                         "on every element (the norm-wise test)")
        if self.mismatches:
            lines.append("  first mismatches:")
            lines += [f"    {m!r}" for m in self.mismatches]
        return "\n".join(lines)

    __repr__ = __str__


def _labeller(shape, names, qo_indptr):
    """A function from an index tuple to its label, e.g. '(token 3, head 7, dim 12)'."""
    import numpy as np
    if qo_indptr is not None:
        indptr = np.asarray(qo_indptr, dtype=np.int64)
        if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != shape[0]:
            raise ValueError(f"compare: qo_indptr must be 1-D, start at 0 and end at the number of rows "
                             f"({shape[0]}); got {indptr.tolist()[:8]}")

        def with_request(index):
            request = int(np.searchsorted(indptr, index[0], side="right")) - 1
            rest = ", ".join(f"{n} {i}" for n, i in zip(names[1:], index[1:]))
            return f"(request {request}, token {index[0] - indptr[request]}" + (f", {rest})" if rest else ")")
        return with_request
    return lambda index: "(" + ", ".join(f"{n} {i}" for n, i in zip(names, index)) + ")"


def compare(out, ref, dtype=None, which="o", kv_dtype=None, atol=None, rtol=None, norm=None, names=None,
            qo_indptr=None, what=None):
    """Compares `out` (a kernel's output: numpy, torch on any device, CuPy) with `ref` (the
    reference's, e.g. a float64 array from flashstep's functions) under the validation
    harness's rule and per-dtype tolerances; returns a Comparison (``.ok``, ``.first_mismatch``,
    ``print(report)``).

    dtype: the dtype the kernel stores ("float32", "float16", "bfloat16", or a numpy/torch
      dtype); None takes `out`'s own (a torch bfloat16 tensor says bfloat16; a numpy array
      of float64 must name it). kv_dtype: K/V's dtype when it differs from q's (an FP8 cache:
      "float8_e4m3fn", "float8_e5m2"). which: "o" (the output) or "lse".
    atol, rtol, norm: override the table's values (each one given replaces that one).
    names: what each axis is called in messages; by default (token, head, dim) for 3-D,
      (token, head) for 2-D, (axis0, axis1, ...) otherwise. qo_indptr: the rows' requests
      (ragged batch), so a mismatch is named (request r, token t, head h, dim d).
    """
    import numpy as np  # here, not at import: `import flashstep.cuda` loads no numpy
    o, stored = _as_float64(out, "out")
    r, _ = _as_float64(ref, "ref")
    if o.shape != r.shape:
        raise ValueError(f"compare: out has shape {o.shape}, ref has shape {r.shape}; they must be equal")
    given = (atol, rtol, norm)
    if dtype is None and None in given:  # the table is needed: which row
        if stored not in _DTYPE_NAMES:
            raise ValueError(f"compare: out has dtype {stored}, which names no stored dtype; pass dtype= (the dtype "
                             "the kernel stored: float32, float16 or bfloat16)")
        dtype = stored
    table = tolerance(dtype, which, kv_dtype, fn="compare") if None in given else (None, None, None)
    tol = tuple(float(g) if g is not None else t for g, t in zip(given, table))
    if names is None:
        names = {3: ("token", "head", "dim"), 2: ("token", "head")}.get(o.ndim,
                                                                       tuple(f"axis{i}" for i in range(o.ndim)))
    if len(names) != o.ndim:
        raise ValueError(f"compare: names has {len(names)} entries; out has {o.ndim} axes")
    label = _labeller(o.shape, tuple(names), qo_indptr)

    shape = o.shape
    o, r = o.reshape(-1), r.reshape(-1)
    t_atol, t_rtol, t_norm = tol
    infinite = np.isinf(r)
    with np.errstate(invalid="ignore", over="ignore"):
        allowed = t_atol + t_rtol * np.abs(r)  # rtol 0 times an infinite ref: NaN, never used
        diff = np.abs(o - r)
        # -inf (or +inf) in the reference is a value of its own: only the same infinity matches
        ok = np.where(infinite, o == r, np.isfinite(o) & (diff <= allowed))
        finite_ref = ~infinite
        d = np.where(finite_ref, diff, 0.0)
        diff2 = math.inf if not np.all(np.isfinite(d)) else float(np.sum(d * d))
        ref2 = float(np.sum(np.where(finite_ref, r, 0.0) ** 2))
        bad_diff = ~np.isfinite(diff) | (infinite & ~ok)
        max_abs = math.inf if np.any(bad_diff) else (float(diff.max()) if diff.size else 0.0)
        nonzero = finite_ref & (r != 0)
        rel = np.where(nonzero, diff / np.where(nonzero, np.abs(r), 1.0), 0.0)
        max_rel = math.inf if np.any(~np.isfinite(rel)) else (float(rel.max()) if rel.size else 0.0)
    # An all-zero (or all -inf) reference makes the relative norm meaningless: then the
    # element-wise test alone decides, as in the harness.
    norm_ratio = math.sqrt(diff2 / ref2) if ref2 > 0 else (math.inf if diff2 > 0 else 0.0)
    bad = np.flatnonzero(~ok)
    mismatches = []
    for k in bad[:_SHOWN]:
        index = tuple(int(i) for i in np.unravel_index(k, shape))
        mismatches.append(Mismatch(index, label(index), float(o[k]), float(r[k]), float(allowed[k])))
    return Comparison(what or which, tol, int(o.size), int(bad.size), max_abs, max_rel, norm_ratio, mismatches)
