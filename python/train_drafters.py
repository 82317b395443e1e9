"""Trains the two hidden-state drafters of the shipped model: a DFlash block drafter
(z-lab's checkpoint format, python/dflash_ref.py) and a DeepSeek-V3 MTP layer (python/mtp_ref.py),
the target frozen, on the data the target was trained on (python/train_small_model.py: the *.py
files of site-packages, its held-out rule, the target's own tokenizer).

    python3 python/train_drafters.py [--target models/kdt-small] [--out models] [--mode both]
                                     [--budget-s 280] [--tiny]

Writes OUT/kdt-small-dflash/ (config.json, model.safetensors: `kdt generate --spec dflash
--draft-model DIR`) and OUT/kdt-small-mtp/ (the target's config.json with num_nextn_predict_layers
= 1, model.safetensors holding model.layers.N.* only, embed_tokens and shared_head.head included:
`kdt generate --spec mtp --draft-model DIR`), each with train_log.json (losses and held-out
per-depth top-1 accuracy, the expected accepted length of a chain of one candidate per depth).

DFlash, after arXiv 2602.06036 (adapted): per training sequence, the target's residual streams after
target_layer_ids are the context; A blocks are anchored at random positions a (a block of
block_size rows: the token at a, then mask tokens), each seeing the context rows before a and its
own rows (dflash_ref.forward_blocks, the engine's attention pattern); row i's loss is the cross
entropy of token a + i, weighted exp(-(i - 1) / gamma) (early depths matter most to acceptance).
The embedding and LM head are the target's, frozen. MTP: rows (h_i, t_{i+1}) predict t_{i+2}, h_i
the target's final hidden state; a second chained pass feeds the layer's own output state with
t_{i+2} to predict t_{i+3} (what the engine does for depths >= 2). The MTP layer starts from the
target's last decoder layer; its embedding and head are the target's, frozen.

The whole run, data preparation included, stops training at --budget-s (one GPU call). --tiny: a
few hundred KB of data, small batches and a few dozen steps on the CPU, to check the pipeline and
the engine's loaders before a GPU run.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref  # noqa: E402
import mtp_ref  # noqa: E402
import train_small_model as tsm  # noqa: E402

T0 = time.time()


def log(*args):
    print(f"[{time.time() - T0:7.1f}s]", *args, flush=True)


def data(target_dir, max_bytes, eos):
    """(train stream, held-out stream) of token ids, split by train_small_model's held-out rule."""
    files, _, _ = tsm.collect_files(max_bytes)
    tok = Tokenizer.from_file(os.path.join(target_dir, "tokenizer.json"))
    train = [f[2] for f in files if f[0] % tsm.HOLDOUT_MOD]
    held = [f[2] for f in files if f[0] % tsm.HOLDOUT_MOD == 0] or train[:1]
    return tsm.encode_files(tok, train, eos), tsm.encode_files(tok, held, eos)


def dflash_config(tcfg, tiny):
    hid = tcfg["hidden_size"]
    L = tcfg["num_hidden_layers"]
    layers = sorted({0, L // 2 - 1 if L > 3 else 0, L - 2}) if L > 2 else [0]
    return dflash_ref.config(hid=hid, layers=1 if tiny else 2, heads=4, kv_heads=2, head_dim=hid // 4,
                             inter=2 * hid if tiny else 3 * hid, vocab=tcfg["vocab_size"], block_size=8,
                             mask=tcfg["vocab_size"] - 1, target_layers=layers, theta=10000.0, eps=tcfg["rms_norm_eps"])


def features(target, ids, layers):
    """The target's residual streams after `layers`, concatenated [B, S, n * hid], and its final
    (normed) hidden states [B, S, hid]."""
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
        return torch.cat([out.hidden_states[l + 1] for l in layers], dim=-1).float(), out.last_hidden_state.float()


def dflash_loss(cfg, w, embed, head, feats, ids, A, gamma, gen):
    """Weighted cross entropy of A random blocks per sequence; also per-depth top-1 hits [bs - 1]."""
    B, S = ids.shape
    bs = cfg["block_size"]
    anchors = torch.randint(1, S - bs + 1, (B, A), generator=gen).to(ids.device)
    blocks = torch.full((B, A, bs), cfg["dflash_config"]["mask_token_id"], dtype=torch.long, device=ids.device)
    blocks[:, :, 0] = ids.gather(1, anchors)
    labels = ids.gather(1, (anchors[:, :, None] + torch.arange(1, bs, device=ids.device)).view(B, -1)).view(B, A, bs - 1)
    logits = dflash_ref.forward_blocks(cfg, w, embed, head, feats, blocks, anchors)[:, :, 1:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none").view(B, A, bs - 1)
    weight = torch.exp(-torch.arange(bs - 1, device=ids.device, dtype=torch.float32) / gamma)
    loss = (ce * weight).sum(-1).mean() / weight.sum()
    return loss, (logits.argmax(-1) == labels).float()


def mtp_loss(m, final, ids, chain):
    """Cross entropy of the MTP rows, and of `chain` - 1 further passes on its own states; top-1 hits per pass."""
    h, total, hits = final[:, :-2], 0.0, []
    S = ids.shape[1]
    for k in range(chain):
        n = S - 2 - k
        logits, out = m(h[:, :n], ids[:, 1 + k:1 + k + n], torch.arange(k, k + n, device=ids.device)[None])
        labels = ids[:, 2 + k:2 + k + n]
        total = total + F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        hits.append((logits.argmax(-1) == labels).float().mean())
        h = out[:, :-1]
    return total / chain, torch.stack(hits)


def accept_len(hits):
    """Expected accepted length of a chain of one candidate per depth: sum over d of P(first d all hit), from
    per-example hits [..., D] (the product of per-depth means would assume independence)."""
    return hits.cumprod(-1).sum(-1).mean().item()


def save_dflash(path, cfg, w):
    dflash_ref.save(path, cfg, {k: v.detach().float().cpu() for k, v in w.items()}, dtype=torch.bfloat16)


def save_mtp(path, tcfg, m):
    os.makedirs(path, exist_ok=True)
    cfg = dict(tcfg, num_nextn_predict_layers=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    state = m.hub_state()
    hub = {}
    E = cfg["n_routed_experts"] if mtp_ref.is_moe(cfg, cfg["num_hidden_layers"]) else 0
    for k, v in state.items():  # transformers' fused experts -> the hub's one tensor per expert
        if k.endswith("mlp.experts.gate_up_proj"):
            pre, inter = k[: -len("gate_up_proj")], cfg["moe_intermediate_size"]
            for e in range(E):
                hub[f"{pre}{e}.gate_proj.weight"], hub[f"{pre}{e}.up_proj.weight"] = v[e, :inter], v[e, inter:]
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(E):
                hub[f"{k[: -len('down_proj')]}{e}.down_proj.weight"] = v[e]
        else:
            hub[k] = v
    save_file({k: v.float().cpu().to(torch.bfloat16).contiguous() for k, v in hub.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=os.path.join(here, "..", "models", "kdt-small"))
    ap.add_argument("--out", default=os.path.join(here, "..", "models"))
    ap.add_argument("--mode", choices=["dflash", "mtp", "both"], default="both")
    ap.add_argument("--budget-s", type=float, default=280)
    ap.add_argument("--max-bytes", type=float, default=None)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seed", type=int, default=24)
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() and not a.tiny else "cpu"
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    with open(os.path.join(a.target, "config.json")) as f:
        tcfg = json.load(f)
    seq, bsz, A, steps_max, lr = (64, 2, 4, 30, 3e-3) if a.tiny else (512, 32, 16, 100000, 1e-3)
    train, held = data(a.target, a.max_bytes or (3e5 if a.tiny else 3e7), tcfg["eos_token_id"])
    log(f"data: {len(train)} train tokens, {len(held)} held-out tokens, device {dev}")
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    embed, head = target.get_input_embeddings().weight, target.lm_head.weight
    modes = ["dflash", "mtp"] if a.mode == "both" else [a.mode]
    dcfg = dflash_config(tcfg, a.tiny)
    layers = dcfg["dflash_config"]["target_layer_ids"]
    params, logs = [], {m: [] for m in modes}
    if "dflash" in modes:
        w = {k: torch.nn.Parameter(v.to(dev)) for k, v in dflash_ref.random_weights(dcfg, gen).items()}
        params += list(w.values())
    if "mtp" in modes:
        m = mtp_ref.MTP(tcfg).to(dev)
        sd = target.state_dict()
        last = f"model.layers.{tcfg['num_hidden_layers'] - 1}."
        m.block.layers[0].load_state_dict({k[len(last):]: v for k, v in sd.items() if k.startswith(last)})
        with torch.no_grad():
            m.block.embed_tokens.weight.copy_(embed)
            m.head.weight.copy_(head)
            m.block.norm.weight.copy_(target.model.norm.weight)
            hid = tcfg["hidden_size"]
            m.eh_proj.weight.zero_()
            m.eh_proj.weight[:, hid:] = torch.eye(hid)  # starts as the target's state through its last layer
        m.block.embed_tokens.weight.requires_grad_(False)
        m.head.weight.requires_grad_(False)
        params += [p for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    use_bf16 = dev == "cuda"
    batches = tsm.batches(train, seq, bsz, gen)
    step = 0
    budget = a.budget_s - (time.time() - T0) - (10 if a.tiny else 30)  # room for evaluation and saving
    t_start = time.time()
    while step < steps_max and time.time() - t_start < budget:
        ids = next(batches)[:, :seq].to(dev)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=use_bf16):
            feats, final = features(target, ids, layers)
            loss = 0.0
            if "dflash" in modes:
                ld, hits = dflash_loss(dcfg, w, embed, head, feats, ids, A, 4.0, gen)
                loss = loss + ld
            if "mtp" in modes:
                lm, mh = mtp_loss(m, final, ids, 2)
                loss = loss + lm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for g in opt.param_groups:  # warmup, then cosine to 10% over the expected step count
            g["lr"] = lr * min(1.0, (step + 1) / 50) * (0.55 + 0.45 * math.cos(math.pi * min(1.0, (time.time() - t_start) / budget)))
        opt.step()
        if step % (5 if a.tiny else 50) == 0:
            if "dflash" in modes:
                logs["dflash"].append({"step": step, "loss": ld.item(), "top1": hits.mean((0, 1)).tolist()})
            if "mtp" in modes:
                logs["mtp"].append({"step": step, "loss": lm.item(), "top1": mh.tolist()})
            log(f"step {step}: loss {loss.item():.3f}" + (f", dflash top-1 by depth {[round(x, 2) for x in hits.mean((0, 1)).tolist()]}" if "dflash" in modes else "")
                + (f", mtp top-1 {[round(x, 2) for x in mh.tolist()]}" if "mtp" in modes else ""))
        step += 1
    # Held-out evaluation: per-depth top-1 and the chain's expected accepted length.
    hgen = torch.Generator().manual_seed(1)
    hb = tsm.batches(held, seq, bsz, hgen)
    ev = {}
    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16, enabled=use_bf16):
        ids = torch.cat([next(hb)[:, :seq] for _ in range(2 if a.tiny else 8)]).to(dev)
        feats, final = features(target, ids, layers)
        if "dflash" in modes:
            _, hits = dflash_loss(dcfg, w, embed, head, feats, ids, A, 4.0, hgen)
            ev["dflash"] = {"top1_by_depth": hits.mean((0, 1)).tolist(), "chain_accept_len": accept_len(hits)}
        if "mtp" in modes:
            _, mh = mtp_loss(m, final, ids, 2)
            ev["mtp"] = {"top1_by_depth": mh.tolist()}
    log(f"{step} steps; held-out: {json.dumps(ev)}")
    for mode in modes:
        path = os.path.join(a.out, os.path.basename(os.path.normpath(a.target)) + "-" + mode)
        save_dflash(path, dcfg, w) if mode == "dflash" else save_mtp(path, tcfg, m)
        with open(os.path.join(path, "train_log.json"), "w") as f:
            json.dump({"steps": step, "seconds": time.time() - T0, "device": dev, "tiny": a.tiny, "heldout": ev.get(mode),
                       "log": logs[mode], "seq": seq, "batch": bsz, "blocks_per_seq": A}, f, indent=1)
        log(f"wrote {path}")


if __name__ == "__main__":
    main()
