"""Writes kdtr_interop.kdtr with python/kdtr.py, for tests/test_kdtr.c to read back.

    python3 python/gen_kdtr.py --out DIR --seed S

Every value follows a pattern the C test recomputes on its own. For a tensor with salt s,
element i (flat, row-major) takes x = mix(seed + (s << 32) + i), where mix(z) multiplies by
0x9E3779B97F4A7C15, xors with its own >> 29, multiplies by 0xBF58476D1CE4E5B9 and xors with
its own >> 32 (all mod 2^64), and stores:
  integers  the low bits of x, two's complement for the signed dtypes;
  f32  ((x >> 40) - 2^23) / 64      f64  ((x >> 11) - 2^52) / 2^30
  f16  ((x >> 53) - 1024) / 16      bf16 ((x >> 56) - 128) / 4      (all exact in their dtype)
Tensors: `seed` u64 scalar; for each dtype with code c: `t_<dtype>` [2, 3, c] salt c,
`s_<dtype>` scalar salt 100 + c, `e_<dtype>` [c, 0]; and an 8-d i32 [2]*8 named
"ünïcødé/名前/😀" with salt 200.
"""
import argparse
import os

import numpy as np

import kdtr

NAMES = {1: "f32", 2: "f64", 3: "f16", 4: "bf16", 5: "i8", 6: "u8", 7: "i16", 8: "i32", 9: "i64",
         10: "u32", 11: "u64"}
INTS = {5: np.int8, 6: np.uint8, 7: np.int16, 8: np.int32, 9: np.int64, 10: np.uint32, 11: np.uint64}
UNSIGNED = {np.int8: np.uint8, np.int16: np.uint16, np.int32: np.uint32, np.int64: np.uint64}
M64 = (1 << 64) - 1


def mix(seed, salt, n):
    """x for elements 0 .. n-1 (uint64, wrapping arithmetic)."""
    z = np.arange(n, dtype=np.uint64) + np.uint64((seed + (salt << 32)) & M64)
    z = z * np.uint64(0x9E3779B97F4A7C15)
    z ^= z >> np.uint64(29)
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    return z ^ (z >> np.uint64(32))


def values(code, x):
    """The stored values of dtype `code` for pattern x (an array or BF16)."""
    signed = lambda bits, scale, bias: ((x >> np.uint64(bits)).astype(np.int64) - bias) / scale
    if code == 1:
        return signed(40, 64.0, 1 << 23).astype(np.float32)
    if code == 2:
        return signed(11, float(1 << 30), 1 << 52).astype(np.float64)
    if code == 3:
        return signed(53, 16.0, 1024).astype(np.float16)
    if code == 4:
        return kdtr.bf16_from_f32(signed(56, 4.0, 128).astype(np.float32))
    t = INTS[code]
    u = UNSIGNED.get(t, t)
    return x.astype(u).view(t)  # astype to unsigned keeps the low bits


def tensors(seed):
    out = {"seed": np.uint64(seed)}
    for code, name in NAMES.items():
        shape = (2, 3, code)
        v = values(code, mix(seed, code, int(np.prod(shape))))
        out[f"t_{name}"] = kdtr.BF16(v.bits.reshape(shape)) if code == 4 else v.reshape(shape)
        s = values(code, mix(seed, 100 + code, 1))
        out[f"s_{name}"] = kdtr.BF16(s.bits.reshape(())) if code == 4 else s.reshape(())
        empty = np.zeros((code, 0), kdtr.DTYPES[code])
        out[f"e_{name}"] = kdtr.BF16(empty) if code == 4 else empty
    out["ünïcødé/名前/😀"] = values(8, mix(seed, 200, 256)).reshape((2,) * 8)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t = tensors(args.seed)
    path = os.path.join(args.out, "kdtr_interop.kdtr")
    kdtr.save(path, t)
    back = kdtr.loads(open(path, "rb").read())  # the python reader accepts what it wrote
    assert list(back) == list(t)
    print(f"wrote {path}: {len(t)} tensors")


if __name__ == "__main__":
    main()
