"""The CLI's ($KDT_BIN) small promises: every subcommand's --help prints its usage and exits 0;
`generate` streams a single request's ids while it decodes, says nothing about rates when
--max-new is 0, refuses an --eos outside the vocabulary, warns when a request would pass
max_position_embeddings; an op's error is prefixed by its name once.
"""
import os
import select
import subprocess

import numpy as np
import pytest

import kdtr

BIN = os.environ.get("KDT_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")
BUILTIN_VOCAB, BUILTIN_MAX_POS = 512, 16384  # src/model/builtin.c


def kdt(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,word", [(["--help"], "usage:"), (["run", "--help"], "usage: kdt run"),
                                       (["info", "--help"], "usage: kdt info"), (["run", "-h"], "usage: kdt run"),
                                       (["generate", "--help"], "usage: kdt generate")])
def test_help_exits_zero(args, word):
    r = kdt(*args)
    assert r.returncode == 0 and word in r.stdout and r.stderr == "", (r.returncode, r.stdout, r.stderr)


def test_max_new_zero_prints_no_rate():
    r = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2,3", "--prompt-ids", "4", "--max-new", "0")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "\n\n"
    assert "nothing generated" in r.stderr and "tokens/s" not in r.stderr


def test_eos_outside_vocabulary_refused():
    r = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2", "--max-new", "2", "--eos", str(BUILTIN_VOCAB))
    assert r.returncode == 2 and r.stdout == ""
    assert f"--eos {BUILTIN_VOCAB} is outside the model's vocabulary (0 .. {BUILTIN_VOCAB - 1})" in r.stderr
    r = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2", "--max-new", "2", "--eos", str(BUILTIN_VOCAB - 1))
    assert r.returncode == 0, r.stderr


def test_warning_past_max_position_embeddings():
    first = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2", "--max-new", "1").stdout.split()[0]
    # The request could run to 2 + 16383 tokens; the eos (its first token) ends it at once.
    r = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2", "--max-new", str(BUILTIN_MAX_POS - 1), "--eos", first)
    assert r.returncode == 0 and r.stdout == first + "\n", r.stderr
    assert f"reaches {BUILTIN_MAX_POS + 1} tokens (prompt + --max-new), past the model's max_position_embeddings " \
           f"{BUILTIN_MAX_POS}" in r.stderr
    r = kdt("generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2", "--max-new", str(BUILTIN_MAX_POS - 2), "--eos", first)
    assert "max_position_embeddings" not in r.stderr


def test_single_request_streams_ids():
    """The first id is on stdout while the process is still decoding thousands more."""
    p = subprocess.Popen([BIN, "generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", "1,2,3", "--max-new", "100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 60)
        assert ready, "no id on stdout after 60 s"
        first = os.read(p.stdout.fileno(), 64)
        assert first and first.split()[0].isdigit()
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_op_error_names_the_op_once(tmp_path):
    kdtr.save(tmp_path / "in.kdtr", {
        "kv_cache": np.zeros((1, 0, 8), np.float32), "block_table": np.zeros((1, 1), np.int32),
        "kv_len": np.array([1], np.int32), "accept_index": np.array([[0, -1]], np.int32),
        "accept_len": np.array([0], np.int32)})
    r = kdt("run", "kv_commit", str(tmp_path / "in.kdtr"), "-o", str(tmp_path / "out.kdtr"), "--backend", "cpu")
    assert r.returncode == 1 and r.stderr.startswith("kdt: kv_commit: NB = 1, BS = 0"), r.stderr
    assert "kv_commit: kv_commit:" not in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "out.kdtr").exists()
