"""The ops (docs/interfaces.md section 2): inputs in the interface's order and names,
outputs returned under the interface's names in a Result.

numpy arrays (or CPU torch tensors) run on the CPU backend and return numpy arrays (torch
tensors); torch tensors on a CUDA device run on the CUDA backend, queued on that device's
current torch stream, and return torch tensors on that device without synchronizing."""
from . import _lib
from ._lib import BF16, F32, I32, U8, U64
from ._tensors import Call, check_outs, scalar_float, scalar_int

MAX_BUDGET = 1024


class Result(dict):
    """The outputs by name (docs/interfaces.md): `r.accept_len` and `r["accept_len"]` are the same tensor."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no output named '{name}' (outputs: {', '.join(self)})") from None

    def __dir__(self):
        return list(self.keys()) + list(super().__dir__())


def _run(call, op, params, outs):
    if call.dims.get("B") != 0:  # an empty batch has nothing to do (torch gives it NULL pointers)
        with call.device_guard():
            _lib.call(op, params, call.backend, call.stream())
    return Result((name, t.obj) for name, t in outs.items())


def _outputs(call, out, spec):
    """The op's outputs, from out= where given, else new; spec lists (name, dtype, dims)."""
    return {name: call.output(out, name, code, dims) for name, code, dims in spec}


TREE_BUILD_OUTPUTS = [("num_nodes", I32, ["B"]), ("node_token", I32, ["B", "Q"]),
                      ("node_parent", I32, ["B", "Q"]), ("node_depth", I32, ["B", "Q"]),
                      ("node_cand", I32, ["B", "Q"]), ("node_score", F32, ["B", "Q"]),
                      ("positions", I32, ["B", "Q"]), ("tree_mask", U8, ["B", "Q", "Q"]),
                      ("first_child", I32, ["B", "Q"]), ("next_sibling", I32, ["B", "Q"])]


def tree_build(scores, tokens, root_token, seq_len, budget, *, out=None):
    """Best-first draft tree (docs/interfaces.md 2.1).

    scores f32 [B, D, K], tokens i32 [B, D, K], root_token i32 [B], seq_len i32 [B], budget int N
    (1 .. 1024). Returns num_nodes [B], node_token / node_parent / node_depth / node_cand /
    positions / first_child / next_sibling i32 [B, Q], node_score f32 [B, Q], tree_mask u8
    [B, Q, Q], with Q = budget + 1. out: optional dict name -> preallocated output."""
    op = "tree_build"
    out = check_outs(op, out, [name for name, _, _ in TREE_BUILD_OUTPUTS])
    n = scalar_int(op, "budget", budget, 1, MAX_BUDGET)
    c = Call(op, {"scores": scores, "tokens": tokens, "root_token": root_token, "seq_len": seq_len,
                  **(out or {})})
    ins = {"scores": c.tensor("scores", scores, (F32,), ["B", "D", "K"]),
           "tokens": c.tensor("tokens", tokens, (I32,), ["B", "D", "K"]),
           "root_token": c.tensor("root_token", root_token, (I32,), ["B"]),
           "seq_len": c.tensor("seq_len", seq_len, (I32,), ["B"])}
    c.dims["Q"] = n + 1
    outs = _outputs(c, out, TREE_BUILD_OUTPUTS)
    p = _lib.TreeBuildParams(B=c.dims["B"], D=c.dims["D"], K=c.dims["K"], budget=n)
    for name, t in {**ins, **outs}.items():
        setattr(p, name, t.ptr)
    return _run(c, op, p, outs)


def verify_attn(q, kv, kv_len, tree_mask, sm_scale, dv=512, *, block_table=None, out=None):
    """Tree-verify attention, absorbed MLA (docs/interfaces.md 2.2).

    q [B, Q, H, Dqk] f32 or bf16; kv the keys, in the dtype of q, in one of two layouts:
      contiguous: kv [B, L, Dqk] and block_table None;
      paged:      kv is the cache [NB, BS, Dqk] and block_table i32 [B, MB] maps request b's
                  key j to row j % BS of block block_table[b][j // BS].
    kv_len i32 [B] (prefix + Q: the tree's keys are the last Q), tree_mask u8 or bool [B, Q, Q],
    sm_scale float, dv int: the latent (value) dims; Dr = Dqk - dv (Kimi K2: 512 + 64).
    Returns o [B, Q, H, dv] in the dtype of q and lse f32 [B, Q, H]."""
    op = "verify_attn"
    out = check_outs(op, out, ("o", "lse"))
    scale = scalar_float(op, "sm_scale", sm_scale)
    paged = block_table is not None
    kv_name = "kv_cache" if paged else "kv"
    c = Call(op, {"q": q, kv_name: kv, "block_table": block_table, "kv_len": kv_len,
                  "tree_mask": tree_mask, **(out or {})})
    tq = c.tensor("q", q, (F32, BF16), ["B", "Q", "H", "Dqk"])
    if paged:
        tkv = c.tensor(kv_name, kv, (tq.code,), ["NB", "BS", "Dqk"])
        tbt = c.tensor("block_table", block_table, (I32,), ["B", "MB"])
    else:
        tkv = c.tensor(kv_name, kv, (tq.code,), ["B", "L", "Dqk"])
    tlen = c.tensor("kv_len", kv_len, (I32,), ["B"])
    tmask = c.tensor("tree_mask", tree_mask, (U8,), ["B", "Q", "Q"], bool_ok=True)
    dqk = c.dims["Dqk"]
    dv = scalar_int(op, "dv", dv, 1, dqk)
    c.dims["Dv"] = dv
    outs = {"o": c.output(out, "o", tq.code, ["B", "Q", "H", "Dv"], like=q),
            "lse": c.output(out, "lse", F32, ["B", "Q", "H"])}
    d = c.dims
    p = _lib.VerifyAttnParams(B=d["B"], Q=d["Q"], H=d["H"], Dv=dv, Dr=dqk - dv, dtype=tq.code,
                              sm_scale=scale, q=tq.ptr, o=outs["o"].ptr)
    if paged:
        p.kv_cache, p.NB, p.BS, p.MB = tkv.ptr, d["NB"], d["BS"], d["MB"]
        p.block_table = tbt.ptr
    else:
        p.kv, p.L = tkv.ptr, d["L"]
    p.kv_len = tlen.ptr
    p.tree_mask = tmask.ptr
    p.lse = outs["lse"].ptr
    return _run(c, op, p, outs)


TREE_ACCEPT_OUTPUTS = [("accept_len", I32, ["B"]), ("accept_index", I32, ["B", "Q"]),
                       ("accept_tokens", I32, ["B", "Q"]), ("status", I32, ["B"])]


def tree_accept(node_token, node_parent, num_nodes, target_pred, *, out=None):
    """Greedy acceptance (docs/interfaces.md 2.3).

    node_token, node_parent i32 [B, Q], num_nodes i32 [B], target_pred i32 [B, Q] (the target's
    greedy next token after each node). Returns accept_len i32 [B], accept_index and
    accept_tokens i32 [B, Q] (fill -1) and status i32 [B] (non-zero: malformed tree)."""
    op = "tree_accept"
    out = check_outs(op, out, [name for name, _, _ in TREE_ACCEPT_OUTPUTS])
    c = Call(op, {"node_token": node_token, "node_parent": node_parent, "num_nodes": num_nodes,
                  "target_pred": target_pred, **(out or {})})
    ins = {"node_token": c.tensor("node_token", node_token, (I32,), ["B", "Q"]),
           "node_parent": c.tensor("node_parent", node_parent, (I32,), ["B", "Q"]),
           "num_nodes": c.tensor("num_nodes", num_nodes, (I32,), ["B"]),
           "target_pred": c.tensor("target_pred", target_pred, (I32,), ["B", "Q"])}
    outs = _outputs(c, out, TREE_ACCEPT_OUTPUTS)
    p = _lib.TreeAcceptParams(B=c.dims["B"], Q=c.dims["Q"])
    for name, t in {**ins, **outs}.items():
        setattr(p, name, t.ptr)
    return _run(c, op, p, outs)


def tree_sample_accept(node_token, node_parent, num_nodes, target_logits, temperature, top_k, top_p, seed, *,
                       draft_probs=None, out=None):
    """Lossless acceptance when sampling (docs/interfaces.md 2.4, docs/sampling.md).

    node_token, node_parent i32 [B, Q], num_nodes i32 [B], target_logits f32 [B, Q, V],
    temperature f32 [B] (0: greedy, as tree_accept on each row's argmax), top_k i32 [B] (0: off),
    top_p f32 [B] (1: off), seed u64 [B]; draft_probs f32 [B, Q, V] when the children were sampled
    from those rows (None: deterministic top-K children). Returns accept_len i32 [B],
    accept_index and accept_tokens i32 [B, Q] (fill -1) and status i32 [B]."""
    op = "tree_sample_accept"
    out = check_outs(op, out, [name for name, _, _ in TREE_ACCEPT_OUTPUTS])
    c = Call(op, {"node_token": node_token, "node_parent": node_parent, "num_nodes": num_nodes,
                  "target_logits": target_logits, "draft_probs": draft_probs, "temperature": temperature,
                  "top_k": top_k, "top_p": top_p, "seed": seed, **(out or {})})
    ins = {"node_token": c.tensor("node_token", node_token, (I32,), ["B", "Q"]),
           "node_parent": c.tensor("node_parent", node_parent, (I32,), ["B", "Q"]),
           "num_nodes": c.tensor("num_nodes", num_nodes, (I32,), ["B"]),
           "target_logits": c.tensor("target_logits", target_logits, (F32,), ["B", "Q", "V"]),
           "temperature": c.tensor("temperature", temperature, (F32,), ["B"]),
           "top_k": c.tensor("top_k", top_k, (I32,), ["B"]),
           "top_p": c.tensor("top_p", top_p, (F32,), ["B"]),
           "seed": c.tensor("seed", seed, (U64,), ["B"])}
    if draft_probs is not None:
        ins["draft_probs"] = c.tensor("draft_probs", draft_probs, (F32,), ["B", "Q", "V"])
    outs = _outputs(c, out, TREE_ACCEPT_OUTPUTS)
    p = _lib.TreeSampleAcceptParams(B=c.dims["B"], Q=c.dims["Q"], V=c.dims["V"])
    for name, t in {**ins, **outs}.items():
        setattr(p, name, t.ptr)
    return _run(c, op, p, outs)


KV_COMMIT_OUTPUTS = [("new_kv_len", I32, ["B"]), ("status", I32, ["B"])]


def kv_commit(kv_cache, block_table, kv_len, accept_index, accept_len, *, out=None):
    """Moves each request's accepted tree rows right after its prefix (docs/interfaces.md 2.5), in place.

    kv_cache [NB, BS, Dqk] f32 or bf16 (modified in place, so it must be writable),
    block_table i32 [B, MB], kv_len i32 [B] (prefix + Q), accept_index i32 [B, Q] and
    accept_len i32 [B] as tree_accept writes them. Returns kv_cache (the same object),
    new_kv_len i32 [B] and status i32 [B] (non-zero: malformed request, left unmoved).
    The rule, the status codes and the caller's duties (no block shared by two requests'
    moves, no concurrent work on the cache) are in docs/interfaces.md 2.5."""
    op = "kv_commit"
    out = check_outs(op, out, [name for name, _, _ in KV_COMMIT_OUTPUTS])
    c = Call(op, {"kv_cache": kv_cache, "block_table": block_table, "kv_len": kv_len,
                  "accept_index": accept_index, "accept_len": accept_len, **(out or {})})
    tkv = c.tensor("kv_cache", kv_cache, (F32, BF16), ["NB", "BS", "Dqk"], output=True)
    ins = {"block_table": c.tensor("block_table", block_table, (I32,), ["B", "MB"]),
           "kv_len": c.tensor("kv_len", kv_len, (I32,), ["B"]),
           "accept_index": c.tensor("accept_index", accept_index, (I32,), ["B", "Q"]),
           "accept_len": c.tensor("accept_len", accept_len, (I32,), ["B"])}
    outs = _outputs(c, out, KV_COMMIT_OUTPUTS)
    d = c.dims
    p = _lib.KvCommitParams(B=d["B"], Q=d["Q"], NB=d["NB"], BS=d["BS"], Dqk=d["Dqk"], MB=d["MB"],
                            dtype=tkv.code, kv_cache=tkv.ptr)
    for name, t in {**ins, **outs}.items():
        setattr(p, name, t.ptr)
    r = _run(c, op, p, outs)
    return Result([("kv_cache", kv_cache)] + list(r.items()))
