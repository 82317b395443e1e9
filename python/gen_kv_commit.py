"""Reference bundles for kv_commit (docs/interfaces.md 2.5), written from the contract with numpy alone.

    python3 python/gen_kv_commit.py --out DIR --seed S

writes DIR/kv_commit_<case>.kdtr: the inputs (kv_cache, block_table, kv_len, accept_index,
accept_len, sometimes the scalar Q) and expected.<output> for kv_cache, new_kv_len, status.
Status codes: 1 accept_len outside 0 .. Q-1, 2 kv_len outside Q .. MB*BS, 3 the path does not
start at 0 or is not strictly increasing up to at most Q-1, 4 a block_table entry a move
touches is outside [0, NB); the first that applies wins.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundle_args  # noqa: E402
import kdtr  # noqa: E402

I32_MAX, I32_MIN = np.iinfo(np.int32).max, np.iinfo(np.int32).min


def commit_reference(cache, block_table, kv_len, accept_index, accept_len):
    """The contract on a cache of raw element bits [NB, BS, Dqk] (f32, or bf16 as uint16)."""
    NB, BS, D = cache.shape
    B, Q = accept_index.shape
    MB = block_table.shape[1]
    rows = cache.copy().reshape(NB * BS, D)
    new_len = kv_len.copy()
    status = np.zeros(B, np.int32)

    def row(b, slot):
        blk = int(block_table[b, slot // BS])
        return blk * BS + slot % BS if 0 <= blk < NB else None

    for b in range(B):
        L, kl = int(accept_len[b]), int(kv_len[b])
        if not 0 <= L <= Q - 1:
            status[b] = 1
            continue
        if not Q <= kl <= MB * BS:
            status[b] = 2
            continue
        path = accept_index[b, :L + 1].astype(np.int64)
        if path[0] != 0 or np.any(np.diff(path) <= 0) or path[-1] > Q - 1:
            status[b] = 3
            continue
        base = kl - Q
        moves = [(row(b, base + int(path[t])), row(b, base + t)) for t in range(1, L + 1) if path[t] != t]
        if any(src is None or dst is None for src, dst in moves):
            status[b] = 4
            continue
        for src, dst in moves:  # in path order
            rows[dst] = rows[src]
        new_len[b] = kl - Q + L + 1
    return rows.reshape(NB, BS, D), new_len, status


def random_path(rng, Q, L):
    return [0] + sorted(rng.choice(np.arange(1, Q), L, replace=False).tolist())


class Batch:
    """Requests over one paged cache; each request owns its blocks (shuffled over the cache)."""

    def __init__(self, rng, dtype, NB, BS, D, MB, Q):
        self.rng, self.dtype, self.BS, self.MB, self.Q = rng, dtype, BS, MB, Q
        self.NB = NB
        self.free = list(rng.permutation(NB))
        x = rng.standard_normal((NB, BS, D)).astype(np.float32)
        self.cache = kdtr.bf16_from_f32(x).bits if dtype == "bf16" else x
        self.tables, self.kv_len, self.paths, self.lens = [], [], [], []

    def add(self, kv_len=None, path=None, accept_len=None):
        """A request with the given kv_len (default: random, the tree often straddling a block
        boundary) and path (default: random, realistic length). Returns its index."""
        Q, BS, MB = self.Q, self.BS, self.MB
        if kv_len is None:
            kv_len = int(self.rng.integers(Q, MB * BS + 1))
        if path is None:
            L = int(min(Q - 1, self.rng.geometric(0.25) - 1 if self.rng.random() < 0.7 else self.rng.integers(0, Q)))
            path = random_path(self.rng, Q, L)
        table = np.full(MB, -1, np.int32)
        used = -(-max(kv_len, 0) // BS) if 0 < kv_len <= MB * BS else MB
        for i in range(used):
            table[i] = self.free.pop()
        row = np.full(Q, -1, np.int32)
        row[:min(len(path), Q)] = path[:Q]
        self.tables.append(table)
        self.kv_len.append(kv_len)
        self.paths.append(row)
        self.lens.append(len(path) - 1 if accept_len is None else accept_len)
        return len(self.lens) - 1

    def tensors(self, with_q):
        bt, kl = np.stack(self.tables), np.array(self.kv_len, np.int32)
        ai, al = np.stack(self.paths), np.array(self.lens, np.int32)
        cache, new_len, status = commit_reference(self.cache, bt, kl, ai, al)
        wrap = kdtr.BF16 if self.dtype == "bf16" else (lambda a: a)
        t = {"kv_cache": wrap(self.cache), "block_table": bt, "kv_len": kl, "accept_index": ai, "accept_len": al,
             "expected.kv_cache": wrap(cache), "expected.new_kv_len": new_len, "expected.status": status}
        if with_q:
            t["Q"] = np.int32(self.Q)
        return t


def random_batch(rng, dtype, BS, D, Q, MB, B, spare=3):
    bt = Batch(rng, dtype, B * MB + spare, BS, D, MB, Q)
    for _ in range(B - 1):
        bt.add()
    bt.add(path=random_path(rng, Q, (Q - 1) // 2))  # sure to move rows
    return bt


def case_overlap(rng):
    """Hand-picked paths: overlapping moves, no moves, accept_len 0, the longest jump."""
    Q = 9
    bt = Batch(rng, "f32", 8 * 4 + 2, 4, 8, 4, Q)
    for path in ([0, 2, 3], [0, 1, 3, 4], [0, 1, 2, 3], [0], [0, 5, 6, 7, 8], [0, Q - 1],
                 [0, 2, 4, 6, 8], [0, 1, 2, 3, 4, 5, 6, 7, 8]):
        bt.add(kv_len=int(rng.integers(Q, 4 * 4 + 1)), path=path)
    return bt


def case_malformed(rng):
    """Every malformed kind, each next to a good request; plus good requests whose bad table
    entries no move touches."""
    Q, BS, MB = 9, 8, 4
    bt = Batch(rng, "bf16", 60 * MB, BS, 16, MB, Q)
    good = lambda: bt.add()  # noqa: E731
    for kw in (dict(accept_len=-1), dict(accept_len=Q), dict(accept_len=I32_MAX), dict(accept_len=I32_MIN),
               dict(kv_len=Q - 1), dict(kv_len=0), dict(kv_len=-5), dict(kv_len=MB * BS + 1), dict(kv_len=I32_MAX),
               dict(path=[1, 2, 3]), dict(path=[0, 3, 3]), dict(path=[0, 4, 2]), dict(path=[0, 2, Q]),
               dict(path=[0, -1, 2]), dict(path=[0, I32_MIN, 3]), dict(path=[0, 2, I32_MAX])):
        bt.add(**kw)
        good()
    # kv_len 19: the tree's slots 10 .. 18 span table entries 1 and 2. Path [0, 1, 8] moves
    # slot 18 (entry 2) to 12 (entry 1); path [0, 6, 8] moves 16 and 18 (entry 2) to 11 and 12.
    for entry in (-1, bt.NB, I32_MAX, I32_MIN):
        for path, bad in (([0, 1, 8], 2), ([0, 6, 8], 1)):  # a bad source entry, a bad destination
            b = bt.add(kv_len=2 * BS + 3, path=path)
            bt.tables[b][bad] = entry
            good()
    b = bt.add(kv_len=2 * BS + 3, path=[0, 1, 2])  # no move at all: bad entries are never touched
    bt.tables[b][1] = bt.tables[b][2] = -1
    b = bt.add(kv_len=3 * BS, path=[0, 3])  # untouched blocks 0 and 1 may hold anything
    bt.tables[b][0], bt.tables[b][1], bt.tables[b][3] = -7, bt.NB + 5, I32_MAX
    return bt


def case_long(rng):
    """Q = 1025: paths of every length class, long ones spanning many blocks and GPU chunks."""
    Q = 1025
    bt = Batch(rng, "f32", 5 * 70 + 3, 16, 8, 70, Q)
    for L in (1024, 700, 1000, 3):
        bt.add(path=random_path(rng, Q, L))
    bt.add(path=list(range(Q)))  # everything accepted: nothing moves
    return bt


def main():
    out, rng = bundle_args.parse(__doc__, seed_offset=7)
    cases = {  # name: (batch, whether the bundle carries the scalar Q)
        "f32_bs64": (lambda: random_batch(rng, "f32", 64, 24, 33, 3, 6), True),
        "bf16_bs16": (lambda: random_batch(rng, "bf16", 16, 40, 17, 4, 8), False),  # 80-byte rows
        "bf16_bs7": (lambda: random_batch(rng, "bf16", 7, 9, 13, 6, 8), True),      # 18-byte rows
        "f32_bs7": (lambda: random_batch(rng, "f32", 7, 5, 20, 5, 6), False),       # 20-byte rows
        "f32_bs1": (lambda: random_batch(rng, "f32", 1, 4, 9, 12, 4), True),
        "mla": (lambda: random_batch(rng, "bf16", 64, 576, 65, 3, 4), True),
        "long": (lambda: case_long(rng), True),
        "wide": (lambda: random_batch(rng, "f32", 4, 4100, 9, 4, 3), False),       # rows wider than a chunk
        "overlap": (lambda: case_overlap(rng), True),
        "malformed": (lambda: case_malformed(rng), True),
    }
    for name, (make, with_q) in cases.items():
        bt = make()
        t = bt.tensors(with_q)
        kdtr.save(os.path.join(out, f"kv_commit_{name}.kdtr"), t)
        st, al = t["expected.status"], t["accept_len"]
        moved = sum(int(np.sum(t["accept_index"][b, 1:al[b] + 1] != np.arange(1, al[b] + 1)))
                    for b in range(len(al)) if st[b] == 0)
        print(f"kv_commit_{name}.kdtr  {bt.dtype} NB={bt.NB} BS={bt.BS} Dqk={bt.cache.shape[2]} "
              f"B={len(al)} Q={bt.Q}  rows moved {moved}  malformed {(st != 0).sum()}")


if __name__ == "__main__":
    main()
