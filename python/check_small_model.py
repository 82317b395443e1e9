"""Checks that the engine reads a folder written by python/train_small_model.py as transformers did: the
greedy continuations in its eval.json (transformers, f32) against `kdt generate` (plain, and speculative
with the draft model), token for token.

    python3 python/check_small_model.py [--kdt build-cpu/kdt] [--model models/kdt-small]
                                        [--draft models/kdt-small-draft] [--backend cpu]
Exits 1 when a continuation differs. With --fixture DIR it also writes DIR/kdt-small: a copy of the model
with expected.kdtr (a held-out prompt, 32 greedy tokens and every row's f32 logits, from transformers on
the saved weights) in the form tests/test_model.c reads, for a logits check:
    KDT_MODEL_FIXTURES=DIR build-cpu/tests/test_model
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


def write_fixture(model_dir, prompt, out):
    import shutil

    import numpy as np
    import torch
    from transformers import DeepseekV3ForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kdtr

    dst = os.path.join(out, "kdt-small")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(model_dir, dst)
    m = DeepseekV3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    x = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(32):
            x = torch.cat([x, m(input_ids=x).logits[:, -1].argmax(-1, keepdim=True)], 1)
        logits = m(input_ids=x).logits[0].numpy().astype(np.float32)
    cont = x[0, len(prompt):].tolist()
    kdtr.save(os.path.join(dst, "expected.kdtr"), {"prompt": np.asarray(prompt, np.int32),
                                                    "continuation": np.asarray(cont, np.int32), "logits": logits})
    print(f"wrote {dst}/expected.kdtr: prompt {len(prompt)} tokens, continuation {cont}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kdt", default="build-cpu/kdt")
    ap.add_argument("--model", default="models/kdt-small")
    ap.add_argument("--draft", default="models/kdt-small-draft")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--fixture", help="also write a test_model fixture of the model here")
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
    if a.fixture:
        write_fixture(a.model, [int(t) for t in prompts[0][:24]], a.fixture)
    print("all equal" if not bad else f"{bad} runs differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
