"""KDTR container (docs/interfaces.md section 1) across languages: python/kdtr.py round trips, the C writer read
by Python and the Python writer read by C (ctypes on $KDT_LIB), `kdt info` ($KDT_BIN) on good and
corrupt files, and python/kdtr.py's own verdict on every corrupt file. The corrupt files are
built here, independently of the C test's. C parts skip when the library or binary is absent.
"""
import ctypes
import os
import subprocess
import struct
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))
import kdtr  # noqa: E402

SEED = int(os.environ.get("KDT_SEED") or (time.time_ns() % 1_000_000))
LIB = os.environ.get("KDT_LIB", "")
BIN = os.environ.get("KDT_BIN", "")
NUMPY = {1: np.float32, 2: np.float64, 3: np.float16, 5: np.int8, 6: np.uint8, 7: np.int16, 8: np.int32,
         9: np.int64, 10: np.uint32, 11: np.uint64}
NAMES = {1: "f32", 2: "f64", 3: "f16", 4: "bf16", 5: "i8", 6: "u8", 7: "i16", 8: "i32", 9: "i64", 10: "u32", 11: "u64"}


def random_tensor(rng, code, shape):
    if code == 4:
        return kdtr.BF16(rng.integers(0, 1 << 16, size=shape, dtype=np.uint16))
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(NUMPY[code]).itemsize, dtype=np.uint8)
    return raw.view(NUMPY[code]).reshape(shape)  # every bit pattern, NaNs included


def sample(rng):
    """Every dtype as a 3-d tensor, a scalar and an empty tensor; an 8-d tensor; multibyte names."""
    out = {}
    for code, name in NAMES.items():
        out[f"t_{name}"] = random_tensor(rng, code, tuple(int(d) for d in rng.integers(1, 5, size=3)))
        out[f"scalar_{name}"] = random_tensor(rng, code, ())
        out[f"empty_{name}"] = random_tensor(rng, code, (int(rng.integers(0, 3)), 0))
    out["eight_dims"] = random_tensor(rng, 8, (2, 1, 3, 1, 2, 1, 1, 2))
    out["héllo→wörld"] = random_tensor(rng, 1, (5,))
    out["名前😀"] = random_tensor(rng, 4, (3,))
    out["é" * 127 + "x"] = random_tensor(rng, 6, (2,))  # 255 bytes
    return out


def bits(value):
    """(code, shape, raw bytes) for comparison."""
    if isinstance(value, kdtr.BF16):
        return 4, value.shape, value.bits.tobytes()
    return kdtr.CODES[value.dtype], value.shape, value.tobytes()


def assert_same(got, want):
    assert list(got) == list(want), "names or order differ"
    for name in want:
        assert bits(got[name]) == bits(want[name]), f"tensor {name!r} differs (seed {SEED})"


# ---------------------------------------------------------------- python only

def test_python_round_trip_every_dtype(tmp_path):
    want = sample(np.random.default_rng(SEED))
    assert_same(kdtr.loads(kdtr.dumps(want)), want)
    kdtr.save(tmp_path / "x.kdtr", want)
    assert_same(kdtr.load(tmp_path / "x.kdtr"), want)


def test_python_layout():
    buf = kdtr.dumps({"a": np.arange(3, dtype=np.int32), "b": np.float32(1.5)})
    magic, version, n, flags, data_offset, file_size = struct.unpack_from("<4sIIIQQ", buf)
    assert (magic, version, n, flags, file_size) == (b"KDTR", 1, 2, 0, len(buf))
    assert data_offset % 64 == 0 and data_offset >= 32 + (2 + 1 + 2 + 8 + 16) + (2 + 1 + 2 + 16)
    assert buf[data_offset:data_offset + 12] == np.arange(3, dtype=np.int32).tobytes()
    assert buf[data_offset + 64:data_offset + 68] == np.float32(1.5).tobytes()


def test_bf16_rounding():
    f = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.0, np.inf, -np.inf, np.nan, np.finfo(np.float32).max, 0.0], np.float32)
    b = kdtr.bf16_from_f32(f).bits
    # 1 + 2^-8 is a tie and rounds to even (1.0); 1 + 3 * 2^-8 rounds up; the largest f32 becomes inf.
    assert list(b) == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0xFF80, 0x7FC0, 0x7F80, 0x0000]
    assert kdtr.bf16_from_f32(np.float32(2.5)).shape == ()
    assert kdtr.bf16_to_f32(np.uint16(0x4020)) == np.float32(2.5)


def test_python_writer_refuses():
    for bad in ({"": np.int8(1)}, {"n" * 256: np.int8(1)}, {"a\0b": np.int8(1)}):
        with pytest.raises(ValueError):
            kdtr.dumps(bad)
    with pytest.raises(TypeError):
        kdtr.dumps({"c": np.complex64(1)})


# ---------------------------------------------------------------- corrupt files

def record(name, code, dims, offset, nbytes, name_len=None):
    raw = name if isinstance(name, bytes) else name.encode()
    return (struct.pack("<H", len(raw) if name_len is None else name_len) + raw + struct.pack("<BB", code, len(dims))
            + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<QQ", offset, nbytes))


def build(records=None, data=None, magic=b"KDTR", version=1, n=None, flags=0, data_offset=None, file_size=None, cut=None):
    """A file from explicit fields; by default 'a' f32 [2, 3] at 0 and 'b' i32 [4] at 64 in 128 data bytes."""
    if records is None:
        records = [record("a", 1, (2, 3), 0, 24), record("b", 8, (4,), 64, 16)]
    if data is None:
        data = bytearray(128)
        data[0:24] = bytes(range(1, 25))
        data[64:80] = bytes(range(65, 81))
    table = b"".join(records)
    doff = (32 + len(table) + 63) // 64 * 64
    body = table + bytes(doff - 32 - len(table)) + bytes(data)
    size = 32 + len(body) if cut is None else cut
    header = struct.pack("<4sIIIQQ", magic, version, len(records) if n is None else n, flags,
                         doff if data_offset is None else data_offset, size if file_size is None else file_size)
    return (header + body)[:size]


def padded(offset_of_nonzero):
    data = bytearray(128)
    data[0:24] = bytes(range(1, 25))
    data[64:80] = bytes(range(65, 81))
    data[offset_of_nonzero] = 9
    return data


REC_A = record("a", 1, (2, 3), 0, 24)
CORRUPT = {
    "magic": ("MAGIC", build(magic=b"KDTr")),
    "version": ("VERSION", build(version=3)),
    "flags": ("FLAGS", build(flags=4)),
    "truncated_header": ("TRUNCATED", build()[:20]),
    "empty_file": ("TRUNCATED", b""),
    "truncated_table": ("TRUNCATED", build(cut=32 + 37 + 10, data_offset=0)),
    "truncated_table_count": ("TRUNCATED", build(n=500)),
    "file_size_larger": ("FILE_SIZE", build(file_size=1000)),
    "file_size_smaller": ("FILE_SIZE", build(file_size=255)),
    "n_tensors": ("N_TENSORS", build(n=65536)),
    "name_len_0": ("NAME_LEN", build([REC_A, record(b"", 8, (4,), 64, 16)])),
    "name_len_256": ("NAME_LEN", build([record("z" * 256, 1, (2, 3), 0, 24), record("b", 8, (4,), 64, 16)])),
    "name_dup": ("NAME_DUP", build([REC_A, record("a", 8, (4,), 64, 16)])),
    "name_nul": ("NAME", build([REC_A, record(b"x\0", 8, (4,), 64, 16)])),
    "name_latin1": ("NAME", build([REC_A, record(b"caf\xe9", 8, (4,), 64, 16)])),
    "name_overlong": ("NAME", build([REC_A, record(b"\xc1\xbf", 8, (4,), 64, 16)])),
    "name_surrogate": ("NAME", build([REC_A, record(b"\xed\xbf\xbf", 8, (4,), 64, 16)])),
    "dtype_0": ("DTYPE", build([REC_A, record("b", 0, (4,), 64, 16)])),
    "dtype_12": ("DTYPE", build([REC_A, record("b", 12, (4,), 64, 16)])),
    "ndim_9": ("NDIM", build([REC_A, record("b", 8, (4,) + (1,) * 8, 64, 16)])),
    "dim_2e40_plus_1": ("DIM", build([REC_A, record("b", 8, (2**40 + 1, 0), 64, 0)])),
    "dims_overflow": ("DIM", build([REC_A, record("b", 2, (2**40, 2**40), 64, 0)])),
    "nbytes": ("NBYTES", build([REC_A, record("b", 8, (4,), 64, 17)])),
    "offset_align": ("OFFSET_ALIGN", build([REC_A, record("b", 8, (4,), 96, 16)])),
    "data_offset_align": ("DATA_OFFSET", build(data_offset=160)),
    "data_offset_in_table": ("DATA_OFFSET", build(data_offset=64)),
    "data_offset_past_end": ("DATA_OFFSET", build(data_offset=384)),
    "overlap": ("OVERLAP", build([record("a", 6, (80,), 0, 80), record("b", 8, (4,), 64, 16)])),
    "bounds": ("BOUNDS", build([REC_A, record("b", 8, (32,), 64, 128)])),
    "bounds_empty": ("BOUNDS", build([REC_A, record("b", 8, (0,), 256, 0)])),
    "padding": ("PADDING", build(data=padded(63))),
}
VALID = {
    "base": build(),
    "name_255": build([record("é" * 127 + "x", 1, (2, 3), 0, 24), record("b", 8, (4,), 64, 16)]),
    "empty_tensor_with_huge_dims": build([REC_A, record("b", 8, (2**40, 2**40, 0), 64, 0)], data=padded(0)[:64] + bytes(64)),
}


@pytest.mark.parametrize("case", CORRUPT)
def test_python_reader_rejects(case):
    rule, buf = CORRUPT[case]
    with pytest.raises(kdtr.KdtrError) as e:
        kdtr.loads(buf)
    assert e.value.rule == rule, str(e.value)


@pytest.mark.parametrize("case", VALID)
def test_python_reader_accepts(case):
    if case == "empty_tensor_with_huge_dims":  # numpy cannot index that shape, so it says so
        with pytest.raises(ValueError, match="numpy cannot hold"):
            kdtr.loads(VALID[case])
        return
    assert len(kdtr.loads(VALID[case])) == 2


need_bin = pytest.mark.skipif(not (BIN and os.path.exists(BIN)), reason="KDT_BIN (build/kdt) not set or missing")


def kdt_info(path):
    return subprocess.run([BIN, "info", str(path)], capture_output=True, text=True, timeout=60)


@need_bin
@pytest.mark.parametrize("case", CORRUPT)
def test_kdt_info_rejects(case, tmp_path):
    rule, buf = CORRUPT[case]
    (tmp_path / "f.kdtr").write_bytes(buf)
    p = kdt_info(tmp_path / "f.kdtr")
    lines = p.stderr.splitlines()
    assert p.returncode != 0 and len(lines) == 1, (p.returncode, p.stderr)
    assert lines[0].endswith(f"(KDT_ERR_KDTR_{rule})"), lines[0]


@need_bin
@pytest.mark.parametrize("case", VALID)
def test_kdt_info_accepts(case, tmp_path):
    (tmp_path / "f.kdtr").write_bytes(VALID[case])
    p = kdt_info(tmp_path / "f.kdtr")
    assert p.returncode == 0 and p.stderr == "", p.stderr


@need_bin
def test_kdt_info_lists_python_file(tmp_path):
    want = sample(np.random.default_rng(SEED + 1))
    kdtr.save(tmp_path / "x.kdtr", want)
    p = kdt_info(tmp_path / "x.kdtr")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].endswith(f"{len(want)} tensors")
    for line, (name, value) in zip(lines[1:], want.items()):
        code, shape, _ = bits(value)
        assert line.split(None, 2) == [name, NAMES[code], "[" + ", ".join(map(str, shape)) + "]"], line
    assert len(lines) == 1 + len(want)


# ---------------------------------------------------------------- C library through ctypes

class View(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int),
                ("dims", ctypes.c_uint64 * 8), ("numel", ctypes.c_uint64), ("nbytes", ctypes.c_uint64),
                ("data", ctypes.c_void_p)]


@pytest.fixture(scope="module")
def lib():
    if not (LIB and os.path.exists(LIB)):
        pytest.skip("KDT_LIB (build/libkdt.so) not set or missing")
    c = ctypes.CDLL(LIB)
    P = ctypes.POINTER
    c.kdt_kdtr_writer_create.argtypes = [P(ctypes.c_void_p)]
    c.kdt_kdtr_writer_free.argtypes = [ctypes.c_void_p]
    c.kdt_kdtr_writer_add.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                      P(ctypes.c_uint64), ctypes.c_void_p]
    c.kdt_kdtr_writer_save.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    c.kdt_kdtr_writer_to_memory.argtypes = [ctypes.c_void_p, P(ctypes.c_void_p), P(ctypes.c_size_t)]
    c.kdt_kdtr_open_memory.argtypes = [ctypes.c_char_p, ctypes.c_size_t, P(ctypes.c_void_p)]
    c.kdt_kdtr_close.argtypes = [ctypes.c_void_p]
    c.kdt_kdtr_count.argtypes = [ctypes.c_void_p]
    c.kdt_kdtr_count.restype = ctypes.c_uint32
    c.kdt_kdtr_get.argtypes = [ctypes.c_void_p, ctypes.c_uint32, P(View)]
    c.kdt_last_error.restype = ctypes.c_char_p
    return c


def c_write(lib, tensors, path=None):
    """Writes tensors with the C writer: to path, or returns the bytes of to_memory."""
    w = ctypes.c_void_p()
    assert lib.kdt_kdtr_writer_create(ctypes.byref(w)) == 0
    try:
        for name, value in tensors.items():
            code, shape, raw = bits(value)
            dims = (ctypes.c_uint64 * 8)(*shape)
            st = lib.kdt_kdtr_writer_add(w, name.encode(), code, len(shape), dims, raw)
            assert st == 0, lib.kdt_last_error()
        if path is not None:
            assert lib.kdt_kdtr_writer_save(w, str(path).encode()) == 0, lib.kdt_last_error()
            return None
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        assert lib.kdt_kdtr_writer_to_memory(w, ctypes.byref(buf), ctypes.byref(size)) == 0
        out = ctypes.string_at(buf, size.value)
        ctypes.CDLL(None).free(buf)
        return out
    finally:
        lib.kdt_kdtr_writer_free(w)


def test_c_writer_python_reader(lib, tmp_path):
    want = sample(np.random.default_rng(SEED + 2))
    buf = c_write(lib, want)
    assert_same(kdtr.loads(buf), want)
    c_write(lib, want, tmp_path / "c.kdtr")
    assert (tmp_path / "c.kdtr").read_bytes() == buf
    assert not (tmp_path / "c.kdtr.tmp").exists()
    assert buf == kdtr.dumps(want), "the C and Python writers lay out the same tensors differently"


def test_python_writer_c_reader(lib):
    want = sample(np.random.default_rng(SEED + 3))
    buf = kdtr.dumps(want)
    r = ctypes.c_void_p()
    assert lib.kdt_kdtr_open_memory(buf, len(buf), ctypes.byref(r)) == 0, lib.kdt_last_error()
    try:
        assert lib.kdt_kdtr_count(r) == len(want)
        for i, (name, value) in enumerate(want.items()):
            v = View()
            assert lib.kdt_kdtr_get(r, i, ctypes.byref(v)) == 0
            code, shape, raw = bits(value)
            assert v.name.decode() == name and v.dtype == code and tuple(v.dims[:v.ndim]) == shape
            assert v.data % 64 == 0 or v.nbytes == 0
            assert ctypes.string_at(v.data, v.nbytes) == raw, name
    finally:
        lib.kdt_kdtr_close(r)


@pytest.mark.parametrize("case", CORRUPT)
def test_c_reader_rejects(lib, case):
    rule, buf = CORRUPT[case]
    r = ctypes.c_void_p()
    st = lib.kdt_kdtr_open_memory(buf, len(buf), ctypes.byref(r))
    status = {"TRUNCATED": 100, "MAGIC": 101, "VERSION": 102, "N_TENSORS": 103, "FLAGS": 104, "DATA_OFFSET": 105,
              "FILE_SIZE": 106, "NAME_LEN": 107, "NAME": 108, "NAME_DUP": 109, "DTYPE": 110, "NDIM": 111,
              "DIM": 112, "NBYTES": 113, "OFFSET_ALIGN": 114, "BOUNDS": 115, "OVERLAP": 116, "PADDING": 117}[rule]
    assert st == status and not r.value, lib.kdt_last_error()
