"""libkdt.so over ctypes: finding the library, the params structs of include/kdt/ops.h, errors.

The structs below mirror include/kdt/ops.h field by field, every pointer as c_void_p so that an
address is stored by plain assignment (python/tests/test_binding.py parses the header and checks
that names, order and types still match)."""
import ctypes
import os
from ctypes import POINTER, c_float, c_int, c_int32, c_int64, c_void_p

# kdt_status codes the binding acts on (include/kdt/kdt.h).
KDT_OK = 0
KDT_ERR_INVALID_ARG = 1
KDT_ERR_UNSUPPORTED = 9

# kdt_dtype codes (the KDTR codes of docs/interfaces.md section 1) and backends.
F32, BF16, U8, I32, U64 = 1, 4, 6, 8, 11
DTYPE_NAMES = {F32: "float32", BF16: "bfloat16", U8: "uint8", I32: "int32", U64: "uint64"}
CPU, CUDA = 0, 1

kdt_dtype = c_int  # a C enum: int-sized on every ABI we build for


class KdtError(RuntimeError):
    """A library call failed; the message is kdt_last_error(), `status` the kdt_status code."""

    def __init__(self, status, status_name, message):
        super().__init__(f"{message} [{status_name}]")
        self.status, self.status_name, self.message = status, status_name, message


class LibraryNotFound(OSError):
    """libkdt.so is nowhere the binding looks; the message lists each place tried."""


class TreeBuildParams(ctypes.Structure):
    _fields_ = [
        ("B", c_int32), ("D", c_int32), ("K", c_int32),
        ("budget", c_int32),
        ("scores", c_void_p),        # f32 [B, D, K]
        ("tokens", c_void_p),        # i32 [B, D, K]
        ("root_token", c_void_p),    # i32 [B]
        ("seq_len", c_void_p),       # i32 [B]
        ("num_nodes", c_void_p),     # i32 [B] out
        ("node_token", c_void_p),    # i32 [B, Q] out
        ("node_parent", c_void_p),   # i32 [B, Q] out
        ("node_depth", c_void_p),    # i32 [B, Q] out
        ("node_cand", c_void_p),     # i32 [B, Q] out
        ("node_score", c_void_p),    # f32 [B, Q] out
        ("positions", c_void_p),     # i32 [B, Q] out
        ("tree_mask", c_void_p),     # u8 [B, Q, Q] out
        ("first_child", c_void_p),   # i32 [B, Q] out
        ("next_sibling", c_void_p),  # i32 [B, Q] out
    ]


class VerifyAttnParams(ctypes.Structure):
    _fields_ = [
        ("B", c_int32), ("Q", c_int32), ("H", c_int32),
        ("Dv", c_int32), ("Dr", c_int32),
        ("dtype", kdt_dtype),        # F32 or BF16: q, kv / kv_cache, o
        ("q", c_void_p),             # [B, Q, H, Dqk]
        ("kv", c_void_p),            # [B, L, Dqk] contiguous layout, else NULL
        ("L", c_int64),
        ("kv_cache", c_void_p),      # [NB, BS, Dqk] paged layout, else NULL
        ("NB", c_int32), ("BS", c_int32),
        ("block_table", c_void_p),   # i32 [B, MB]
        ("MB", c_int32),
        ("kv_len", c_void_p),        # i32 [B]
        ("tree_mask", c_void_p),     # u8 [B, Q, Q]
        ("sm_scale", c_float),
        ("o", c_void_p),             # [B, Q, H, Dv] out
        ("lse", c_void_p),           # f32 [B, Q, H] out
    ]


class TreeAcceptParams(ctypes.Structure):
    _fields_ = [
        ("B", c_int32), ("Q", c_int32),
        ("node_token", c_void_p),    # i32 [B, Q]
        ("node_parent", c_void_p),   # i32 [B, Q]
        ("num_nodes", c_void_p),     # i32 [B]
        ("target_pred", c_void_p),   # i32 [B, Q]
        ("accept_len", c_void_p),    # i32 [B] out
        ("accept_index", c_void_p),  # i32 [B, Q] out
        ("accept_tokens", c_void_p),  # i32 [B, Q] out
        ("status", c_void_p),        # i32 [B] out
    ]


class TreeSampleAcceptParams(ctypes.Structure):
    _fields_ = [
        ("B", c_int32), ("Q", c_int32), ("V", c_int32),
        ("node_token", c_void_p),    # i32 [B, Q]
        ("node_parent", c_void_p),   # i32 [B, Q]
        ("num_nodes", c_void_p),     # i32 [B]
        ("target_logits", c_void_p),  # f32 [B, Q, V]
        ("draft_probs", c_void_p),   # f32 [B, Q, V] or NULL
        ("temperature", c_void_p),   # f32 [B]
        ("top_k", c_void_p),         # i32 [B]
        ("top_p", c_void_p),         # f32 [B]
        ("seed", c_void_p),          # u64 [B]
        ("accept_len", c_void_p),    # i32 [B] out
        ("accept_index", c_void_p),  # i32 [B, Q] out
        ("accept_tokens", c_void_p),  # i32 [B, Q] out
        ("status", c_void_p),        # i32 [B] out
    ]


class KvCommitParams(ctypes.Structure):
    _fields_ = [
        ("B", c_int32), ("Q", c_int32),
        ("NB", c_int32), ("BS", c_int32), ("Dqk", c_int32),
        ("dtype", kdt_dtype),        # F32 or BF16
        ("kv_cache", c_void_p),      # [NB, BS, Dqk] in/out
        ("block_table", c_void_p),   # i32 [B, MB]
        ("MB", c_int32),
        ("kv_len", c_void_p),        # i32 [B]
        ("accept_index", c_void_p),  # i32 [B, Q]
        ("accept_len", c_void_p),    # i32 [B]
        ("new_kv_len", c_void_p),    # i32 [B] out
        ("status", c_void_p),        # i32 [B] out
    ]


OPS = {
    "tree_build": TreeBuildParams,
    "verify_attn": VerifyAttnParams,
    "tree_accept": TreeAcceptParams,
    "tree_sample_accept": TreeSampleAcceptParams,
    "kv_commit": KvCommitParams,
}

_HERE = os.path.dirname(os.path.abspath(__file__))


def candidate_paths():
    """(where, path) pairs in search order: $KDT_LIB, the package's own copy, the source tree's build/."""
    env = os.environ.get("KDT_LIB")
    if env:
        return [("$KDT_LIB", env)]
    return [("the installed package", os.path.join(_HERE, "libkdt.so")),
            ("the source tree's build/", os.path.join(_HERE, os.pardir, os.pardir, "build", "libkdt.so"))]


def _load():
    tried = []
    for where, path in candidate_paths():
        path = os.path.normpath(path)
        if not os.path.isfile(path):
            tried.append(f"{path} ({where}: no such file)")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise LibraryNotFound(f"kdt: cannot load {path} ({where}): {e}") from e
        _declare(lib)
        lib.path = path
        return lib
    raise LibraryNotFound("kdt: libkdt.so not found; looked in: " + "; ".join(tried)
                          + ". Run `make` in the repository, set KDT_LIB=/path/to/libkdt.so, or "
                          "reinstall with `pip install ./python` after `make`.")


def _declare(lib):
    for op, params in OPS.items():
        fn = getattr(lib, "kdt_" + op)
        fn.argtypes = [POINTER(params), c_int, c_void_p]
        fn.restype = c_int
    lib.kdt_last_error.argtypes, lib.kdt_last_error.restype = [], ctypes.c_char_p
    lib.kdt_status_name.argtypes, lib.kdt_status_name.restype = [c_int], ctypes.c_char_p
    lib.kdt_cuda_available.argtypes, lib.kdt_cuda_available.restype = [], c_int


_lib = None


def lib():
    """The loaded library (loaded on first use, so that `import kdt` never fails)."""
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


def call(op, params, backend, stream):
    """Runs kdt_<op>; a non-zero status raises KdtError with kdt_last_error()'s message."""
    lb = lib()
    status = getattr(lb, "kdt_" + op)(ctypes.byref(params), backend, stream)
    if status != KDT_OK:
        raise KdtError(status, lb.kdt_status_name(status).decode(), lb.kdt_last_error().decode(errors="replace"))
