"""Short, named errors for bad arguments of the extension's functions and methods.

pybind11 answers an argument of the wrong Python type with "incompatible function
arguments", a message that lists every overload and repeats every argument passed
(whole arrays included). Each function of the module is wrapped here so that such a call
raises a short TypeError or ValueError that names the argument and says what it accepts,
e.g. ``sampling_from_probs: seed must be an integer in [0, 18446744073709551615], got -1``
(the flashstep command checks ``--seed`` with the same rule and words).

A few rules are checked before the call, because the C++ side would accept the value:
- ``q`` must have a head_dim (last axis) of at least 1;
- token ids (``tokens``, ``token_ids``) must be >= 0.
The argument types come from the signature pybind11 writes at the top of each docstring
(in pybind11 2's words or 3's); an integer's range from its C++ type in that function
(INTEGER_RANGES, by function: the same name may be uint64 in one and int64 in another).
"""
import functools
import numbers
import re

import numpy as np

UINT64_MAX = 2**64 - 1
_UINT64 = (0, UINT64_MAX)
_INT32 = (-2**31, 2**31 - 1)
_INT64 = (-2**63, 2**63 - 1)
_TOKENS = {"tokens", "token_ids"}

# The integer arguments whose C++ type is not int64_t, by function or method (the lambdas
# and member functions bound in python/src/bind_*.cpp); every other `int` is int64_t.
_SAMPLERS = ("sampling_from_probs", "sampling_from_logits", "top_k_sampling_from_probs",
             "top_p_sampling_from_probs", "min_p_sampling_from_probs", "top_k_top_p_sampling_from_probs",
             "top_k_top_p_sampling_from_logits", "chain_speculative_sampling")
_WINDOWED = ("single_decode_with_kv_cache", "single_prefill_with_kv_cache", "batch_decode_with_paged_kv_cache",
             "batch_prefill_with_paged_kv_cache", "batch_prefill_with_ragged_kv_cache", "build_block_sparse",
             "block_sparse_attention", "split_kv_decode")
INTEGER_RANGES = {
    **{f: {"seed": _UINT64, "offset": _UINT64} for f in _SAMPLERS},
    **{f: {"window_left": _INT32} for f in _WINDOWED},
    "philox_uniform": {"seed": _UINT64, "subsequence": _UINT64},
    "TinyDecoder": {"weight_seed": _UINT64},
    "TinyDecoder.generate": {"seed": _UINT64},
    **{f"PageAllocator.{m}": {"page": _INT32} for m in ("incref", "decref", "refcount")},
    **{f"PagedSequences.{m}": {"seq": _INT32}
       for m in ("fork", "append_tokens", "free_sequence", "has_sequence", "pages", "seq_len", "last_page_len")},
    "RadixCache.lock": {"node": _INT32},
    "RadixCache.unlock": {"node": _INT32},
    "RadixCache.node": {"id": _INT32},
}


def integer_range(function, name):
    """(lowest, highest) the integer argument `name` of `function` (a module function's
    name, "Class" for a constructor, "Class.method") accepts."""
    return INTEGER_RANGES.get(function, {}).get(name, _INT64)


def _short(value):
    text = repr(value)
    if isinstance(value, np.ndarray):
        text = f"an array of shape {value.shape} and dtype {value.dtype}"
    elif len(text) > 40:
        text = f"{type(value).__name__} {text[:30]}..."
    return text


def _split_top_level(text):
    """'a: int = 1, b: Optional[List[int]] = None' -> ['a: int = 1', 'b: ...']."""
    parts, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if text[start:].strip():
        parts.append(text[start:].strip())
    return parts


_SIGNATURE = re.compile(r"^(\w+)\((.*)\)( -> .*)?$")


# pybind11 3 writes some types in typing's newer words; the checks read pybind11 2's.
_NEWER_TYPE_WORDS = (
    ("typing.SupportsInt | typing.SupportsIndex", "int"), ("typing.SupportsInt", "int"),
    ("typing.SupportsFloat | typing.SupportsIndex", "float"), ("typing.SupportsFloat", "float"),
    ("collections.abc.Sequence[", "List["), ("list[", "List["),
)


def _type_text(kind):
    """A parameter's type text in pybind11 2's words: 'typing.SupportsInt | typing.SupportsIndex'
    -> 'int', 'X | None' -> 'Optional[X]', 'collections.abc.Sequence[X]' -> 'List[X]'."""
    for newer, older in _NEWER_TYPE_WORDS:
        kind = kind.replace(newer, older)
    if kind.endswith(" | None"):
        kind = f"Optional[{kind[:-len(' | None')]}]"
    return kind


def signature_of(function):
    """[(name, type text, has default)] from a pybind11 docstring's first line, or None."""
    doc = getattr(function, "__doc__", None) or ""
    m = _SIGNATURE.match(doc.splitlines()[0] if doc else "")
    if not m:
        return None
    params = []
    for part in _split_top_level(m.group(2)):
        name, _, rest = part.partition(":")
        kind, _, default = rest.partition("=")
        params.append((name.strip(), _type_text(kind.strip()), bool(default.strip())))
    return params


def _is_integer(value):
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def type_problem(function, name, kind, value):
    """(exception class, 'must be ..., got ...') if `value` cannot be a `kind` (the type
    text of argument `name` in `function`'s signature), else None."""
    optional = kind.startswith("Optional[")
    if optional:
        if value is None:
            return None
        kind = kind[len("Optional["):-1]
    none = " or None" if optional else ""
    if kind == "int":
        if not _is_integer(value):
            return TypeError, f"must be an integer{none}, got {_short(value)}"
        low, high = integer_range(function, name)
        if not low <= int(value) <= high:
            return ValueError, f"must be an integer in [{low}, {high}], got {int(value)}"
    elif kind == "float":
        if not isinstance(value, (numbers.Real, np.floating, np.integer)) or isinstance(value, bool):
            return TypeError, f"must be a number{none}, got {_short(value)}"
    elif kind == "bool":
        if not isinstance(value, (bool, np.bool_)):
            return TypeError, f"must be True or False, got {_short(value)}"
    elif kind == "str":
        if not isinstance(value, str):
            return TypeError, f"must be a string{none}, got {_short(value)}"
    elif kind.startswith("List["):
        if not isinstance(value, (list, tuple, np.ndarray)):
            return TypeError, f"must be a list ({kind}){none}, got {_short(value)}"
        inner = kind[len("List["):-1]
        for i, item in enumerate(value):
            problem = type_problem(function, name, inner, item)
            if problem:
                return problem[0], f"[{i}] {problem[1]}"
    elif kind.startswith("flashstep."):
        wanted = kind.rsplit(".", 1)[1]
        if type(value).__name__ != wanted:
            return TypeError, f"must be a flashstep.{wanted}{none}, got {_short(value)}"
    return None


def _bind(params, args, kwargs):
    """{name: value} of a call, the way Python would bind it (unknown keyword names kept,
    for _explain to report)."""
    bound = dict(zip((p[0] for p in params), args))
    bound.update(kwargs)
    return bound


def _check_before(fn, bound):
    q = bound.get("q")
    if isinstance(q, np.ndarray) and q.ndim >= 1 and q.shape[-1] == 0:
        raise ValueError(f"{fn}: head_dim (the last axis of q) must be >= 1, got q of shape {q.shape}")
    for name in _TOKENS & bound.keys():
        tokens = bound[name]
        if isinstance(tokens, (list, tuple, np.ndarray)) and len(tokens):
            try:
                values = np.asarray(tokens)
            except (ValueError, TypeError):
                continue
            if values.dtype.kind in "iu" and values.ndim == 1 and values.min() < 0:
                at = int(np.argmax(values < 0))
                raise ValueError(f"{fn}: {name} must be token ids >= 0, got {name}[{at}] = "
                                 f"{int(values[at])}")


def _explain(fn, params, bound):
    names = [p[0] for p in params]
    for key in bound:
        if key not in names:
            return TypeError(f"{fn}: no argument named {key!r} (arguments: {', '.join(names)})")
    for name, kind, has_default in params:
        if name == "self":
            continue
        if name not in bound:
            if not has_default:
                return TypeError(f"{fn}: missing argument {name!r}")
            continue
        problem = type_problem(fn, name, kind, bound[name])
        if problem:
            return problem[0](f"{fn}: {name} {problem[1]}")
    return None


def checked(function, qualname, method=False):
    """`function` with the checks above; other errors pass through unchanged."""
    params = signature_of(function)
    if params is None:
        return function
    names = [p[0] for p in params]

    @functools.wraps(function)
    def call(*args, **kwargs):
        bound = _bind(params, args, kwargs)
        _check_before(qualname, bound)
        try:
            return function(*args, **kwargs)
        except (TypeError, AttributeError) as e:
            text = str(e)
            if "incompatible" not in text and "__float__" not in text and "__index__" not in text:
                raise
            if len(args) > len(names):
                error = TypeError(f"{qualname}: takes at most {len(names) - method} arguments, got "
                                  f"{len(args) - method}")
            else:
                error = _explain(qualname, params, bound) or TypeError(
                    f"{qualname}: bad arguments; it takes "
                    f"({', '.join(n for n in names if n != 'self')})")
        raise error from None

    return call


def install(module):
    """Wraps every function and method of the extension `module` in place."""
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if type(value).__name__ == "builtin_function_or_method":
            setattr(module, name, checked(value, name))
        elif isinstance(value, type):
            for attr, member in list(vars(value).items()):
                if type(member).__name__ != "instancemethod":
                    continue
                if attr.startswith("__") and attr != "__init__":
                    continue
                function = member.__func__
                qual = name if attr == "__init__" else f"{name}.{attr}"
                setattr(value, attr, checked(function, qual, method=True))
