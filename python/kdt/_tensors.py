"""Checking numpy arrays and torch tensors against an op's contract before any C call.

One _Call per op invocation: it picks the backend from the arguments (a torch tensor on a CUDA
device means the CUDA backend on that device, anything else the CPU backend), binds the symbolic
dims (B, Q, ...) from the first tensor that has them, and raises TypeError / ValueError naming the
argument at fault. torch is only touched when the caller already imported it."""
import sys

import numpy as np

from . import _lib
from ._lib import BF16, F32, I32, U8, U64

try:  # ml_dtypes gives numpy a real bfloat16; without it bf16 travels as uint16 bit patterns
    import ml_dtypes
    _NP_BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    _NP_BF16 = None

_NP_CODES = {np.dtype(np.float32): F32, np.dtype(np.int32): I32, np.dtype(np.uint8): U8,
             np.dtype(np.bool_): U8, np.dtype(np.uint16): BF16, np.dtype(np.uint64): U64}
if _NP_BF16 is not None:
    _NP_CODES[_NP_BF16] = BF16
_NP_OUT = {F32: np.float32, I32: np.int32, U8: np.uint8, BF16: np.uint16}


def _torch():
    return sys.modules.get("torch")


def _is_torch(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _torch_code(x):
    t = _torch()
    codes = {t.float32: F32, t.int32: I32, t.uint8: U8, t.bool: U8, t.bfloat16: BF16}
    if hasattr(t, "uint64"):
        codes[t.uint64] = U64
    return codes.get(x.dtype)


def _torch_out(code):
    t = _torch()
    return {F32: t.float32, I32: t.int32, U8: t.uint8, BF16: t.bfloat16}[code]


def _dtype_str(x):
    return str(x.dtype).replace("torch.", "")


class Tensor:
    """A checked argument: the object, its kdt dtype code and its data pointer."""
    __slots__ = ("obj", "code", "ptr", "shape")

    def __init__(self, obj, code, ptr, shape):
        self.obj, self.code, self.ptr, self.shape = obj, code, ptr, shape


class Call:
    def __init__(self, op, tensors):
        """tensors: every tensor-valued argument (name -> object, None for absent ones), so that
        the backend and device are decided once, from all of them."""
        self.op, self.dims, self.dim_from = op, {}, {}
        self.device, self.device_from, self.like = None, None, None
        for name, x in tensors.items():
            if x is None:
                continue
            if self.like is None:
                self.like = x
            if _is_torch(x) and x.is_cuda and self.device is None:
                self.device, self.device_from = x.device, name
        self.backend = _lib.CUDA if self.device is not None else _lib.CPU

    def _err(self, msg):
        return f"kdt.{self.op}: {msg}"

    def tensor(self, name, x, codes, dims, *, output=False, bool_ok=False):
        """Checks one tensor: kind and device, dtype (codes: allowed kdt dtypes), dims (a list of
        ints or symbol names bound on first use), C-contiguity, and for outputs writability."""
        if x is None:
            raise TypeError(self._err(f"'{name}' is required"))
        if self.backend == _lib.CUDA:
            if not _is_torch(x):
                raise TypeError(self._err(f"'{name}' is a {type(x).__name__}, but '{self.device_from}' is a "
                                          f"torch tensor on {self.device}: a CUDA call takes torch tensors "
                                          f"on one CUDA device"))
            if x.device != self.device:
                raise ValueError(self._err(f"'{name}' is on {x.device}, but '{self.device_from}' is on "
                                           f"{self.device}: every tensor of a CUDA call must be on the same "
                                           f"CUDA device"))
        elif _is_torch(x):
            if x.device.type != "cpu":
                raise ValueError(self._err(f"'{name}' is on {x.device}; the binding runs on CPU tensors "
                                           f"(CPU backend) or CUDA tensors (CUDA backend)"))
        elif not isinstance(x, np.ndarray):
            raise TypeError(self._err(f"'{name}' must be a numpy array or a torch tensor, "
                                      f"got {type(x).__name__}"))
        if _is_torch(x):
            code, is_bool = _torch_code(x), x.dtype == _torch().bool
        else:
            code, is_bool = _NP_CODES.get(x.dtype), x.dtype.kind == "b"
        if code not in codes or (is_bool and not bool_ok):
            want = " or ".join(_lib.DTYPE_NAMES[c] for c in codes) + (" (or bool)" if bool_ok else "")
            if BF16 in codes and not _is_torch(x):
                want += " (numpy bf16: uint16 bit patterns or ml_dtypes.bfloat16)"
            raise TypeError(self._err(f"'{name}' has dtype {_dtype_str(x)}, expected {want}"))
        shape = tuple(int(d) for d in x.shape)
        if len(shape) != len(dims):
            raise ValueError(self._err(f"'{name}' has shape {shape}, expected {len(dims)} dims "
                                       f"[{', '.join(map(str, dims))}]"))
        for axis, (sym, got) in enumerate(zip(dims, shape)):
            if isinstance(sym, int):
                if got != sym:
                    raise ValueError(self._err(f"'{name}' has shape {shape}, expected dim {axis} = {sym}"))
            elif sym not in self.dims:
                self.dims[sym], self.dim_from[sym] = got, name
            elif self.dims[sym] != got:
                what = "batch sizes differ: " if sym == "B" else ""
                raise ValueError(self._err(f"{what}'{name}' has {sym} = {got} (shape {shape}), but "
                                           f"'{self.dim_from[sym]}' has {sym} = {self.dims[sym]}"))
        if _is_torch(x):
            contiguous, ptr = x.is_contiguous(), x.data_ptr()
            if output and x.requires_grad:
                raise ValueError(self._err(f"'{name}' requires grad; pass a tensor without autograd history"))
        else:
            contiguous, ptr = x.flags.c_contiguous, x.ctypes.data
            if output and not x.flags.writeable:
                raise ValueError(self._err(f"'{name}' is read-only"))
            if not x.flags.aligned:
                raise ValueError(self._err(f"'{name}' is not aligned to its dtype (np.require(x, requirements='A'))"))
        if not contiguous:
            raise ValueError(self._err(f"'{name}' is not C-contiguous (call .contiguous() / "
                                       f"np.ascontiguousarray first)"))
        return Tensor(x, code, ptr, shape)

    def output(self, out, name, code, dims, like=None):
        """The caller's out[name] checked against (code, dims), or a new tensor of that kind."""
        dims = [self.dims[d] if isinstance(d, str) else d for d in dims]
        if out is not None and out.get(name) is not None:
            t = self.tensor(name, out[name], (code,), dims, output=True)
            if like is not None and t.obj.dtype != like.dtype:
                raise TypeError(self._err(f"'{name}' has dtype {_dtype_str(t.obj)}, expected "
                                          f"{_dtype_str(like)} like the input"))
            return t
        if _is_torch(self.like):
            x = _torch().empty(dims, dtype=_torch_out(code), device=self.like.device)
            return Tensor(x, code, x.data_ptr(), tuple(dims))
        x = np.empty(dims, dtype=like.dtype if like is not None else _NP_OUT[code])
        return Tensor(x, code, x.ctypes.data, tuple(dims))

    def stream(self):
        """The CUDA stream handle to queue on: the current torch stream of the tensors' device."""
        if self.backend == _lib.CPU:
            return None
        return _torch().cuda.current_stream(self.device).cuda_stream

    def device_guard(self):
        """Makes the tensors' device current during the C call, so launches land there."""
        if self.backend == _lib.CPU:
            return _Null()
        return _torch().cuda.device(self.device)


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_outs(op, out, names):
    """out= must be a mapping of output names; an unknown name is a mistake worth reporting."""
    if out is None:
        return None
    if not hasattr(out, "get") or not hasattr(out, "keys"):
        raise TypeError(f"kdt.{op}: out= must be a dict of output name -> tensor, got {type(out).__name__}")
    unknown = sorted(set(out.keys()) - set(names))
    if unknown:
        raise ValueError(f"kdt.{op}: out= has unknown names {unknown}; the outputs are {list(names)}")
    return out


def scalar_int(op, name, x, lo, hi):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu":
            x = int(x)
        elif _is_torch(x) and x.dim() == 0 and not x.dtype.is_floating_point and x.dtype != _torch().bool:
            x = int(x.item())
        else:
            raise TypeError(f"kdt.{op}: '{name}' must be an int, got {type(x).__name__}")
    x = int(x)
    if not lo <= x <= hi:
        raise ValueError(f"kdt.{op}: '{name}' = {x} outside {lo} .. {hi}")
    return x


def scalar_float(op, name, x):
    if isinstance(x, (np.ndarray,)) and x.ndim == 0:
        x = x.item()
    elif _is_torch(x) and x.dim() == 0:
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"kdt.{op}: '{name}' must be a float, got {type(x).__name__}")
    x = float(x)
    if not np.isfinite(x):
        raise ValueError(f"kdt.{op}: '{name}' = {x} is not finite")
    return x
