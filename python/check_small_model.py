"""Checks that the engine reads a folder written by python/train_small_model.py as transformers did: the
greedy continuations in its eval.json (transformers, f32) against `kdt generate` (plain, and speculative
with the draft model), token for token.

    python3 python/check_small_model.py [--kdt build-cpu/kdt] [--model models/kdt-small]
                                        [--draft models/kdt-small-draft] [--backend cpu]
Exits 1 when a continuation differs.
"""
import argparse
import json
import os
import subprocess
import sys


def run(kdt, args):
    p = subprocess.run([kdt, "generate"] + args, capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"kdt generate {' '.join(args)}: exit {p.returncode}\n{p.stderr}")
    return [list(map(int, line.split())) for line in p.stdout.splitlines() if line.strip()], p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kdt", default="build-cpu/kdt")
    ap.add_argument("--model", default="models/kdt-small")
    ap.add_argument("--draft", default="models/kdt-small-draft")
    ap.add_argument("--backend", default="cpu")
    a = ap.parse_args()
    ev = json.load(open(os.path.join(a.model, "eval.json")))
    prompts = [line.split() for line in open(os.path.join(a.model, "heldout_prompts.ids"))]
    bad = 0
    for i, s in enumerate(ev["samples"]):
        ids = ",".join(prompts[i])
        want = s["ids"]
        base = ["--model", a.model, "--backend", a.backend, "--prompt-ids", ids, "--max-new", str(len(want))]
        for name, extra in (("plain", []), ("lookup", ["--spec", "lookup"]),
                            ("draft model", ["--spec", "model", "--draft-model", a.draft])):
            got, err = run(a.kdt, base + extra)
            got = got[0] if got else []
            n = next((j for j, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            ok = got == want
            bad += not ok
            acc = [ln for ln in err.splitlines() if "mean accepted" in ln]
            print(f"prompt {i} {name}: {'equal' if ok else f'differs at {n}'} over {len(want)} tokens"
                  + (f"; {acc[0].split(': ', 1)[1]}" if acc else ""))
    print("all equal" if not bad else f"{bad} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
