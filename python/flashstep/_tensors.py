"""Device arrays from PyTorch, CuPy or any DLPack / CUDA Array Interface producer, checked
before anything reaches the GPU.

``device_array(x, fn, name)`` reads a tensor's pointer, shape, strides (in elements),
dtype and device without copying:
- a PyTorch tensor through its own attributes (its ``__cuda_array_interface__`` has no
  bfloat16, so it is not used for torch);
- anything else through ``__cuda_array_interface__`` (CuPy, Numba) or, failing that,
  ``__dlpack__`` / ``__dlpack_device__``.
A host array (numpy, a CPU tensor) or an object with neither protocol is refused with a
ValueError naming the function and the argument. Nothing here imports torch or cupy;
they are used only when the caller's objects come from them.
"""
import array
import ctypes

# Element types by name, with their sizes.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8,
            "uint8": 1, "int8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}
# CUDA Array Interface typestrs (little-endian; '|' for one byte).
_TYPESTR = {"<f4": "float32", "<f2": "float16", "<f8": "float64", "<i4": "int32", "<i8": "int64",
            "|u1": "uint8", "|i1": "int8", "|b1": "bool"}
# DLPack (type code, bits) -> name; codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool,
# 10 float8_e4m3fn, 12 float8_e5m2 (DLPack 1.1).
_DLPACK = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16", (2, 64): "float64",
           (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8", (0, 8): "int8", (6, 8): "bool",
           (10, 8): "float8_e4m3fn", (12, 8): "float8_e5m2"}
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_CUDA_MANAGED = 1, 2, 3, 13


class DeviceArray:
    """What the C interface needs of a tensor: pointer, shape, strides (elements), dtype,
    device index (None when the producer does not say), and the object it came from."""

    def __init__(self, obj, ptr, shape, strides, dtype, device, kind):
        self.obj, self.ptr, self.shape, self.strides = obj, ptr, tuple(shape), tuple(strides)
        self.dtype, self.device, self.kind = dtype, device, kind

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self):
        return self.numel * ITEMSIZE[self.dtype]

    def is_contiguous(self):
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


_TORCH_TYPES = set()  # types already seen to be torch tensors: run() asks once per tensor
_TORCH_DTYPES = {}  # torch dtype -> its name here ("bfloat16")


def _is_torch(x):
    t = type(x)
    if t in _TORCH_TYPES:
        return True
    if t.__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_cuda"):
        _TORCH_TYPES.add(t)
        return True
    return False


def _torch_dtype_name(dtype):
    name = _TORCH_DTYPES.get(dtype)
    if name is None:
        name = _TORCH_DTYPES[dtype] = str(dtype).replace("torch.", "")
    return name


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _from_dlpack(x, fn, name):
    device_type, device_id = x.__dlpack_device__()
    if device_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        where = "host memory" if device_type in (_KDL_CPU, _KDL_CUDA_HOST) else f"DLPack device type {device_type}"
        raise ValueError(f"{fn}: {name} must be a CUDA array; it is in {where}")
    capsule = x.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # The capsule is not consumed: its destructor frees the producer's description, while
    # the memory it points at stays owned by `x`, which the caller keeps alive.
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _contiguous_strides(shape)
    dtype = _DLPACK.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if dtype is None:
        raise ValueError(f"{fn}: {name} has a DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, "
                         f"{t.dtype.lanes} lanes) that flashstep does not read")
    ptr = (t.data or 0) + t.byte_offset
    return DeviceArray(x, ptr, shape, strides, dtype, device_id, "dlpack")


def device_array(x, fn, name):
    """`x` as a DeviceArray on a CUDA device; ValueError naming `fn` and `name` otherwise."""
    if x is None:
        raise ValueError(f"{fn}: {name} is required (got None)")
    if _is_torch(x):
        device = x.get_device()  # -1 on the CPU; cheaper than x.device.index
        if device < 0:
            raise ValueError(f"{fn}: {name} must be a CUDA tensor; it is on {x.device}")
        return DeviceArray(x, x.data_ptr(), x.shape, x.stride(), _torch_dtype_name(x.dtype), device, "torch")
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(cai["shape"])
        dtype = _TYPESTR.get(cai["typestr"])
        if dtype is None:
            raise ValueError(f"{fn}: {name} has element type {cai['typestr']!r}, which flashstep does not read")
        size = ITEMSIZE[dtype]
        strides = cai.get("strides")
        strides = _contiguous_strides(shape) if strides is None else tuple(s // size for s in strides)
        if cai.get("strides") is not None and any(s % size for s in cai["strides"]):
            raise ValueError(f"{fn}: {name} has strides {tuple(cai['strides'])} bytes, not whole elements")
        ptr = cai["data"][0] or 0
        kind = "cupy" if type(x).__module__.startswith("cupy") else "cai"
        return DeviceArray(x, ptr, shape, strides, dtype, None, kind)
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        return _from_dlpack(x, fn, name)
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        raise ValueError(f"{fn}: {name} must be a CUDA array; it is a host array ({type(x).__name__})")
    raise ValueError(f"{fn}: {name} must be a CUDA tensor (PyTorch, CuPy, or anything with "
                     f"__cuda_array_interface__ or __dlpack__); got {type(x).__name__}")


def check(a, fn, name, dtypes=None, shape=None, contiguous=True):
    """Checks a DeviceArray's dtype (one of `dtypes`), shape (a tuple; None entries match
    any size) and contiguity; returns it. ValueError naming `fn` and `name` otherwise."""
    if dtypes is not None and a.dtype not in dtypes:
        raise ValueError(f"{fn}: {name} must have dtype {' or '.join(dtypes)}; it has {a.dtype}")
    if shape is not None:
        ok = len(a.shape) == len(shape) and all(want is None or want == got for want, got in zip(shape, a.shape))
        if not ok:
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{fn}: {name} must have shape {want}; it has {a.shape}")
    if contiguous and not a.is_contiguous():
        raise ValueError(f"{fn}: {name} must be contiguous (row-major); its strides are {a.strides} elements "
                         f"for shape {a.shape} (call .contiguous() first)")
    return a


def same_device(fn, arrays):
    """All arrays (DeviceArray, name) on one device; returns its index (None if unknown)."""
    device = None
    for a, name in arrays:
        if a.device is None:
            continue
        if device is None:
            device = a.device
        elif a.device != device:
            raise ValueError(f"{fn}: {name} is on cuda:{a.device}, the other tensors on cuda:{device}")
    return device


def current_stream(like):
    """The caller's current CUDA stream for the framework of `like` (a DeviceArray), as an
    int: PyTorch's or CuPy's current stream, else 0 (the legacy default stream)."""
    if like.kind == "torch":
        import torch
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:  # the same pointer, without building a torch.cuda.Stream object
            return raw(like.device)
        return torch.cuda.current_stream(like.obj.device).cuda_stream
    if like.kind == "cupy":
        import cupy
        return cupy.cuda.get_current_stream().ptr
    return 0


def empty(like, shape, dtype, fn, name):
    """A new contiguous device array of `shape` and `dtype` in the framework of `like`:
    torch or CuPy; other producers must pass the output themselves."""
    if like.kind == "torch":
        import torch
        t = torch.empty(shape, dtype=getattr(torch, dtype), device=like.obj.device)
        return t
    if like.kind == "cupy":
        import cupy
        if dtype == "bfloat16":
            raise ValueError(f"{fn}: CuPy has no bfloat16; pass {name}= yourself")
        return cupy.empty(shape, dtype=dtype)
    raise ValueError(f"{fn}: the inputs are neither PyTorch nor CuPy arrays, so {name} cannot be allocated "
                     f"here: pass {name}=")


class IndexArray:
    """A one-dimensional int32 index array read where it lives, without copying: host
    memory this process can read (a CPU tensor, a numpy array, an array.array) or a CUDA
    device's. `obj` owns the memory and is kept alive with it."""

    __slots__ = ("obj", "ptr", "size", "on_device", "kind")

    def __init__(self, obj, ptr, size, on_device, kind):
        self.obj, self.ptr, self.size, self.on_device, self.kind = obj, ptr, size, on_device, kind

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        """Entry i (negative counts from the end) of a host array."""
        if i < 0:
            i += self.size
        if self.on_device or not 0 <= i < self.size:
            raise IndexError(i)
        return ctypes.c_int32.from_address(self.ptr + 4 * i).value

    def min_max(self, n):
        """(min, max) of the first n entries of a host array, n >= 1: numpy reads the
        memory in place, whoever owns it (a torch tensor, an array.array, a list's copy),
        on this thread (torch's aminmax would wake its thread pool for a large array)."""
        import numpy
        head = numpy.frombuffer((ctypes.c_int32 * n).from_address(self.ptr), dtype=numpy.int32)
        return int(head.min()), int(head.max())


def _is_cuda_dlpack(x):
    return hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] in (_KDL_CUDA, _KDL_CUDA_MANAGED)


def index_array(x, fn, name):
    """An int32 index array as an IndexArray, read in place: a torch tensor (CPU or CUDA),
    anything with __cuda_array_interface__ or CUDA DLPack, a numpy array or array.array of
    int32; a list, tuple or range is converted once (in C, with a range check). One
    dimension, int32, contiguous; ValueError naming `fn` and `name` otherwise."""
    if x is None:
        raise ValueError(f"{fn}: {name} is required (got None)")
    if _is_torch(x):
        if x.dtype != _torch_int32(x):
            raise ValueError(f"{fn}: {name} must have dtype int32; it has {str(x.dtype).replace('torch.', '')}")
        if x.dim() != 1:
            raise ValueError(f"{fn}: {name} must be one-dimensional; it has shape {tuple(x.shape)}")
        if x.is_cuda:
            if x.numel() > 1 and x.stride(0) != 1:
                raise ValueError(f"{fn}: {name} must be contiguous; its stride is {x.stride(0)} elements")
            return IndexArray(x, x.data_ptr(), x.numel(), True, "torch")
        if x.numel() > 1 and x.stride(0) != 1:
            x = x.contiguous()
        return IndexArray(x, x.data_ptr(), x.numel(), False, "torch")
    if getattr(x, "__cuda_array_interface__", None) is not None or _is_cuda_dlpack(x):
        a = check(device_array(x, fn, name), fn, name, dtypes=("int32",), shape=(None,))
        return IndexArray(x, a.ptr, a.numel, True, a.kind)
    ai = getattr(x, "__array_interface__", None)
    if ai is not None:  # numpy, or anything describing host memory the same way
        dtype = str(getattr(x, "dtype", ai["typestr"]))
        if ai["typestr"] != "<i4":
            raise ValueError(f"{fn}: {name} must have dtype int32; it has {dtype}")
        if len(ai["shape"]) != 1:
            raise ValueError(f"{fn}: {name} must be one-dimensional; it has shape {tuple(ai['shape'])}")
        if ai.get("strides") not in (None, (4,)) and ai["shape"][0] > 1:
            if not hasattr(x, "copy"):
                raise ValueError(f"{fn}: {name} must be contiguous; its strides are {ai['strides']} bytes")
            x = x.copy()
            ai = x.__array_interface__
        kind = "numpy" if type(x).__module__ == "numpy" else "host"
        return IndexArray(x, ai["data"][0] or 0, ai["shape"][0], False, kind)
    if isinstance(x, array.array):
        if x.itemsize != 4 or x.typecode not in "il":
            raise ValueError(f"{fn}: {name} must hold int32; it is an array.array of typecode {x.typecode!r}")
        return IndexArray(x, x.buffer_info()[0], len(x), False, "array")
    dtype = getattr(x, "dtype", None)
    if dtype is not None and str(dtype) != "int32":
        raise ValueError(f"{fn}: {name} must have dtype int32; it has {dtype}")
    try:
        values = array.array("i", x)
    except OverflowError:
        raise ValueError(f"{fn}: {name} has values outside int32") from None
    except TypeError:
        raise ValueError(f"{fn}: {name} must be a one-dimensional int32 array; got {type(x).__name__}") from None
    return IndexArray(values, values.buffer_info()[0], len(values), False, "array")


def host_copy(a, copy_from_device):
    """A host IndexArray holding the values of device IndexArray `a`: a torch CPU tensor
    when `a` is a torch tensor, an array.array otherwise, filled by copy_from_device(dst,
    src, nbytes, like) (which waits for the copy)."""
    if a.kind == "torch":
        import torch
        out = torch.empty(a.size, dtype=torch.int32, device="cpu")  # host memory under any default device
        obj, ptr = out, out.data_ptr()
    else:
        obj = array.array("i", bytes(4 * a.size))
        ptr = obj.buffer_info()[0]
    if a.size:
        copy_from_device(ptr, a.ptr, 4 * a.size, a)
    return IndexArray(obj, ptr, a.size, False, "torch" if a.kind == "torch" else "array")


def _torch_int32(x):
    import torch
    return torch.int32
