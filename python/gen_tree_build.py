"""Reference bundles for tree_build (docs/interfaces.md 2.1), written from the interface's rule alone.

    python3 python/gen_tree_build.py --out DIR --seed S

writes DIR/tree_build_<case>.kdtr (the op's inputs and expected.<output> for every output) and
DIR/tree_build_bad_<case>.kdtr (inputs the op must refuse: expected_status, the kdt_status code,
and expected_error, UTF-8 bytes the error message must contain).

The reference is the rule taken literally, vectorized over the batch: every step looks at every
not yet selected child of every selected node (no frontier, no heap, no reliance on sorted rows),
takes the highest finite score, then lower depth, lower parent, lower k. Scores are summed in
float32 exactly as docs/interfaces.md says. A child whose sum is not finite is never selected (that covers
-inf and NaN, and +inf from an overflowing sum: "no candidate with a finite score is left").
"""
import argparse
import os
import sys

import numpy as np

import kdtr

OUTPUTS = ["num_nodes", "node_token", "node_parent", "node_depth", "node_cand", "node_score",
           "positions", "tree_mask", "first_child", "next_sibling"]
F32 = np.float32


def select(scores, N):
    """Best-first selection. Returns count [B], parent, depth, cand [B, Q] (-1 fill), score [B, Q] (-inf fill)."""
    B, D, K = scores.shape
    Q = N + 1
    parent = np.full((B, Q), -1, np.int32)
    depth = np.full((B, Q), -1, np.int32)
    cand = np.full((B, Q), -1, np.int32)
    score = np.full((B, Q), -np.inf, F32)
    depth[:, 0] = 0
    score[:, 0] = 0
    child = np.full((B, Q, K), -np.inf, F32)   # child[b, i, k]: score of candidate k under node i
    avail = np.zeros((B, Q, K), bool)          # selectable: under a selected node, not taken, finite
    child[:, 0] = score[:, 0, None] + scores[:, 0]
    avail[:, 0] = np.isfinite(child[:, 0])
    count = np.zeros(B, np.int32)
    for s in range(N):
        L = s + 1                               # nodes 0..s exist in every still active request
        av = avail[:, :L]
        rows = np.flatnonzero(av.any(axis=(1, 2)))
        if rows.size == 0:
            break
        av = av[rows]
        sc = np.where(av, child[rows, :L], -np.inf)
        best = sc.max(axis=(1, 2))
        tie = av & (sc == best[:, None, None])
        cdepth = depth[rows, :L] + 1            # depth of a child of node i
        dmin = np.where(tie.any(axis=2), cdepth, D + 2).min(axis=1)
        tie &= (cdepth == dmin[:, None])[:, :, None]
        flat = tie.reshape(rows.size, L * K).argmax(axis=1)  # first True: lowest parent, then lowest k
        p, k = flat // K, flat % K
        n = s + 1
        parent[rows, n] = p
        depth[rows, n] = depth[rows, p] + 1
        cand[rows, n] = k
        score[rows, n] = child[rows, p, k]
        avail[rows, p, k] = False
        count[rows] = n
        grow = rows[depth[rows, n] < D]
        if grow.size:
            child[grow, n] = score[grow, n, None] + scores[grow, depth[grow, n]]
            avail[grow, n] = np.isfinite(child[grow, n])
    return count, parent, depth, cand, score


def build(scores, tokens, root_token, seq_len, N):
    """Every output of docs/interfaces.md 2.1 for one batch."""
    B, D, K = scores.shape
    Q = N + 1
    count, parent, depth, cand, score = select(scores, N)
    live = depth >= 0
    token = np.full((B, Q), -1, np.int32)
    token[:, 0] = root_token
    b_idx, i_idx = np.nonzero(live & (np.arange(Q) > 0))
    token[b_idx, i_idx] = tokens[b_idx, depth[b_idx, i_idx] - 1, cand[b_idx, i_idx]]
    positions = np.where(live, seq_len[:, None].astype(np.int64) + depth, -1).astype(np.int32)

    mask = np.zeros((B, Q, Q), np.uint8)
    mask[:, 0, 0] = 1
    for i in range(1, Q):
        r = np.flatnonzero(count >= i)
        if r.size == 0:
            break
        mask[r, i] = mask[r, parent[r, i]]
        mask[r, i, i] = 1

    # Children lists: sort the nodes by (request, parent, index); neighbours in one group are siblings.
    first_child = np.full((B, Q), -1, np.int32)
    next_sibling = np.full((B, Q), -1, np.int32)
    order = np.lexsort((i_idx, parent[b_idx, i_idx], b_idx))
    sb, sp, si = b_idx[order], parent[b_idx, i_idx][order], i_idx[order]
    same = (sb[1:] == sb[:-1]) & (sp[1:] == sp[:-1])
    next_sibling[sb[:-1][same], si[:-1][same]] = si[1:][same]
    head = np.ones(sb.size, bool)
    head[1:] = ~same
    first_child[sb[head], sp[head]] = si[head]

    return {"num_nodes": count, "node_token": token, "node_parent": parent, "node_depth": depth,
            "node_cand": cand, "node_score": score, "positions": positions, "tree_mask": mask,
            "first_child": first_child, "next_sibling": next_sibling}


# ---- inputs ----

def sort_rows(x):
    """Non-increasing rows; NaN sorts with -inf, at the end (the interface's order)."""
    x = np.asarray(x, F32)
    order = np.argsort(-np.where(np.isnan(x), -np.inf, x), axis=-1, kind="stable")
    return np.take_along_axis(x, order, axis=-1)


def logprob_scores(rng, B, D, K):
    """Top-K log-probabilities of random softmaxes, sorted within each (b, d)."""
    V = max(2 * K, 32)
    logits = rng.normal(0.0, rng.uniform(0.5, 3.0), size=(B, D, V))
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    top = -np.sort(-lp, axis=-1)[..., :K]
    return sort_rows(top.astype(F32))


def make_inputs(rng, B, D, K, scores=None):
    if scores is None:
        scores = logprob_scores(rng, B, D, K)
    return {"scores": scores,
            "tokens": rng.integers(0, 163840, size=(B, D, K), dtype=np.int32),
            "root_token": rng.integers(0, 163840, size=B, dtype=np.int32),
            "seq_len": rng.integers(0, 200000, size=B, dtype=np.int32)}


def ties_scores(rng, B, D, K):
    vals = np.array([0.0, -0.0, -1.0, -2.0, np.log(0.5)], F32)  # -0.0 ties with 0.0
    return sort_rows(vals[rng.integers(0, vals.size, size=(B, D, K))])


def nonfinite_scores(rng, B, D, K):
    """Rows that end in -inf / NaN at random points, whole rows of -inf or NaN; request 0 has no
    finite candidate at depth 0 (0 nodes), request 1 only NaN there."""
    s = logprob_scores(rng, B, D, K)
    cut = rng.integers(0, K + 1, size=(B, D))
    tail = np.arange(K)[None, None, :] >= cut[..., None]
    bad = np.where(rng.random((B, D, K)) < 0.5, -np.inf, np.nan).astype(F32)
    s = np.where(tail, bad, s)
    s[0, 0] = -np.inf
    s[1, 0] = np.nan
    return s


def overflow_scores(rng, B, D, K):
    """Finite scores whose float32 sums overflow to -inf (never selected), mixed with small ones."""
    big = np.array([-1e38, -2e38, -3e38, -0.5, -1.0], F32)
    return sort_rows(big[rng.integers(0, big.size, size=(B, D, K))])


def mixed_sign_scores(rng, B, D, K):
    """Positive scores too: a child can beat its parent, so best-first differs from a global top-N."""
    return sort_rows(rng.normal(0.0, 1.0, size=(B, D, K)).astype(F32))


def tiny_set_scores(rng, B, D, K):
    """Scores from {0, -0.0, -1, -2}: sums equal across depths and parents everywhere, and a 0
    makes a child tie its parent (the CUDA kernel's parallel paths and their tie-breaks)."""
    vals = np.array([0.0, -0.0, -1.0, -2.0], F32)
    return sort_rows(vals[rng.integers(0, vals.size, size=(B, D, K))])


def zero_scores(rng, B, D, K):
    """Every score 0 or -0.0, some rows cut by -inf / NaN: every node ties every other; the tree is
    breadth-first by depth, then parent, then k."""
    s = np.where(rng.random((B, D, K)) < 0.5, F32(0.0), F32(-0.0)).astype(F32)
    cut = rng.integers(1, K + 1, size=(B, D))
    return np.where(np.arange(K)[None, None, :] >= cut[..., None], F32(-np.inf), s).astype(F32)


def quantized_scores(rng, B, D, K):
    """Multiples of -0.25 (exact sums): many equal scores at different depths and parents."""
    return sort_rows(-(rng.integers(0, 6, size=(B, D, K)) * 0.25).astype(F32))


def mixed_path_scores(rng, B, D, K):
    """A batch mixing requests the CUDA kernel takes down a parallel path (log-probabilities, ties)
    with requests it takes down its sequential path (a positive score, a +inf head)."""
    s = np.concatenate([logprob_scores(rng, B, D, K)[: B // 2], tiny_set_scores(rng, B - B // 2, D, K)])
    kind = rng.integers(0, 3, size=B)      # 0: as is; 1: a row shifted above 0; 2: a +inf head
    for b in range(B):
        d = int(rng.integers(0, D))
        if kind[b] == 1:
            s[b, d] += F32(1.5)
        elif kind[b] == 2:
            s[b, d, 0] = np.inf
    return s


CASES = [  # name, B, D, K, N, scores maker (None: log-probs)
    ("singlereq", 1, 7, 4, 12, None),
    ("small_budget", 5, 7, 4, 4, None),
    ("tiny", 8, 3, 3, 5, None),
    ("underfull", 5, 2, 2, 8, None),
    ("wide", 4, 7, 8, 32, None),
    ("large", 64, 16, 8, 256, None),
    ("batch256", 256, 8, 16, 64, None),
    ("budget1024", 4, 16, 16, 1024, None),
    ("ties", 16, 6, 4, 40, ties_scores),
    ("ties_large", 8, 12, 6, 300, ties_scores),
    ("nonfinite", 12, 6, 5, 30, nonfinite_scores),
    ("overflow", 6, 5, 4, 24, overflow_scores),
    ("mixed_sign", 8, 8, 6, 48, mixed_sign_scores),
    ("chain_k1", 6, 12, 1, 20, None),
    ("tiny_set", 24, 7, 4, 60, tiny_set_scores),
    ("tiny_set_wide", 6, 5, 16, 200, tiny_set_scores),
    ("zeros", 8, 6, 3, 50, zero_scores),
    ("quantized", 16, 9, 6, 100, quantized_scores),
    ("mixed_paths", 24, 8, 5, 48, mixed_path_scores),
    ("bench_shape", 64, 16, 8, 128, None),
    ("edge_d64k64", 2, 64, 64, 400, None),
    ("empty_batch", 0, 3, 2, 5, None),
]

INVALID_ARG, NOT_FOUND, DTYPE, SHAPE = 1, 2, 3, 4


def bad_cases(rng):
    """(name, tensors, expected status, text the message must contain)."""
    B, D, K = 3, 4, 5
    out = []

    def base():
        t = make_inputs(rng, B, D, K)
        t["budget"] = np.int32(10)
        return t

    t = base()
    b, d, k = int(rng.integers(0, B)), int(rng.integers(0, D)), int(rng.integers(1, K))
    t["scores"][b, d, k] = t["scores"][b, d, k - 1] + F32(0.5)
    out.append(("unsorted", t, INVALID_ARG, f"scores[{b}][{d}][{k}]"))

    t = base()
    b, d, j = int(rng.integers(0, B)), int(rng.integers(0, D)), int(rng.integers(0, K - 1))
    t["scores"][b, d, j] = np.nan          # a finite score after a NaN
    out.append(("nan_inside", t, INVALID_ARG, f"scores[{b}][{d}][{j + 1}]"))

    t = base()
    t["scores"][b, d, j] = -np.inf
    out.append(("neginf_inside", t, INVALID_ARG, f"scores[{b}][{d}][{j + 1}]"))

    for name, value in (("budget0", 0), ("budget1025", 1025), ("budget_neg", -3)):
        t = base()
        t["budget"] = np.int32(value)
        out.append((name, t, INVALID_ARG, "budget"))

    t = base()
    t["budget"] = np.float32(10)
    out.append(("budget_dtype", t, DTYPE, "budget"))

    t = base()
    t["tokens"] = rng.integers(0, 100, size=(B, D, K + 1), dtype=np.int32)
    out.append(("tokens_shape", t, SHAPE, "tokens"))

    t = base()
    t["root_token"] = rng.integers(0, 100, size=B + 1, dtype=np.int32)
    out.append(("root_shape", t, SHAPE, "root_token"))

    t = base()
    t["seq_len"] = t["seq_len"].astype(np.int64)
    out.append(("seq_len_dtype", t, DTYPE, "seq_len"))

    t = base()
    b = int(rng.integers(0, B))
    t["seq_len"][b] = -5
    out.append(("seq_len_negative", t, INVALID_ARG, f"seq_len[{b}]"))

    t = base()
    del t["scores"]
    out.append(("missing_scores", t, NOT_FOUND, "scores"))

    t = make_inputs(rng, 2, 65, 2)
    t["budget"] = np.int32(10)
    out.append(("depth65", t, SHAPE, "scores"))

    t = make_inputs(rng, 2, 3, 65)
    t["budget"] = np.int32(10)
    out.append(("topk65", t, SHAPE, "scores"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    with np.errstate(invalid="ignore", over="ignore"):
        for name, B, D, K, N, maker in CASES:
            t = make_inputs(rng, B, D, K, maker(rng, B, D, K) if maker else None)
            expected = build(t["scores"], t["tokens"], t["root_token"], t["seq_len"], N)
            t["budget"] = np.int32(N)
            t.update({"expected." + k: expected[k] for k in OUTPUTS})
            kdtr.save(os.path.join(args.out, f"tree_build_{name}.kdtr"), t)
        for name, t, status, text in bad_cases(rng):
            t["expected_status"] = np.int32(status)
            t["expected_error"] = np.frombuffer(text.encode("utf-8"), np.uint8)
            kdtr.save(os.path.join(args.out, f"tree_build_bad_{name}.kdtr"), t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
