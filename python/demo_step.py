"""One speculative step on random data, op by op through the `kdt` CLI (scripts/demo.sh).

A drafter's top-K log-probs become a draft tree (tree_build), the target's attention runs over the
prefix and the tree (verify_attn, paged latent cache), a made-up target agrees with the drafter's
first choice along one branch (tree_accept), and the accepted rows move up in the cache (kv_commit).
"""
import argparse
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kdtr  # noqa: E402


def run(kdt, op, tensors, work):
    src, dst = os.path.join(work, f"{op}_in.kdtr"), os.path.join(work, f"{op}_out.kdtr")
    kdtr.save(src, tensors)
    subprocess.run([kdt, "run", op, src, "-o", dst], check=True)
    return kdtr.load(dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kdt", default="build/kdt")
    ap.add_argument("--work", default="/tmp/kdt-demo")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    B, D, K, N, H, prefix, BS = 2, 5, 4, 16, 16, 100, 64
    Q = N + 1

    logits = rng.normal(size=(B, D, K)).astype(np.float32) * 2
    scores = -np.sort(-(logits - np.log(np.exp(logits).sum(-1, keepdims=True) + 1.0)), axis=-1)
    tokens = rng.integers(0, 1000, size=(B, D, K), dtype=np.int32)
    root = rng.integers(0, 1000, size=B, dtype=np.int32)
    seq_len = np.full(B, prefix, np.int32)
    tree = run(args.kdt, "tree_build", {"scores": scores.astype(np.float32), "tokens": tokens,
                                         "root_token": root, "seq_len": seq_len, "budget": np.int32(N)}, args.work)
    print(f"tree_build: {tree['num_nodes'].tolist()} draft nodes per request; request 0:")
    for i in range(int(tree["num_nodes"][0]) + 1):
        print(f"  node {i:2d} token {tree['node_token'][0, i]:4d} parent {tree['node_parent'][0, i]:2d} "
              f"depth {tree['node_depth'][0, i]} score {tree['node_score'][0, i]:8.3f}")

    kv_len = np.full(B, prefix + Q, np.int32)
    MB = (prefix + Q + BS - 1) // BS
    table = rng.permutation(B * MB).astype(np.int32).reshape(B, MB)
    cache = rng.normal(size=(B * MB, BS, 576)).astype(np.float32)
    q = rng.normal(size=(B, Q, H, 576)).astype(np.float32)
    attn = run(args.kdt, "verify_attn", {"q": q, "kv_cache": cache, "block_table": table, "kv_len": kv_len,
                                          "tree_mask": tree["tree_mask"], "sm_scale": np.float32(0.13086),
                                          "dv": np.int32(512)}, args.work)
    print(f"verify_attn: o {attn['o'].shape}, lse of request 0 row 0 heads 0..3: {attn['lse'][0, 0, :4]}")

    # A target that agrees with each node's first child: the accepted path follows k = 0.
    pred = np.full((B, Q), 7, np.int32)
    for b in range(B):
        for i in range(Q):
            c = tree["first_child"][b, i]
            if c >= 0:
                pred[b, i] = tree["node_token"][b, c]
    acc = run(args.kdt, "tree_accept", {"node_token": tree["node_token"], "node_parent": tree["node_parent"],
                                         "num_nodes": tree["num_nodes"], "target_pred": pred}, args.work)
    print(f"tree_accept: accept_len {acc['accept_len'].tolist()}, request 0 path {acc['accept_index'][0][:int(acc['accept_len'][0]) + 1].tolist()}, "
          f"tokens {acc['accept_tokens'][0][:int(acc['accept_len'][0]) + 1].tolist()}")
    com = run(args.kdt, "kv_commit", {"kv_cache": cache, "block_table": table, "kv_len": kv_len,
                                       "accept_index": acc["accept_index"], "accept_len": acc["accept_len"]}, args.work)
    print(f"kv_commit: kv_len {kv_len.tolist()} -> {com['new_kv_len'].tolist()}")


if __name__ == "__main__":
    main()
