"""Bad arguments from Python: a short ValueError or TypeError naming the argument.

pybind11 on its own answers a wrongly typed scalar with "incompatible function
arguments", thousands of characters long with whole arrays in it. Every message here
must name the argument and stay short. The seed rule and its words are the flashstep
command's (tests/cli/test_arguments.py): an integer in [0, 18446744073709551615].
"""
import math
import re

import numpy as np
import pytest

import flashstep

SEED_RULE = "must be an integer in [0, 18446744073709551615]"
MAX_MESSAGE = 300


def raises(kind, function, /, *args, naming, **kwargs):
    with pytest.raises(kind) as info:
        function(*args, **kwargs)
    text = str(info.value)
    assert naming in text, text
    assert len(text) < MAX_MESSAGE, (len(text), text[:400])
    assert "incompatible function arguments" not in text, text
    return text


@pytest.fixture
def decode_inputs(rng):
    return rng.standard_normal((4, 8)), rng.standard_normal((5, 2, 8)), rng.standard_normal((5, 2, 8))


@pytest.fixture
def probs(rng):
    p = rng.random((2, 10)) + 0.1
    return p / p.sum(axis=1, keepdims=True)


# ---- sm_scale: None is the default 1/sqrt(head_dim); NaN and infinities are refused ----

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float32("nan")])
def test_sm_scale_not_finite_is_refused(decode_inputs, bad):
    q, k, v = decode_inputs
    raises(ValueError, flashstep.single_decode_with_kv_cache, q, k, v, sm_scale=bad, naming="sm_scale")


def test_sm_scale_none_is_one_over_sqrt_head_dim(decode_inputs):
    q, k, v = decode_inputs
    # numpy: head 0 of request 0, kv head 0 (GQA 4 / 2), head_dim 8 -> scale 1/sqrt(8).
    s = k[:, 0, :] @ q[0] / math.sqrt(8)
    p = np.exp(s - s.max())
    expected = (p / p.sum()) @ v[:, 0, :]
    out = flashstep.single_decode_with_kv_cache(q, k, v, sm_scale=None)
    np.testing.assert_allclose(out[0], expected, rtol=1e-12, atol=1e-12)


def test_sm_scale_of_the_wrong_type(decode_inputs):
    q, k, v = decode_inputs
    raises(TypeError, flashstep.single_decode_with_kv_cache, q, k, v, sm_scale="x", naming="sm_scale")


# ---- sizes ----

def test_head_dim_zero_is_refused(rng):
    q, k, v = np.zeros((4, 0)), np.zeros((5, 2, 0)), np.zeros((5, 2, 0))
    raises(ValueError, flashstep.single_decode_with_kv_cache, q, k, v, return_lse=True,
           naming="head_dim")
    raises(ValueError, flashstep.single_prefill_with_kv_cache, np.zeros((3, 4, 0)),
           np.zeros((5, 2, 0)), np.zeros((5, 2, 0)), naming="head_dim")


def test_window_left_past_int32(decode_inputs):
    q, k, v = decode_inputs
    raises(ValueError, flashstep.single_decode_with_kv_cache, q, k, v, window_left=2**40,
           naming="window_left")


@pytest.mark.parametrize("page_size", [0, -1, 2**31, 2**40])
def test_page_size_out_of_range(page_size):
    text = raises(ValueError, flashstep.PageAllocator, 4, page_size, naming="page_size")
    assert "1..2^31-1" in text, text


@pytest.mark.parametrize("num_pages", [0, -1, 2**31, 2**40])
def test_num_pages_out_of_range(num_pages):
    # Checked before the pool is allocated: 2^40 pages must be refused, not attempted.
    text = raises(ValueError, flashstep.PageAllocator, num_pages, 16, naming="num_pages")
    assert "1..2^31-1" in text, text


# ---- integer ranges come from each function's C++ signature, not from a name ----

def test_an_int32_argument_past_its_range_says_so():
    allocator = flashstep.PageAllocator(4, 1)
    text = raises(ValueError, allocator.incref, 2**31, naming="page")
    assert "[-2147483648, 2147483647]" in text, text
    sequences = flashstep.PagedSequences(allocator)
    text = raises(ValueError, sequences.seq_len, 2**40, naming="seq")
    assert "[-2147483648, 2147483647]" in text, text


def test_the_same_name_can_have_another_range_elsewhere(probs):
    # `seed` is uint64 in the samplers and in TinyDecoder.generate; `offset` too, while
    # the int64 arguments of other functions take negative values to their own check.
    raises(ValueError, flashstep.philox_uniform, -1, 0, [0], naming="seed")
    text = raises(ValueError, flashstep.philox_uniform, 0, 2**64, [0], naming="subsequence")
    assert "[0, 18446744073709551615]" in text, text
    text = raises(ValueError, flashstep.PageAllocator, 4, 2**63, naming="page_size")
    assert "[-9223372036854775808, 9223372036854775807]" in text, text


# ---- seeds: the same rule as the command's --seed ----

@pytest.mark.parametrize("seed", [-1, 2**64, 2**70])
def test_seed_out_of_range(probs, seed):
    text = raises(ValueError, flashstep.sampling_from_probs, probs, seed=seed, naming="seed")
    assert SEED_RULE in text, text


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_seed_bounds_are_accepted(probs, seed):
    assert flashstep.sampling_from_probs(probs, seed=seed).shape == (2,)


def test_seed_of_the_wrong_type(probs):
    raises(TypeError, flashstep.sampling_from_probs, probs, seed="1", naming="seed")
    raises(TypeError, flashstep.sampling_from_probs, probs, seed=1.5, naming="seed")


# ---- flags, strings, parameters, arrays ----

def test_causal_must_be_a_bool(rng):
    q, k = rng.standard_normal((3, 4, 8)), rng.standard_normal((5, 2, 8))
    raises(TypeError, flashstep.single_prefill_with_kv_cache, q, k, k, causal="yes", naming="causal")


def test_top_p_must_be_a_number(probs):
    raises(ValueError, flashstep.top_p_sampling_from_probs, probs, "a", naming="top_p")
    raises(ValueError, flashstep.top_p_sampling_from_probs, probs, top_p="a", naming="top_p")


def test_a_list_where_an_array_is_expected_is_a_type_error(decode_inputs):
    q, k, v = decode_inputs
    text = raises(TypeError, flashstep.single_decode_with_kv_cache, q.tolist(), k, v, naming="q")
    assert "must be a numpy array of float32 or float64, got list" in text, text
    raises(TypeError, flashstep.merge_state, q, None, q, q, naming="s_a")


def test_an_array_of_the_wrong_dtype_is_a_value_error(decode_inputs):
    q, k, v = decode_inputs
    raises(ValueError, flashstep.single_decode_with_kv_cache, q.astype(np.int32), k, v, naming="q")


def test_an_unknown_keyword_is_named(decode_inputs):
    q, k, v = decode_inputs
    raises(TypeError, flashstep.single_decode_with_kv_cache, q, k, v, scale=1.0, naming="'scale'")


# ---- token ids ----

@pytest.mark.parametrize("tokens", [[3, -1], np.array([-5], dtype=np.int64)])
def test_negative_token_ids_are_refused(tokens):
    cache = flashstep.RadixCache(flashstep.PageAllocator(16, 1))
    raises(ValueError, cache.match_prefix, tokens, naming="tokens")


def test_token_ids_of_zero_and_up_are_accepted():
    cache = flashstep.RadixCache(flashstep.PageAllocator(16, 1))
    assert cache.match_prefix([0, 1, 2]).length == 0


# ---- every scalar argument of every function: a wrong type is named, briefly ----

# Arrays are converted by the function itself, after every scalar: None stands for one.
ARRAYS = ("numpy.ndarray", "numpy.typing.ArrayLike", "Optional[numpy.typing.ArrayLike]",
          "Union[numpy.ndarray, Tuple[numpy.ndarray, numpy.ndarray]]", "Union[int, numpy.ndarray]",
          "Union[float, numpy.ndarray]", "Optional[Union[float, numpy.ndarray]]")
DUMMY = {**{kind: None for kind in ARRAYS}, "int": 0, "bool": False, "float": 1.0, "str": "NHD",
         "Optional[float]": None, "Optional[List[str]]": None, "List[int]": [], "List[str]": []}
SCALARS = ("int", "bool", "float", "str", "Optional[float]")


def parameters(function):
    """[(name, type, has default)] from the signature line pybind11 puts in the docstring."""
    return flashstep._arguments.signature_of(function) or []


def test_array_arguments_show_their_type_not_handle():
    for fname in (n for n in dir(flashstep) if not n.startswith("_")):
        function = getattr(flashstep, fname)
        line = ((function.__init__ if isinstance(function, type) else function).__doc__ or "").split("\n")[0]
        assert "handle" not in line, line
    assert parameters(flashstep.merge_state)[0] == ("v_a", "numpy.ndarray", False)
    assert ("kv_indptr", "numpy.typing.ArrayLike", False) in parameters(flashstep.build_cascade_levels)


def cases():
    for fname in sorted(n for n in dir(flashstep) if not n.startswith("_")):
        function = getattr(flashstep, fname)
        if isinstance(function, type) or not callable(function):
            continue
        params = parameters(function)
        if any(kind not in DUMMY for _, kind, has_default in params if not has_default):
            continue  # needs an object of the module's own types
        for name, kind, _ in params:
            if kind in SCALARS:
                yield pytest.param(fname, name, id=f"{fname}.{name}")


@pytest.mark.parametrize("fname,name", list(cases()))
def test_every_scalar_argument_of_the_wrong_type_is_named(fname, name):
    function = getattr(flashstep, fname)
    args = {n: DUMMY[kind] for n, kind, has_default in parameters(function) if not has_default}
    args[name] = object()
    raises((TypeError, ValueError), function, naming=name, **args)
