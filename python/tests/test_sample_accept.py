"""tree_sample_accept (docs/interfaces.md 2.4) through the Python binding and `kdt run`: every bundle of
python/gen_tree_sample_accept.py exact on numpy arrays (into fresh and into poisoned out=
tensors), on torch CUDA tensors where present, and through the CLI; the binding's own refusals.
"""
import glob
import os
import subprocess

import numpy as np
import pytest

import kdt
import kdtr

DATA = os.environ.get("KDT_TEST_DATA", "")
BIN = os.environ.get("KDT_BIN", "")
PATHS = sorted(glob.glob(os.path.join(DATA, "tree_sample_accept_*.kdtr"))) if DATA else []
OUTS = ("accept_len", "accept_index", "accept_tokens", "status")
ARGS = ("node_token", "node_parent", "num_nodes", "target_logits", "temperature", "top_k", "top_p", "seed")
pytestmark = pytest.mark.skipif(not PATHS, reason="no tree_sample_accept_*.kdtr in $KDT_TEST_DATA")


def split(path):
    t = kdtr.load(path)
    return {k: v for k, v in t.items() if not k.startswith("expected.")}, \
        {k[len("expected."):]: v for k, v in t.items() if k.startswith("expected.")}


def call(t, out=None, conv=lambda x: x):
    return kdt.tree_sample_accept(*[conv(t[a]) for a in ARGS], out=out,
                                  draft_probs=conv(t["draft_probs"]) if "draft_probs" in t else None)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: os.path.basename(p)[:-5])
def test_bundle_numpy(path):
    t, exp = split(path)
    r = call(t)
    for name in OUTS:
        np.testing.assert_array_equal(r[name], exp[name], err_msg=name)
    out = {name: np.full_like(exp[name], -7) for name in OUTS}  # poisoned: every element must be written
    call(t, out=out)
    for name in OUTS:
        np.testing.assert_array_equal(out[name], exp[name], err_msg=f"{name} (out=)")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: os.path.basename(p)[:-5])
def test_bundle_torch_cuda(path):
    torch = pytest.importorskip("torch")
    if not (torch.cuda.is_available() and kdt.cuda_available() and hasattr(torch, "uint64")):
        pytest.skip("needs torch (with uint64) on a CUDA device and a CUDA build of libkdt.so")
    t, exp = split(path)
    r = call(t, conv=lambda x: torch.from_numpy(np.ascontiguousarray(x)).cuda())
    torch.cuda.synchronize()
    for name in OUTS:
        np.testing.assert_array_equal(r[name].cpu().numpy(), exp[name], err_msg=name)


@pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")
def test_kdt_run(tmp_path):
    path = next(p for p in PATHS if p.endswith("_sampled.kdtr"))
    _, exp = split(path)
    out = tmp_path / "out.kdtr"
    r = subprocess.run([BIN, "run", "tree_sample_accept", path, "-o", str(out), "--backend", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = kdtr.load(str(out))
    for name in OUTS:
        np.testing.assert_array_equal(got[name], exp[name], err_msg=name)


def test_refusals():
    t, _ = split(PATHS[0])
    with pytest.raises(TypeError, match="'seed' has dtype int64"):
        kdt.tree_sample_accept(*[t[a].astype(np.int64) if a == "seed" else t[a] for a in ARGS])
    with pytest.raises(ValueError, match="'target_logits'"):
        kdt.tree_sample_accept(*[t[a][:, :-1] if a == "target_logits" else t[a] for a in ARGS])
