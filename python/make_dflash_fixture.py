"""Builds tests/fixtures/dflash/: a random DFlash drafter (z-lab's checkpoint layout) for the tiny
DeepseekV3 target tests/fixtures/model/bf16, and what tests/test_spec_dflash.c checks the C
drafter against.

    python3 python/make_dflash_fixture.py [--out tests/fixtures/dflash] [--seed 24]

expected.kdtr: prompt i32 [P] and root i32 [1] (the token after the prompt: the block's first
row); features f32 [P, nT * hidden]: transformers' hidden_states[l + 1] (the residual stream
after layer l) of the target's f32 forward over the prompt for each of target_layer_ids,
concatenated; logits f32 [block_size, vocab]: python/dflash_ref.py's float64 forward of the
block [root, mask, ...] at positions P .. over those features (rows 1 .. block_size - 1 are
depths 1 .., row 0 is unused by the drafter).
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref  # noqa: E402
import kdtr  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "dflash"))
    ap.add_argument("--target", default=os.path.join(here, "..", "tests", "fixtures", "model", "bf16"))
    ap.add_argument("--seed", type=int, default=24)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    tc = target.config
    cfg = dflash_ref.config(hid=tc.hidden_size, vocab=tc.vocab_size, mask=tc.vocab_size - 1, target_layers=(0, 1))
    gen = torch.Generator().manual_seed(a.seed)
    w = dflash_ref.random_weights(cfg, gen, scale=4.0)
    w = {k: v.to(torch.float32) for k, v in w.items()}   # what the checkpoint holds
    dflash_ref.save(a.out, cfg, w)
    prompt = torch.randint(2, tc.vocab_size - 1, (13,), generator=gen)
    root = int(torch.randint(2, tc.vocab_size - 1, (1,), generator=gen))
    with torch.no_grad():
        hs = target(input_ids=prompt[None], output_hidden_states=True).hidden_states
    feats = torch.cat([hs[l + 1][0] for l in cfg["dflash_config"]["target_layer_ids"]], dim=-1)
    embed = target.get_input_embeddings().weight.detach().double()
    head = target.lm_head.weight.detach().double()
    block = torch.tensor([root] + [cfg["dflash_config"]["mask_token_id"]] * (cfg["block_size"] - 1))
    w64 = {k: v.double() for k, v in w.items()}
    logits = dflash_ref.forward(cfg, w64, embed, head, feats.double(), block, len(prompt))
    kdtr.save(os.path.join(a.out, "expected.kdtr"), {
        "prompt": prompt.numpy().astype(np.int32), "root": np.array([root], np.int32),
        "features": feats.numpy().astype(np.float32), "logits": logits.numpy().astype(np.float32)})
    top = logits[1:].argmax(-1).tolist()
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"dflash fixture: {size / 1024:.0f} KiB, root {root}, depth argmax {top}")


if __name__ == "__main__":
    main()
