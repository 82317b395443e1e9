"""Reference bundles for tree_sample_accept (docs/interfaces.md 2.4), from the rule in docs/sampling.md with
numpy and Python integers alone: Philox4x32-10, the f32 exp and the integer weights are
reimplemented here, so the expected outputs are the exact bits both backends must give.

    python3 python/gen_tree_sample_accept.py --out DIR --seed S

writes DIR/tree_sample_accept_<case>.kdtr: the inputs (node_token, node_parent, num_nodes,
target_logits, draft_probs where the case has it, temperature, top_k, top_p, seed) and
expected.<output> for accept_len, accept_index, accept_tokens, status.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundle_args  # noqa: E402
import kdtr  # noqa: E402
from gen_tree_accept import accept_reference, best_first_tree, random_tree  # noqa: E402

F32 = np.float32
ONE = 1 << 32
M32 = 0xFFFFFFFF
BONUS = 0xFFFFFFFF
FLT_MAX = F32(3.40282347e38)
C = [F32(float.fromhex(h)) for h in ("0x1.6c16c2p-10", "0x1.111112p-7", "0x1.555556p-5", "0x1.555556p-3")]
LOG2E, LN2_HI, LN2_LO = F32(float.fromhex("0x1.715476p+0")), F32(float.fromhex("0x1.63p-1")), F32(float.fromhex("-0x1.bd0106p-13"))


def philox(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, p0 & M32
    return c0, c1, c2, c3


def uniform(seed, b, t, j, stream=0):
    o = philox((b, t, j, stream), (seed & M32, seed >> 32))
    return float(((o[0] << 32) | o[1]) >> 11) * 2.0 ** -53


def keys(row, T):
    with np.errstate(all="ignore"):
        s = (row.astype(F32) / F32(T)).astype(F32)
    s = np.where(np.isnan(s), F32(-np.inf), s)
    s = np.where(s > FLT_MAX, FLT_MAX, s)
    return np.where(s == 0, F32(0), s).astype(F32)


def order(k):
    u = k.view(np.uint32)
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def sample_exp(x):
    """kdt_sample_exp elementwise, each f32 operation rounded on its own."""
    ok = x >= F32(-87)
    x = np.where(ok, x, F32(0)).astype(F32)
    n = np.floor(x * LOG2E + F32(0.5)).astype(F32)
    r = (x - n * LN2_HI).astype(F32)
    r = (r - n * LN2_LO).astype(F32)
    p = C[0]
    for c in C[1:] + [F32(0.5), F32(1), F32(1)]:
        p = (p * r + c).astype(F32)
    scale = ((n.astype(np.int32) + 127) << 23).astype(np.uint32).view(F32)
    return np.where(ok, (p * scale).astype(F32), F32(0))


def weights(k, m):
    with np.errstate(all="ignore"):
        e = sample_exp((k - m).astype(F32))
    w = (np.minimum(e, F32(1)) * F32(ONE)).astype(np.uint64)
    return np.where(k == m, np.uint64(ONE), w)


def draft_weights(q):
    q = np.where(q > 0, np.minimum(q, F32(1)), F32(0)).astype(F32)
    return (q * F32(ONE)).astype(np.uint64)


def residual_step(r, qw, c):
    d = qw.astype(np.float64) * c
    big = d >= 2.0 ** 62
    sub = np.where(big, 0, d).astype(np.uint64)
    return np.where(big | (r <= sub), np.uint64(0), r - sub).astype(np.uint64)


def distribution(row, T, k, P):
    """The filtered target weights w [V] (np.uint64) of one row and their sum."""
    key = keys(row, T)
    V = key.size
    m = key.max()
    o = order(key)
    tau = 0
    if 0 < k < V:
        tau = int(np.sort(o)[::-1][k - 1])
    w = np.where(o >= tau, weights(key, m), np.uint64(0)).astype(np.uint64)
    if P < 1:
        need = max(int(float(F32(P)) * float(int(w.sum()))), 1)
        uo, inv = np.unique(o, return_inverse=True)  # ascending distinct orders
        grp = np.zeros(uo.size, np.uint64)
        np.add.at(grp, inv, w)
        cum = np.cumsum(grp[::-1].astype(object))  # largest key first, exact integers
        g = int(np.argmax(cum >= need))
        tau = int(uo[::-1][g])
        w = np.where(o >= tau, w, np.uint64(0)).astype(np.uint64)
    return w, int(w.sum())


def sample_from(w, u):
    Z = int(w.sum())
    t = min(int(u * float(Z)), Z - 1)
    cum = np.cumsum(w.astype(object))
    return int(np.argmax(cum > t))


def greedy_argmax(row):
    return 0 if np.all(np.isnan(row)) else int(np.nanargmax(row))


def sample_accept_reference(ins):
    tok, par, num = ins["node_token"], ins["node_parent"], ins["num_nodes"]
    logits, q = ins["target_logits"], ins.get("draft_probs")
    B, Q, V = logits.shape
    pred = np.full((B, Q), -1, np.int32)  # greedy requests: tree_accept on the argmax
    out = {"accept_len": np.zeros(B, np.int32), "accept_index": np.full((B, Q), -1, np.int32),
           "accept_tokens": np.full((B, Q), -1, np.int32), "status": np.zeros(B, np.int32)}
    for b in range(B):
        T, k, P, seed = float(ins["temperature"][b]), int(ins["top_k"][b]), float(ins["top_p"][b]), int(ins["seed"][b])
        if not T > 0:
            pred[b] = [greedy_argmax(logits[b, i]) for i in range(Q)]
            g = accept_reference(tok[b:b + 1], par[b:b + 1], num[b:b + 1], pred[b:b + 1])
            for name in out:
                out[name][b] = g[name][0]
            continue
        n = int(num[b])
        status = 1 if not 0 <= n <= Q - 1 else 2 if any(not 0 <= par[b, c] < c for c in range(1, n + 1)) else 0
        cur, path, emitted = 0, [0], []
        while True:
            w, Z = distribution(logits[b, cur], T, k, P)
            r = w.copy()
            qw = draft_weights(q[b, cur]) if q is not None and status == 0 else None
            Qz = int(qw.sum()) if qw is not None else 0
            nxt, j = None, 0
            kids = [c for c in range(cur + 1, n + 1) if par[b, c] == cur] if status == 0 else []
            for c in kids:
                x = int(tok[b, c])
                u = uniform(seed, b, len(emitted), j)
                j += 1
                rx = int(r[x]) if 0 <= x < V else 0
                if Qz > 0:
                    qx = int(qw[x]) if 0 <= x < V else 0
                    num_, den = float(rx) * float(Qz), float(Z) * float(qx)
                    if (num_ > 0) if den == 0 else (u < num_ / den):
                        nxt = c
                        break
                    r = residual_step(r, qw, float(Z) / float(Qz))
                    Z = int(r.sum())
                else:
                    if Z > 0 and u < float(rx) / float(Z):
                        nxt = c
                        break
                    if rx > 0:
                        r[x] = 0
                        Z -= rx
            if nxt is None:
                if Z == 0:
                    r = w
                u = uniform(seed, b, len(emitted), BONUS)
                emitted.append(sample_from(r, u))
                break
            emitted.append(int(tok[b, nxt]))
            cur = nxt
            path.append(cur)
        L = len(path) - 1
        out["accept_len"][b], out["status"][b] = L, status
        out["accept_index"][b, :L + 1] = path
        out["accept_tokens"][b, :L + 1] = emitted
    return out


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def make_logits(rng, tok, par, num, V, boost=6.0, scale=1.5):
    """Random logits per row, each node's children's tokens raised so that paths get accepted."""
    B, Q = tok.shape
    lg = (rng.standard_normal((B, Q, V)) * scale).astype(F32)
    for b in range(B):
        for c in range(1, int(num[b]) + 1):
            x, a = int(tok[b, c]), int(par[b, c])
            if 0 <= a < Q and 0 <= x < V:
                lg[b, a, x] += F32(boost + rng.random())
    return lg


def pack(Q, trees):
    B = len(trees)
    tok, par, num = np.full((B, Q), -1, np.int32), np.full((B, Q), -1, np.int32), np.zeros(B, np.int32)
    for b, (t, p, n) in enumerate(trees):
        tok[b, :n + 1], par[b, :n + 1], num[b] = t[:n + 1], p[:n + 1], n
    return tok, par, num


def params(rng, B, T=(0.6, 1.0, 1.3), k=(0,), P=(1.0,)):
    return {"temperature": rng.choice(np.array(T, F32), B).astype(F32), "top_k": rng.choice(np.array(k, np.int32), B),
            "top_p": rng.choice(np.array(P, F32), B).astype(F32),
            "seed": rng.integers(0, 2 ** 63, B, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)}


def trees_in_vocab(rng, B, V, D, K, N):
    trees = []
    for _ in range(B):
        t, p, n = best_first_tree(rng, D, K, N)
        trees.append((t % V, p, n))
    return trees


def case_det(rng, B, V, N, **kw):
    tok, par, num = pack(N + 1, trees_in_vocab(rng, B, V, 6, 4, N))
    return {"node_token": tok, "node_parent": par, "num_nodes": num,
            "target_logits": make_logits(rng, tok, par, num, V), **params(rng, B, **kw)}


def case_filters(rng):
    """top-k and top-p at their edges, logits quantized so that ties sit at the cuts."""
    B, V, N = 24, 203, 24
    ins = case_det(rng, B, V, N, T=(0.5, 1.0), k=(0, 1, 2, 7, V - 1, V, V + 5), P=(1e-6, 0.3, 0.8, 0.95, 1.0))
    ins["target_logits"] = (np.round(ins["target_logits"] * 2) / 2).astype(F32)
    return ins


def case_sampled(rng, B, V, N):
    """Children drawn from the draft rows with replacement (duplicates happen), one child with
    q(x) = 0 and one token out of range."""
    D, K = 5, 3
    trees = []
    for _ in range(B):
        t, p, n = best_first_tree(rng, D, K, N)
        trees.append((t % V, p, n))
    tok, par, num = pack(N + 1, trees)
    lg = (rng.standard_normal((B, N + 1, V)) * 1.5).astype(F32)
    q = softmax(lg.astype(np.float64) + rng.standard_normal((B, N + 1, V)) * 0.7).astype(F32)
    for b in range(B):
        n = int(num[b])
        for c in range(1, n + 1):
            pr = q[b, par[b, c]].astype(np.float64)
            tok[b, c] = rng.choice(V, p=pr / pr.sum())
        if n >= 2:
            q[b, par[b, 1], tok[b, 1]] = 0  # a child the drafter could not have drawn
            tok[b, n] = V + 3 if b % 2 else -2
    ins = {"node_token": tok, "node_parent": par, "num_nodes": num, "target_logits": lg, "draft_probs": q,
           **params(rng, B, k=(0, 0, 5), P=(1.0, 1.0, 0.9))}
    return ins


def case_greedy(rng):
    """Temperature 0 everywhere: tree_accept on each row's argmax (ties and NaN as the loop's)."""
    B, V, N = 12, 97, 32
    ins = case_det(rng, B, V, N)
    ins["temperature"][:] = 0
    lg = ins["target_logits"]
    lg[0, 0, :] = np.nan
    lg[1, 0, 5:9] = lg[1, 0].max() + 1  # a tie: the lowest id wins
    lg[2, 0, ::3] = np.nan
    return ins


def case_mixed(rng):
    ins = case_det(rng, 16, 130, 40, T=(0.0, 0.7, 1.0), k=(0, 3), P=(1.0, 0.7))
    return ins


def case_malformed(rng):
    B, V, N = 8, 61, 16
    ins = case_det(rng, B, V, N, T=(0.0, 0.8))
    num, par = ins["num_nodes"], ins["node_parent"]
    num[0], num[1], num[2] = -1, N + 1, np.iinfo(np.int32).max
    par[3, 2], par[4, 3], par[5, 1] = 2, 7, -5
    return ins


def case_special(rng):
    """Rows all -inf, NaN, +inf and huge logits, children out of the vocabulary, tiny temperatures."""
    B, V, N = 8, 37, 12
    ins = case_det(rng, B, V, N, T=(1e-3, 1.0, 50.0))
    lg, tok = ins["target_logits"], ins["node_token"]
    lg[0, 0, :] = -np.inf
    lg[1, 0, :] = np.nan
    lg[1, 0, 3] = 2.0
    lg[2, 0, [4, 9]] = np.inf
    lg[3, 0, :] = rng.standard_normal(V).astype(F32) * F32(1e37)
    lg[4, :, :] = -np.inf
    tok[5, 1:4] = [-1, V, np.iinfo(np.int32).max]
    return ins


def case_q1(rng):
    B, V = 6, 50
    ins = {"node_token": np.full((B, 1), -1, np.int32), "node_parent": np.full((B, 1), -1, np.int32),
           "num_nodes": np.zeros(B, np.int32), "target_logits": rng.standard_normal((B, 1, V)).astype(F32),
           **params(rng, B, T=(0.0, 1.0), k=(0, 4), P=(1.0, 0.5))}
    return ins


def case_chain_bigv(rng):
    """Long chains over a vocabulary of 50001 (not a multiple of 4)."""
    B, V, N = 2, 50001, 16
    trees = [(rng.integers(0, V, N + 1).astype(np.int32), np.arange(-1, N, dtype=np.int32), N) for _ in range(B)]
    tok, par, num = pack(N + 1, trees)
    lg = make_logits(rng, tok, par, num, V, boost=14.0)
    return {"node_token": tok, "node_parent": par, "num_nodes": num, "target_logits": lg,
            **params(rng, B, T=(1.0,), k=(0, 40), P=(1.0, 0.9))}


def main():
    out, rng = bundle_args.parse(__doc__)
    cases = {
        "det": lambda: case_det(rng, 16, 1001, 32),
        "det_star": lambda: case_det(rng, 4, 64, 48),
        "filters": lambda: case_filters(rng),
        "sampled": lambda: case_sampled(rng, 16, 211, 24),
        "greedy": lambda: case_greedy(rng),
        "mixed": lambda: case_mixed(rng),
        "malformed": lambda: case_malformed(rng),
        "special": lambda: case_special(rng),
        "q1": lambda: case_q1(rng),
        "chain_bigv": lambda: case_chain_bigv(rng),
    }
    for name, make in cases.items():
        ins = make()
        exp = sample_accept_reference(ins)
        kdtr.save(os.path.join(out, f"tree_sample_accept_{name}.kdtr"),
                  {**ins, **{f"expected.{k}": v for k, v in exp.items()}})
        B, Q, V = ins["target_logits"].shape
        print(f"tree_sample_accept_{name}.kdtr  B={B} Q={Q} V={V}  accept_len mean {exp['accept_len'].mean():.2f} "
              f"max {exp['accept_len'].max()}  malformed {(exp['status'] != 0).sum()}")


if __name__ == "__main__":
    main()
