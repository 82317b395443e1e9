"""Builds the tiny DeepseekV3 checkpoints of tests/fixtures/model/ with transformers, and the
logits and greedy continuations tests/test_model.c checks the C forward against.

    python3 python/make_fixtures.py [--out tests/fixtures/model] [--seed 1234]

Needs torch and transformers (5.x). Each fixture folder holds a checkpoint in the hub's form
(docs/interfaces.md section 4: config.json with rope_scaling / rope_theta at the top level, one tensor per
expert) or, for `tf5`, transformers 5's own form (save_pretrained's config.json with
rope_parameters, experts fused in model.safetensors), plus expected.kdtr:
  prompt i32 [P], continuation i32 [32] (greedy), logits f32 [P + 32, vocab]: transformers'
  f32 logits of every row of prompt + continuation in one forward.
Weights are drawn with a fixed seed and scaled up from transformers' init so that logits are
far from flat. Every hub folder is read back with from_pretrained and must give the same logits,
so the files say what the model computed.

Router margins. The router keeps the top k experts, a discontinuous choice: where two biased
scores (or two group scores) are within bf16 noise, the CUDA bf16 path picks another expert and
that row's logits move by tens of percent, so the fixtures would test luck, not the code. Tiny
random routers are full of such near-ties, so here the router's weights are scaled up (spread
scores) and e_score_correction_bias takes well-separated values (a shuffled ladder), and every
fixture is checked on every row of prompt + continuation and every MoE layer, through hooks on
transformers' own router: the k-th best biased score of the kept groups beats the next by
>= ROUTER_MARGIN, and the topk_group-th group score beats the next by as much. A model and
prompt that fail are re-drawn (the next seed). ROUTER_MARGIN = 0.05 in score units (sigmoid
scores lie in (0, 1)): running the same model entirely in bf16 (torch, every weight and
activation bf16, noisier than the CUDA path, which keeps the residual stream and the router in
f32) moves biased scores by about 2e-3 (median) to 3e-2 (worst), so 0.05 is clear of the worst
seen; that all-bf16 model must also pick the very same experts on every row, checked too. Each
greedy step must win by >= LOGIT_GAP times its row's logit standard deviation (bf16 moves
logits by about 1e-2 relative).

The fixtures exercise: q_lora_rank set / null, YaRN with mscale != mscale_all_dim, default rope,
first_k_dense_replace 0 / 1, moe_layer_freq 2 (transformers ignores the field, so the model's
MLPs are swapped the way DeepSeek's reference code builds them), grouped routing (n_group 4,
topk_group 2) and one group, norm_topk_prob true / false, tied embeddings, a sharded checkpoint,
bf16 weights, rope_interleave false, and the fused layout; and the other MLA families of docs/interfaces.md
section 4, each against its own transformers class: Moonlight's shape, DeepSeek-V2-Lite
(DeepseekV2ForCausalLM: softmax routing, greedy top-k, no bias; its margin is SOFTMAX_MARGIN, as
no bias ladder can spread softmax scores, and it runs on the CPU backend only), GLM-4.7-Flash
(Glm4MoeLiteForCausalLM: nope and v heads unlike each other, mlp_layer_types, an MTP layer in the
checkpoint), and Kimi-VL's nesting (text_config, language_model. names, vision tensors).
python/make_quant_fixtures.py builds the quantized ones on top of this file.
"""
import argparse
import copy
import json
import math
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kdtr  # noqa: E402

try:
    import torch
    from safetensors.torch import save_file
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                              Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM)
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP
except ImportError as e:  # the CI machine has neither; the fixtures are committed
    print(f"make_fixtures: skipped ({e}); needs torch and transformers")
    sys.exit(0)

# model_type -> transformers' config and model classes (the MLA families of docs/interfaces.md section 4)
FAMILIES = {
    "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM),
    "deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
    "glm4_moe_lite": (Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM),
}

PROMPT_LEN = 8
NEW_TOKENS = 32
GATE_SCALE = 3.0      # router weights times this: router logits of standard deviation ~3
BIAS_STEP = 0.35      # e_score_correction_bias: a shuffled ladder of this step
ROUTER_MARGIN = 0.05  # see the top of this file
SOFTMAX_MARGIN = 0.01  # DeepSeek-V2's softmax router (CPU only): no bias ladder can spread its scores
LOGIT_GAP = 0.05      # top-2 logit gap of each greedy step, in units of its row's std
MIN_DISTINCT = 8      # distinct tokens in the continuation: no model stuck on one token
MAX_TRIES = 2000      # models tried
PROMPT_TRIES = 64     # prompts tried per model

BASE = dict(
    architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
    vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
    first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu",
    rms_norm_eps=1e-6, max_position_embeddings=128, rope_theta=10000.0,
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                  "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.7},
    tie_word_embeddings=False, attention_bias=False, num_nextn_predict_layers=0,
    bos_token_id=0, eos_token_id=1, torch_dtype="float32",
)

# name -> (config changes, how it is saved)
FIXTURES = {
    "yarn": ({}, "hub"),
    "qproj_tied": (dict(q_lora_rank=None, rope_scaling=None, rope_theta=500.0, norm_topk_prob=False,
                        tie_word_embeddings=True, first_k_dense_replace=0, n_group=1, topk_group=1,
                        num_experts_per_tok=3), "hub"),
    "moe_freq": (dict(num_hidden_layers=4, moe_layer_freq=2, n_shared_experts=2, rope_interleave=False,
                      rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8,
                                    "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 1.0}),
                 "hub"),
    "sharded": (dict(routed_scaling_factor=1.5, n_group=2, topk_group=1), "sharded"),
    "bf16": ({}, "bf16"),
    "tf5": (dict(num_experts_per_tok=3), "tf5"),
    # Moonlight-16B-A3B's shape: q_lora_rank null, one group, default rope, 64 routed of which 6
    "moonlight": (dict(q_lora_rank=None, n_group=1, topk_group=1, num_experts_per_tok=3, rope_scaling=None,
                       rope_theta=50000.0, routed_scaling_factor=2.446), "hub"),
    # DeepSeek-V2-Lite: softmax routing, greedy top-k over all experts, no correction bias
    "v2_lite": (dict(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", q_lora_rank=None,
                     scoring_func="softmax", topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
                     routed_scaling_factor=1.0, num_experts_per_tok=2,
                     rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
                "hub"),
    # GLM-4.7-Flash: nope 192 / rope 64 / v 256 scaled down (nope and v unlike each other and the
    # rope dims), mlp_layer_types, and one MTP layer in the checkpoint (model.layers.N) to ignore
    "glm_flash": (dict(architectures=["Glm4MoeLiteForCausalLM"], model_type="glm4_moe_lite", qk_nope_head_dim=24,
                       v_head_dim=32, n_group=1, topk_group=1, rope_scaling=None, rope_theta=1000000.0,
                       routed_scaling_factor=1.8, rms_norm_eps=1e-5, num_nextn_predict_layers=1,
                       mlp_layer_types=["dense", "sparse", "sparse"]), "mtp"),
    # Kimi-VL: the language model (Moonlight's shape) nested under text_config / language_model.
    "kimi_vl": (dict(q_lora_rank=None, n_group=1, topk_group=1, rope_scaling=None, rope_theta=800000.0), "nested"),
}


def is_moe(cfg, layer):
    return (cfg["n_routed_experts"] is not None and layer >= cfg["first_k_dense_replace"]
            and layer % cfg["moe_layer_freq"] == 0)


def build(cfg, seed):
    """The transformers model for a hub config, with DeepSeek's moe_layer_freq rule applied."""
    config_cls, model_cls = FAMILIES[cfg["model_type"]]
    config = config_cls.from_dict(dict(cfg))
    torch.manual_seed(seed)
    model = model_cls(config).float().eval()
    for layer, dec in enumerate(model.model.layers):
        want_moe = is_moe(cfg, layer)
        if want_moe != (layer >= cfg["first_k_dense_replace"]):
            assert not want_moe
            dec.mlp = DeepseekV3MLP(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name == "lm_head.weight":
                p.copy_(torch.randn(p.shape, generator=gen) * 2.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("mlp.gate.weight"):  # spread router scores (see the top)
                p.copy_(torch.randn(p.shape, generator=gen) * GATE_SCALE / math.sqrt(p.shape[-1]))
            else:  # [.., out, in] projections: unit-variance outputs
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # well-separated, centred
                n = b.shape[0]
                b.copy_(BIAS_STEP * (torch.randperm(n, generator=gen).float() - (n - 1) / 2))
    if cfg["tie_word_embeddings"]:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def hub_state(model, cfg):
    """state_dict in the hub's layout: one tensor per expert, no lm_head when tied."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().clone().contiguous()
        if k.endswith("mlp.experts.gate_up_proj"):
            pre, inter = k[: -len("gate_up_proj")], cfg["moe_intermediate_size"]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{pre}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].clone()
        elif k == "lm_head.weight" and cfg["tie_word_embeddings"]:
            continue
        else:
            out[k] = v
    return out


def vision_stub(gen):
    """A few vision-tower tensors of a multimodal checkpoint, which the loader must skip."""
    return {"vision_tower.patch_embed.proj.weight": torch.randn(16, 3, 2, 2, generator=gen).to(torch.bfloat16),
            "vision_tower.encoder.blocks.0.wqkv.weight": torch.randn(48, 16, generator=gen).to(torch.bfloat16),
            "mm_projector.proj.0.weight": torch.randn(32, 64, generator=gen).to(torch.bfloat16)}


def nest(cfg, arch, model_type):
    """A multimodal config holding cfg as its text_config (Kimi-VL, K2.5, K2.6)."""
    return {"architectures": [arch], "model_type": model_type, "text_config": cfg,
            "vision_config": {"model_type": "moonvit", "hidden_size": 16, "patch_size": 2},
            "ignore_index": -100, "media_placeholder_token_id": 95}


def mtp_stub(cfg, gen):
    """GLM's MTP layer after the last decoder layer (model.layers.N), which the loader ignores."""
    n, hid = cfg["num_hidden_layers"], cfg["hidden_size"]
    return {f"model.layers.{n}.eh_proj.weight": torch.randn(hid, 2 * hid, generator=gen),
            f"model.layers.{n}.enorm.weight": torch.ones(hid), f"model.layers.{n}.hnorm.weight": torch.ones(hid),
            f"model.layers.{n}.self_attn.q_a_proj.weight": torch.randn(cfg["q_lora_rank"], hid, generator=gen),
            f"model.layers.{n}.shared_head.norm.weight": torch.ones(hid)}


def save_hub(state, cfg, path, how):
    gen = torch.Generator().manual_seed(7)
    if how == "nested":
        state = {"language_model." + k: v for k, v in state.items()} | vision_stub(gen)
        cfg = nest(cfg, "KimiVLForConditionalGeneration", "kimi_vl")
    elif how == "mtp":
        state = state | mtp_stub(cfg, gen)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if how == "bf16":
        state = {k: v.to(torch.bfloat16) for k, v in state.items()}
    if how != "sharded":
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(state)
    shards = [names[i::3] for i in range(3)]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k] for k in part}, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def router_hooks(model, cfg, out):
    """Hooks on transformers' routers that append, per MoE layer call, (layer, biased scores
    [rows, E], chosen experts [rows, k]); returns the handles."""
    hooks = []
    for layer, dec in enumerate(model.model.layers):
        gate = getattr(dec.mlp, "gate", None)
        if gate is None:
            continue

        def hook(mod, inputs, output, layer=layer):
            router_logits, _, topk_indices = output
            if hasattr(mod, "e_score_correction_bias"):
                biased = router_logits.float().sigmoid() + mod.e_score_correction_bias.float()
            else:  # DeepSeek-V2: softmax scores, no bias
                biased = router_logits.float().softmax(dim=-1)
            out.append((layer, biased.detach(), topk_indices.detach().sort(dim=-1)[0]))
        hooks.append(gate.register_forward_hook(hook))
    return hooks


def router_margin(cfg, biased):
    """Per row, the smaller of the group gap (topk_group-th vs next group score) and the expert
    gap (k-th vs next biased score among the kept groups); biased [rows, E]."""
    E, G, TG, K = cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"], cfg["num_experts_per_tok"]
    per_group = biased.view(-1, G, E // G)
    group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)
    g = group_scores.sort(dim=-1, descending=True)[0]
    group_gap = g[:, TG - 1] - g[:, TG] if TG < G else torch.full((biased.shape[0],), math.inf)
    kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(TG, dim=-1)[1], 1)
    cand = biased.masked_fill(kept.repeat_interleave(E // G, dim=1) == 0, -math.inf)
    c = cand.sort(dim=-1, descending=True)[0]
    expert_gap = c[:, K - 1] - c[:, K] if K < c.shape[1] else torch.full((biased.shape[0],), math.inf)
    return torch.minimum(group_gap, expert_gap)


def greedy(model, prompt, cfg):
    """Greedy continuation by full forwards, and the f32 logits of every row; None as soon as a
    row meets a router near-tie or a greedy step a logit near-tie."""
    ids = list(prompt)
    records = []
    hooks = router_hooks(model, cfg, records)
    try:
        with torch.no_grad():
            for step in range(NEW_TOKENS + 1):
                records.clear()
                logits = model(input_ids=torch.tensor([ids])).logits[0].float()
                need = SOFTMAX_MARGIN if cfg.get("scoring_func") == "softmax" else ROUTER_MARGIN
                if any(router_margin(cfg, b).min() < need for _, b, _ in records):
                    return None
                if step == NEW_TOKENS:
                    break
                last = logits[-1]
                top2 = last.topk(2)[0]
                if top2[0] - top2[1] < LOGIT_GAP * last.std():
                    return None
                ids.append(int(torch.argmax(last)))
    finally:
        for h in hooks:
            h.remove()
    logits = logits.numpy()
    cont = np.array(ids[len(prompt):], np.int32)
    if len(set(cont.tolist())) < MIN_DISTINCT:
        return None
    assert (np.argmax(logits[len(prompt) - 1:-1], axis=1) == cont).all()
    return cont, logits, records


def same_choices_in_bf16(model, cfg, ids, records):
    """The model run entirely in bf16 picks the same experts on every row and layer as in f32;
    also returns the largest move of a biased score."""
    low = copy.deepcopy(model).to(torch.bfloat16)
    got = []
    hooks = router_hooks(low, cfg, got)
    with torch.no_grad():
        low(input_ids=torch.tensor([ids]))
    for h in hooks:
        h.remove()
    same = all(torch.equal(a[2], b[2]) for a, b in zip(records, got))
    return same, max(float((a[1] - b[1]).abs().max()) for a, b in zip(records, got))


def draw(cfg, how, seed):
    """A model and prompt whose prompt + greedy continuation pass the margin checks (the top of
    this file), trying seed, seed + 1, ...; returns (model, prompt, continuation, logits)."""
    for attempt in range(MAX_TRIES):
        s = seed + attempt
        model = build(cfg, s)
        if how == "bf16":  # the reference computes in f32 from the bf16-rounded weights
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
        rng = np.random.default_rng(s)
        for _ in range(PROMPT_TRIES):
            prompt = rng.integers(2, cfg["vocab_size"], PROMPT_LEN).astype(np.int32)
            got = greedy(model, prompt, cfg)
            if got is not None:
                break
        if got is None:
            continue
        cont, logits, records = got
        same, moved = same_choices_in_bf16(model, cfg, list(prompt) + list(cont), records)
        if not same:
            continue
        margin = min(float(router_margin(cfg, b).min()) for _, b, _ in records) if records else math.inf
        gaps = [np.diff(np.sort(logits[len(prompt) - 1 + i])[-2:])[0] / logits[len(prompt) - 1 + i].std()
                for i in range(NEW_TOKENS)]
        print(f"  seed {s} ({attempt + 1} tries): router margin {margin:.3f} (all-bf16 moves scores <= "
              f"{moved:.1e}), greedy gap >= {min(gaps):.3f} row std")
        return model, prompt, cont, logits
    raise RuntimeError(f"no seed in [{seed}, {seed + MAX_TRIES}) passes the margin checks")


def make(name, changes, how, out, seed):
    cfg = dict(BASE)
    cfg.update(changes)
    path = os.path.join(out, name)
    model, prompt, cont, logits = draw(cfg, how, seed)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)

    if how == "tf5":  # transformers' own config form, experts fused as the model holds them
        model.save_pretrained(path)
        for f in os.listdir(path):
            if f.endswith(".safetensors") or f.endswith(".json") and f != "config.json":
                os.remove(os.path.join(path, f))
        state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        if cfg["tie_word_embeddings"]:
            state.pop("lm_head.weight")
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        save_hub(hub_state(model, cfg), cfg, path, how)
        if cfg["moe_layer_freq"] == 1 and how != "nested":  # transformers reads the folder back to the same logits
            back = FAMILIES[cfg["model_type"]][1].from_pretrained(path, dtype=torch.float32).eval()
            with torch.no_grad():
                again = back(input_ids=torch.tensor([list(prompt) + list(cont)])).logits[0].numpy()
            err = np.linalg.norm(again - logits) / np.linalg.norm(logits)
            assert err < 1e-6, f"{name}: from_pretrained gives other logits (rel {err:.2e})"
    kdtr.save(os.path.join(path, "expected.kdtr"),
              {"prompt": prompt, "continuation": cont, "logits": logits.astype(np.float32)})
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f"{name}: {how}, {size / 1024:.0f} KiB, continuation {' '.join(map(str, cont[:8]))} ...")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "model"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", help="make just this fixture")
    args = ap.parse_args()
    torch.set_num_threads(1)
    for i, (name, (changes, how)) in enumerate(FIXTURES.items()):
        if args.only and name != args.only:
            continue
        make(name, changes, how, args.out, args.seed + 10000 * i)


if __name__ == "__main__":
    main()
