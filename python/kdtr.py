"""KDTR container (docs/interfaces.md section 1) over numpy: write and read named tensors.

    import numpy as np, kdtr
    kdtr.save("x.kdtr", {"scores": np.zeros((2, 3), np.float32), "budget": np.int32(8)})
    tensors = kdtr.load("x.kdtr")        # dict name -> numpy array (0-d for scalars)

bf16 has no numpy dtype: it is read and written as uint16 bit patterns wrapped in BF16, and
`bf16_from_f32` / `bf16_to_f32` convert (round to nearest even). A file that breaks a rule raises
KdtrError, whose `rule` is the C reader's status for it (KDT_ERR_KDTR_<rule>).
"""
import struct

import numpy as np

MAGIC = b"KDTR"
VERSION = 1
ALIGN = 64
HEADER = struct.Struct("<4sIIIQQ")
MAX_DIM = 1 << 40
MIN_RECORD = 21  # name_len, a 1-byte name, dtype, ndim, offset, nbytes

# code -> numpy dtype; bf16 is stored as its uint16 bits.
DTYPES = {1: np.float32, 2: np.float64, 3: np.float16, 4: np.uint16, 5: np.int8, 6: np.uint8,
          7: np.int16, 8: np.int32, 9: np.int64, 10: np.uint32, 11: np.uint64}
CODES = {np.dtype(t): c for c, t in DTYPES.items() if c != 4}


class BF16:
    """A bf16 tensor given as its uint16 bit patterns."""

    def __init__(self, bits):
        self.bits = np.array(bits, dtype=np.uint16, order="C")  # ascontiguousarray would make 0-d 1-d

    @property
    def shape(self):
        return self.bits.shape

    def to_f32(self):
        return bf16_to_f32(self.bits)


def bf16_from_f32(x):
    """Rounds float32 values to bf16 (nearest even) and returns a BF16."""
    u = np.array(x, dtype=np.float32, order="C").view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    bits = np.where(nan, 0x7FC0, rounded).astype(np.uint16)
    return BF16(bits)


def bf16_to_f32(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _encode(value):
    """(code, shape, bytes) of one tensor."""
    if isinstance(value, BF16):
        return 4, value.bits.shape, value.bits.tobytes()
    arr = np.asarray(value)
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)
    code = CODES.get(arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype)
    if code is None:
        raise TypeError(f"kdtr: dtype {arr.dtype} has no KDTR code")
    return code, arr.shape, np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def dumps(tensors):
    """Serializes a dict name -> array (or BF16) to KDTR bytes."""
    if len(tensors) > 65535:
        raise ValueError("kdtr: more than 65535 tensors")
    table, blobs, offset = [], [], 0
    for name, value in tensors.items():
        raw = name.encode("utf-8")
        if not 1 <= len(raw) <= 255 or b"\0" in raw:
            raise ValueError(f"kdtr: bad tensor name {name!r}")
        code, shape, data = _encode(value)
        if len(shape) > 8 or any(d > MAX_DIM for d in shape):
            raise ValueError(f"kdtr: tensor {name!r}: shape {shape} out of range")
        table.append(struct.pack("<H", len(raw)) + raw + struct.pack("<BB", code, len(shape))
                     + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<QQ", offset, len(data)))
        blobs.append(data)
        offset = _align(offset + len(data))
    table = b"".join(table)
    data_offset = _align(HEADER.size + len(table))
    out = bytearray(data_offset + offset)
    pos = data_offset
    for blob in blobs:
        out[pos:pos + len(blob)] = blob
        pos = _align(pos + len(blob))
    out[:HEADER.size] = HEADER.pack(MAGIC, VERSION, len(tensors), 0, data_offset, len(out))
    out[HEADER.size:HEADER.size + len(table)] = table
    return bytes(out)


def save(path, tensors):
    with open(path, "wb") as f:
        f.write(dumps(tensors))


class KdtrError(ValueError):
    """A file breaks a rule of docs/interfaces.md section 1; `rule` is the C status suffix (KDT_ERR_KDTR_<rule>)."""

    def __init__(self, rule, message):
        super().__init__(f"{message} ({rule})")
        self.rule = rule


def loads(buf):
    """Parses KDTR bytes into a dict name -> numpy array (BF16 for bf16), checking every rule."""
    buf = memoryview(buf).cast("B")
    if len(buf) < HEADER.size:
        raise KdtrError("TRUNCATED", "shorter than the 32-byte header")
    magic, version, n, flags, data_offset, file_size = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise KdtrError("MAGIC", "magic is not KDTR")
    if version != VERSION:
        raise KdtrError("VERSION", f"version {version} is not 1")
    if n > 65535:
        raise KdtrError("N_TENSORS", f"n_tensors {n} > 65535")
    if flags:
        raise KdtrError("FLAGS", f"flags {flags:#x} has a set bit")
    if file_size != len(buf):
        raise KdtrError("FILE_SIZE", f"file_size {file_size} != length {len(buf)}")
    if data_offset % ALIGN or data_offset > file_size:
        raise KdtrError("DATA_OFFSET", f"data_offset {data_offset} misaligned or past the end")
    if n > (len(buf) - HEADER.size) // MIN_RECORD:
        raise KdtrError("TRUNCATED", f"{n} table records cannot fit in {len(buf)} bytes")
    pos, out, spans = HEADER.size, {}, []

    def take(fmt):
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(buf):
            raise KdtrError("TRUNCATED", "table runs past the end")
        vals = struct.unpack_from(fmt, buf, pos)
        pos += size
        return vals

    for _ in range(n):
        (name_len,) = take("<H")
        if not 1 <= name_len <= 255:
            raise KdtrError("NAME_LEN", f"name_len {name_len} outside 1..255")
        (raw,) = take(f"{name_len}s")
        if b"\0" in raw:
            raise KdtrError("NAME", "name holds a NUL byte")
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise KdtrError("NAME", "name is not UTF-8") from e
        if name in out:
            raise KdtrError("NAME_DUP", f"duplicate name {name!r}")
        code, ndim = take("<BB")
        if code not in DTYPES:
            raise KdtrError("DTYPE", f"tensor {name!r}: unknown dtype code {code}")
        if ndim > 8:
            raise KdtrError("NDIM", f"tensor {name!r}: ndim {ndim} > 8")
        dims = take(f"<{ndim}Q")
        if any(d > MAX_DIM for d in dims):
            raise KdtrError("DIM", f"tensor {name!r}: dim > 2^40")
        size = int(np.prod(dims, dtype=object)) * np.dtype(DTYPES[code]).itemsize
        if size >= 1 << 64:
            raise KdtrError("DIM", f"tensor {name!r}: byte count overflows 64 bits")
        offset, nbytes = take("<QQ")
        if size != nbytes:
            raise KdtrError("NBYTES", f"tensor {name!r}: nbytes {nbytes} != product(dims) * size = {size}")
        if offset % ALIGN:
            raise KdtrError("OFFSET_ALIGN", f"tensor {name!r}: offset {offset} not a multiple of 64")
        if offset + nbytes > file_size - data_offset:
            raise KdtrError("BOUNDS", f"tensor {name!r}: bytes past the end of the file")
        out[name] = (code, dims, offset, nbytes)
    if data_offset < pos:
        raise KdtrError("DATA_OFFSET", f"data_offset {data_offset} inside the table (ends at {pos})")
    for name, (code, dims, offset, nbytes) in out.items():
        if nbytes:  # an empty tensor occupies no bytes, so it can neither overlap nor pad
            spans.append((offset, offset + nbytes, name))
    spans.sort()
    for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
        if s1 < e0:
            raise KdtrError("OVERLAP", f"tensors {a!r} and {b!r} overlap")
        if any(buf[data_offset + e0:data_offset + s1]):
            raise KdtrError("PADDING", f"non-zero padding between {a!r} and {b!r}")
    result = {}
    for name, (code, dims, offset, nbytes) in out.items():
        start = data_offset + offset
        arr = np.frombuffer(buf[start:start + nbytes], dtype=np.dtype(DTYPES[code]).newbyteorder("<"))
        try:
            arr = arr.reshape(dims).copy()
        except ValueError as e:  # a valid empty tensor whose other dims numpy cannot index
            raise ValueError(f"kdtr: tensor {name!r}: numpy cannot hold shape {dims}") from e
        result[name] = BF16(arr) if code == 4 else arr
    return result


def load(path):
    with open(path, "rb") as f:
        return loads(f.read())
