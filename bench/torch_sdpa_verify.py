"""torch SDPA on the verify_attn benchmark's shapes: the baseline of bench/bench_verify_attn.cu's torch column.

    python3 bench/torch_sdpa_verify.py [--reps 20] [--csv build/bench/torch_sdpa_verify.csv]

Absorbed MLA as a torch user would write it without a tree-attention kernel: the Q*H (tree row,
head) pairs of a request packed as the query rows of one head, over contiguous latent K [kv_len,
576] and V = K[:, :512], with an explicit bool mask (prefix visible to all rows, tree keys per a
random tree), sm_scale 0.13086, bf16. Median of --reps runs timed with CUDA events, the L2
flushed (256 MB written) before each. Writes B,H,Q,prefix,us rows to --csv for
`bench_verify_attn --torch-csv`. Exits 0 with a message where torch or a CUDA device is missing.
"""
import argparse
import os
import statistics
import sys

SHAPES = [(1, 64, 33, 32768), (16, 64, 17, 4096), (32, 64, 9, 8192), (1, 64, 257, 8192), (2, 16, 17, 2048),
          (64, 8, 17, 8192), (128, 8, 9, 16384)]


def tree_mask(torch, B, Q, gen):
    """[B, Q, Q] bool: node i sees itself and its ancestors; parent below child."""
    m = torch.zeros(B, Q, Q, dtype=torch.bool)
    for b in range(B):
        parent = [-1]
        for i in range(1, Q):
            parent.append(i - 1 if torch.rand(1, generator=gen).item() < 0.5 else int(torch.randint(0, i, (1,), generator=gen)))
        for i in range(Q):
            j = i
            while j >= 0:
                m[b, i, j] = True
                j = parent[j]
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--csv", default="build/bench/torch_sdpa_verify.csv")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("torch_sdpa_verify: torch is not installed; nothing to time (skipped)")
        return 0
    if not torch.cuda.is_available():
        print("torch_sdpa_verify: no CUDA device visible to torch; nothing to time (skipped)")
        return 0
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    rows_out = []
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    for B, H, Q, prefix in SHAPES:
        n = prefix + Q
        try:
            q = (torch.rand(B, 1, Q * H, 576, device=dev) * 4 - 2).to(torch.bfloat16)
            k = (torch.rand(B, 1, n, 576, device=dev) * 2 - 1).to(torch.bfloat16)
            v = k[..., :512]
            tm = tree_mask(torch, B, Q, gen).to(dev)                       # [B, Q, Q]
            mask = torch.ones(B, 1, Q * H, n, dtype=torch.bool, device=dev)
            mask[:, 0, :, prefix:] = tm.repeat_interleave(H, dim=1)         # row i * H + h sees tree row i's keys
            fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.13086)
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(args.reps):
                flush.random_(0, 255)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                e1.synchronize()
                times.append(e0.elapsed_time(e1) * 1e3)
            us = statistics.median(times)
            tflops = 2 * B * H * Q * n * (576 + 512) / us / 1e6
            print(f"B={B} H={H} Q={Q} prefix={prefix}: {us:.1f} us ({tflops:.0f} TFLOP/s)")
            rows_out.append((B, H, Q, prefix, us))
            del q, k, v, mask
        except RuntimeError as e:  # out of memory or no kernel for the shape: say so, keep going
            print(f"B={B} H={H} Q={Q} prefix={prefix}: failed: {str(e).splitlines()[0]}")
            torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    with open(args.csv, "w") as f:
        f.write("B,H,Q,prefix,us\n")
        for r in rows_out:
            f.write("%d,%d,%d,%d,%.2f\n" % r)
    print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
