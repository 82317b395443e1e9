"""Baseline for tree_accept: the docs/interfaces.md 2.3 greedy rule in vectorized torch (no Python loop over
requests; one loop over the tree's depth, no host sync inside), timed with
torch.cuda.Event for the B x N grid of bench/bench_accept.cu.

    python3 bench/torch_accept.py [--kdt build/kdt] [--iters 100] [--out FILE]

Before timing it checks the torch result against the numpy reference of
python/gen_tree_accept.py, and against `kdt run tree_accept --backend cuda` when --kdt exists.
Exits 0 with a message where torch or CUDA is missing.
"""
import argparse
import datetime
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import kdtr  # noqa: E402
from gen_tree_accept import accept_reference  # noqa: E402

try:
    import torch
except ImportError:
    print("torch_accept: torch is not installed here; nothing to time (run it on the GPU machine)")
    sys.exit(0)


def torch_accept(tok, par, num, pred, steps):
    """docs/interfaces.md 2.3 on [B, Q] int32 CUDA tensors: (accept_len, accept_index, accept_tokens, status).
    `steps` bounds the walk (the tree's depth, which a serving stack knows); no host sync inside."""
    B, Q = tok.shape
    ar = torch.arange(Q, device=tok.device, dtype=torch.int32)
    n_ok = (num >= 0) & (num <= Q - 1)
    nn = torch.where(n_ok, num, 0)
    node = (ar >= 1) & (ar <= nn[:, None])  # draft nodes 1 .. num_nodes
    bad = (node & ((par < 0) | (par >= ar))).any(1)
    status = torch.where(~n_ok, 1, torch.where(bad, 2, 0)).to(torch.int32)
    node &= (status == 0)[:, None]
    cur = torch.zeros(B, 1, dtype=torch.int64, device=tok.device)
    alive = (status == 0)[:, None]
    index = torch.full((B, Q), -1, dtype=torch.int32, device=tok.device)
    index[:, 0] = 0
    length = torch.zeros(B, 1, dtype=torch.int64, device=tok.device)
    for _ in range(steps):
        hit = node & (par == cur) & (tok == pred.gather(1, cur))
        nxt = torch.where(hit, ar, Q).amin(1, keepdim=True)  # the lowest-index matching child, Q if none
        alive = alive & (nxt < Q)
        cur = torch.where(alive, nxt.long(), cur)
        length += alive
        index.scatter_(1, length, cur.to(torch.int32))  # a request that stopped rewrites its last node
    tokens = torch.full((B, Q), -1, dtype=torch.int32, device=tok.device)
    next_nodes = index.gather(1, (ar[None, :].long() + 1).clamp(max=Q - 1).expand(B, Q))
    body = ar[None, :] < length
    tokens = torch.where(body, tok.gather(1, next_nodes.clamp(min=0).long()), tokens)
    tokens.scatter_(1, length, pred.gather(1, cur))
    return length.squeeze(1).to(torch.int32), index, tokens, status


def tree_depth(par, num):
    """Deepest node of the well-formed requests (host side, before timing): the walk's bound."""
    depth, best = np.zeros(par.shape, np.int64), 0
    for b in range(par.shape[0]):
        for c in range(1, int(num[b]) + 1):
            depth[b, c] = depth[b, par[b, c]] + 1
        best = max(best, int(depth[b].max()))
    return best


def make_trees(rng, B, N):
    """Random trees like bench_accept.cu's: half the parents the previous node, half uniform
    below; targets follow a random child with probability 0.8."""
    Q = N + 1
    c = np.arange(Q)
    par = np.where(rng.random((B, Q)) < 0.5, c - 1, np.floor(rng.random((B, Q)) * c)).astype(np.int32)
    par[:, 0] = -1
    tok = rng.integers(0, 32000, (B, Q)).astype(np.int32)
    pick = np.full((B, Q), -1, np.int64)
    b_idx, c_idx = np.nonzero(np.ones((B, N), bool))
    c_idx = c_idx + 1
    order = rng.permutation(b_idx.size)
    pick[b_idx[order], par[b_idx[order], c_idx[order]]] = c_idx[order]  # a random child per node
    follow = (pick >= 0) & (rng.random((B, Q)) < 0.8)
    pred = np.where(follow, np.take_along_axis(tok, np.maximum(pick, 0), 1), 32000 + rng.integers(0, 1000, (B, Q)))
    return tok, par, np.full(B, N, np.int32), pred.astype(np.int32)


def check(kdt, dev):
    """torch against numpy on a tree batch with malformed requests, and kdt's cuda backend if present."""
    rng = np.random.default_rng(5)
    tok, par, num, pred = make_trees(rng, 64, 64)
    num[3], num[5], par[7, 9], par[11, 20] = -1, 65, 9, 70  # malformed requests beside good ones
    ref = accept_reference(tok, par, num, pred)
    got = torch_accept(*(torch.from_numpy(a).to(dev) for a in (tok, par, num, pred)), steps=tok.shape[1] - 1)
    names = ("accept_len", "accept_index", "accept_tokens", "status")
    for name, g in zip(names, got):
        if not np.array_equal(g.cpu().numpy(), ref[name]):
            sys.exit(f"torch_accept: torch {name} differs from the numpy reference")
    msg = "torch == numpy reference (B=64, N=64, 4 malformed)"
    if kdt and os.path.exists(kdt):
        with tempfile.TemporaryDirectory() as d:
            kdtr.save(f"{d}/in.kdtr", {"node_token": tok, "node_parent": par, "num_nodes": num, "target_pred": pred})
            r = subprocess.run([kdt, "run", "tree_accept", f"{d}/in.kdtr", "-o", f"{d}/out.kdtr", "--backend", "cuda"],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"torch_accept: kdt run failed: {r.stderr.strip()}")
            out = kdtr.load(f"{d}/out.kdtr")
            for name in names:
                if not np.array_equal(out[name], ref[name]):
                    sys.exit(f"torch_accept: kdt cuda {name} differs from the numpy reference")
        msg += " == kdt cuda"
    else:
        msg += f" (kdt binary {kdt!r} not found: kdt not compared)"
    return msg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kdt", default=os.path.join(HERE, "..", "build", "kdt"))
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_accept: torch has no CUDA device here; nothing to time")
        return 0
    dev = torch.device("cuda")
    lines = [f"# torch_accept (vectorized torch, loop over depth steps)\n",
             f"- GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
             f"- command: `{' '.join(sys.argv)}`",
             f"- check: {check(args.kdt, dev)}",
             f"- time: average of {args.iters} back-to-back calls between two torch.cuda.Events, microseconds\n",
             "| B | N | tree depth | mean accept | torch us |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rng = np.random.default_rng(1)
    for B in (1, 8, 64, 256):
        for N in (16, 64, 256, 1024):
            trees = make_trees(rng, B, N)
            steps = tree_depth(trees[1], trees[2])
            inputs = [torch.from_numpy(a).to(dev) for a in trees]
            out = torch_accept(*inputs, steps)
            for _ in range(3):
                torch_accept(*inputs, steps)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.iters):
                torch_accept(*inputs, steps)
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1000 / args.iters
            row = f"| {B} | {N} | {steps} | {out[0].float().mean().item():.2f} | {us:.1f} |"
            print(row, flush=True)
            lines.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
