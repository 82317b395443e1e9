#!/usr/bin/env python3
"""Load benchmark of `kdt serve` (docs/serve.md): C clients at once, each sending streamed
/v1/completions one after another, for C in --concurrency (default 1, 8, 32, 64). Per level:
throughput (generated tokens/s, requests/s), time to first token and inter-token latency (p50,
p99). Bounded: each level stops after --requests requests or --seconds seconds, whichever comes
first, and every request has a timeout. Loopback only. Standard library only (the GPU machine
has no `openai` package).

  python3 bench/serve_load.py --port 8000 --label lookup --csv serve_load.csv [--plot serve_load.png]

Prompts are random token ids (below --vocab) of --prompt-len tokens, with a repeated stretch so
that prompt lookup has something to find; max_tokens is --max-tokens; temperature 0.
"""
import argparse
import csv
import http.client
import json
import os
import random
import sys
import threading
import time

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def make_prompt(rng, n, vocab):
    head = [rng.randrange(vocab) for _ in range(max(1, n // 2))]
    return (head + head)[:n] if n > 1 else head


def one_request(host, port, body, timeout):
    """Streams one completion; returns (ttft, [per-token gaps], tokens) or raises."""
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:200]))
        ttft, last, gaps, tokens = None, None, [], 0
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(ev["error"]["message"])
            n = len(ev["choices"][0].get("token_ids", []))
            if n == 0:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - t0
            else:
                gaps += [(now - last) / n] * n  # a chunk of n tokens: n gaps of its share
            last = now
            tokens += n
        return ttft, gaps, tokens
    finally:
        c.close()


def run_level(args, conc, rng):
    prompts = [make_prompt(rng, args.prompt_len, args.vocab) for _ in range(args.requests)]
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "errors": 0, "tokens": 0, "ttft": [], "itl": [], "err": ""}
    deadline = time.perf_counter() + args.seconds

    def worker():
        while True:
            with lock:
                i = state["next"]
                if i >= len(prompts) or time.perf_counter() >= deadline:
                    return
                state["next"] += 1
            body = {"prompt": prompts[i], "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
            if args.model:
                body["model"] = args.model
            try:
                ttft, gaps, n = one_request(args.host, args.port, body, args.timeout)
                with lock:
                    state["done"] += 1
                    state["tokens"] += n
                    if ttft is not None:
                        state["ttft"].append(ttft)
                    state["itl"] += gaps
            except Exception as e:  # counted, and the level goes on
                with lock:
                    state["errors"] += 1
                    state["err"] = str(e)[:200]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.seconds + args.timeout + 5)
    wall = time.perf_counter() - t0
    ms = 1e3
    return {"label": args.label, "concurrency": conc, "requests": state["next"], "completed": state["done"],
            "errors": state["errors"], "wall_s": round(wall, 3), "tokens": state["tokens"],
            "tokens_per_s": round(state["tokens"] / wall, 2), "requests_per_s": round(state["done"] / wall, 3),
            "ttft_p50_ms": round(percentile(state["ttft"], 50) * ms, 2), "ttft_p99_ms": round(percentile(state["ttft"], 99) * ms, 2),
            "itl_p50_ms": round(percentile(state["itl"], 50) * ms, 3), "itl_p99_ms": round(percentile(state["itl"], 99) * ms, 3),
            "last_error": state["err"]}


def plot(csv_path, png):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("serve_load: no matplotlib, no plot", file=sys.stderr)
        return
    rows = list(csv.DictReader(open(csv_path)))
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for label in sorted({r["label"] for r in rows}):
        rs = [r for r in rows if r["label"] == label]
        c = [int(r["concurrency"]) for r in rs]
        ax[0].plot(c, [float(r["tokens_per_s"]) for r in rs], "o-", label=label)
        ax[1].plot(c, [float(r["ttft_p50_ms"]) for r in rs], "o-", label=label + " p50")
        ax[1].plot(c, [float(r["ttft_p99_ms"]) for r in rs], "x--", label=label + " p99")
        ax[2].plot(c, [float(r["itl_p50_ms"]) for r in rs], "o-", label=label + " p50")
        ax[2].plot(c, [float(r["itl_p99_ms"]) for r in rs], "x--", label=label + " p99")
    for a, t in zip(ax, ["generated tokens/s", "time to first token (ms)", "inter-token latency (ms)"]):
        a.set_xscale("log", base=2)
        a.set_xlabel("concurrent clients")
        a.set_title(t)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--model", default="", help="the model name to send (default: none, the server's)")
    ap.add_argument("--label", default="kdt", help="the CSV's label column (e.g. the --spec of the server)")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--requests", type=int, default=128, help="most requests per level")
    ap.add_argument("--seconds", type=float, default=60, help="most seconds per level (requests in flight finish)")
    ap.add_argument("--timeout", type=float, default=120, help="per request")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=512, help="prompt token ids are below this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv", default="serve_load.csv", help="appended to (header written when new)")
    ap.add_argument("--plot", default="", help="PNG of every label in the CSV (needs matplotlib)")
    ap.add_argument("--plot-only", action="store_true", help="no load: only the plot of the CSV")
    args = ap.parse_args()
    if args.plot_only:
        plot(args.csv, args.plot or os.path.splitext(args.csv)[0] + ".png")
        return
    if args.host not in LOOPBACK:
        sys.exit("serve_load: loopback only (--host 127.0.0.1), not %s" % args.host)
    rng = random.Random(args.seed)
    new = not os.path.exists(args.csv)
    with open(args.csv, "a", newline="") as f:
        w = None
        for conc in [int(c) for c in args.concurrency.split(",")]:
            row = run_level(args, conc, rng)
            print(" ".join("%s=%s" % kv for kv in row.items()), flush=True)
            if w is None:
                w = csv.DictWriter(f, fieldnames=list(row))
                if new:
                    w.writeheader()
            w.writerow(row)
            f.flush()
    if args.plot:
        plot(args.csv, args.plot)


if __name__ == "__main__":
    main()
