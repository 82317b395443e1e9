"""Peer benchmark: the kdt ops from Python against what a Python user would write without them.

    python3 bench/peer_bench.py [--reps 50] [--out docs/perf/peer_bench.md]

Runs on a machine with torch and a CUDA device (and a CUDA build of libkdt.so, found as the
binding finds it: $KDT_LIB, the installed package, or build/libkdt.so); elsewhere it prints why
and exits 0. All inputs live on the GPU as torch tensors, as in a serving stack.

  tree_build   Python heapq best-first search per request, including the device->host copy of
               scores/tokens and the host->device copy of the tree, vs kdt.tree_build on the GPU
               (also kdt.tree_build on numpy with the same copies, to separate the two effects).
  tree_accept  a vectorized torch greedy walk (one masked step per tree level, no host sync)
               vs kdt.tree_accept.
  verify_attn  torch SDPA on absorbed MLA (Dqk 576, Dv 512): the Q*H query rows of a request
               packed as rows of one head over contiguous latent K/V, with an explicit bool mask
               (prefix visible, tree per tree_mask); vs kdt.verify_attn on a paged bf16 cache
               (BS 64). The SDPA side is given contiguous K/V and a prebuilt mask (its best case).

Times are medians over --reps runs (fewer where a run is slow) of CUDA events around each call.
Before each run the L2 is flushed and the host waits for the GPU, so a call's host-side cost
(Python, launches, copies) counts as well as its GPU time: the latency a Python caller sees.
Each baseline's outputs are checked against kdt's, and the verdict printed beside the times.
"""
import argparse
import heapq
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50, help="timed runs per case (host baselines: fewer if slow)")
    ap.add_argument("--out", help="also write the table as markdown to this file")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: a smoke test of this script on small shapes (CPU backend, wall-clock times)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peer_bench: torch is not installed; nothing to compare (skipped)")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("peer_bench: no CUDA device visible to torch; nothing to compare (skipped)")
        return 0
    import kdt
    try:
        print(f"peer_bench: {kdt.library_path()}", file=sys.stderr)
        if args.device == "cuda" and not kdt.cuda_available():
            print(f"peer_bench: {kdt.library_path()} has no CUDA backend or sees no device (skipped)")
            return 0
    except kdt.LibraryNotFound as e:
        print(f"peer_bench: {e} (skipped)")
        return 0
    bench = Bench(torch, kdt, args.reps, args.seed, args.device)
    bench.tree_build_cases()
    bench.tree_accept_cases()
    bench.verify_attn_cases()
    table = bench.table()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            how = (f"{torch.cuda.get_device_name()} (torch {torch.__version__}); medians of CUDA-event "
                   f"times, L2 flushed before each run" if args.device == "cuda" else
                   f"CPU, a smoke test of the script (torch {torch.__version__}); wall-clock medians")
            f.write(f"# Peer benchmark\n\n`python3 bench/peer_bench.py --reps {args.reps}` on {how}; "
                    f"speedup = baseline / kdt.\n\n{table}\n")
        print(f"peer_bench: table written to {args.out}")
    return 0


class Bench:
    def __init__(self, torch, kdt, reps, seed, device):
        self.torch, self.kdt, self.reps = torch, kdt, reps
        self.dev = torch.device(device)
        self.cuda = device == "cuda"
        self.kname = f"kdt {device}"
        self.rng = np.random.default_rng(seed)
        self.flush = torch.empty(256 << 20 if self.cuda else 1, dtype=torch.uint8, device=self.dev)  # > 60 MB L2
        self.rows = []

    def shapes(self, cases, small):
        return cases if self.cuda else small

    def time_us(self, fn, budget_s=3.0):
        """Median microseconds of fn() between CUDA events, after warm-up; at most budget_s total."""
        torch = self.torch
        for _ in range(3):
            fn()
        times = []
        if not self.cuda:
            while len(times) < self.reps and (len(times) < 3 or sum(times) < budget_s * 1e6):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(times), len(times)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while len(times) < self.reps and (len(times) < 5 or sum(times) < budget_s * 1e6):
            self.flush.zero_()
            torch.cuda.synchronize()  # so host-side launch overhead counts inside the events
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times), len(times)

    def row(self, op, shape, base_name, base_fn, kdt_name, kdt_fn, check):
        times = []
        for fn in (kdt_fn, base_fn):
            try:
                times.append(self.time_us(fn)[0])
            except Exception as e:  # an unfinished op or a baseline out of memory: note it, go on
                times.append(f"error: {str(e).splitlines()[0][:80]}")
        t_kdt, t_base = times
        fmt = lambda t: f"{t:,.1f}" if isinstance(t, float) else t  # noqa: E731
        ok = all(isinstance(t, float) for t in times)
        ratio = t_base / t_kdt if ok else None
        speedup = "" if ratio is None else f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"
        self.rows.append((op, shape, base_name, fmt(t_base), kdt_name, fmt(t_kdt), speedup, check() if ok else ""))
        print("  ".join(self.rows[-1]), file=sys.stderr, flush=True)

    def table(self):
        head = ("op", "shape", "baseline", "baseline us", "kdt", "kdt us", "speedup", "outputs agree")
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)

    # ---- tree_build ----

    def tree_inputs(self, B, D, K):
        torch = self.torch
        logits = self.rng.standard_normal((B, D, K + 1)).astype(np.float32) * 2
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        scores = -np.sort(-logp[:, :, :K], axis=-1)
        tokens = self.rng.integers(0, 160000, (B, D, K)).astype(np.int32)
        root = self.rng.integers(0, 160000, B).astype(np.int32)
        seq_len = self.rng.integers(100, 4000, B).astype(np.int32)
        return [torch.from_numpy(x).to(self.dev) for x in (scores, tokens, root, seq_len)]

    def tree_build_cases(self):
        torch, kdt = self.torch, self.kdt
        for B, D, K, N in self.shapes(((64, 8, 8, 64), (64, 16, 8, 128), (1, 7, 4, 12)), ((8, 8, 8, 64), (1, 7, 4, 12))):
            g = self.tree_inputs(B, D, K)
            shape = f"B={B} D={D} K={K} N={N}"
            ref = {}

            def run_kdt():
                ref.update(kdt.tree_build(*g, N))

            def run_heapq():
                host = [x.cpu().numpy() for x in g]
                tree = heapq_tree_build(*host, N)
                ref["heapq"] = {k: torch.from_numpy(v).to(self.dev) for k, v in tree.items()}

            def run_kdt_cpu():
                host = [x.cpu().numpy() for x in g]
                tree = kdt.tree_build(*host, N)
                ref["cpu"] = {k: torch.from_numpy(v).to(self.dev) for k, v in tree.items()}

            def agree(key):
                return lambda: "yes" if all(torch.equal(ref[key][k], ref[k]) for k in
                                            ("num_nodes", "node_token", "node_parent", "positions",
                                             "tree_mask", "first_child", "next_sibling")) else "NO"

            self.row("tree_build", shape, "python heapq + copies", run_heapq, self.kname, run_kdt, agree("heapq"))
            self.row("tree_build", shape, "kdt cpu (numpy) + copies", run_kdt_cpu, self.kname, run_kdt, agree("cpu"))

    # ---- tree_accept ----

    def tree_accept_cases(self):
        torch, kdt = self.torch, self.kdt
        for B, D, N in self.shapes(((64, 8, 64), (64, 16, 128), (256, 8, 64), (1, 7, 12)), ((64, 8, 64), (1, 7, 12))):
            g = self.tree_inputs(B, D, 8)
            try:
                tree = kdt.tree_build(*g, N)
            except kdt.KdtError as e:
                self.rows.append(("tree_accept", f"B={B} N={N}", "torch vectorized", "", self.kname,
                                  f"needs tree_build: {e.message}", "", ""))
                continue
            pred = followed_predictions(torch, tree, 0.8)
            args = (tree.node_token, tree.node_parent, tree.num_nodes, pred)
            out = {}

            def run_kdt():
                out["kdt"] = kdt.tree_accept(*args)

            def run_torch():
                out["torch"] = torch_greedy_accept(torch, *args, D)

            def agree():
                return "yes" if all(torch.equal(out["torch"][k], out["kdt"][k])
                                    for k in ("accept_len", "accept_index", "accept_tokens")) else "NO"

            self.row("tree_accept", f"B={B} D={D} N={N}", "torch vectorized", run_torch, self.kname, run_kdt, agree)

    # ---- verify_attn ----

    def verify_attn_cases(self):
        torch, kdt = self.torch, self.kdt
        F = torch.nn.functional
        Dv, Dqk, BS, scale = 512, 576, 64, 0.13086
        for B, H, Q, prefix in self.shapes(((2, 16, 17, 2048), (16, 64, 17, 4096), (1, 64, 33, 4096)),
                                           ((2, 4, 17, 100), (1, 2, 33, 64))):
            L = prefix + Q
            q = (torch.randn(B, Q, H, Dqk, device=self.dev) * 0.5).to(torch.bfloat16)
            kv = (torch.randn(B, L, Dqk, device=self.dev)).to(torch.bfloat16)
            mask = torch.from_numpy(random_tree_mask(self.rng, B, Q)).to(self.dev)  # [B, Q, Q] u8
            kv_len = torch.full((B,), L, dtype=torch.int32, device=self.dev)
            # paged copy: each request's rows in shuffled blocks of BS
            MB = -(-L // BS)
            perm = torch.from_numpy(self.rng.permutation(B * MB).astype(np.int32)).to(self.dev)
            block_table = perm.view(B, MB).contiguous()
            cache = torch.zeros(B * MB, BS, Dqk, dtype=torch.bfloat16, device=self.dev)
            padded = torch.zeros(B, MB * BS, Dqk, dtype=torch.bfloat16, device=self.dev)
            padded[:, :L] = kv
            cache[block_table.view(-1).long()] = padded.view(B * MB, BS, Dqk)
            # SDPA: rows i*H + h of request b see the prefix and tree keys where mask[b, i] is 1
            sd_mask = torch.ones(B, Q, L, dtype=torch.bool, device=self.dev)
            sd_mask[:, :, prefix:] = mask.bool()
            sd_mask = sd_mask.repeat_interleave(H, dim=1).unsqueeze(1)        # [B, 1, Q*H, L]
            sq = q.view(B, 1, Q * H, Dqk)
            sk, sv = kv.unsqueeze(1), kv[:, :, :Dv].unsqueeze(1)
            out = {}

            def run_kdt():
                out["kdt"] = kdt.verify_attn(q, cache, kv_len, mask, scale, Dv, block_table=block_table).o

            def run_sdpa():
                out["sdpa"] = F.scaled_dot_product_attention(sq, sk, sv, attn_mask=sd_mask, scale=scale)

            def agree():  # bf16 outputs of two kernels: relative L2 error, the C tests' bf16 bound
                a, b = out["kdt"].float(), out["sdpa"].view(B, Q, H, Dv).float()
                rel = ((a - b).norm() / b.norm()).item()
                return f"{'yes' if rel < 1e-2 else 'NO'} (rel L2 {rel:.1e})"

            self.row("verify_attn", f"B={B} H={H} Q={Q} prefix={prefix}", "torch SDPA (bool mask)",
                     run_sdpa, self.kname + " paged bf16", run_kdt, agree)


def heapq_tree_build(scores, tokens, root_token, seq_len, N):
    """docs/interfaces.md 2.1 the way a Python user writes it: a heap of frontier candidates per request."""
    B, D, K = scores.shape
    Q = N + 1
    out = {"num_nodes": np.zeros(B, np.int32), "node_token": np.full((B, Q), -1, np.int32),
           "node_parent": np.full((B, Q), -1, np.int32), "node_depth": np.full((B, Q), -1, np.int32),
           "node_cand": np.full((B, Q), -1, np.int32), "node_score": np.full((B, Q), -np.inf, np.float32),
           "positions": np.full((B, Q), -1, np.int32), "tree_mask": np.zeros((B, Q, Q), np.uint8),
           "first_child": np.full((B, Q), -1, np.int32), "next_sibling": np.full((B, Q), -1, np.int32)}
    for b in range(B):
        sc, tk = scores[b].tolist(), tokens[b].tolist()
        # key: (-score, depth, parent, k) is the interface's order: best score, then shallower, lower parent, lower k
        heap = [(-s, 1, 0, k) for k, s in enumerate(sc[0]) if s > -math.inf]
        heapq.heapify(heap)
        nodes = [(int(root_token[b]), -1, 0, -1, 0.0)]  # (token, parent, depth, cand, score), root first
        while heap and len(nodes) <= N:
            neg, depth, parent, k = heapq.heappop(heap)
            idx = len(nodes)
            nodes.append((tk[depth - 1][k], parent, depth, k, -neg))
            if depth < D:
                for k2, s in enumerate(sc[depth]):
                    total = -neg + s
                    if total > -math.inf:  # also drops NaN
                        heapq.heappush(heap, (-total, depth + 1, idx, k2))
        n = len(nodes)
        out["num_nodes"][b] = n - 1
        tok, par, dep, cand, score = (list(col) for col in zip(*nodes))
        out["node_token"][b, :n], out["node_parent"][b, :n], out["node_depth"][b, :n] = tok, par, dep
        out["node_cand"][b, :n], out["node_score"][b, :n] = cand, score
        out["positions"][b, :n] = np.asarray(dep) + seq_len[b]
        mask, first, sib, last = out["tree_mask"][b], out["first_child"][b], out["next_sibling"][b], {}
        mask[0, 0] = 1
        for c in range(1, n):
            p = par[c]
            mask[c] = mask[p]
            mask[c, c] = 1
            if p in last:
                sib[last[p]] = c
            else:
                first[p] = c
            last[p] = c
    return out


def torch_greedy_accept(torch, node_token, node_parent, num_nodes, target_pred, depth):
    """docs/interfaces.md 2.3 vectorized over requests: one masked step per tree level, no host sync."""
    B, Q = node_token.shape
    cols = torch.arange(Q, device=node_token.device)
    par = node_parent.long().clamp(min=0)
    # node c can be accepted from its parent when its token is the parent's prediction
    match = (cols[None] >= 1) & (cols[None] <= num_nodes[:, None]) & (node_token == target_pred.gather(1, par))
    cur = torch.zeros(B, dtype=torch.long, device=node_token.device)
    length = torch.zeros(B, dtype=torch.int32, device=node_token.device)
    index = torch.full((B, Q), -1, dtype=torch.int32, device=node_token.device)
    tokens = torch.full((B, Q + 1), -1, dtype=torch.int32, device=node_token.device)
    index[:, 0] = 0
    for step in range(min(depth, Q - 1)):
        cand = match & (node_parent == cur[:, None])
        has = cand.any(1)
        nxt = cand.int().argmax(1)  # lowest matching index
        cur = torch.where(has, nxt, cur)
        length += has.int()
        index[:, step + 1] = torch.where(has, nxt, -1).int()
        tokens[:, step] = torch.where(has, node_token.gather(1, nxt[:, None])[:, 0], -1)
        match = match & has[:, None]
    tokens.scatter_(1, length.long()[:, None], target_pred.gather(1, cur[:, None]))
    return {"accept_len": length, "accept_index": index, "accept_tokens": tokens[:, :Q]}


def followed_predictions(torch, tree, p_follow):
    """Target predictions that agree with the tree's first child with probability p_follow."""
    tok, first = tree.node_token, tree.first_child
    follow = tok.gather(1, first.clamp(min=0).long())
    noise = torch.randint(0, 160000, tok.shape, device=tok.device, dtype=torch.int32)
    keep = torch.rand(tok.shape, device=tok.device) < p_follow
    return torch.where(keep & (first >= 0), follow, noise).int().contiguous()


def random_tree_mask(rng, B, Q):
    """tree_mask [B, Q, Q] u8 of random trees (parent of node c drawn below c)."""
    mask = np.zeros((B, Q, Q), np.uint8)
    for b in range(B):
        mask[b, 0, 0] = 1
        for c in range(1, Q):
            p = rng.integers(0, c)
            mask[b, c] = mask[b, p]
            mask[b, c, c] = 1
    return mask


if __name__ == "__main__":
    sys.exit(main())
