"""Reference bundles for verify_attn (docs/interfaces.md 2.2), written from the rule of docs/interfaces.md with numpy alone.

    python3 python/gen_verify_attn.py --out DIR --seed S [--only NAME ...] [--sm-scale X]

writes DIR/verify_attn_<case>.kdtr: the inputs (q, kv + kv_len or kv_cache + block_table +
kv_len, tree_mask, sm_scale, dv) and expected.o, expected.lse (f64, computed in f64 from the
very values stored in the bundle, so a bf16 bundle's reference uses the bf16-rounded inputs).
Tree masks come from best-first trees built by the tree_build rule (docs/interfaces.md 2.1) on random top-K
scores; an underfull tree leaves fill rows and columns of zeros. Cache rows that hold no key
of any request are NaN, so a kernel that reads one fails.

DIR/verify_attn_bad_<case>.kdtr are inputs the op must refuse; expected.error holds the
kdt_status code (include/kdt/kdt.h) it must return.
"""
import argparse
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kdtr  # noqa: E402

KIMI_K2_SM_SCALE = 0.13086  # 192^-0.5 * mscale^2
ERR_INVALID_ARG, ERR_NOT_FOUND, ERR_DTYPE, ERR_SHAPE = 1, 2, 3, 4


def best_first_mask(rng, Q, D, K):
    """[Q, Q] ancestor-or-self mask of a tree built by the tree_build rule with budget Q - 1."""
    logits = rng.normal(0, 2, (D, K))
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    scores = np.sort(logp, axis=1)[:, ::-1].astype(np.float32)  # top-K order per depth
    parent, score = [-1], [np.float32(0)]
    # Candidates: (-score, depth, parent index, k): the heap order is the rule's tie order.
    heap = [(-float(scores[0, k]), 1, 0, k) for k in range(K) if np.isfinite(scores[0, k])]
    heapq.heapify(heap)
    while heap and len(parent) < Q:
        neg, d, par, k = heapq.heappop(heap)
        parent.append(par)
        score.append(np.float32(-neg))
        if d < D:
            me = len(parent) - 1
            for k2 in range(K):
                s = np.float32(score[me] + scores[d, k2])
                if np.isfinite(s):
                    heapq.heappush(heap, (-float(s), d + 1, me, k2))
    mask = np.zeros((Q, Q), np.uint8)
    for i in range(len(parent)):
        a = i
        while a >= 0:
            mask[i, a] = 1
            a = parent[a]
    return mask


def reference(q, keys, mask, kv_len, scale, dv):
    """o [B, Q, H, Dv], lse [B, Q, H] in f64. keys[b] is request b's [kv_len[b], Dqk] (f64)."""
    B, Q, H, Dqk = q.shape
    o = np.zeros((B, Q, H, dv))
    lse = np.full((B, Q, H), -np.inf)
    for b in range(B):
        n = int(kv_len[b])
        s = (q[b].reshape(Q * H, Dqk) @ keys[b].T).reshape(Q, H, n) * scale
        seen = np.ones((Q, n), bool)
        seen[:, n - Q:] = mask[b] != 0
        s = np.where(seen[:, None, :], s, -np.inf)
        rows = seen.any(1)  # a row that sees no key keeps o = 0, lse = -inf
        mx = s[rows].max(-1, keepdims=True)
        lse[b, rows] = (mx + np.log(np.exp(s[rows] - mx).sum(-1, keepdims=True)))[..., 0]
        p = np.exp(s[rows] - lse[b, rows][..., None])
        o[b, rows] = (p.reshape(-1, n) @ keys[b][:, :dv]).reshape(-1, H, dv)
    return o, lse


def store(x, dtype):
    """(bundle tensor, the f64 values it holds)."""
    if dtype == "bf16":
        t = kdtr.bf16_from_f32(x.astype(np.float32))
        return t, t.to_f32().astype(np.float64)
    t = x.astype(np.float32)
    return t, t.astype(np.float64)


def make_case(rng, B, H, Q, kv_len, Dv=512, Dr=64, dtype="f32", bs=None, tree=(6, 4), scale=KIMI_K2_SM_SCALE):
    """Inputs and expected outputs. kv_len: int or one per request; bs: paged block size (None:
    contiguous); tree: (D, K) of the best-first trees (a small trie leaves fill rows)."""
    kv_len = np.broadcast_to(np.asarray(kv_len, np.int32), (B,)).copy()
    Dqk = Dv + Dr
    scale = float(np.float32(scale))
    # Scores of std about 1.5 whatever Dqk: peaked enough to matter, never one-hot.
    q, q64 = store(rng.standard_normal((B, Q, H, Dqk)) * (1.5 / (scale * np.sqrt(Dqk))), dtype)
    mask = np.stack([best_first_mask(rng, Q, *tree) for _ in range(B)])
    t = {"q": q, "tree_mask": mask, "sm_scale": np.float32(scale), "dv": np.int32(Dv), "kv_len": kv_len}
    if bs is None:
        L = int(kv_len.max()) + 3
        kv = np.full((B, L, Dqk), np.nan)
        for b in range(B):
            kv[b, :kv_len[b]] = rng.standard_normal((kv_len[b], Dqk))
        t["kv"], kv64 = store(kv, dtype)
        keys = [kv64[b, :kv_len[b]] for b in range(B)]
    else:
        nblk = -(-kv_len // bs)
        MB, NB = int(nblk.max()) + 1, int(nblk.sum()) + 2  # a spare column and two spare blocks
        order = rng.permutation(NB)
        table = np.where(rng.random((B, MB)) < 0.5, -1, NB + 5).astype(np.int32)  # never read
        cache = np.full((NB, bs, Dqk), np.nan)
        used = 0
        for b in range(B):
            table[b, :nblk[b]] = order[used:used + nblk[b]]
            used += nblk[b]
            rows = rng.standard_normal((kv_len[b], Dqk))
            for j0 in range(0, kv_len[b], bs):
                cache[table[b, j0 // bs], :min(bs, kv_len[b] - j0)] = rows[j0:j0 + bs]
        t["kv_cache"], cache64 = store(cache, dtype)
        t["block_table"] = table
        keys = [np.concatenate([cache64[table[b, j // bs], j % bs][None] for j in range(kv_len[b])]) for b in range(B)]
    o, t["expected.lse"] = reference(q64, keys, mask, kv_len, scale, Dv)
    t["expected.o"] = o.astype(np.float32)  # f32 rounding (6e-8) is far below every tolerance
    return t


# name -> make_case arguments. The first two are the original engine's cases at full MLA dims;
# the large-Q / large-H / long cases use small dims so the CPU reference stays fast in CI.
CASES = {
    "h16_p2048_b16": dict(B=2, H=16, Q=17, kv_len=2065),
    "h64_p128_b32": dict(B=1, H=64, Q=33, kv_len=161),
    "h128": dict(B=1, H=128, Q=9, kv_len=200),
    "h160_small": dict(B=1, H=160, Q=5, kv_len=70, Dv=64, Dr=16),
    "paged_bs64": dict(B=2, H=16, Q=17, kv_len=700, bs=64),
    "paged_bs64_ragged": dict(B=3, H=8, Q=17, kv_len=[1000, 18, 333], bs=64),
    "ragged": dict(B=3, H=8, Q=9, kv_len=[400, 9, 129], tree=(3, 3)),
    "q257": dict(B=1, H=2, Q=257, kv_len=357, Dv=64, Dr=16, bs=16, tree=(12, 6)),
    "q1025": dict(B=1, H=1, Q=1025, kv_len=1100, Dv=64, Dr=16, tree=(40, 8)),
    "q1": dict(B=2, H=16, Q=1, kv_len=[101, 40]),
    "kvlen_q_plus_1": dict(B=2, H=8, Q=17, kv_len=18),
    "kvlen_eq_q": dict(B=2, H=4, Q=17, kv_len=17, tree=(2, 3)),
    "fill_rows": dict(B=2, H=16, Q=33, kv_len=[300, 250], tree=(2, 3)),
    "bf16": dict(B=2, H=16, Q=17, kv_len=[1000, 640], dtype="bf16"),
    "bf16_paged_bs64": dict(B=2, H=64, Q=33, kv_len=[161, 400], dtype="bf16", bs=64),
    "small_64_16": dict(B=2, H=8, Q=33, kv_len=500, Dv=64, Dr=16),
    "paged_bs16_small": dict(B=2, H=8, Q=17, kv_len=[300, 17], Dv=64, Dr=16, bs=16),
    "paged_bs7_odd_dims": dict(B=2, H=3, Q=5, kv_len=[50, 20], Dv=40, Dr=3, bs=7),
    "bf16_odd_dims": dict(B=2, H=5, Q=9, kv_len=[77, 9], Dv=33, Dr=0, dtype="bf16", bs=7),
    "long_131072": dict(B=1, H=4, Q=9, kv_len=131072, Dv=64, Dr=16),
}


def bad_cases(rng):
    """name -> (tensors, expected kdt_status). Each breaks one rule of a small valid input."""
    base = dict(B=2, H=2, Q=5, kv_len=[20, 12], Dv=32, Dr=8, tree=(3, 2))
    paged = {k: v for k, v in make_case(rng, bs=8, **base).items() if not k.startswith("expected.")}
    contig = {k: v for k, v in make_case(rng, **base).items() if not k.startswith("expected.")}
    out = {}

    def bad(name, src, err, **change):
        t = dict(src)
        for k, v in change.items():
            if v is None:
                del t[k]
            else:
                t[k] = v
        out[name] = (t, err)

    table, kv_len = paged["block_table"].copy(), paged["kv_len"]
    NB = paged["kv_cache"].shape[0]
    oob = table.copy()
    oob[0, 1] = NB
    neg = table.copy()
    neg[1, (kv_len[1] - 1) // 8] = -1
    bad("block_table_oob", paged, ERR_INVALID_ARG, block_table=oob)
    bad("block_table_negative", paged, ERR_INVALID_ARG, block_table=neg)
    bad("kv_len_below_q", paged, ERR_INVALID_ARG, kv_len=np.array([20, 4], np.int32))
    bad("kv_len_above_cache_paged", paged, ERR_INVALID_ARG, kv_len=np.array([table.shape[1] * 8 + 1, 12], np.int32))
    bad("kv_len_above_L", contig, ERR_INVALID_ARG, kv_len=np.array([20, contig["kv"].shape[1] + 1], np.int32))
    bad("dv_above_dqk", contig, ERR_INVALID_ARG, dv=np.int32(41))
    bad("dv_zero", contig, ERR_INVALID_ARG, dv=np.int32(0))
    bad("dv_missing", contig, ERR_NOT_FOUND, dv=None)
    bad("dv_not_i32", contig, ERR_DTYPE, dv=np.int64(32))
    bad("sm_scale_nan", contig, ERR_INVALID_ARG, sm_scale=np.float32(np.nan))
    bad("sm_scale_inf", contig, ERR_INVALID_ARG, sm_scale=np.float32(np.inf))
    bad("mask_value_2", contig, ERR_INVALID_ARG, tree_mask=contig["tree_mask"] * 2)
    bad("both_layouts", paged, ERR_INVALID_ARG, kv=contig["kv"])
    bad("no_kv", contig, ERR_NOT_FOUND, kv=None)
    bad("q_3d", contig, ERR_SHAPE, q=contig["q"].reshape(2, 5, 80))
    bad("q_len_0", contig, ERR_SHAPE, q=np.zeros((2, 0, 2, 40), np.float32), tree_mask=np.zeros((2, 0, 0), np.uint8))
    bad("q_f16", contig, ERR_DTYPE, q=contig["q"].astype(np.float16))
    bad("kv_bf16_q_f32", contig, ERR_DTYPE, kv=kdtr.bf16_from_f32(np.nan_to_num(contig["kv"])))
    bad("kv_wrong_dqk", contig, ERR_SHAPE, kv=contig["kv"][:, :, :39].copy())
    bad("kv_wrong_batch", contig, ERR_SHAPE, kv=contig["kv"][:1].copy())
    bad("cache_wrong_dqk", paged, ERR_SHAPE, kv_cache=paged["kv_cache"][:, :, :39].copy())
    bad("block_table_wrong_batch", paged, ERR_SHAPE, block_table=table[:1].copy())
    bad("block_table_missing", paged, ERR_NOT_FOUND, block_table=None)
    bad("kv_len_wrong_shape", contig, ERR_SHAPE, kv_len=np.array([20, 12, 12], np.int32))
    bad("mask_wrong_shape", contig, ERR_SHAPE, tree_mask=np.zeros((2, 5, 6), np.uint8))
    bad("mask_missing", contig, ERR_NOT_FOUND, tree_mask=None)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", help="case names to write (default: all, bad ones included)")
    ap.add_argument("--sm-scale", type=float, default=KIMI_K2_SM_SCALE)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for name, kw in CASES.items():
        if args.only and name not in args.only:
            continue
        kdtr.save(os.path.join(args.out, f"verify_attn_{name}.kdtr"), make_case(rng, scale=args.sm_scale, **kw))
    for name, (t, err) in bad_cases(rng).items():
        if args.only and f"bad_{name}" not in args.only:
            continue
        t["expected.error"] = np.int32(err)
        kdtr.save(os.path.join(args.out, f"verify_attn_bad_{name}.kdtr"), t)


if __name__ == "__main__":
    main()
