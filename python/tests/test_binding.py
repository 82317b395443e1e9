"""The Python binding (python/kdt) against the KDTR reference bundles and its own contract.

Every op runs on numpy arrays against $KDT_TEST_DATA/<op>_*.kdtr (python/gen_<op>.py), once with
outputs it allocates and once into out= tensors poisoned with 0xFF, so an element the op never
writes fails the comparison. Where torch and a CUDA device are present the same bundles run on
torch CUDA tensors. An op whose bundles or C implementation are missing is skipped with a reason.
"""
import ctypes
import glob
import os
import re

import numpy as np
import pytest

import kdt
import kdtr
from kdt import _lib

try:
    import torch
except ImportError:
    torch = None

DATA = os.environ.get("KDT_TEST_DATA", "")
HEADER = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "include", "kdt", "ops.h")
OPS = ("tree_build", "verify_attn", "tree_accept", "kv_commit")
HAVE_CUDA = torch is not None and torch.cuda.is_available() and kdt.cuda_available()
cuda_only = pytest.mark.skipif(not HAVE_CUDA, reason="needs torch with a CUDA device and a CUDA build of libkdt.so")


INPUTS = {"tree_build": ("scores", "tokens", "root_token", "seq_len", "budget"),
          "verify_attn": ("q", "kv_len", "tree_mask", "sm_scale", "dv"),
          "tree_accept": ("node_token", "node_parent", "num_nodes", "target_pred"),
          "kv_commit": ("kv_cache", "block_table", "kv_len", "accept_index", "accept_len")}
# Refusal bundles the Python API cannot express: a Python int has no width (dv given as i64),
# and one `kv` argument cannot carry both layouts. Bundles lacking an input are left out too:
# a Python call cannot omit an argument.
NOT_EXPRESSIBLE = {"verify_attn_bad_dv_not_i32", "verify_attn_bad_both_layouts"}


def expressible(op, path):
    name = os.path.basename(path)[:-5]
    if not name.startswith(f"{op}_bad_"):
        return True
    names = set(kdtr.load(path))
    kv = "kv" in names or {"kv_cache", "block_table"} <= names
    return name not in NOT_EXPRESSIBLE and set(INPUTS[op]) <= names and (op != "verify_attn" or kv)


def bundles(*ops, good_only=False):
    """pytest params (op, path), one per bundle, or one per op that skips saying why it has none.
    good_only leaves out the bundles the op must refuse (<op>_bad_*)."""
    params = []
    for op in ops:
        paths = sorted(glob.glob(os.path.join(DATA, f"{op}_*.kdtr"))) if DATA else []
        paths = [p for p in paths if expressible(op, p)
                 and not (good_only and os.path.basename(p).startswith(f"{op}_bad_"))]
        params += [pytest.param(op, p, id=os.path.basename(p)[:-5]) for p in paths]
        if not paths:
            why = (f"no {op}_*.kdtr bundles in $KDT_TEST_DATA={DATA!r} (python/gen_{op}.py not there yet?)"
                   if DATA else "KDT_TEST_DATA is not set (scripts/run_tests.sh sets it)")
            params.append(pytest.param(op, None, id=f"{op}-none", marks=pytest.mark.skip(reason=why)))
    return params


def load(path):
    """Bundle inputs (bf16 as uint16 bits), expected outputs by name, and for bundles the op must
    refuse (gen_tree_build: expected_status + expected_error text; gen_verify_attn: expected.error)
    the kdt_status wanted and the message text, else (None, None)."""
    t = {k: (v.bits if isinstance(v, kdtr.BF16) else v) for k, v in kdtr.load(path).items()}
    status = t.pop("expected_status", t.pop("expected.error", None))
    text = t.pop("expected_error", None)
    inputs = {k: v for k, v in t.items() if not k.startswith("expected.")}
    expected = {k[len("expected."):]: v for k, v in t.items() if k.startswith("expected.")}
    refusal = (None if status is None else int(status), None if text is None else bytes(text).decode())
    return inputs, expected, refusal


def call_op(op, t, out=None):
    """Calls the binding with a bundle's tensors (numpy or torch), the argument order of docs/interfaces.md. Scalars
    go in as the bundle's 0-d arrays, so a float budget is refused as it would be from Python."""
    if op == "tree_build":
        return kdt.tree_build(t["scores"], t["tokens"], t["root_token"], t["seq_len"], t["budget"], out=out)
    if op == "verify_attn":
        paged = "block_table" in t
        return kdt.verify_attn(t["q"], t["kv_cache"] if paged else t["kv"], t["kv_len"], t["tree_mask"],
                               t["sm_scale"], t["dv"], block_table=t["block_table"] if paged else None, out=out)
    if op == "tree_accept":
        return kdt.tree_accept(t["node_token"], t["node_parent"], t["num_nodes"], t["target_pred"], out=out)
    return kdt.kv_commit(t["kv_cache"], t["block_table"], t["kv_len"], t["accept_index"], t["accept_len"], out=out)


def to_numpy(x):
    """numpy view of an output; torch bf16 becomes uint16 bits like the bundles'."""
    if isinstance(x, np.ndarray):
        return x
    x = x.detach().cpu()
    return x.view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16 else x.numpy()


def check_attn(name, got, exp, is_bf16):
    """tests/test_verify_attn.c's tolerances: o by relative L2 (and max abs for f32), lse by max
    abs; rows that see no key must agree exactly (o = 0, lse = -inf)."""
    got = (kdtr.bf16_to_f32(got) if got.dtype == np.uint16 else got).astype(np.float64)
    exp = exp.astype(np.float64)
    assert not np.isnan(got).any(), f"verify_attn.{name}: NaN in the output"
    fin = np.isfinite(exp)
    np.testing.assert_array_equal(got[~fin], exp[~fin], err_msg=f"verify_attn.{name}: non-finite entries")
    err = np.abs(got[fin] - exp[fin])
    if name == "lse":
        assert err.max(initial=0) <= 1e-3, f"verify_attn.lse: max abs error {err.max():.3g}"
        return
    rel_l2 = np.linalg.norm(err) / max(np.linalg.norm(exp[fin]), 1e-30)
    assert rel_l2 <= (1e-2 if is_bf16 else 1e-5), f"verify_attn.o: relative L2 error {rel_l2:.3g}"
    if not is_bf16:
        assert err.max(initial=0) <= 1e-5 * np.abs(exp).max(initial=0), f"verify_attn.o: max abs error {err.max():.3g}"


def check(op, got, expected, is_bf16):
    """Each expected output against the binding's: exact for ints, masks, tree scores and cache
    moves (compared as bits); the C tests' tolerances for attention."""
    assert set(expected) <= set(got), f"outputs missing: {set(expected) - set(got)}"
    for name, exp in expected.items():
        g = to_numpy(got[name])
        assert g.shape == exp.shape, f"{op}.{name}: shape {g.shape} != {exp.shape}"
        if op == "verify_attn":
            check_attn(name, g, exp, is_bf16)
        elif g.dtype.kind == "f" or g.dtype == np.uint16:
            np.testing.assert_array_equal(g.view(np.uint8), exp.view(np.uint8), err_msg=f"{op}.{name} (bits)")
        else:
            np.testing.assert_array_equal(g, exp, err_msg=f"{op}.{name}")


def poisoned(x):
    """A 0xFF-filled array/tensor like x: NaN for floats, -1 for signed ints, 255 for u8."""
    if isinstance(x, np.ndarray):
        y = np.empty_like(x)
        y.view(np.uint8)[...] = 0xFF
        return y
    y = torch.empty_like(x)
    y.view(torch.uint8).fill_(0xFF)
    return y


PY_ERROR = {1: ValueError, 3: TypeError, 4: ValueError}  # kdt_status -> the binding's own check
# Ops whose C entry point leaves value rules (sorted scores, seq_len range) to the KDTR adapter.
VALUES_UNCHECKED = {"tree_build"}


def check_refusal(op, path, t, refusal):
    """The binding refuses a bad bundle: by its own check (the exception type matching the
    kdt_status the library gives) or with KdtError carrying the library's status and message."""
    name = os.path.basename(path)[:-5]
    status, text = refusal
    try:
        call_op(op, t)
    except kdt.KdtError as e:  # the message is the params API's, not the KDTR adapter's the text is for
        assert e.status == status, f"{name}: KdtError {e.status_name}, expected status {status}: {e}"
    except (TypeError, ValueError) as e:
        assert isinstance(e, PY_ERROR[status]), f"{name}: {type(e).__name__} ({e}), expected {PY_ERROR[status].__name__}"
        arg = re.match(r"\w+", text).group(0) if text else None  # "scores[1][2]" names 'scores'
        assert arg is None or f"'{arg}'" in str(e), f"{name}: message {str(e)!r} does not name '{arg}'"
    else:
        if op in VALUES_UNCHECKED and status == _lib.KDT_ERR_INVALID_ARG:
            pytest.skip(f"{name}: kdt_{op} checks no tensor values (its KDTR adapter does), so the "
                        f"binding passes this input through")
        pytest.fail(f"{name}: the binding ran an input the op must refuse (status {status})")


# ---- every op on numpy against the bundles ----

@pytest.mark.parametrize("op,path", bundles(*OPS))
def test_op_numpy(op, path):
    inputs, expected, refusal = load(path)
    if refusal[0] is not None:
        return check_refusal(op, path, inputs, refusal)
    is_bf16 = inputs.get("q", inputs.get("kv_cache", np.zeros(0, np.float32))).dtype == np.uint16
    t = dict(inputs)
    if op == "kv_commit":
        t["kv_cache"] = inputs["kv_cache"].copy()  # in place
    r = call_op(op, t)
    check(op, r, expected, is_bf16)
    if op == "kv_commit":
        assert r.kv_cache is t["kv_cache"], "kv_commit must return the cache it updated in place"
        t["kv_cache"] = inputs["kv_cache"].copy()
    out = {name: poisoned(v) for name, v in r.items() if name != "kv_cache"}
    r2 = call_op(op, t, out=out)
    for name, v in out.items():
        assert r2[name] is v, f"{op}: out[{name!r}] was not written in place"
    check(op, r2, expected, is_bf16)


# ---- the same on torch CUDA tensors ----

def to_torch(t, device="cuda"):
    res = {}
    for k, v in t.items():
        if isinstance(v, np.ndarray) and v.ndim > 0:
            x = torch.from_numpy((v.view(np.int16) if v.dtype == np.uint16 else v).copy()).to(device)
            res[k] = x.view(torch.bfloat16) if v.dtype == np.uint16 else x
        else:
            res[k] = v
    return res


@cuda_only
@pytest.mark.parametrize("op,path", bundles(*OPS) if HAVE_CUDA else [("all", None)])
def test_op_torch_cuda(op, path):
    inputs, expected, refusal = load(path)
    if refusal[0] is not None:
        # What is refused on numpy is refused alike on CUDA, except value checks of host data:
        # values inside device memory are the kernels' to survive (tests/test_<op>.c), not to report.
        try:
            call_op(op, inputs)
        except (TypeError, ValueError, kdt.KdtError) as e:
            cpu_error = e
        else:
            pytest.skip(f"kdt_{op} runs this input on the CPU backend too (see test_op_numpy)")
        try:
            call_op(op, to_torch(inputs))
            torch.cuda.synchronize()
        except type(cpu_error) as e:
            assert not isinstance(e, kdt.KdtError) or e.status == cpu_error.status, f"{e} vs {cpu_error}"
            return
        if isinstance(cpu_error, kdt.KdtError):
            pytest.skip(f"a check of host data on the CPU backend ({cpu_error.status_name}); the CUDA "
                        f"backend does not read device data back")
        pytest.fail(f"the CUDA call ran an input the binding refuses on numpy: {cpu_error}")
    is_bf16 = inputs.get("q", inputs.get("kv_cache", np.zeros(0, np.float32))).dtype == np.uint16
    t = to_torch(inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the inputs' copies were queued on the default stream
    with torch.cuda.stream(side):  # the binding must queue on the current stream, whichever it is
        r = call_op(op, t)
    side.synchronize()
    for name, v in r.items():
        assert isinstance(v, torch.Tensor) and v.is_cuda, f"{op}.{name} is not a CUDA tensor"
    check(op, r, expected, is_bf16)
    if op == "kv_commit":
        t = to_torch(inputs)
    out = {name: poisoned(v) for name, v in r.items() if name != "kv_cache"}
    r2 = call_op(op, t, out=out)
    torch.cuda.synchronize()
    check(op, r2, expected, is_bf16)


@cuda_only
def test_cuda_rejects_cpu_and_numpy_tensors():
    tok, par, num, pred = accept_inputs(4, 6)
    g = [torch.from_numpy(x).cuda() for x in (tok, par, num, pred)]
    with pytest.raises((TypeError, ValueError), match=r"'num_nodes' is on cpu.*same CUDA device"):
        kdt.tree_accept(g[0], g[1], torch.from_numpy(num), g[3])
    with pytest.raises(TypeError, match=r"'target_pred' is a ndarray.*torch tensors"):
        kdt.tree_accept(g[0], g[1], g[2], pred)
    with pytest.raises(ValueError, match=r"'accept_index' is on cpu"):
        kdt.tree_accept(*g, out={"accept_index": torch.empty(4, 6, dtype=torch.int32)})
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match=r"same CUDA device"):
            kdt.tree_accept(g[0], g[1], g[2].to("cuda:1"), g[3])


@cuda_only
def test_cuda_matches_cpu_on_random_trees():
    tok, par, num, pred = accept_inputs(64, 33)
    ref = kdt.tree_accept(tok, par, num, pred)
    r = kdt.tree_accept(*[torch.from_numpy(x).cuda() for x in (tok, par, num, pred)])
    for name in ref:
        np.testing.assert_array_equal(r[name].cpu().numpy(), ref[name], err_msg=name)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_cpu_tensors_run_on_cpu():
    tok, par, num, pred = accept_inputs(5, 9)
    ref = kdt.tree_accept(tok, par, num, pred)
    r = kdt.tree_accept(*[torch.from_numpy(x) for x in (tok, par, num, pred)])
    for name in ref:
        assert isinstance(r[name], torch.Tensor) and r[name].device.type == "cpu"
        np.testing.assert_array_equal(r[name].numpy(), ref[name], err_msg=name)


# ---- round trips through each op's struct, against numpy written here ----

def attn_reference(q, kv, kv_len, mask, scale, dv):
    """docs/interfaces.md 2.2 in float64 on the contiguous layout."""
    B, Q, H, _ = q.shape
    o, lse = np.zeros((B, Q, H, dv)), np.zeros((B, Q, H))
    for b in range(B):
        n = int(kv_len[b])
        keys = kv[b, :n].astype(np.float64)
        for i in range(Q):
            seen = np.ones(n, bool)
            seen[n - Q:] = mask[b, i].astype(bool)
            s = scale * q[b, i].astype(np.float64) @ keys[seen].T      # [H, seen]
            m = s.max(1, keepdims=True)
            e = np.exp(s - m)
            lse[b, i] = np.log(e.sum(1)) + m[:, 0]
            o[b, i] = (e / e.sum(1, keepdims=True)) @ keys[seen, :dv]
    return o, lse


def test_verify_attn_layouts_against_numpy():
    rng = np.random.default_rng()
    B, Q, H, dv, dr, L, BS = 3, 5, 4, 16, 8, 37, 8
    q = rng.standard_normal((B, Q, H, dv + dr)).astype(np.float32)
    kv = rng.standard_normal((B, L, dv + dr)).astype(np.float32)
    kv_len = rng.integers(Q, L + 1, B).astype(np.int32)
    mask = np.zeros((B, Q, Q), np.uint8)
    for b in range(B):
        for i in range(Q):
            p = rng.integers(0, i) if i else 0
            mask[b, i] = mask[b, p]
            mask[b, i, i] = 1
    o_ref, lse_ref = attn_reference(q, kv, kv_len, mask, 0.3, dv)
    r = kdt.verify_attn(q, kv, kv_len, mask, 0.3, dv)
    np.testing.assert_allclose(r.o, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.lse, lse_ref, rtol=1e-5, atol=1e-5)
    # the same keys in shuffled blocks of a paged cache
    MB = -(-L // BS)
    table = rng.permutation(B * MB + 2)[:B * MB].reshape(B, MB).astype(np.int32)
    cache = rng.standard_normal((B * MB + 2, BS, dv + dr)).astype(np.float32)
    padded = np.zeros((B, MB * BS, dv + dr), np.float32)
    padded[:, :L] = kv
    cache[table.reshape(-1)] = padded.reshape(B * MB, BS, dv + dr)
    r = kdt.verify_attn(q, cache, kv_len, mask.astype(bool), 0.3, dv, block_table=table)
    np.testing.assert_allclose(r.o, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(r.lse, lse_ref, rtol=1e-5, atol=1e-5)


def test_kv_commit_against_numpy():
    rng = np.random.default_rng()
    B, Q, BS, Dqk = 4, 9, 4, 6
    prefix = rng.integers(0, 11, B)
    kv_len = (prefix + Q).astype(np.int32)
    MB = -(-int(kv_len.max()) // BS)
    table = rng.permutation(B * MB).reshape(B, MB).astype(np.int32)
    cache = rng.standard_normal((B * MB, BS, Dqk)).astype(np.float32)
    acc_len = rng.integers(0, 5, B).astype(np.int32)
    acc_idx = np.full((B, Q), -1, np.int32)
    for b in range(B):
        acc_idx[b, :acc_len[b] + 1] = [0] + sorted(rng.choice(np.arange(1, Q), acc_len[b], replace=False))
    want = cache.copy()
    for b in range(B):
        row = lambda j: (table[b, j // BS], j % BS)  # noqa: E731
        for t in range(1, acc_len[b] + 1):
            want[row(prefix[b] + t)] = want[row(prefix[b] + acc_idx[b, t])]
    r = kdt.kv_commit(cache, table, kv_len, acc_idx, acc_len)
    assert r.kv_cache is cache
    np.testing.assert_array_equal(cache, want)
    np.testing.assert_array_equal(r.new_kv_len, prefix + 1 + acc_len)
    np.testing.assert_array_equal(r.status, 0)


def test_empty_batch_returns_empty_outputs():
    z = np.zeros((0, 4), np.int32)
    r = kdt.tree_accept(z, z, np.zeros(0, np.int32), z)
    assert r.accept_index.shape == (0, 4) and r.accept_len.shape == (0,)


# ---- argument checking: clean Python exceptions before any C call ----

def accept_inputs(B, Q, seed=0):
    """Random trees: parent of node c is below c, tokens from a tiny vocabulary so paths match."""
    rng = np.random.default_rng(seed)
    par = np.full((B, Q), -1, np.int32)
    for c in range(1, Q):
        par[:, c] = rng.integers(0, c, B)
    tok = rng.integers(0, 3, (B, Q)).astype(np.int32)
    num = rng.integers(0, Q, B).astype(np.int32)
    pred = rng.integers(0, 3, (B, Q)).astype(np.int32)
    return tok, par, num, pred


def test_accept_against_python_walk():
    """tree_accept through the binding against a walk written here (docs/interfaces.md 2.3)."""
    tok, par, num, pred = accept_inputs(32, 17, seed=np.random.SeedSequence().entropy % 2**32)
    r = kdt.tree_accept(tok, par, num, pred)
    for b in range(32):
        cur, path = 0, [0]
        for _ in range(num[b]):
            kids = [c for c in range(1, num[b] + 1) if par[b, c] == cur and tok[b, c] == pred[b, cur]]
            if not kids:
                break
            cur = kids[0]
            path.append(cur)
        assert r.accept_len[b] == len(path) - 1
        assert list(r.accept_index[b, :len(path)]) == path and (r.accept_index[b, len(path):] == -1).all()
        assert list(r.accept_tokens[b, :len(path)]) == [tok[b, c] for c in path[1:]] + [pred[b, cur]]
        assert r.status[b] == 0


def test_wrong_dtype():
    tok, par, num, pred = accept_inputs(4, 6)
    with pytest.raises(TypeError, match=r"kdt.tree_accept: 'node_parent' has dtype int64, expected int32"):
        kdt.tree_accept(tok, par.astype(np.int64), num, pred)
    with pytest.raises(TypeError, match=r"'scores' has dtype float64, expected float32"):
        kdt.tree_build(np.zeros((1, 2, 2)), np.zeros((1, 2, 2), np.int32), num[:1], num[:1], 4)
    with pytest.raises(TypeError, match=r"'tree_mask' has dtype int8, expected uint8 \(or bool\)"):
        kdt.verify_attn(np.zeros((1, 2, 1, 8), np.float32), np.zeros((1, 4, 8), np.float32),
                        np.array([4], np.int32), np.zeros((1, 2, 2), np.int8), 0.1, 4)
    with pytest.raises(TypeError, match=r"'num_nodes' has dtype bool, expected int32"):
        kdt.tree_accept(tok, par, num.astype(bool), pred)


def test_bool_tree_mask_and_bf16_dtype_rules():
    q = np.zeros((1, 2, 1, 8), np.uint16)  # bf16 bits
    with pytest.raises(TypeError, match=r"'kv' has dtype float32, expected bfloat16"):
        kdt.verify_attn(q, np.zeros((1, 4, 8), np.float32), np.array([4], np.int32),
                        np.ones((1, 2, 2), bool), 0.1, 4)
    with pytest.raises(ValueError, match=r"'dv' = 9 outside 1 .. 8"):
        kdt.verify_attn(q, np.zeros((1, 4, 8), np.uint16), np.array([4], np.int32),
                        np.ones((1, 2, 2), bool), 0.1, 9)


def test_not_an_array():
    tok, par, num, pred = accept_inputs(4, 6)
    with pytest.raises(TypeError, match=r"'node_token' must be a numpy array or a torch tensor, got list"):
        kdt.tree_accept(tok.tolist(), par, num, pred)


def test_non_contiguous():
    tok, par, num, pred = accept_inputs(4, 12)
    with pytest.raises(ValueError, match=r"'target_pred' is not C-contiguous"):
        kdt.tree_accept(tok[:, :6].copy(), par[:, :6].copy(), num, pred[:, ::2])
    kv = np.zeros((1, 8, 16), np.float32)
    with pytest.raises(ValueError, match=r"'kv' is not C-contiguous"):
        kdt.verify_attn(np.zeros((1, 2, 1, 8), np.float32), kv[:, :, ::2], np.array([4], np.int32),
                        np.ones((1, 2, 2), np.uint8), 0.1, 4)


def test_mismatched_batch_sizes():
    tok, par, num, pred = accept_inputs(4, 6)
    with pytest.raises(ValueError, match=r"batch sizes differ: 'num_nodes' has B = 3 .* 'node_token' has B = 4"):
        kdt.tree_accept(tok, par, num[:3], pred)
    with pytest.raises(ValueError, match=r"batch sizes differ: 'seq_len' has B = 2"):
        kdt.tree_build(np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2), np.int32),
                       np.zeros(1, np.int32), np.zeros(2, np.int32), 4)
    with pytest.raises(ValueError, match=r"batch sizes differ: 'block_table' has B = 2"):
        kdt.verify_attn(np.zeros((1, 2, 1, 8), np.float32), np.zeros((3, 4, 8), np.float32),
                        np.array([4], np.int32), np.ones((1, 2, 2), np.uint8), 0.1, 4,
                        block_table=np.zeros((2, 1), np.int32))
    with pytest.raises(ValueError, match=r"'tokens' has K = 3"):
        kdt.tree_build(np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 3), np.int32),
                       np.zeros(1, np.int32), np.zeros(1, np.int32), 4)


def test_bad_out():
    tok, par, num, pred = accept_inputs(4, 6)
    with pytest.raises(ValueError, match=r"'accept_index' has shape \(4, 7\), expected dim 1 = 6"):
        kdt.tree_accept(tok, par, num, pred, out={"accept_index": np.empty((4, 7), np.int32)})
    with pytest.raises(TypeError, match=r"'status' has dtype float32, expected int32"):
        kdt.tree_accept(tok, par, num, pred, out={"status": np.empty(4, np.float32)})
    with pytest.raises(ValueError, match=r"out= has unknown names \['accept_lens'\]"):
        kdt.tree_accept(tok, par, num, pred, out={"accept_lens": np.empty(4, np.int32)})
    ro = np.empty(4, np.int32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"'accept_len' is read-only"):
        kdt.tree_accept(tok, par, num, pred, out={"accept_len": ro})
    with pytest.raises(ValueError, match=r"'tree_mask' has shape \(1, 5, 4\)"):
        kdt.tree_build(np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2), np.int32), np.zeros(1, np.int32),
                       np.zeros(1, np.int32), 4, out={"tree_mask": np.empty((1, 5, 4), np.uint8)})
    with pytest.raises(TypeError, match=r"'o' has dtype float32, expected bfloat16"):
        kdt.verify_attn(np.zeros((1, 2, 1, 8), np.uint16), np.zeros((1, 4, 8), np.uint16),
                        np.array([4], np.int32), np.ones((1, 2, 2), np.uint8), 0.1, 4,
                        out={"o": np.empty((1, 2, 1, 4), np.float32)})


def test_bad_scalars():
    args = (np.zeros((1, 2, 2), np.float32), np.zeros((1, 2, 2), np.int32), np.zeros(1, np.int32),
            np.zeros(1, np.int32))
    for budget in (0, 1025):
        with pytest.raises(ValueError, match=rf"'budget' = {budget} outside 1 .. 1024"):
            kdt.tree_build(*args, budget)
    with pytest.raises(TypeError, match=r"'budget' must be an int, got float"):
        kdt.tree_build(*args, 4.0)
    with pytest.raises(ValueError, match=r"'sm_scale' = nan is not finite"):
        kdt.verify_attn(np.zeros((1, 2, 1, 8), np.float32), np.zeros((1, 4, 8), np.float32),
                        np.array([4], np.int32), np.ones((1, 2, 2), np.uint8), float("nan"), 4)


def test_read_only_cache_for_kv_commit():
    kv = np.zeros((2, 4, 8), np.float32)
    kv.flags.writeable = False
    with pytest.raises(ValueError, match=r"'kv_cache' is read-only"):
        kdt.kv_commit(kv, np.zeros((1, 2), np.int32), np.array([6], np.int32), np.zeros((1, 3), np.int32),
                      np.zeros(1, np.int32))


def test_c_error_raises_kdt_error():
    """A contract break only C checks (Q above the library's maximum) comes back as KdtError."""
    z = np.zeros((1, 1026), np.int32)
    with pytest.raises(kdt.KdtError, match=r"Q = 1026 outside 1 .. 1025 \[KDT_ERR_SHAPE\]") as e:
        kdt.tree_accept(z, z, np.zeros(1, np.int32), z)
    assert e.value.status_name == "KDT_ERR_SHAPE"


def test_result_attributes_and_keys():
    r = kdt.tree_accept(*accept_inputs(2, 3))
    assert r.accept_len is r["accept_len"] and list(r) == ["accept_len", "accept_index", "accept_tokens", "status"]
    with pytest.raises(AttributeError, match="no output named 'nope'"):
        r.nope


def test_library_not_found(monkeypatch, tmp_path):
    missing = str(tmp_path / "nowhere" / "libkdt.so")
    monkeypatch.setenv("KDT_LIB", missing)
    monkeypatch.setattr(_lib, "_lib", None)
    with pytest.raises(kdt.LibraryNotFound, match=re.escape(missing) + r".*\$KDT_LIB"):
        kdt.tree_accept(*accept_inputs(2, 3))


# ---- the params structs still mirror include/kdt/ops.h ----

# Field types as ops.h spells them -> the ctypes type the mirror must use (pointers: c_void_p).
C_TYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "kdt_dtype": ctypes.c_int, "*": ctypes.c_void_p}


def header_structs():
    """struct name -> [(field, ctypes type)] parsed from include/kdt/ops.h."""
    text = re.sub(r"/\*.*?\*/", "", open(HEADER).read(), flags=re.S)
    structs = {}
    for name, body in re.findall(r"typedef struct (kdt_\w+_params) \{(.*?)\}", text, flags=re.S):
        fields = []
        for decl in body.split(";"):
            decl = decl.replace("const ", "").strip()
            if not decl:
                continue
            ctype, names = re.fullmatch(r"(\w+)\s+(.*)", decl, flags=re.S).groups()
            for n in names.split(","):
                n = n.strip()
                fields.append((n.lstrip("* "), C_TYPES["*" if n.startswith("*") else ctype]))
        structs[name] = fields
    return structs


@pytest.mark.skipif(not os.path.exists(HEADER), reason="include/kdt/ops.h not found (installed package)")
def test_params_structs_match_header():
    structs = header_structs()
    assert set(structs) == {f"kdt_{op}_params" for op in _lib.OPS}
    for op, cls in _lib.OPS.items():
        want = structs[f"kdt_{op}_params"]
        assert [n for n, _ in cls._fields_] == [n for n, _ in want], f"kdt_{op}_params: field names or order differ"
        for (n, got), (_, t) in zip(cls._fields_, want):
            assert got is t, f"kdt_{op}_params.{n}: ctypes {got.__name__}, ops.h says {t.__name__}"
        # the offsets follow from names and types; checked anyway against a struct built from the header
        ref = type("Ref", (ctypes.Structure,), {"_fields_": want})
        assert ctypes.sizeof(cls) == ctypes.sizeof(ref)
        assert [getattr(cls, n).offset for n, _ in want] == [getattr(ref, n).offset for n, _ in want]


# ---- the SGLang verify layout ----

@pytest.mark.parametrize("op,path", bundles("tree_build", good_only=True))
def test_sglang_layout_walk_matches_tree_accept(op, path):
    """SGLang's greedy walk over retrive_next_token / retrive_next_sibling (as verify_tree_greedy
    does it) accepts the same path as kdt.tree_accept, on the bundle's expected trees."""
    _, tree, _ = load(path)
    B, Q = tree["node_token"].shape
    s = kdt.sglang_verify_inputs(tree)
    rng = np.random.default_rng()
    # target predictions that often follow the tree: each node's first child's token, or noise
    kids = np.where(tree["first_child"] >= 0, tree["first_child"], 0)
    pred = np.take_along_axis(s.draft_token.reshape(B, Q), kids, 1).astype(np.int32)
    pred = np.where(rng.random((B, Q)) < 0.8, pred, rng.integers(0, 50, (B, Q))).astype(np.int32)
    acc = kdt.tree_accept(tree["node_token"], tree["node_parent"], tree["num_nodes"], pred)
    np.testing.assert_array_equal(s.retrive_index, np.arange(B * Q).reshape(B, Q))
    for b in range(B):
        n = tree["num_nodes"][b]
        assert (s.draft_token.reshape(B, Q)[b, :n + 1] == tree["node_token"][b, :n + 1]).all()
        assert (s.draft_token.reshape(B, Q)[b, n + 1:] == tree["node_token"][b, 0]).all()
        assert (s.positions.reshape(B, Q)[b, n + 1:] == tree["positions"][b, 0]).all()
        m = s.custom_mask.reshape(B, Q, Q)[b]
        assert (m[:n + 1, :n + 1] == tree["tree_mask"][b, :n + 1, :n + 1].astype(bool)).all()
        for i in range(n + 1, Q):
            assert m[i].nonzero()[0].tolist() == [0, i]
        last, path = s.retrive_index[b, 0], [0]
        cur = 0
        for _ in range(1, Q):
            cur = s.retrive_next_token[b, cur]
            while cur != -1 and s.draft_token[b * Q + cur] != pred.reshape(-1)[last]:
                cur = s.retrive_next_sibling[b, cur]
            if cur == -1:
                break
            last = s.retrive_index[b, cur]
            path.append(int(cur))
        assert path == acc.accept_index[b, :acc.accept_len[b] + 1].tolist()


# ---- the README's speculative step runs as written ----

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


@cuda_only
def test_readme_speculative_step():
    text = open(README).read().split("## One speculative step", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    env = {}
    exec(compile(code, "python/README.md", "exec"), env)
    torch.cuda.synchronize()
    acc = env["acc"]
    assert (acc.status == 0).all() and (acc.accept_len >= 1).all(), "the example's target follows the tree"
