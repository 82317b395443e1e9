"""Builds the tiny DeepseekV3 checkpoints of tests/fixtures/model/ with transformers, and the
logits and greedy continuations tests/test_model.c checks the C forward against.

    python3 python/make_fixtures.py [--out tests/fixtures/model] [--seed 1234]

Needs torch and transformers (5.x). Each fixture folder holds a checkpoint in the hub's form
(SPEC section 4: config.json with rope_scaling / rope_theta at the top level, one tensor per
expert) or, for `tf5`, transformers 5's own form (save_pretrained's config.json with
rope_parameters, experts fused in model.safetensors), plus expected.kdtr:
  prompt i32 [P], continuation i32 [32] (greedy), logits f32 [P + 32, vocab]: transformers'
  f32 logits of every row of prompt + continuation in one forward.
Weights are drawn with a fixed seed and scaled up from transformers' init so that logits are
far from flat; e_score_correction_bias is random. Every hub folder is read back with
from_pretrained and must give the same logits, so the files say what the model computed.

The fixtures exercise: q_lora_rank set / null, YaRN with mscale != mscale_all_dim, default rope,
first_k_dense_replace 0 / 1, moe_layer_freq 2 (transformers ignores the field, so the model's
MLPs are swapped the way DeepSeek's reference code builds them), grouped routing (n_group 4,
topk_group 2) and one group, norm_topk_prob true / false, tied embeddings, a sharded checkpoint,
bf16 weights, rope_interleave false, and the fused layout.
"""
import argparse
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
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP
except ImportError as e:  # the CI machine has neither; the fixtures are committed
    print(f"make_fixtures: skipped ({e}); needs torch and transformers")
    sys.exit(0)

PROMPT_LEN = 8
NEW_TOKENS = 32

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
}


def is_moe(cfg, layer):
    return (cfg["n_routed_experts"] is not None and layer >= cfg["first_k_dense_replace"]
            and layer % cfg["moe_layer_freq"] == 0)


def build(cfg, seed):
    """The transformers model for a hub config, with DeepSeek's moe_layer_freq rule applied."""
    config = DeepseekV3Config.from_dict(dict(cfg))
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).float().eval()
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
            else:  # [.., out, in] projections: unit-variance outputs
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
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


def save_hub(state, cfg, path, how):
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


def greedy(model, prompt):
    """Greedy continuation by full forwards, and the f32 logits of every row."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
        logits = model(input_ids=torch.tensor([ids])).logits[0].float().numpy()
    cont = np.array(ids[len(prompt):], np.int32)
    # Each greedy step must be decided by a clear margin, or the C side could differ by rounding.
    for i in range(NEW_TOKENS):
        row = np.sort(logits[len(prompt) - 1 + i])
        if row[-1] - row[-2] < 1e-3:
            raise RuntimeError(f"near-tie at step {i} ({row[-1] - row[-2]:.2e}): pick another seed")
    assert (np.argmax(logits[len(prompt) - 1:-1], axis=1) == cont).all()
    return cont, logits


def make(name, changes, how, out, seed):
    cfg = dict(BASE)
    cfg.update(changes)
    path = os.path.join(out, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    model = build(cfg, seed)
    if how == "bf16":  # the reference computes in f32 from the bf16-rounded weights
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, cfg["vocab_size"], PROMPT_LEN).astype(np.int32)
    cont, logits = greedy(model, prompt)

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
        if cfg["moe_layer_freq"] == 1:  # transformers reads the folder back to the same logits
            back = DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
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
        make(name, changes, how, args.out, args.seed + 100 * i)


if __name__ == "__main__":
    main()
