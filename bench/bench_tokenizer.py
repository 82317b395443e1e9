"""Encoding speed, single-threaded, on the same text: the C tokenizer (libkdt.so through ctypes, one
call) against tiktoken (encode_ordinary) on Kimi K2's tiktoken.model, and against `tokenizers`
(RAYON_NUM_THREADS=1, one encode call; and per document, encode_batch, the way it is fastest) on a
DeepSeek-V3-style tokenizer.json trained here; the ids of the one-call runs are checked equal. Times
are the process's CPU time (best of --repeat), so other jobs on the machine count little. Prints a
markdown table (docs/perf/tokenizer.md).

    KDT_LIB=build/libkdt.so PYTHONPATH=python python3 bench/bench_tokenizer.py [--mb 8] [--repeat 3]
"""
import argparse
import os
import platform
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tok_corpus as tc  # noqa: E402
from kdt.tokenizer import Tokenizer  # noqa: E402


def best(fn, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        t.append(time.process_time() - t0)
    return min(t), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    mb = int(a.mb * (1 << 20))
    parts = {"code": tc.code_docs(mb // 2), "prose": tc.prose_docs(mb // 4)}
    import random
    rng = random.Random(0)
    parts["generated"] = [tc.random_text(rng, 20_000) for _ in range(max(1, mb // 4 // 30_000))]
    parts["all"] = [d for v in parts.values() for d in v]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        enc = tc.write_kimi(os.path.join(d, "kimi"))
        hf = tc.train_bpe(parts["code"][::4] + parts["prose"][::4] + parts["generated"][::4], 32000, "deepseek")
        tc.write_hf(hf, os.path.join(d, "ds"), "deepseek")
        kimi, ds = Tokenizer(os.path.join(d, "kimi")), Tokenizer(os.path.join(d, "ds"))
        for name, docs in parts.items():
            for sp in list(enc.special_tokens_set) + tc.DS_SPECIALS:  # encode_ordinary: no special tokens
                docs = [d.replace(sp, "") for d in docs]
            text = "".join(docs)
            data = text.encode()
            n = len(data) / (1 << 20)
            t_k, ids_k = best(lambda: kimi.encode_bytes(data), a.repeat)
            t_t, ids_t = best(lambda: enc.encode_ordinary(text), a.repeat)
            assert ids_k == ids_t, f"{name}: kimi ids differ from tiktoken's"
            t_d, ids_d = best(lambda: ds.encode_bytes(data), a.repeat)
            t_h, enc_h = best(lambda: hf.encode(text, add_special_tokens=False), a.repeat)
            assert ids_d == enc_h.ids, f"{name}: deepseek-style ids differ from tokenizers'"
            t_b, _ = best(lambda: hf.encode_batch(docs, add_special_tokens=False), a.repeat)
            rows.append((name, n, n / t_k, n / t_t, n / t_d, n / t_h, n / t_b))
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread each; CPU time, "
          f"best of {a.repeat}")
    print()
    print("| text | MB | kdt, tiktoken.model (Kimi K2) | tiktoken | kdt / tiktoken | kdt, tokenizer.json (DeepSeek-V3 style, 32k)"
          " | tokenizers, one call | tokenizers, per document | kdt / tokenizers (best) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n, k, t, d, h, b in rows:
        print(f"| {name} | {n:.1f} | {k:.1f} MB/s | {t:.1f} MB/s | {k / t:.2f}x | {d:.1f} MB/s | {h:.1f} MB/s | {b:.1f} MB/s |"
              f" {d / max(h, b):.2f}x |")


if __name__ == "__main__":
    main()
