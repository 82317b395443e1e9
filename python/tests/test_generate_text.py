"""`kdt generate --prompt / --prompt-file` ($KDT_BIN, docs/interfaces.md section 3): the text printed equals the
detokenized ids that `--prompt-ids` gives for the tokenizer's ids of the prompt (BOS added as
tokenizer_config.json says), plain and speculative; the text arrives while the run goes on
(streamed, not at the end). The model is the bf16 fixture (vocab 96) with a byte-level BPE
tokenizer of exactly 96 ids trained here with `tokenizers`."""
import os
import shutil
import subprocess

import pytest

import tok_corpus as tc

tokenizers = pytest.importorskip("tokenizers")
ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
BIN = os.environ.get("KDT_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")
PROMPT = "hello world, the cat sat on"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("textmodel") / "m")
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "model", "bf16"), folder)
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(p), "isolated") for p in tc.DS_SPLITS]
                                                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=tc.DS_SPECIALS[:2], show_progress=False)
    tok.train_from_iterator(["hello world, the cat sat on the mat.\n" * 40, "abcdefghijklmnopqrstuvwxyz é"], trainer)
    fill = 96 - tok.get_vocab_size()  # every id the model can emit must be a token
    tok.add_tokens([AddedToken(f"<f{i}>", normalized=False) for i in range(fill)])
    assert tok.get_vocab_size() == 96
    tc.write_hf(tok, folder, "deepseek")
    return folder, tok


def run(*args):
    r = subprocess.run([BIN, "generate", "--backend", "cpu", *args], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


@pytest.mark.parametrize("spec", [[], ["--spec", "lookup", "--depth", "3", "--budget", "6"], ["--spec", "model"]])
def test_text_equals_decoded_ids(model, spec):
    folder, tok = model
    bos, eos = tok.token_to_id(tc.DS_SPECIALS[0]), tok.token_to_id(tc.DS_SPECIALS[1])
    ids = [bos] + tok.encode(PROMPT, add_special_tokens=False).ids
    out = run("--model", folder, "--prompt-ids", ",".join(map(str, ids)), "--max-new", "24", "--eos", str(eos), *spec)
    gen = [int(x) for x in out.split()]
    assert gen
    text = run("--model", folder, "--prompt", PROMPT, "--max-new", "24", *spec)
    assert text.decode("utf-8") == tok.decode(gen, skip_special_tokens=False) + "\n"


def test_prompt_file_and_streaming(model, tmp_path):
    folder, _ = model
    p = tmp_path / "prompt.txt"
    p.write_text(PROMPT, encoding="utf-8")
    want = run("--model", folder, "--prompt", PROMPT, "--max-new", "40")
    assert run("--model", folder, "--prompt-file", str(p), "--max-new", "40") == want
    # streamed: text reaches the pipe while the run still goes on (a long one, stopped here)
    proc = subprocess.Popen([BIN, "generate", "--backend", "cpu", "--model", folder, "--prompt", PROMPT, "--max-new",
                             "20000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    first = os.read(proc.stdout.fileno(), 8)
    running = proc.poll() is None
    proc.kill()
    proc.wait()
    assert first and want.startswith(first) and running
    r = subprocess.run([BIN, "generate", "--model", "builtin", "--prompt", "hi", "--max-new", "2"], capture_output=True,
                       timeout=60)
    assert r.returncode == 2 and b"tokenizer" in r.stderr
    r = subprocess.run([BIN, "generate", "--model", folder, "--prompt", "hi", "--prompt-ids", "1"], capture_output=True,
                       timeout=60)
    assert r.returncode == 2
