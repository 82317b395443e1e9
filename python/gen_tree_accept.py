"""Reference bundles for tree_accept (docs/interfaces.md 2.3), written from the rule of docs/interfaces.md with numpy alone.

    python3 python/gen_tree_accept.py --out DIR --seed S

writes DIR/tree_accept_<case>.kdtr: the inputs (node_token, node_parent, num_nodes,
target_pred) and expected.<output> for accept_len, accept_index, accept_tokens, status.
Status codes (docs/interfaces.md 2.3): 1 num_nodes outside 0 .. Q-1, 2 a parent of nodes 1 .. num_nodes
outside [0, child).
"""
import heapq
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bundle_args  # noqa: E402
import kdtr  # noqa: E402

I32_MAX, I32_MIN = np.iinfo(np.int32).max, np.iinfo(np.int32).min
VOCAB = 32000


def accept_reference(node_token, node_parent, num_nodes, target_pred):
    """docs/interfaces.md 2.3 for every request: check the tree, then the greedy walk."""
    B, Q = node_token.shape
    accept_len = np.zeros(B, np.int32)
    accept_index = np.full((B, Q), -1, np.int32)
    accept_tokens = np.full((B, Q), -1, np.int32)
    status = np.zeros(B, np.int32)
    for b in range(B):
        n = int(num_nodes[b])
        if not 0 <= n <= Q - 1:
            status[b] = 1
        elif np.any((node_parent[b, 1:n + 1] < 0) | (node_parent[b, 1:n + 1] >= np.arange(1, n + 1))):
            status[b] = 2
        path = [0]
        if status[b] == 0:
            par, tok = node_parent[b, 1:n + 1], node_token[b, 1:n + 1]  # node c at [c - 1]
            while len(path) <= n:
                hits = np.flatnonzero((par == path[-1]) & (tok == target_pred[b, path[-1]]))
                if hits.size == 0:
                    break
                path.append(int(hits[0]) + 1)
        L = len(path) - 1
        accept_len[b] = L
        accept_index[b, :L + 1] = path
        accept_tokens[b, :L] = node_token[b, path[1:]]
        accept_tokens[b, L] = target_pred[b, path[-1]]
    return {"accept_len": accept_len, "accept_index": accept_index, "accept_tokens": accept_tokens,
            "status": status}


def best_first_tree(rng, D, K, N):
    """(token, parent, n) of one request built by the tree_build rule from random top-K scores."""
    scores = np.sort(np.log(rng.dirichlet(np.ones(K), size=D)).astype(np.float32), axis=1)[:, ::-1]
    tokens = np.stack([rng.choice(VOCAB, K, replace=False) for _ in range(D)]).astype(np.int32)
    token, parent, score, depth = [int(rng.integers(VOCAB))], [-1], [np.float32(0)], [0]
    heap = [(-float(scores[0, k]), 1, 0, k) for k in range(K) if np.isfinite(scores[0, k])]
    heapq.heapify(heap)
    while heap and len(token) <= N:
        _, d, par, k = heapq.heappop(heap)
        s = np.float32(score[par] + scores[d - 1, k])
        token.append(int(tokens[d - 1, k]))
        parent.append(par)
        score.append(s)
        depth.append(d)
        if d < D:
            me = len(token) - 1
            for k2 in range(K):
                s2 = np.float32(s + scores[d, k2])
                if np.isfinite(s2):  # -inf and NaN are never selected
                    heapq.heappush(heap, (-float(s2), d + 1, me, k2))
    return np.array(token, np.int32), np.array(parent, np.int32), len(token) - 1


def random_tree(rng, n, vocab, deep=0.5):
    """Random valid parents: with probability `deep` the parent is the previous node."""
    parent = np.full(n + 1, -1, np.int32)
    for c in range(1, n + 1):
        parent[c] = c - 1 if rng.random() < deep else rng.integers(0, c)
    return rng.integers(0, vocab, n + 1).astype(np.int32), parent, n


def greedy_targets(rng, token, parent, n, p_follow, vocab=VOCAB):
    """target_pred where each node, with probability p_follow, predicts a random child's token."""
    pred = rng.integers(0, vocab, n + 1).astype(np.int32)
    for v in range(n + 1):
        kids = np.flatnonzero(parent[1:n + 1] == v) + 1
        if kids.size and rng.random() < p_follow:
            pred[v] = token[rng.choice(kids)]
    return pred


def pack(Q, trees, preds):
    """Batch of requests with tree_build's fill (-1) past each tree; preds are [Q] rows."""
    B = len(trees)
    tok = np.full((B, Q), -1, np.int32)
    par = np.full((B, Q), -1, np.int32)
    num = np.zeros(B, np.int32)
    for b, (t, p, n) in enumerate(trees):
        tok[b, :n + 1], par[b, :n + 1], num[b] = t[:n + 1], p[:n + 1], n
    return tok, par, num, np.stack(preds).astype(np.int32)


def batch(rng, Q, trees, p_follow=0.8, vocab=VOCAB):
    preds = [greedy_targets(rng, t, p, n, p_follow, vocab) for t, p, n in trees]
    preds = [np.concatenate([pr, rng.integers(0, vocab, Q - pr.size).astype(np.int32)]) for pr in preds]
    return pack(Q, trees, preds)


def case_bestfirst(rng, B, D, K, N, p_follow):
    return batch(rng, N + 1, [best_first_tree(rng, D, K, N) for _ in range(B)], p_follow)


def case_none(rng):
    tok, par, num, pred = case_bestfirst(rng, 4, 4, 4, 16, 0.9)
    for b in range(4):  # the root predicts a token none of its children has
        pred[b, 0] = VOCAB + b
    return tok, par, num, pred


def case_full_chain(rng, B, N):
    trees = [(rng.integers(0, VOCAB, N + 1).astype(np.int32), np.arange(-1, N, dtype=np.int32), N) for _ in range(B)]
    return batch(rng, N + 1, trees, p_follow=1.0)


def case_deep(rng, B, N):
    """Bushy trees whose greedy path runs down one branch to a deepest leaf."""
    trees, preds = [], []
    for _ in range(B):
        tok, par, n = random_tree(rng, N, VOCAB, deep=0.4)
        depth = np.zeros(n + 1, np.int64)
        for c in range(1, n + 1):
            depth[c] = depth[par[c]] + 1
        leaf = int(np.argmax(depth))
        path = [leaf]
        while path[-1]:
            path.append(int(par[path[-1]]))
        path = path[::-1]
        pred = rng.integers(0, VOCAB, N + 1).astype(np.int32)
        for a, c in zip(path, path[1:]):
            pred[a] = tok[c]
            sib = np.flatnonzero(par[1:] == a) + 1
            tok[sib[sib != c]] = VOCAB + 1  # siblings never match, so the walk stays on the branch
        trees.append((tok, par, n))
        preds.append(pred)
    return pack(N + 1, trees, preds)


def case_siblings(rng, B, N):
    """A vocabulary of 3 tokens: siblings share tokens, so the lowest index must win."""
    trees = [random_tree(rng, N, 3, deep=0.2) for _ in range(B)]
    return batch(rng, N + 1, trees, p_follow=0.9, vocab=3)


def case_empty(rng):
    Q, B = 17, 4
    tok, par, num, pred = case_bestfirst(rng, B, 4, 4, Q - 1, 0.9)
    num[:] = 0  # nodes past num_nodes are not part of the tree
    return tok, par, num, pred


def case_q1(rng):
    B = 5
    return (np.full((B, 1), -1, np.int32), np.full((B, 1), -1, np.int32), np.zeros(B, np.int32),
            rng.integers(0, VOCAB, (B, 1)).astype(np.int32))


def case_q1025(rng):
    N = 1024
    trees = [best_first_tree(rng, 64, 16, N), random_tree(rng, N, 3, deep=0.7),
             (rng.integers(0, VOCAB, N + 1).astype(np.int32), np.arange(-1, N, dtype=np.int32), N),
             random_tree(rng, 600, VOCAB, deep=0.9)]
    return batch(rng, N + 1, trees, p_follow=0.95)


def case_garbage_fill(rng):
    """Good trees whose slots past num_nodes hold matching children of tree nodes or malformed
    parents: neither is part of the tree, so both must be ignored."""
    Q, B = 33, 8
    tok, par, num, pred = case_bestfirst(rng, B, 4, 4, Q - 1, 0.9)
    for b in range(B):
        n = int(rng.integers(1, 12))
        num[b] = n
        for c in range(n + 1, Q):
            a = int(rng.integers(0, n + 1))
            par[b, c], tok[b, c] = (a, pred[b, a]) if rng.random() < 0.5 else (int(rng.integers(c, Q + 9)), -5)
    return tok, par, num, pred


def case_malformed(rng):
    """Every malformed kind, each next to a good request."""
    N, Q = 32, 33
    bad = [
        ("num", -1), ("num", I32_MIN), ("num", Q), ("num", Q + 1), ("num", I32_MAX),
        ("self", None), ("above", None), ("cycle", None), ("neg", -1), ("neg", I32_MIN),
        ("big", Q), ("big", I32_MAX), ("last", None),
    ]
    trees, kinds = [], []
    for kind in bad:
        trees += [best_first_tree(rng, 5, 4, N), random_tree(rng, N, 4, deep=0.5)]
        kinds += [kind, None]
    tok, par, num, pred = batch(rng, Q, trees, p_follow=0.9)
    for b, kind in enumerate(kinds):
        if kind is None:
            continue
        what, val = kind
        n = int(num[b])
        c = int(rng.integers(2, n + 1))
        if what == "num":
            num[b] = val
        elif what == "self":
            par[b, c] = c
        elif what == "above":
            par[b, c] = int(rng.integers(c + 1, n + 1)) if c < n else c
        elif what == "cycle":  # c -> c + 1 -> c
            c = min(c, n - 1)
            par[b, c], par[b, c + 1] = c + 1, c
        elif what in ("neg", "big"):
            par[b, c] = val
        elif what == "last":  # the check must reach node num_nodes itself
            par[b, n] = n
    return tok, par, num, pred


def main():
    out, rng = bundle_args.parse(__doc__)
    cases = {
        "bestfirst": lambda: case_bestfirst(rng, 8, 6, 4, 32, 0.75),
        "bestfirst_n64": lambda: case_bestfirst(rng, 64, 8, 8, 64, 0.8),
        "none": lambda: case_none(rng),
        "full_chain": lambda: case_full_chain(rng, 4, 64),
        "deep": lambda: case_deep(rng, 8, 64),
        "siblings": lambda: case_siblings(rng, 16, 48),
        "empty": lambda: case_empty(rng),
        "q1": lambda: case_q1(rng),
        "q1025": lambda: case_q1025(rng),
        "garbage_fill": lambda: case_garbage_fill(rng),
        "malformed": lambda: case_malformed(rng),
    }
    for name, make in cases.items():
        tok, par, num, pred = make()
        exp = accept_reference(tok, par, num, pred)
        tensors = {"node_token": tok, "node_parent": par, "num_nodes": num, "target_pred": pred}
        tensors.update({f"expected.{k}": v for k, v in exp.items()})
        kdtr.save(os.path.join(out, f"tree_accept_{name}.kdtr"), tensors)
        print(f"tree_accept_{name}.kdtr  B={tok.shape[0]} Q={tok.shape[1]}  accept_len mean "
              f"{exp['accept_len'].mean():.2f} max {exp['accept_len'].max()}  malformed {(exp['status'] != 0).sum()}")


if __name__ == "__main__":
    main()
