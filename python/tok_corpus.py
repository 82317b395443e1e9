"""Text and tokenizers for the tokenizer tests and benchmark (python/tests/test_tokenizer.py,
bench/bench_tokenizer.py).

Text: real files of this machine, split by a hash of their path into a "seen" set (the equality
test, the training text of the test tokenizers) and an "unseen" set that only the held-out test
reads: Python sources of the installed packages (code), translated messages of the gettext
catalogues (*.mo: prose in many scripts), and generated text with a seed (scripts from their
Unicode blocks with word and space structure, emoji and ZWJ sequences, combining marks, runs of
spaces, tabs and newlines, Unicode spaces, digits and long numbers, case-folding traps, the
tokenizer's special tokens embedded).

Tokenizers, built at test time: a DeepSeek-V3-style tokenizer.json (its three Split regexes and
ByteLevel, its special tokens, trained with `tokenizers`), a GPT-2-style one (ByteLevel with
use_regex, "a b" merges), and Kimi K2's tiktoken.model and tokenizer_config.json rebuilt from
the `splintr-rs` package (its real vocabulary, pattern and special tokens).
"""
import base64
import gettext
import glob
import hashlib
import json
import os
import random
import sys
import sysconfig
import unicodedata

DS_SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
DS_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
               "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"]
DS_CHAT_TEMPLATE = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
                    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                    "{{ '<｜User｜>' + message['content'] }}{% elif message['role'] == 'assistant' %}"
                    "{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")


def _unseen(path):
    """Held-out files: a fixed 30% of paths by hash."""
    return hashlib.sha1(path.encode()).digest()[0] % 10 >= 7


def _files(pattern_list, unseen):
    out = []
    for pat in pattern_list:
        out += [p for p in glob.glob(pat, recursive=True) if _unseen(p) == unseen and os.path.isfile(p)]
    return sorted(set(out))


def code_docs(budget, unseen=False):
    """Python sources of the installed packages and the standard library, up to budget bytes."""
    roots = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]}
    files = _files([os.path.join(r, "**", "*.py") for r in roots], unseen)
    random.Random(1).shuffle(files)
    docs, n = [], 0
    for p in files:
        try:
            with open(p, encoding="utf-8") as f:
                t = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        if 200 < len(t) < 200_000:
            docs.append(t)
            n += len(t.encode())
        if n >= budget:
            break
    return docs


def prose_docs(budget, unseen=False):
    """Translations of gettext catalogues (/usr/share/locale and friends): real prose in the scripts
    of every language the machine has; one document per catalogue."""
    files = _files(["/usr/share/locale/*/LC_MESSAGES/*.mo", "/usr/share/**/LC_MESSAGES/*.mo"], unseen)
    random.Random(2).shuffle(files)
    docs, n = [], 0
    for p in files:
        try:
            with open(p, "rb") as f:
                cat = gettext.GNUTranslations(f)._catalog
        except Exception:  # a catalogue in a charset Python lacks, or a damaged one
            continue
        msgs = [v for k, v in cat.items() if k and isinstance(v, str) and v.strip()]
        if not msgs:
            continue
        t = "\n".join(msgs)[:60_000]
        docs.append(t)
        n += len(t.encode())
        if n >= budget:
            break
    return docs


# Unicode blocks for generated words: (letters, marks that follow letters, word separator)
SCRIPTS = {
    "latin": ("abcdefghijklmnopqrstuvwxyzàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœšžłđğışțą" "ABCDEFGHIJKLMNOPQRSTUVWXYZÀÉÎÖÜŒŠŽŁ", "", " "),
    "cyrillic": ("".join(map(chr, range(0x430, 0x450))) + "АБВГДЕЖЗИКЛМНОПРСТУФ", "", " "),
    "greek": ("".join(map(chr, range(0x3B1, 0x3CA))) + "ΑΒΓΔΕΖΗΘάέήίόύώ", "", " "),
    "arabic": ("".join(map(chr, range(0x627, 0x64B))), "\u064e\u064f\u0650\u0651\u0652", " "),
    "hebrew": ("".join(map(chr, range(0x5D0, 0x5EB))), "\u05b4\u05b8\u05bc", " "),
    "devanagari": ("".join(map(chr, range(0x905, 0x93A))), "\u093e\u093f\u0940\u0947\u094b\u094d\u0902", " "),
    "thai": ("".join(map(chr, range(0xE01, 0xE2F))), "\u0e31\u0e34\u0e35\u0e48\u0e49", ""),
    "han": ("".join(map(chr, range(0x4E00, 0x4E00 + 3000))), "", ""),
    "kana": ("".join(map(chr, range(0x3041, 0x3097))) + "".join(map(chr, range(0x30A1, 0x30FB))), "", ""),
    "hangul": ("".join(map(chr, range(0xAC00, 0xAC00 + 2000))), "", " "),
}
EMOJI = ["😀", "😂", "🙏", "👍🏽", "❤️", "🇫🇷", "🇯🇵", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "✋🏻", "🤖", "1️⃣", "🫠"]
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u180e", "\u2003", "\u202f",
          "\x0b", "\x0c"]
TRAPS = ["don't", "I'LL", "WE'RE", "it\u2019s", "\u017fs", "'\u017f", "\u212a", "ﬁ", "Ǆ", "ǅ", "\u0130", "x'S", "'ve'll"]


def _word(rng, script):
    letters, marks, _ = SCRIPTS[script]
    w = []
    for _ in range(rng.randint(1, 9)):
        w.append(rng.choice(letters))
        if marks and rng.random() < 0.3:
            w.append(rng.choice(marks))
    return "".join(w)


def _number(rng):
    r = rng.random()
    if r < 0.4:
        return str(rng.randint(0, 10 ** rng.randint(1, 30)))
    if r < 0.6:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if r < 0.8:
        return "".join(chr(rng.choice([0x660, 0x966, 0xFF10, 0xE50]) + rng.randint(0, 9)) for _ in range(rng.randint(1, 7)))
    return "½⅓²³₄" + str(rng.randint(0, 99))


# Characters of the BMP assigned in Unicode 15.0 - 16.0 (not in PCRE2 10.42's Unicode 14 tables).
_BMP_AFTER_14 = {0x0CF3, 0x0ECE, 0x0897, 0x1B4E, 0x1B4F, 0x1B7F, 0x1C89, 0x1C8A, 0x2427, 0x2428, 0x2429, 0x2FFC,
                 0x2FFD, 0x2FFE, 0x2FFF, 0x31E4, 0x31E5, 0x31EF, 0xA7CB, 0xA7CC, 0xA7CD, 0xA7DA, 0xA7DB, 0xA7DC}


def _any_char(rng):
    """A character assigned in Unicode 14, PCRE2 10.42's version (one assigned later has other
    properties in the libraries' newer tables, docs/tokenizer.md): Python's table where it is
    14.0 (Python 3.11), else the BMP without the later additions."""
    old = unicodedata.unidata_version == "14.0.0"
    while True:
        c = chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0xFFFD)] + ([rng.randint(0x10000, 0x3FFFF)] if old else [])))
        if unicodedata.category(c) != "Cn" and ord(c) not in _BMP_AFTER_14:
            return c


def random_text(rng, n_chars, specials=()):
    """Generated text of about n_chars characters mixing every kind the tests need."""
    out, n = [], 0
    script = rng.choice(list(SCRIPTS))
    while n < n_chars:
        r = rng.random()
        if r < 0.03:
            script = rng.choice(list(SCRIPTS))
        if r < 0.55:
            s = _word(rng, script) + SCRIPTS[script][2]
        elif r < 0.62:
            s = _number(rng)
        elif r < 0.67:
            s = rng.choice(EMOJI)
        elif r < 0.72:
            s = rng.choice("aeouAEOU") + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 4)))
        elif r < 0.80:
            s = rng.choice(SPACES) * (rng.randint(1, 3) if rng.random() < 0.9 else rng.randint(20, 300))
        elif r < 0.85:
            s = rng.choice(TRAPS)
        elif r < 0.93:
            s = "".join(rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~«»“”…—¿¡") for _ in range(rng.randint(1, 4)))
        elif r < 0.95 and specials:
            s = rng.choice(specials)
        elif r < 0.97:
            s = _any_char(rng)
        else:
            s = rng.choice(["def f(x):\n    return x\n", "<|im_end|>", "<｜User｜", "[BOS", "<|", "｜>", "‍", "\ufeff"])
        out.append(s)
        n += len(s)
    return "".join(out)


def documents(seed, code_bytes, prose_bytes, random_bytes, specials=(), unseen=False):
    """A list of documents: code, prose, then generated ones (with specials embedded in some
    real documents too)."""
    rng = random.Random(seed)
    docs = code_docs(code_bytes, unseen) + prose_docs(prose_bytes, unseen)
    if specials:
        for i in range(0, len(docs), 7):
            d = docs[i]
            k = rng.randrange(len(d) + 1)
            docs[i] = d[:k] + rng.choice(specials) + d[k:]
    n = 0
    while n < random_bytes:
        d = random_text(rng, rng.randint(100, 20_000), specials)
        docs.append(d)
        n += len(d.encode())
    return docs


# ---- tokenizers ----

def train_bpe(docs, vocab_size, style):
    """A byte-level BPE trained with `tokenizers`: style "deepseek" (DeepSeek-V3's pre-tokenizer and
    special tokens, plus one non-special added token and one with lstrip/rstrip) or "gpt2"."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if style == "deepseek":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), "isolated") for p in DS_SPLITS]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = DS_SPECIALS
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials = ["<|endoftext|>"]
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    if style == "deepseek":
        tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False),
                        AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)])
    return tok


def write_hf(tok, folder, style):
    """tokenizer.json (+ tokenizer_config.json); the GPT-2 one with merges as "a b" strings."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tok.save(path)
    if style == "gpt2":
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
    else:
        cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": {"content": DS_SPECIALS[0]},
               "eos_token": {"content": DS_SPECIALS[1]}, "chat_template": DS_CHAT_TEMPLATE,
               "tokenizer_class": "LlamaTokenizerFast"}
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
    return path


def kimi_parts():
    """Kimi K2's (mergeable ranks, special tokens, pattern) from splintr-rs: the special tokens are
    the 256 reserved ids from 163584 (splintr's agent tokens beyond them are its own)."""
    import splintr
    t = splintr.Tokenizer.from_pretrained("kimi_k2")
    n = 163840 - 256
    ranks = {t.decode_token_bytes(i): i for i in range(n)}
    specials = {k: v for k, v in t.special_tokens().items() if n <= v < 163840}
    return ranks, specials, splintr.KIMI_PATTERN


def write_kimi(folder):
    """tiktoken.model and tokenizer_config.json as Kimi K2 ships them; returns a tiktoken.Encoding."""
    import tiktoken
    ranks, specials, pattern = kimi_parts()
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tiktoken.model"), "w") as f:
        for b, r in sorted(ranks.items(), key=lambda x: x[1]):
            f.write(base64.b64encode(b).decode() + " " + str(r) + "\n")
    cfg = {"added_tokens_decoder": {str(v): {"content": k, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True} for k, v in specials.items()},
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
           "chat_template": "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['content'] }}<|im_end|>{% endfor %}",
           "tokenizer_class": "TikTokenTokenizer"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return tiktoken.Encoding(name="kimi_k2", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)


if __name__ == "__main__":
    docs = documents(int(sys.argv[1]) if len(sys.argv) > 1 else 0, 4 << 20, 3 << 20, 3 << 20)
    print(len(docs), "documents,", sum(len(d.encode()) for d in docs), "bytes")
