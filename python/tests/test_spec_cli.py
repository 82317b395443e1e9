"""`kdt generate --spec` ($KDT_BIN) end to end: speculative decoding prints what plain greedy
decoding prints, token for token, for each drafter and a few (D, K, N), on the transformers
fixtures (whose continuation is transformers' own) and on the built-in model with a batch of
prompts; the statistics are on stderr; bad draft options are refused.
"""
import glob
import os
import random
import subprocess

import pytest

import kdtr

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
BIN = os.environ.get("KDT_BIN", "")
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "model", "*", "expected.kdtr")))
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")

SETTINGS = [("lookup", 4, 4, 16), ("lookup", 1, 1, 1), ("model", 2, 8, 16), ("model", 8, 2, 16), ("model", 3, 1, 3)]


def generate(*args):
    r = subprocess.run([BIN, "generate", "--backend", "cpu", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.parametrize("path", FIXTURES[:3], ids=lambda p: os.path.basename(os.path.dirname(p)))
@pytest.mark.parametrize("spec,d,k,n", SETTINGS)
def test_fixture_spec_equals_greedy(path, spec, d, k, n):
    exp = kdtr.load(path)
    prompt, cont = exp["prompt"], exp["continuation"]
    model = os.path.dirname(path)
    base = ["--model", model, "--prompt-ids", ",".join(map(str, prompt)), "--max-new", str(len(cont))]
    extra = ["--draft-layers", "1"] if spec == "model" else []
    r = generate(*base, "--spec", spec, "--depth", str(d), "--topk", str(k), "--budget", str(n), *extra)
    assert r.stdout == " ".join(map(str, cont)) + "\n"
    assert "mean accepted length" in r.stderr and "time per step" in r.stderr and "verify forward" in r.stderr


def test_builtin_batch_lookup_and_model():
    rng = random.Random()
    prompts = []
    for length in (4, 9, 15):
        p = [rng.randrange(512) for _ in range(4)]
        while len(p) < length:
            p.append(p[-4] if rng.random() < 0.7 else rng.randrange(512))
        prompts.append(",".join(map(str, p)))
    args = ["--model", "builtin"] + [a for p in prompts for a in ("--prompt-ids", p)] + ["--max-new", "24"]
    want = generate(*args).stdout
    assert want.count("\n") == 3
    assert generate(*args, "--spec", "lookup", "--depth", "3", "--budget", "6").stdout == want
    assert generate(*args, "--spec", "model", "--depth", "4", "--topk", "1", "--budget", "4").stdout == want
    eos = want.split()[5]
    cut = []
    for line in want.splitlines():
        toks = line.split()
        cut.append(" ".join(toks[:toks.index(eos) + 1] if eos in toks else toks))
    r = generate(*args, "--spec", "model", "--depth", "3", "--topk", "1", "--budget", "3", "--eos", eos)
    assert r.stdout.splitlines() == cut


def test_refusals_and_help():
    r = subprocess.run([BIN, "generate", "--model", "builtin", "--prompt-ids", "1,2", "--max-new", "2", "--draft-layers", "2"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draft-layers needs --model" in r.stderr
    if FIXTURES:
        r = subprocess.run([BIN, "generate", "--model", os.path.dirname(FIXTURES[0]), "--prompt-ids", "1,2", "--max-new", "2",
                            "--spec", "model", "--draft-layers", "99"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "draft layers = 99" in r.stderr
    h = subprocess.run([BIN, "generate", "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "--draft-layers" in h.stdout and "--spec" in h.stdout


@pytest.mark.parametrize("d,k,n", [(4, 4, 16), (1, 1, 1), (3, 8, 24)])
def test_dflash_equals_greedy(d, k, n):
    """The random DFlash drafter of tests/fixtures/dflash on its target, tests/fixtures/model/bf16."""
    exp = kdtr.load(os.path.join(ROOT, "tests", "fixtures", "model", "bf16", "expected.kdtr"))
    prompt, cont = exp["prompt"], exp["continuation"]
    r = generate("--model", os.path.join(ROOT, "tests", "fixtures", "model", "bf16"), "--prompt-ids", ",".join(map(str, prompt)),
                 "--max-new", str(len(cont)), "--spec", "dflash", "--draft-model", os.path.join(ROOT, "tests", "fixtures", "dflash"),
                 "--depth", str(d), "--topk", str(k), "--budget", str(n))
    assert r.stdout == " ".join(map(str, cont)) + "\n"
    assert "spec dflash" in r.stderr


def test_dflash_refusals():
    model = os.path.join(ROOT, "tests", "fixtures", "model", "bf16")
    r = subprocess.run([BIN, "generate", "--model", model, "--prompt-ids", "1,2", "--max-new", "2", "--spec", "dflash"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draft-model" in r.stderr
    r = subprocess.run([BIN, "generate", "--backend", "cpu", "--model", model, "--prompt-ids", "1,2", "--max-new", "2", "--spec", "dflash",
                        "--draft-model", os.path.join(ROOT, "tests", "fixtures", "dflash"), "--depth", "5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "block_size" in r.stderr


@pytest.mark.parametrize("d,k,n", [(3, 4, 16), (1, 2, 2)])
def test_mtp_equals_greedy(d, k, n):
    """The random MTP layer of tests/fixtures/mtp (a DeepSeek-V3 checkpoint with model.layers.3)."""
    model = os.path.join(ROOT, "tests", "fixtures", "mtp")
    base = ["--model", model, "--prompt-ids", "5,6,7,8,9,10", "--max-new", "16"]
    want = generate(*base).stdout
    r = generate(*base, "--spec", "mtp", "--depth", str(d), "--topk", str(k), "--budget", str(n))
    assert r.stdout == want and "spec mtp" in r.stderr


def test_mtp_refuses_a_checkpoint_without_mtp():
    model = os.path.join(ROOT, "tests", "fixtures", "model", "bf16")
    r = subprocess.run([BIN, "generate", "--backend", "cpu", "--model", model, "--prompt-ids", "1,2", "--max-new", "2", "--spec", "mtp"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "num_nextn_predict_layers" in r.stderr
