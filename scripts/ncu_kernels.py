#!/usr/bin/env python3
"""Per-kernel times of one profiled forward step from ncu's --csv log (gpu__time_duration.sum and,
where measured, dram__bytes_read.sum), for scripts/gpu_small_kernels.sh.

  ncu_kernels.py list LOG CSV NAME      writes CSV (kernel, us, MB read) in launch order; prints the
                                        step's total and the small row kernels' (norms, router,
                                        combine, cache append, split-K reduces) per name
  ncu_kernels.py diff BASE.csv NEW.csv  per kernel name: launches and us before and after, and the totals
"""
import csv
import re
import sys

SMALL = r"rmsnorm|route_plan|route_wide|route_kernel|moe_combine|kv_append|splitKreduce|moe_count|moe_fill|silu_mul|q_prep|rope_table|embed"
SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def short(name):
    name = re.sub(r"\(.*", "", name).replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    return re.sub(r"^void ", "", name)[:80]


def kernels(log):
    rows = [r for r in csv.reader(l for l in open(log, errors="replace") if l.startswith('"')) if len(r) > 10]
    if len(rows) < 2:
        return []
    h = rows[0]
    iid, kn, mn, mu, mv = (h.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
    ks = {}
    for r in rows[1:]:
        k = ks.setdefault(r[iid], {"name": short(r[kn]), "us": 0.0, "mb": 0.0})
        v = float(r[mv].replace(",", "")) * SCALE.get(r[mu], 1)
        if r[mn].startswith("gpu__time"):
            k["us"] = v
        else:
            k["mb"] = v / 1e6
    return list(ks.values())


def by_name(ks):
    agg = {}
    for k in ks:
        a = agg.setdefault(k["name"], [0, 0.0])
        a[0] += 1
        a[1] += k["us"]
    return agg


def cmd_list(log, out, name):
    ks = kernels(log)
    if not ks:
        print(f"{name}: no ncu rows")
        return
    with open(out, "w") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "us", "MB read"])
        for k in ks:
            w.writerow([k["name"], f'{k["us"]:.1f}', f'{k["mb"]:.2f}'])
    tot = sum(k["us"] for k in ks)
    small = [k for k in ks if re.search(SMALL, k["name"])]
    print(f"{name}: {len(ks)} kernels, {tot:.1f} us; small row kernels {len(small)}, {sum(k['us'] for k in small):.1f} us")
    for n, (c, us) in sorted(by_name(small).items(), key=lambda t: -t[1][1]):
        print(f"{name}:   {n[:60]}: {c} x, {us:.1f} us ({us / c:.1f} each)")


def load(path):
    with open(path) as f:
        return [{"name": r["kernel"], "us": float(r["us"])} for r in csv.DictReader(f)]


def cmd_diff(base, new):
    b, n = by_name(load(base)), by_name(load(new))
    print("| kernel | before: launches, us | after: launches, us |")
    print("|---|---:|---:|")
    for k in sorted(set(b) | set(n), key=lambda k: -(b.get(k, [0, 0])[1] + n.get(k, [0, 0])[1])):
        bc, bu = b.get(k, [0, 0.0])
        nc, nu = n.get(k, [0, 0.0])
        print(f"| {k[:70]} | {bc}, {bu:.1f} | {nc}, {nu:.1f} |")
    print(f"| **step** | {sum(v[0] for v in b.values())}, {sum(v[1] for v in b.values()):.1f} | "
          f"{sum(v[0] for v in n.values())}, {sum(v[1] for v in n.values()):.1f} |")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "list":
        cmd_list(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "diff":
        cmd_diff(*sys.argv[2:])
    else:
        sys.exit(__doc__)
