"""The table of bench/llamacpp/run.sh: llama.cpp and kdt on the same prompts, from the run's logs.

    python3 report.py LOGS_DIR TOKENIZER_JSON OUT.md

LOGS_DIR holds runs.tsv (name, engine, new tokens per run), prompts/<i>.txt and .ids, one folder per
run with p<i>.out (stdout) and p<i>.err (stderr) per prompt, tokenize/p<i>.out and llama_bench.log.

Decode tokens/s over the 8 prompts: tokens after the first (which the prefill gives) over the time
after the prefill, summed over the prompts. kdt: "decode N tokens in T s" of `kdt generate`.
llama-simple: llama.cpp's "eval time" (the single-token decode calls, the prompt's batch left out).
llama-lookup, llama-speculative(-simple): their "decoded N tokens in T seconds", timed from after the
prompt's batch; N counts the first token too, which favours llama.cpp by one token in N.
accepted: draft tokens kept per verify step (kdt: its mean accepted length; llama.cpp: n_accept over
n_predict - n_accept, one token per step being the target's own). Outputs are compared as text (the
generated ids of kdt through the tokenizer; llama.cpp's printed pieces), over the shorter of the two
(llama-lookup and llama-speculative emit one token more than asked, EOS ends either early).
"""
import re
import sys
from pathlib import Path

EOS_TEXT = "<｜end▁of▁sentence｜>"
BOS_TEXT = "<｜begin▁of▁sentence｜>"


def read(p: Path) -> str:
    return p.read_text(errors="replace") if p.exists() else ""


def num(pattern: str, text: str, cast=float):
    m = re.search(pattern, text)
    return cast(m.group(1)) if m else None


def parse_prompt(engine: str, out: str, err: str, prompt: str, decode) -> dict | None:
    """One prompt's run: tokens, seconds, accepted, steps and the generated text (None if it failed)."""
    r = {"accepted": 0.0, "steps": 0.0}
    if engine == "kdt":
        m = re.search(r"decode (\d+) tokens in ([\d.]+) s", err)
        if not m:
            return None
        r["tokens"], r["seconds"] = int(m.group(1)), float(m.group(2))
        steps, acc = num(r"(\d+) steps, mean accepted length", err, int), num(r"mean accepted length ([\d.]+)", err)
        if steps:
            r["steps"], r["accepted"] = steps, steps * acc
        r["ids"] = [int(t) for t in out.split()]
        r["text"] = decode(r["ids"])
    else:
        if engine == "llama-simple":
            m = re.search(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs", err)
            if not m:
                return None
            r["tokens"], r["seconds"] = int(m.group(2)), float(m.group(1)) / 1e3
        else:
            m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", err)
            if not m:
                return None
            r["tokens"], r["seconds"] = int(m.group(1)), float(m.group(2))
            acc, pred = num(r"n_accept\s*=\s*(\d+)", err, int), num(r"n_predict\s*=\s*(\d+)", err, int)
            if acc is not None and pred:
                r["accepted"], r["steps"] = acc, pred - acc
        k = out.find(prompt)
        r["text"] = out[k + len(prompt):] if k >= 0 else None
    if r["text"] is not None:
        r["text"] = r["text"].replace(EOS_TEXT, "").rstrip("\n")
    return r


def parts_at(a: str | None, b: str | None) -> int | None:
    """-1 where a and b agree over the shorter, else the first differing character; None if unknown."""
    if a is None or b is None:
        return None
    m = min(len(a), len(b))
    return next((i for i in range(m) if a[i] != b[i]), -1)


def token_at(ids: list[int], char: int, decode) -> int:
    """The index of the token of ids (kdt's plain output) in which character `char` falls."""
    for k in range(1, len(ids) + 1):
        if len(decode(ids[:k])) > char:
            return k - 1
    return len(ids)


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    logs, out_md = Path(sys.argv[1]), Path(sys.argv[3])
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(sys.argv[2])
        decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
    except Exception as e:  # the text comparisons need it; the timings do not
        print(f"report.py: no tokenizer ({e}); kdt outputs are not compared with llama.cpp's")
        decode = lambda ids: None  # noqa: E731
    n_prompts = len(list((logs / "prompts").glob("*.txt")))
    prompts = [read(logs / "prompts" / f"{i}.txt") for i in range(n_prompts)]
    prompt_ids = [[int(t) for t in read(logs / "prompts" / f"{i}.ids").split(",") if t] for i in range(n_prompts)]
    runs = [line.split("\t") for line in read(logs / "runs.tsv").splitlines() if line.strip()]

    res = {}
    for name, engine, n in runs:
        res[name] = (engine, int(n), [
            parse_prompt(engine, read(logs / name / f"p{i}.out"), read(logs / name / f"p{i}.err"), prompts[i], decode)
            for i in range(n_prompts)])

    def plain(engine_kind: str, n: int):
        for name, (engine, nn, per) in res.items():
            if nn == n and ((engine == "kdt") == (engine_kind == "kdt")) and "_plain_" in name:
                return per
        return None

    lines = ["# llama.cpp and kdt on models/kdt-small, batch 1, greedy", "",
             f"{n_prompts} held-out prompts, each run alone (batch 1). tokens/s: decode tokens over decode time, "
             "summed over the prompts (bench/llamacpp/report.py says what each engine's figure counts). "
             "accepted: draft tokens kept per verify step. = own plain: outputs equal to the same engine's "
             "plain greedy run; = kdt plain: equal to kdt's plain greedy run (text over the shorter output); "
             "parts at: the earliest kdt-plain token where one differs.", "",
             "| engine | run | new tokens | prompts | tokens | seconds | tokens/s | vs kdt plain | vs llama plain "
             "| accepted | = own plain | = kdt plain | parts at |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rates = {}
    for name, (engine, n, per) in res.items():
        ok = [r for r in per if r]
        if ok:
            secs = sum(r["seconds"] for r in ok)
            rates[name] = sum(r["tokens"] for r in ok) / secs if secs > 0 else 0.0
    for name, (engine, n, per) in res.items():
        ok = [r for r in per if r]
        if not ok:
            lines.append(f"| {engine} | {name} | {n} | 0/{n_prompts} | - | - | - | - | - | - | - | - | - |")
            continue
        kp, own = plain("kdt", n), plain(engine, n)
        kname = next((k for k, v in res.items() if v[2] is kp), None)
        lname = next((k for k, v in res.items() if v[1] == n and v[0] == "llama-simple"), None)
        steps = sum(r["steps"] for r in ok)
        acc = f"{sum(r['accepted'] for r in ok) / steps:.2f}" if steps else "-"
        eq_own = eq_kdt = 0
        first = None
        for i, r in enumerate(per):
            if not r:
                continue
            if own and own[i]:
                if engine == "kdt":
                    m = min(len(r["ids"]), len(own[i]["ids"]))
                    eq_own += r["ids"][:m] == own[i]["ids"][:m]
                else:
                    eq_own += parts_at(r["text"], own[i]["text"]) == -1
            if kp and kp[i]:
                p = parts_at(r["text"], kp[i]["text"])
                eq_kdt += p == -1
                if p is not None and p >= 0:
                    t = token_at(kp[i]["ids"], p, decode)
                    first = t if first is None else min(first, t)
        tokens, secs = sum(r["tokens"] for r in ok), sum(r["seconds"] for r in ok)
        vk = f"{rates[name] / rates[kname]:.2f}x" if kname in rates and rates[kname] else "-"
        vl = f"{rates[name] / rates[lname]:.2f}x" if lname in rates and rates[lname] else "-"
        lines.append(f"| {engine} | {name} | {n} | {len(ok)}/{n_prompts} | {tokens} | {secs:.4f} | {rates[name]:.1f} "
                     f"| {vk} | {vl} | {acc} | {eq_own}/{len(ok)} | {eq_kdt}/{len(ok)} | "
                     f"{'-' if first is None else first} |")

    same = 0
    for i in range(n_prompts):
        m = re.search(r"\[([\d, ]*)\]", read(logs / "tokenize" / f"p{i}.out"))
        same += bool(m) and [int(t) for t in m.group(1).split(",") if t.strip()] == prompt_ids[i]
    lines += ["", f"llama.cpp's tokenizer gives heldout_prompts.ids for {same} of {n_prompts} prompts "
              "(llama-tokenize on the converted GGUF)."]
    bench = [line for line in read(logs / "llama_bench.log").splitlines() if line.startswith("|")]
    if bench:
        lines += ["", "llama-bench (tg: decode only, no prompt; fa: flash attention):", "", *bench]
    out_md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
