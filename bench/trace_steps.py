#!/usr/bin/env python3
"""Per-step summary of a Chrome trace written by dev/trace/cupti_trace.c (the CUPTI timeline).

    python3 bench/trace_steps.py TRACE.json [--label NAME] [--out FILE.md] [--slice FILE.json] [--skip 2]

A step is one model forward: from the start of one `embed_kernel` (every forward's first kernel) to
the next. For each step after the first --skip: its period, the time the GPU runs a kernel, memcpy or
memset (the union of their intervals), the idle rest, the kernel count and the host API time by
call. Prints the medians, the largest idle gaps of the median step with the events on either side,
and that step's events in order (the timeline of one step). --slice writes three steps around the
median one as a smaller trace for Perfetto / chrome://tracing.
"""
import argparse
import bisect
import json
import shutil
import statistics
import subprocess
import sys

DEVICE_WORK = ("kernel", "memcpy", "memset")


def load(path):
    with open(path) as f:
        doc = json.load(f)
    ev = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X"]
    if not ev:
        sys.exit(f"{path}: no events (was the program run with CUDA_INJECTION64_PATH?)")
    demangle(ev)
    return doc, ev


def demangle(ev):
    """CUPTI names kernels by their mangled symbols; c++filt (binutils) reads them where it is installed."""
    names = sorted({e["name"] for e in ev if e["name"].startswith("_Z")})
    tool = shutil.which("c++filt")
    if not names or not tool:
        return
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    if len(out) >= len(names):
        table = dict(zip(names, out))
        for e in ev:
            e["name"] = table.get(e["name"], e["name"])


def union(intervals):
    """Total length of the union of [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def steps_of(ev):
    gpu = sorted((e for e in ev if e["pid"] == 0 and e["cat"] in DEVICE_WORK), key=lambda e: e["ts"])
    host = sorted((e for e in ev if e["pid"] == 1), key=lambda e: e["ts"])
    starts = [e["ts"] for e in gpu if e["cat"] == "kernel" and "embed_kernel" in e["name"]]
    gts, hts = [e["ts"] for e in gpu], [e["ts"] for e in host]
    window = lambda evs, ts, a, b: evs[bisect.bisect_left(ts, a):bisect.bisect_left(ts, b)]  # ts in [a, b)
    out = []
    for a, b in zip(starts, starts[1:]):
        g, h = window(gpu, gts, a, b), window(host, hts, a, b)
        busy = union([(e["ts"], min(e["ts"] + e["dur"], b)) for e in g])
        api = {}
        for e in h:
            api[e["name"]] = api.get(e["name"], 0.0) + e["dur"]
        out.append({"start": a, "end": b, "period": b - a, "busy": busy, "gpu": g, "host": h, "api": api,
                    "kernels": sum(e["cat"] == "kernel" for e in g)})
    return out


def short(name, n=60):
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "").removeprefix("void ")
    return name.split("(")[0][:n]


def report(label, steps, skip):
    use = steps[skip:]
    if not use:
        return f"## {label}\n\nfewer than {skip + 1} steps in the trace\n", None
    per = sorted(use, key=lambda s: s["period"])
    med = per[len(per) // 2]
    md = statistics.median
    lines = [f"## {label}", "",
             f"{len(use)} steps (forwards) after the first {skip}; medians: period **{md(s['period'] for s in use):.1f} us**, "
             f"GPU busy {md(s['busy'] for s in use):.1f} us ({100 * md(s['busy'] / s['period'] for s in use):.0f}%), "
             f"idle {md(s['period'] - s['busy'] for s in use):.1f} us, {md(s['kernels'] for s in use):.0f} kernels", ""]
    api = {}
    for s in use:
        for k, v in s["api"].items():
            api.setdefault(k, []).append(v)
    lines += ["| host API call | median us a step | steps with it |", "|---|---:|---:|"]
    for k, v in sorted(api.items(), key=lambda t: -sum(t[1]))[:8]:
        lines.append(f"| {k} | {md(v + [0.0] * (len(use) - len(v))):.1f} | {len(v)} |")
    g = med["gpu"]
    gaps = []
    for i in range(1, len(g)):
        prev_end = max(e["ts"] + e["dur"] for e in g[:i])
        if g[i]["ts"] > prev_end:
            gaps.append((g[i]["ts"] - prev_end, short(g[i - 1]["name"], 40), short(g[i]["name"], 40)))
    tail = med["end"] - max((e["ts"] + e["dur"] for e in g), default=med["start"])
    lines += ["", f"The median step ({med['period']:.1f} us, {med['kernels']} kernels): the GPU idles "
              f"{med['period'] - med['busy']:.1f} us, {tail:.1f} of them after its last event (waiting for the host)."]
    if gaps:
        lines += ["", "| largest idle gaps, us | after | before |", "|---:|---|---|"]
        lines += [f"| {d:.1f} | {a} | {b} |" for d, a, b in sorted(gaps, reverse=True)[:6]]
    lines += ["", "Its events in order (t from the step's start, us):", "",
              "| t | dur | lane | event |", "|---:|---:|---|---|"]
    both = sorted(med["gpu"] + med["host"], key=lambda e: e["ts"])
    for e in both:
        lane = "gpu" if e["pid"] == 0 else "host"
        lines.append(f"| {e['ts'] - med['start']:.1f} | {e['dur']:.1f} | {lane} {e['cat']} | {short(e['name'])} |")
    return "\n".join(lines) + "\n", med


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--slice", default=None)
    ap.add_argument("--skip", type=int, default=2, help="leading forwards left out (prefill, warm-up)")
    a = ap.parse_args()
    doc, ev = load(a.trace)
    steps = steps_of(ev)
    text, med = report(a.label or a.trace, steps, a.skip)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.slice and med:
        i = steps.index(med)
        lo, hi = steps[max(i - 1, 0)]["start"], steps[min(i + 1, len(steps) - 1)]["end"]
        keep = [e for e in doc["traceEvents"] if e.get("ph") != "X" or lo <= e["ts"] < hi]
        with open(a.slice, "w") as f:
            json.dump({"traceEvents": keep}, f)


if __name__ == "__main__":
    main()
