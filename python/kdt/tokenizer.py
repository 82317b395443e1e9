"""The C tokenizer (include/kdt/tokenizer.h) from Python.

    tok = kdt.Tokenizer("models/kdt-small")
    ids = tok.encode("Hello")            # list of ints, no BOS
    text = tok.decode(ids)               # str (invalid UTF-8 as U+FFFD)
"""
import ctypes
from ctypes import POINTER, c_char_p, c_int, c_int32, c_size_t, c_void_p

from ._lib import KDT_OK, KdtError, lib

_libc = ctypes.CDLL(None)
_libc.free.argtypes = [c_void_p]
_declared = set()


def _api():
    lb = lib()
    if id(lb) in _declared:
        return lb
    lb.kdt_tokenizer_load.argtypes = [c_char_p, POINTER(c_void_p)]
    lb.kdt_tokenizer_free.argtypes = [c_void_p]
    lb.kdt_tokenizer_encode.argtypes = [c_void_p, c_char_p, c_size_t, c_int, POINTER(POINTER(c_int32)), POINTER(c_size_t)]
    lb.kdt_tokenizer_decode.argtypes = [c_void_p, POINTER(c_int32), c_size_t, POINTER(c_void_p), POINTER(c_size_t)]
    for name in ("vocab_size", "bos_id", "eos_id"):
        getattr(lb, "kdt_tokenizer_" + name).argtypes = [c_void_p]
        getattr(lb, "kdt_tokenizer_" + name).restype = c_int32
    lb.kdt_tokenizer_token_id.argtypes, lb.kdt_tokenizer_token_id.restype = [c_void_p, c_char_p], c_int32
    lb.kdt_tokenizer_chat_template.argtypes, lb.kdt_tokenizer_chat_template.restype = [c_void_p], c_char_p
    lb.kdt_detok_stream_create.argtypes = [c_void_p, POINTER(c_void_p)]
    lb.kdt_detok_stream_push.argtypes = [c_void_p, c_int32, POINTER(c_char_p), POINTER(c_size_t)]
    lb.kdt_detok_stream_flush.argtypes = [c_void_p, POINTER(c_char_p), POINTER(c_size_t)]
    lb.kdt_detok_stream_free.argtypes = [c_void_p]
    for fn in ("load", "encode", "decode"):
        getattr(lb, "kdt_tokenizer_" + fn).restype = c_int
    for fn in ("create", "push", "flush"):
        getattr(lb, "kdt_detok_stream_" + fn).restype = c_int
    _declared.add(id(lb))
    return lb


def _check(lb, status):
    if status != KDT_OK:
        raise KdtError(status, lb.kdt_status_name(status).decode(), lb.kdt_last_error().decode(errors="replace"))


class Tokenizer:
    """A tokenizer folder: tokenizer.json (+ tokenizer_config.json) or tiktoken.model + tokenizer_config.json."""

    def __init__(self, path):
        self._lib = _api()
        self._h = c_void_p()
        _check(self._lib, self._lib.kdt_tokenizer_load(str(path).encode(), ctypes.byref(self._h)))

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.kdt_tokenizer_free(self._h)
            self._h = None

    def encode_bytes(self, data, add_special=False):
        """ids of UTF-8 bytes (KdtError naming the byte offset when they are not valid UTF-8)."""
        ids, n = POINTER(c_int32)(), c_size_t()
        _check(self._lib, self._lib.kdt_tokenizer_encode(self._h, data, len(data), int(add_special), ctypes.byref(ids),
                                                          ctypes.byref(n)))
        try:
            return ids[:n.value]
        finally:
            _libc.free(ctypes.cast(ids, c_void_p))

    def encode(self, text, add_special=False):
        return self.encode_bytes(text.encode("utf-8", "surrogatepass"), add_special)

    def decode(self, ids):
        arr = (c_int32 * len(ids))(*ids)
        out, n = c_void_p(), c_size_t()
        _check(self._lib, self._lib.kdt_tokenizer_decode(self._h, arr, len(ids), ctypes.byref(out), ctypes.byref(n)))
        try:
            return ctypes.string_at(out, n.value).decode("utf-8")
        finally:
            _libc.free(out)

    def decode_stream(self, ids):
        """The pieces a kdt_detok_stream gives for each id in turn, then the flush's, as bytes."""
        s = c_void_p()
        _check(self._lib, self._lib.kdt_detok_stream_create(self._h, ctypes.byref(s)))
        out, text, n = [], c_char_p(), c_size_t()
        try:
            for i in ids:
                _check(self._lib, self._lib.kdt_detok_stream_push(s, i, ctypes.byref(text), ctypes.byref(n)))
                out.append(ctypes.string_at(text, n.value))
            _check(self._lib, self._lib.kdt_detok_stream_flush(s, ctypes.byref(text), ctypes.byref(n)))
            out.append(ctypes.string_at(text, n.value))
        finally:
            self._lib.kdt_detok_stream_free(s)
        return out

    @property
    def vocab_size(self):
        return self._lib.kdt_tokenizer_vocab_size(self._h)

    @property
    def bos_id(self):
        return self._lib.kdt_tokenizer_bos_id(self._h)

    @property
    def eos_id(self):
        return self._lib.kdt_tokenizer_eos_id(self._h)

    @property
    def chat_template(self):
        t = self._lib.kdt_tokenizer_chat_template(self._h)
        return t.decode() if t is not None else None

    def token_id(self, token):
        return self._lib.kdt_tokenizer_token_id(self._h, token.encode())
