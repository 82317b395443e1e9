"""`kdt generate --gpus N` and `kdt serve --gpus N` on the CPU backend (docs/multi_gpu.md): the
routed experts split over N ranks, one thread each on the local communicator, give the output of
one rank (ids and text, plain and speculative); a rank that fails to load ends the command with a
message naming it, no hang; more ranks than CUDA devices is a clear error.
"""
import os
import subprocess

import pytest

from test_server import Server

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
BIN = os.environ.get("KDT_BIN", "")
SMALL = os.path.join(ROOT, "models", "kdt-small")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")


def generate(*args, env=None):
    return subprocess.run([BIN, "generate", "--backend", "cpu", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("spec", ["none", "lookup"])
def test_builtin_batch_ranks_equal(spec):
    args = ["--model", "builtin", "--prompt-ids", "5,6,7,8", "--prompt-ids", "9,1,1", "--max-new", "16", "--spec", spec]
    one = generate(*args)
    assert one.returncode == 0, one.stderr
    assert len(one.stdout.strip().split("\n")) == 2
    for n in (2, 3, 4):
        r = generate(*args, "--gpus", str(n))
        assert r.returncode == 0, r.stderr
        assert r.stdout == one.stdout, n
        assert f"experts split over {n} ranks" in r.stderr


@pytest.mark.skipif(not os.path.isdir(SMALL), reason="no models/kdt-small")
def test_small_text_spec_model_ranks_equal():
    args = ["--model", SMALL, "--prompt", "def parse_args():", "--max-new", "24", "--spec", "model"]
    one = generate(*args)
    four = generate(*args, "--gpus", "4")
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    assert four.stdout == one.stdout and len(one.stdout) > 0


def test_rank_load_failure_ends_all():
    r = generate("--model", "builtin", "--prompt-ids", "1,2", "--max-new", "4", "--gpus", "3",
                 env={"KDT_TEST_FAIL_LOAD_RANK": "2"})
    assert r.returncode == 1 and r.stdout == ""
    assert "rank 2" in r.stderr and "injected load failure" in r.stderr and "KDT_ERR_COMM" in r.stderr


def test_more_ranks_than_devices():
    r = subprocess.run([BIN, "generate", "--backend", "cuda", "--model", "builtin", "--prompt-ids", "1", "--max-new", "1",
                        "--gpus", "64"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--gpus 64 asks for 64 CUDA devices" in r.stderr
    r = generate("--model", "builtin", "--prompt-ids", "1", "--max-new", "1", "--gpus", "0")
    assert r.returncode == 2 and "--gpus takes" in r.stderr


def test_serve_ranks_equal_generate():
    want = [int(t) for t in generate("--model", "builtin", "--prompt-ids", "4,5,6", "--max-new", "10").stdout.split()]
    s = Server("--gpus", "3", "--spec", "lookup")
    try:
        st, r = s.post("/v1/completions", {"prompt": [4, 5, 6], "max_tokens": 10})
        assert st == 200 and r["choices"][0]["token_ids"] == want, "".join(s.log)
    finally:
        assert s.stop() == 0, "".join(s.log)
