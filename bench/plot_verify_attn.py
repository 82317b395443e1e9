"""Plots bench_verify_attn's CSV: time per shape for each kernel, and throughput against the ceilings.

    python3 bench/plot_verify_attn.py build/bench/verify_attn.csv [--out docs/perf/verify_attn_sm90.png]

Left: time (log scale) of the sm90 kernels in the CSV (us_tma, us_cp_async), the general
fallback, torch SDPA where measured, and FlashMLA's own published number with the target bar
(1.4x FlashMLA, 1.0x on 2,16,17,2048). Right: TFLOP/s of the default kernel and the percent of
the GEMM ceiling measured in the same run.
"""
import argparse
import csv
import math
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--out", default="docs/perf/verify_attn_sm90.png")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_verify_attn: matplotlib is not installed (skipped)")
        return 0
    with open(args.csv) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot_verify_attn: {args.csv} has no rows")
        return 1

    def num(r, k):
        try:
            v = float(r[k])
            return v if math.isfinite(v) else None
        except (KeyError, ValueError):
            return None

    labels = [f"{r['B']},{r['H']},{r['Q']},{r['prefix']}" for r in rows]
    names = {"us_tma": "sm90 TMA (default)", "us_cp_async": "sm90 cp.async"}
    series = [(names[k], k) for k in rows[0] if k in names]
    series += [("fallback", "us_fallback"), ("torch SDPA", "us_torch"), ("FlashMLA (no mask)", "flashmla_us")]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(16, 6))
    width = 0.8 / len(series)
    for k, (name, key) in enumerate(series):
        xs, ys = [], []
        for i, r in enumerate(rows):
            v = num(r, key)
            if v is not None:
                xs.append(i + (k - len(series) / 2 + 0.5) * width)
                ys.append(v)
        if ys:
            ax.bar(xs, ys, width, label=name)
    for i, r in enumerate(rows):
        fm = num(r, "flashmla_us")
        if fm:
            t = fm if (r["B"], r["H"]) == ("2", "16") else 1.4 * fm
            ax.plot([i - 0.45, i + 0.45], [t, t], "k--", lw=1)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), labels, rotation=30, ha="right")
    ax.set_ylabel("time (us), dashed: target")
    ax.set_xlabel("B, H, Q, prefix")
    ax.legend(fontsize=8)
    ax.set_title("verify_attn, bf16, paged 64, tree mask")

    tf = [num(r, "tflops") or 0 for r in rows]
    ax2.bar(range(len(rows)), tf, 0.6, color="tab:blue")
    gemm = num(rows[0], "gemm_tflops")
    if gemm:
        ax2.axhline(gemm, color="k", ls="--", lw=1, label=f"bf16 GEMM ceiling {gemm:.0f}")
    for i, r in enumerate(rows):
        p = num(r, "pct_gemm")
        if p is not None:
            ax2.text(i, tf[i], f"{p:.0f}%", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(rows)), labels, rotation=30, ha="right")
    ax2.set_ylabel(f"TFLOP/s (sm90 default, {rows[0].get('kernel', '?')} kernel)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
