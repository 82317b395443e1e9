"""`kdt generate` ($KDT_BIN, docs/interfaces.md section 3) end to end: the transformers fixtures' greedy
continuations (tests/fixtures/model/*/expected.kdtr, python/make_fixtures.py), the built-in
model's output format and determinism, and the refusals: a bad checkpoint names the file or
tensor, an unknown --spec is refused (tests/test_spec.c and test_spec_cli.py check speculation).
"""
import glob
import os
import shutil
import subprocess

import pytest

import kdtr

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
BIN = os.environ.get("KDT_BIN", "")
FIXTURES = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "model", "*", "expected.kdtr")))
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")


def generate(*args):
    return subprocess.run([BIN, "generate", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: os.path.basename(os.path.dirname(p)))
def test_fixture_continuation(path):
    exp = kdtr.load(path)
    prompt, cont = exp["prompt"], exp["continuation"]
    r = generate("--model", os.path.dirname(path), "--prompt-ids", ",".join(map(str, prompt)),
                 "--max-new", str(len(cont)), "--backend", "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == [" ".join(map(str, cont)), ""]
    assert "tokens/s" in r.stderr


def test_builtin_format_and_determinism():
    a = generate("--model", "builtin", "--prompt-ids", "5,6,7,8", "--max-new", "12")
    b = generate("--model", "builtin", "--prompt-ids", "5,6,7,8", "--max-new", "12")
    assert a.returncode == 0, a.stderr
    ids = [int(t) for t in a.stdout.strip().split(" ")]
    assert len(ids) == 12 and all(0 <= t < 512 for t in ids)
    assert a.stdout == b.stdout and a.stdout.count("\n") == 1
    assert "prefill" in a.stderr and "decode" in a.stderr


def test_bad_checkpoint(tmp_path):
    if not FIXTURES:
        pytest.skip("no fixtures")
    src = os.path.dirname(FIXTURES[0])
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    for f in bad.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[:-64])
    if (bad / "model.safetensors.index.json").exists():
        pytest.skip("first fixture is sharded")
    r = generate("--model", str(bad), "--prompt-ids", "1,2", "--max-new", "2")
    assert r.returncode != 0 and r.stdout == ""
    assert "model.safetensors" in r.stderr and "truncated" in r.stderr
    r = generate("--model", str(tmp_path / "nothing"), "--prompt-ids", "1", "--max-new", "1")
    assert r.returncode != 0 and "config.json" in r.stderr


def test_refusals():
    assert generate("--prompt-ids", "1,2", "--max-new", "2", "--spec", "other").returncode == 2
    assert generate("--prompt-ids", "1,x", "--max-new", "2").returncode == 2
    assert generate("--max-new", "2").returncode == 2
    r = generate("--prompt-ids", "1,100000", "--max-new", "2")
    assert r.returncode != 0 and "100000" in r.stderr
