"""A PyTorch reference of the DFlash draft model (z-lab's DFlashDraftModel, arXiv 2602.06036) in
its checkpoint layout, written from the architecture's description for the engine's tests and
training (python/train_drafters.py); float64 by default so that it is the exact side of a comparison.

Layout (names as in z-lab's model.safetensors): fc.weight [hid, nT * hid], hidden_norm.weight,
norm.weight [hid]; layers.i.{input_layernorm, post_attention_layernorm}.weight [hid],
layers.i.self_attn.{q_proj [H*hd, hid], k_proj / v_proj [KV*hd, hid], o_proj [hid, H*hd],
q_norm / k_norm [hd]}.weight, layers.i.mlp.{gate_proj / up_proj [I, hid], down_proj [hid, I]}.weight.

Forward: context rows c = hidden_norm(fc(concat of the target's residual streams after
target_layer_ids)); block rows x = embed([root, mask, ...]). Per layer, h = input_layernorm(x),
queries from h only, keys / values from [c ; h] (the context's keys from c directly, no layer
norm), q_norm / k_norm per head, rope (rotate-half) at the rows' positions (context 0 .. C-1, the
block C .. C + bs - 1), attention with no mask, x += o_proj; x += mlp(post_attention_layernorm(x)).
Logits = lm_head(norm(x)) of the block's rows (row i + 1 predicts the token i + 1 places after the root).
"""
import json
import os

import torch


def config(hid=32, layers=2, heads=4, kv_heads=2, head_dim=8, inter=64, vocab=96, block_size=5, mask=95,
           target_layers=(0, 1), theta=10000.0, eps=1e-6):
    """A config.json for a DFlash drafter (z-lab's keys)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hid, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inter,
        "vocab_size": vocab, "rms_norm_eps": eps, "rope_theta": theta, "hidden_act": "silu", "attention_bias": False,
        "rope_scaling": None, "max_position_embeddings": 4096, "block_size": block_size, "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": list(target_layers)},
    }


def shapes(cfg):
    hid, hd, I = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    nT = len(cfg["dflash_config"]["target_layer_ids"])
    out = {"fc.weight": (hid, nT * hid), "hidden_norm.weight": (hid,), "norm.weight": (hid,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        out.update({p + "input_layernorm.weight": (hid,), p + "post_attention_layernorm.weight": (hid,),
                    p + "self_attn.q_proj.weight": (q, hid), p + "self_attn.k_proj.weight": (kv, hid),
                    p + "self_attn.v_proj.weight": (kv, hid), p + "self_attn.o_proj.weight": (hid, q),
                    p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                    p + "mlp.gate_proj.weight": (I, hid), p + "mlp.up_proj.weight": (I, hid),
                    p + "mlp.down_proj.weight": (hid, I)})
    return out


def random_weights(cfg, gen, scale=1.0):
    """Norm weights near 1, matrices N(0, scale / fan_in): logits far from flat."""
    w = {}
    for name, shp in shapes(cfg).items():
        if len(shp) == 1:
            w[name] = 1.0 + 0.2 * torch.randn(shp, generator=gen)
        else:
            w[name] = torch.randn(shp, generator=gen) * (scale / shp[1]) ** 0.5
    return w


def save(path, cfg, weights, dtype=torch.float32):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file({k: v.detach().to(dtype).contiguous() for k, v in weights.items()}, os.path.join(path, "model.safetensors"))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):
    """x [B, n, heads, hd] rotated at pos [B, n], rotate-half layout."""
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
    ang = pos.to(x.device, torch.float64)[..., None] * inv
    cos, sin = torch.cos(ang).to(x.dtype)[:, :, None, :], torch.sin(ang).to(x.dtype)[:, :, None, :]
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def forward_blocks(cfg, w, embed, lm_head, ctx_feat, blocks, anchors):
    """Logits [B, A, bs, V] of A blocks per sequence sharing one context: ctx_feat [B, C, nT * hid]
    (row j at position j), blocks [B, A, bs] token ids, anchors [B, A] (block a's first row at
    position anchors[:, a], seeing the context rows before it and its own block only)."""
    dt = w["fc.weight"].dtype
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    H, KV, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    B, C, _ = ctx_feat.shape
    A, bs = blocks.shape[1], blocks.shape[2]
    dev = ctx_feat.device
    c = rms(ctx_feat.to(dt) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)            # [B, C, hid]
    x = embed.to(dt)[blocks].reshape(B, A * bs, -1) * cfg.get("input_embedding_scale", 1.0)
    pos_b = (anchors[:, :, None] + torch.arange(bs, device=dev)).reshape(B, A * bs)                    # [B, A*bs]
    pos_k = torch.cat([torch.arange(C, device=dev).expand(B, C), pos_b], dim=1)                        # [B, C + A*bs]
    blk = torch.arange(A, device=dev).repeat_interleave(bs)
    see_ctx = torch.arange(C, device=dev)[None, None, :] < anchors.repeat_interleave(bs, dim=1)[:, :, None]  # [B, A*bs, C]
    see_blk = (blk[:, None] == blk[None, :]).expand(B, -1, -1)
    visible = torch.cat([see_ctx, see_blk], dim=2)[:, None]                                # [B, 1, A*bs, C + A*bs]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, A * bs, H, hd)
        kv_in = torch.cat([c, h], dim=1)
        k = (kv_in @ w[p + "self_attn.k_proj.weight"].T).view(B, C + A * bs, KV, hd)
        v = (kv_in @ w[p + "self_attn.v_proj.weight"].T).view(B, C + A * bs, KV, hd)
        q = rope(rms(q, w[p + "self_attn.q_norm.weight"], eps), pos_b, theta)
        k = rope(rms(k, w[p + "self_attn.k_norm.weight"], eps), pos_k, theta)
        k = k.repeat_interleave(H // KV, dim=2)
        v = v.repeat_interleave(H // KV, dim=2)
        att = torch.einsum("bqhd,bkhd->bhqk", q, k) * hd ** -0.5
        att = att.masked_fill(~visible, float("-inf"))
        o = torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(B, A * bs, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    logits = rms(x, w["norm.weight"], eps) @ lm_head.to(dt).T * cfg.get("output_multiplier", 1.0)
    return logits.view(B, A, bs, -1)


def forward(cfg, w, embed, lm_head, ctx_feat, block, pos0):
    """Logits [bs, V] of one block [bs] at positions pos0 .. over the context ctx_feat [pos0, nT * hid]
    (every row before it)."""
    assert ctx_feat.shape[0] == pos0
    return forward_blocks(cfg, w, embed, lm_head, ctx_feat[None], block[None, None], torch.tensor([[pos0]]))[0, 0]
