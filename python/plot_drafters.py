"""Turns bench_drafters' CSVs (scripts/gpu_drafters.sh) into docs/perf/drafters.png and docs/perf/drafters.md.

    python3 python/plot_drafters.py [--cuda drafters_cuda.csv] [--cpu drafters_cpu.csv]
                                    [--png docs/perf/drafters.png] [--md docs/perf/drafters.md]

The markdown has, per backend, the fastest setting of each drafter at each batch size, the whole grid,
the outputs-equal-greedy totals, and places for the notes of the run (commands, machine, what it means).
The plot (needs matplotlib; skipped without it): per backend, left the speedup over plain greedy of each
drafter's fastest (D, K, N) at each batch size, right the mean accepted length over the grid at batch 1.
"""
import argparse
import csv
import os
import sys


def load(path):
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ("batch", "D", "K", "N", "prompts", "tokens", "equal_greedy", "parted", "first_part"):
            r[k] = int(r[k])
        for k in ("seconds", "tokens_per_s", "speedup", "mean_accepted", "tokens_per_step"):
            r[k] = float(r[k])
    return rows


def drafters(rows):
    return sorted({r["drafter"] for r in rows}, key=lambda d: (d != "none", d != "lookup", d != "model", d))


def best(rows, batch, drafter):
    c = [r for r in rows if r["batch"] == batch and r["drafter"] == drafter]
    return max(c, key=lambda r: r["tokens_per_s"]) if c else None


def cfg(r):
    return "-" if r["drafter"] == "none" else f"D={r['D']} K={r['K']} N={r['N']}"


def table(rows, title):
    out = [f"## {title}", ""]
    if not rows:
        return out + ["(no results)", ""]
    batches = sorted({r["batch"] for r in rows})
    out += ["Fastest setting of each drafter (tokens/s over whole generate calls, prefill included):", "",
            "| batch | drafter | setting | tokens/s | vs none | accepted | tok/step | = greedy | parts at |",
            "|---|---|---|---|---|---|---|---|---|"]
    for b in batches:
        for d in drafters(rows):
            r = best(rows, b, d)
            if r:
                out.append(f"| {b} | {d} | {cfg(r)} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['mean_accepted']:.2f} |"
                           f" {r['tokens_per_step']:.2f} | {r['equal_greedy']}/{r['prompts']} |"
                           f" {r['first_part'] if r['parted'] else '-'} |")
    out.append("")
    for b in batches:
        top = max((r for r in rows if r["batch"] == b), key=lambda r: r["tokens_per_s"])
        out.append(f"- Best at batch {b}: **{top['drafter']}** ({cfg(top)}), {top['tokens_per_s']:.1f} tokens/s,"
                   f" {top['speedup']:.2f}x plain greedy.")
    spec = [r for r in rows if r["drafter"] != "none"]
    eq, tot = sum(r["equal_greedy"] for r in spec), sum(r["prompts"] for r in spec)
    parted = [r for r in spec if r["parted"]]
    out.append(f"- Speculative outputs equal to plain greedy: {eq} of {tot} request runs"
               + (f"; {len(parted)} settings have parting requests, the earliest at token "
                  f"{min(r['first_part'] for r in parted)}." if parted else "."))
    out += ["", "<details><summary>The whole grid</summary>", "",
            "| batch | drafter | D | K | N | prompts | tokens/s | vs none | accepted | tok/step | = greedy | parts at |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["batch"], drafters(rows).index(r["drafter"]), r["D"], r["K"], r["N"])):
        out.append(f"| {r['batch']} | {r['drafter']} | {r['D']} | {r['K']} | {r['N']} | {r['prompts']} | {r['tokens_per_s']:.1f} |"
                   f" {r['speedup']:.2f}x | {r['mean_accepted']:.2f} | {r['tokens_per_step']:.2f} |"
                   f" {r['equal_greedy']}/{r['prompts']} | {r['first_part'] if r['parted'] else '-'} |")
    return out + ["", "</details>", ""]


def write_md(path, cuda, cpu):
    lines = ["# Drafters on real weights", "",
             "The shipped model `models/kdt-small` (python/train_small_model.py: 6 layers, Kimi K2's MLA shapes, 8 experts",
             "top 2) on its held-out prompts, greedy, with each drafter: none (plain greedy decoding), lookup (n-grams of the",
             "prompt and output), model (`models/kdt-small-draft`, 1 layer) and prefix-L (the target's first L layers).",
             "accepted: mean draft tokens kept per request and step; tok/step: tokens emitted per request and step;",
             "= greedy: requests whose output equals plain greedy decoding token for token; parts at: the earliest",
             "position where one differs.", "",
             "Made by `bash scripts/gpu_drafters.sh` (bench/bench_drafters.c) on TODO(machine, date); plot and tables by",
             "`python3 python/plot_drafters.py --cuda drafters_cuda.csv --cpu drafters_cpu.csv`.", "",
             "![drafters](drafters.png)", ""]
    lines += table(cuda, "H200, CUDA backend, bf16")
    lines += table(cpu, "CPU backend, f32 (single-threaded forward, fewer prompts and new tokens)")
    lines += ["## Notes", "", "TODO (after the run): what the numbers say, where bf16 outputs part and why.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot(path, sets):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_drafters: matplotlib is not installed (plot skipped)")
        return
    sets = [(name, rows) for name, rows in sets if rows]
    if not sets:
        return
    fig, axes = plt.subplots(len(sets), 2, figsize=(12, 4 * len(sets)), squeeze=False)
    for row, (name, rows) in enumerate(sets):
        ax = axes[row][0]
        batches = sorted({r["batch"] for r in rows})
        ds = [d for d in drafters(rows) if d != "none"]
        w = 0.8 / max(1, len(ds))
        for i, d in enumerate(ds):
            xs, ys, labels = [], [], []
            for j, b in enumerate(batches):
                r = best(rows, b, d)
                if r:
                    xs.append(j + (i - (len(ds) - 1) / 2) * w)
                    ys.append(r["speedup"])
                    labels.append(f"{r['D']},{r['K']},{r['N']}")
            bars = ax.bar(xs, ys, w, label=d)
            for bar, lab in zip(bars, labels):
                ax.annotate(lab, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                            fontsize=6, rotation=90)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(batches)), [f"batch {b}" for b in batches])
        ax.set_ylabel("speedup over plain greedy (fastest D,K,N)")
        ax.set_title(name)
        ax.legend(fontsize=8)
        ax = axes[row][1]
        b1 = min(batches)
        grid = sorted({(r["D"], r["K"], r["N"]) for r in rows if r["drafter"] != "none"})
        for d in ds:
            pts = {(r["D"], r["K"], r["N"]): r["mean_accepted"] for r in rows if r["drafter"] == d and r["batch"] == b1}
            ax.plot(range(len(grid)), [pts.get(g, float("nan")) for g in grid], marker="o", label=d)
        ax.set_xticks(range(len(grid)), [f"{D},{K},{N}" for D, K, N in grid], rotation=45, fontsize=7)
        ax.set_xlabel("D, K, N")
        ax.set_ylabel(f"mean accepted length (batch {b1})")
        ax.set_title(f"{name}: acceptance")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot_drafters: wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuda", default="drafters_cuda.csv")
    ap.add_argument("--cpu", default="drafters_cpu.csv")
    ap.add_argument("--png", default="docs/perf/drafters.png")
    ap.add_argument("--md", default="docs/perf/drafters.md")
    a = ap.parse_args()
    cuda, cpu = load(a.cuda), load(a.cpu)
    if not cuda and not cpu:
        print(f"plot_drafters: neither {a.cuda} nor {a.cpu} has results")
        return 1
    write_md(a.md, cuda, cpu)
    print(f"plot_drafters: wrote {a.md}")
    plot(a.png, [("H200 bf16", cuda), ("CPU f32", cpu)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
