"""The C tokenizer (include/kdt/tokenizer.h, through python/kdt/tokenizer.py) against the Python
libraries: `tokenizers` for tokenizer.json (a DeepSeek-V3-style and a GPT-2-style byte-level
BPE, both trained here) and `tiktoken` for Kimi K2's tiktoken.model (its real vocabulary, pattern
and special tokens, rebuilt from splintr-rs). Same ids on 10 MB of varied text
(python/tok_corpus.py), decode(encode(x)) == x, the same decoded text, fresh random text each run
(KDT_SEED replays it), text from files the other tests never read, streaming decode, invalid
UTF-8, and `kdt tokenize` / `kdt detokenize`."""
import os
import random
import subprocess

import pytest

import tok_corpus as tc

pytest.importorskip("tokenizers")
pytest.importorskip("tiktoken")
pytest.importorskip("splintr")
kdt_tok = pytest.importorskip("kdt.tokenizer")

MB = 1 << 20
SEED = int(os.environ.get("KDT_SEED", random.randrange(1 << 30)))
BIN = os.environ.get("KDT_BIN", "")
ALL_DS = tc.DS_SPECIALS + ["<think>", "</think>", "<mask>"]


class Ref:
    """A reference library's encode / decode, and our tokenizer on the same folder."""

    def __init__(self, name, folder, encode_batch, decode, specials, strips=()):
        self.name, self.folder, self.encode_batch, self.decode = name, folder, encode_batch, decode
        self.specials, self.strips = specials, strips
        self.ours = kdt_tok.Tokenizer(folder)


@pytest.fixture(scope="module")
def corpus():
    """10 MB: code, prose in many scripts, generated text with every special token embedded."""
    docs = tc.documents(SEED, 4 * MB, 3 * MB, 3 * MB, specials=ALL_DS + ["<|endoftext|>", "[BOS]", "<|im_end|>"])
    assert sum(len(d.encode()) for d in docs) >= 10 * MB
    return docs


@pytest.fixture(scope="module")
def refs(tmp_path_factory, corpus):
    root = tmp_path_factory.mktemp("tok")
    train = corpus[::5]
    out = {}
    for style, vocab in (("deepseek", 6000), ("gpt2", 3000)):
        hf = tc.train_bpe(train, vocab, style)
        folder = str(root / style)
        tc.write_hf(hf, folder, style)
        out[style] = Ref(style, folder, lambda docs, hf=hf: [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)],
                         lambda ids, hf=hf: hf.decode(ids, skip_special_tokens=False),
                         ALL_DS if style == "deepseek" else ["<|endoftext|>"], ["<mask>"] if style == "deepseek" else [])
    enc = tc.write_kimi(str(root / "kimi"))
    out["kimi"] = Ref("kimi", str(root / "kimi"), lambda docs: enc.encode_batch(docs, allowed_special="all", num_threads=2),
                      enc.decode, list(enc.special_tokens_set))
    return out


def first_difference(ref, doc, want, got):
    k = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    lo = max(0, k - 3)
    return (f"{ref.name}: ids differ at token {k} of {len(want)} (ours {len(got)}): text around it "
            f"{ref.decode(want[lo:k + 4])!r}; {ref.name} gives {want[lo:k + 4]}, ours {got[lo:k + 4]}; "
            f"document starts {doc[:60]!r}")


def check_docs(ref, docs):
    want_all = ref.encode_batch(docs)
    n_bytes = 0
    for doc, want in zip(docs, want_all):
        got = ref.ours.encode(doc)
        assert got == want, first_difference(ref, doc, want, got)
        text = ref.ours.decode(got)
        assert text == ref.decode(want), f"{ref.name}: decoded text differs from the library's for {doc[:60]!r}"
        if not any(s in doc for s in ref.strips):  # lstrip/rstrip tokens swallow spaces: no round trip
            assert text == doc, f"{ref.name}: decode(encode(x)) != x for {doc[:60]!r}"
        n_bytes += len(doc.encode())
    return n_bytes


@pytest.mark.parametrize("name", ["deepseek", "gpt2", "kimi"])
def test_equal_to_library(refs, corpus, name):
    """All 10 MB for DeepSeek-V3 style and Kimi; every third document (3 MB) for GPT-2 style, to save
    CI time on the slowest reference."""
    docs = corpus[::3] if name == "gpt2" else corpus
    assert check_docs(refs[name], docs) >= (3 if name == "gpt2" else 10) * MB


@pytest.mark.parametrize("name", ["deepseek", "gpt2", "kimi"])
def test_fresh_random_text(refs, name):
    rng = random.Random(SEED ^ 0x5EED)
    docs = [tc.random_text(rng, rng.randint(1, 5000), refs[name].specials) for _ in range(150)]
    check_docs(refs[name], docs)


@pytest.fixture(scope="module")
def unseen():
    """Files of the other hash bucket: no test or training text came from them."""
    docs = tc.documents(SEED + 1, MB // 2, MB // 4, 0, unseen=True)
    assert docs
    return docs


@pytest.mark.parametrize("name", ["deepseek", "gpt2", "kimi"])
def test_unseen_files(refs, unseen, name):
    check_docs(refs[name], unseen)


def test_stream_never_splits_a_character(refs):
    ours = refs["kimi"].ours
    text = "héllo wörld 日本語のテキスト 👨‍👩‍👧‍👦 ﷺ ok " * 3
    ids = ours.encode(text)
    singles = [ours.decode([i]) for i in ids]
    assert any("\ufffd" in s for s in singles), "no id of this text ends inside a character: the test proves nothing"
    pieces = ours.decode_stream(ids)
    for p in pieces:
        p.decode("utf-8")  # strict: a piece never holds part of a character
    assert b"".join(pieces).decode() == text
    # ids that stop inside a character: held back, then U+FFFD at the flush, as Python decodes
    cut = next(k for k in range(1, len(ids)) if "\ufffd" in ours.decode(ids[:k]))
    pieces = ours.decode_stream(ids[:cut])
    assert "\ufffd" not in b"".join(pieces[:-1]).decode()
    assert b"".join(pieces).decode() == refs["kimi"].decode(ids[:cut])


def test_invalid_utf8_names_the_offset(refs):
    for name in ("deepseek", "kimi"):
        ours = refs[name].ours
        for bad, off in ((b"abc\xff", 3), (b"\xc3(", 0), (b"ok \xe2\x82", 3), (b"\xed\xa0\x80", 0), (b"x\xf4\x90\x80\x80", 1)):
            with pytest.raises(kdt_tok.KdtError) as e:
                ours.encode_bytes(bad)
            assert f"byte offset {off}" in str(e.value)
        with pytest.raises(kdt_tok.KdtError) as e:
            ours.decode([ours.vocab_size])
        assert "not a token" in str(e.value)


def test_config(refs):
    ds, kimi = refs["deepseek"].ours, refs["kimi"].ours
    assert ds.bos_id == ds.token_id(tc.DS_SPECIALS[0]) >= 0 and ds.eos_id == ds.token_id(tc.DS_SPECIALS[1]) >= 0
    assert ds.encode("hi", add_special=True) == [ds.bos_id] + ds.encode("hi")
    assert ds.chat_template == tc.DS_CHAT_TEMPLATE
    assert (kimi.bos_id, kimi.eos_id, kimi.vocab_size) == (163584, 163585, 163840)
    assert kimi.encode("hi", add_special=True) == kimi.encode("hi")  # Kimi's config asks for no BOS
    assert refs["gpt2"].ours.bos_id == -1 and refs["gpt2"].ours.chat_template is None


@pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")
def test_cli(refs, tmp_path):
    ref = refs["deepseek"]
    text = "Grüße, 世界! def f(x):\n\treturn x ** 2  # 😀" + tc.DS_SPECIALS[3] + "  \n\n"
    want = ref.encode_batch([text])[0]
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    r = subprocess.run([BIN, "tokenize", "--model", ref.folder, "--file", str(path)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == " ".join(map(str, want)) + "\n"
    r = subprocess.run([BIN, "tokenize", "--model", ref.folder], input=text.encode(), capture_output=True, timeout=60)
    assert r.stdout.decode().split() == [str(i) for i in want]
    r = subprocess.run([BIN, "detokenize", "--model", ref.folder], input=",".join(map(str, want)).encode(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode("utf-8") == text
    r = subprocess.run([BIN, "tokenize", "--model", ref.folder], input=b"ok\xff", capture_output=True, timeout=60)
    assert r.returncode != 0 and b"byte offset 2" in r.stderr
    r = subprocess.run([BIN, "detokenize", "--model", ref.folder], input=b"1 2 x", capture_output=True, timeout=60)
    assert r.returncode != 0 and b"x" in r.stderr
