"""Builds the quantized checkpoints of tests/fixtures/model/ in the hub's exact layouts (docs/interfaces.md
section 4), each with its dequantized twin, and the bit-level bundle tests/fixtures/quant/unpack.kdtr.

    python3 python/make_quant_fixtures.py [--out tests/fixtures] [--only fp8|int4_k26|unpack]

Needs torch, transformers and compressed-tensors (pip install compressed-tensors).
  fp8/       DeepSeek-V3 / Kimi K2-Instruct: quantization_config {quant_method: fp8, fmt: e4m3,
             weight_block_size: [128, 128]}; every linear but lm_head and the router an F8_E4M3
             `weight` (torch.float8_e4m3fn) with an F32 `weight_scale_inv` per 128x128 block (the
             dense MLP's 160 rows and inputs make partial blocks); the rest BF16, the correction
             bias F32.
  int4_k26/  Kimi K2.6: config.json nests the DeepseekV3 config and its quantization_config
             (compressed-tensors, pack-quantized, 4-bit symmetric groups of 32, K2.6's ignore list)
             under text_config; names start with `language_model.`; the routed experts'
             weight_packed / weight_scale / weight_shape are what compressed-tensors'
             PackedQuantizationCompressor writes; the rest BF16; the vision tower in its own shard.
Each folder's twin/ holds the same model with every weight as the exact value it stands for
(quantized value times scale, in f32; bf16 where that is exact); expected.kdtr holds transformers' f32 logits of that model (the
prompt and greedy continuation chosen with python/make_fixtures.py's margin checks).
unpack.kdtr: INT4 words packed by compressed-tensors' pack_to_int32 with their int8 values
(unpack_from_int32) and a group-scaled f32 dequantization, including a partial group; an FP8
matrix with partial blocks, its scales and its dequantization; torch's value of all 256 e4m3 codes.
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
    from compressed_tensors.compressors import PackedQuantizationCompressor, pack_to_int32, unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    import make_fixtures as mf
except ImportError as e:
    print(f"make_quant_fixtures: skipped ({e}); needs torch, transformers and compressed-tensors")
    sys.exit(0)

FP8_BLOCK = 128
INT4_ARGS = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
INT4_SCHEME = QuantizationScheme(targets=["Linear"], weights=INT4_ARGS)
# Kimi K2.5 / K2.6's ignore list: attention, shared experts, dense MLPs, lm_head, vision stay bf16
K26_IGNORE = ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
              "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]

FIXTURES = {
    "fp8": dict(intermediate_size=160),
    "int4_k26": dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=32, n_group=1, topk_group=1,
                     rope_theta=50000.0),
}


def fp8_blocks(w):
    """DeepSeek's FP8 blocks of w [R, C]: e4m3 values, f32 scales [ceil(R/128), ceil(C/128)] (block
    amax / 448), and the exact f32 product."""
    R, C = w.shape
    rb, cb = math.ceil(R / FP8_BLOCK), math.ceil(C / FP8_BLOCK)
    pad = torch.zeros(rb * FP8_BLOCK, cb * FP8_BLOCK)
    pad[:R, :C] = w
    scale = (pad.view(rb, FP8_BLOCK, cb, FP8_BLOCK).abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12).float()
    full = scale.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:R, :C]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale, q.float() * full


def int4_groups(w):
    """compressed-tensors' pack-quantized INT4 of the bf16 weight w [R, C]: its state dict
    (weight_packed, weight_scale, weight_shape) and the exact f32 product."""
    w = w.to(torch.bfloat16)
    R, C = w.shape
    g = w.float().view(R, C // 32, 32)
    scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), INT4_ARGS)
    scale = scale.to(torch.bfloat16)
    out = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, INT4_SCHEME)
    q = unpack_from_int32(out["weight_packed"], 4, out["weight_shape"])
    exact = q.float() * scale.float().repeat_interleave(32, 1)
    back = PackedQuantizationCompressor.decompress(dict(out), INT4_SCHEME)["weight"]
    assert torch.equal(back.to(torch.bfloat16), exact.to(torch.bfloat16)), "compressed-tensors' decompress disagrees"
    return out, exact


def quantized(name, kind):
    """Whether hub tensor `name` is a quantized linear weight in this kind of checkpoint."""
    if not name.endswith("_proj.weight"):
        return False
    if kind == "fp8":
        return True
    return ".mlp.experts." in name  # int4: the routed experts only (K26_IGNORE keeps the rest)


def load_hub(model, cfg, hub):
    """Puts hub-layout tensors back into the transformers model (experts fused as it holds them)."""
    state = model.state_dict()
    inter = cfg["moe_intermediate_size"]
    for k in state:
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            state[k] = torch.stack([torch.cat([hub[f"{pre}{e}.gate_proj.weight"], hub[f"{pre}{e}.up_proj.weight"]])
                                    for e in range(state[k].shape[0])])
            assert state[k].shape[1] == 2 * inter
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            state[k] = torch.stack([hub[f"{pre}{e}.down_proj.weight"] for e in range(state[k].shape[0])])
        elif k in hub:
            state[k] = hub[k]
    model.load_state_dict(state)


LAST = {}  # the stored tensors of the model the last build made


def quant_build(kind, build):
    """make_fixtures.build, then every weight replaced by what the checkpoint stores: quantized
    linears by their exact products, the rest rounded to bf16 (the correction bias stays f32)."""
    def wrapped(cfg, seed):
        model = build(cfg, seed)
        hub = mf.hub_state(model, cfg)
        stored, exact = {}, {}
        for k, v in hub.items():
            if quantized(k, kind) and kind == "fp8":
                q, scale, exact[k] = fp8_blocks(v)
                stored[k], stored[k + "_scale_inv"] = q, scale
            elif quantized(k, kind):
                out, exact[k] = int4_groups(v)
                base = k[: -len(".weight")]
                for part, t in out.items():
                    stored[f"{base}.{part}"] = t
            elif k.endswith("e_score_correction_bias"):
                stored[k], exact[k] = v, v
            else:
                stored[k] = v.to(torch.bfloat16)
                exact[k] = stored[k].float()
        load_hub(model, cfg, exact)
        LAST.update(stored=stored, exact=exact)
        return model
    return wrapped


def save(state, path, shards=None):
    """model.safetensors, or shards {file: [names]} with model.safetensors.index.json."""
    os.makedirs(path, exist_ok=True)
    if shards is None:
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for fname, names in shards.items():
        save_file({k: state[k] for k in names}, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in names})
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def bf16_if_exact(v):
    """v in bf16 where that loses nothing (the weights stored bf16), else f32 (the dequantized ones)."""
    v = v.float().contiguous()
    return v.to(torch.bfloat16) if torch.equal(v.to(torch.bfloat16).float(), v) else v


def make(name, out, seed):
    cfg = dict(mf.BASE)
    cfg.update(FIXTURES[name])
    kind = "fp8" if name == "fp8" else "int4"
    build = mf.build
    mf.build = quant_build(kind, build)
    try:
        model, prompt, cont, logits = mf.draw(cfg, "hub", seed)
    finally:
        mf.build = build
    stored, exact = LAST["stored"], LAST["exact"]
    path = os.path.join(out, "model", name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    if kind == "fp8":
        qcfg = dict(cfg, quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                              "weight_block_size": [FP8_BLOCK, FP8_BLOCK]})
        save(stored, path)
        twin_cfg = cfg
    else:
        text = dict(cfg, model_type="kimi_k2")
        qc = QuantizationConfig(config_groups={"group_0": INT4_SCHEME}, format="pack-quantized", ignore=K26_IGNORE,
                                quantization_status="compressed").model_dump()
        qcfg = mf.nest(dict(text, quantization_config=qc), "KimiK25ForConditionalGeneration", "kimi_k25")
        lm = {"language_model." + k: v for k, v in stored.items()}
        vision = mf.vision_stub(torch.Generator().manual_seed(7))
        save(lm | vision, path, {"model-00001-of-00002.safetensors": sorted(lm),
                                 "model-00002-of-00002.safetensors": sorted(vision)})
        twin_cfg = mf.nest(text, "KimiK25ForConditionalGeneration", "kimi_k25")
        exact = {"language_model." + k: v for k, v in exact.items()}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(qcfg, f, indent=2)
    twin = os.path.join(path, "twin")
    save({k: bf16_if_exact(v) for k, v in exact.items()}, twin)
    with open(os.path.join(twin, "config.json"), "w") as f:
        json.dump(twin_cfg, f, indent=2)
    kdtr.save(os.path.join(path, "expected.kdtr"),
              {"prompt": prompt, "continuation": cont, "logits": logits.astype(np.float32)})
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f != "twin")
    print(f"{name}: {size / 1024:.0f} KiB (twin apart), continuation {' '.join(map(str, cont[:8]))} ...")


def make_unpack(out, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = 5, 72  # 72 inputs: two groups of 32 and a partial one of 8; 9 words a row
    q = torch.randint(-8, 8, (rows, cols), generator=gen, dtype=torch.int8)
    q[0, :16] = torch.arange(-8, 8, dtype=torch.int8)  # every value, in order, in the first two words
    packed = pack_to_int32(q, 4)
    assert torch.equal(unpack_from_int32(packed, 4, torch.Size([rows, cols])), q)
    scale = (torch.rand(rows, 3, generator=gen) * 0.1 + 0.01).to(torch.bfloat16)
    deq = q.float() * scale.float().repeat_interleave(32, 1)[:, :cols]
    w = torch.randn(130, 200, generator=gen) * 3  # partial 128x128 blocks on both edges
    fq, fs, fdeq = fp8_blocks(w)
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    path = os.path.join(out, "quant")
    os.makedirs(path, exist_ok=True)
    kdtr.save(os.path.join(path, "unpack.kdtr"), {
        "int4.packed": packed.numpy(), "int4.values": q.numpy(),
        "int4.scale": kdtr.BF16(scale.view(torch.int16).numpy().view(np.uint16)),
        "int4.dequant": deq.numpy(), "int4.group": np.int32(32),
        "fp8.weight": fq.view(torch.uint8).numpy(), "fp8.scale_inv": fs.numpy(), "fp8.dequant": fdeq.numpy(),
        "fp8.block": np.int32(FP8_BLOCK), "fp8.codes": codes.numpy()})
    print(f"unpack: int4 [{rows}, {cols}] group 32, fp8 [130, 200] blocks of {FP8_BLOCK}, 256 e4m3 codes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--only", help="fp8, int4_k26 or unpack")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.only in (None, "unpack"):
        make_unpack(args.out, args.seed)
    for i, name in enumerate(FIXTURES):
        if args.only in (None, name):
            make(name, args.out, args.seed + 10000 * i)


if __name__ == "__main__":
    main()
