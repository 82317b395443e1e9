"""Builds tests/fixtures/mtp/: a tiny random DeepSeek-V3 checkpoint (python/make_fixtures.py's
BASE shape, 3 layers) WITH one MTP layer (model.layers.3, num_nextn_predict_layers = 1) in the
hub's layout, bf16, and what tests/test_spec_mtp.c checks the C MTP layer against.

    python3 python/make_mtp_fixture.py [--out tests/fixtures/mtp] [--seed 61]

expected.kdtr: prompt i32 [P]; hidden f32 [P, hidden]: transformers' final hidden states (after
the last norm) of the target over the prompt; logits f32 [P - 1, vocab]: python/mtp_ref.py's MTP
logits of rows (hidden[i], prompt[i + 1]), i = 0 .. P - 2, at positions i. Both from the saved
(bf16-rounded) weights read back in f32.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kdtr  # noqa: E402
import make_fixtures  # noqa: E402
import mtp_ref  # noqa: E402


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "mtp"))
    ap.add_argument("--seed", type=int, default=61)
    a = ap.parse_args()
    cfg = dict(make_fixtures.BASE, num_nextn_predict_layers=1, rope_scaling=None)
    # The MTP layer is drawn as a fourth decoder layer of the same model, then given its own pieces.
    full = make_fixtures.build(dict(cfg, num_hidden_layers=4), a.seed)
    state = make_fixtures.hub_state(full, cfg)
    mtp = mtp_ref.MTP(cfg)
    gen = torch.Generator().manual_seed(a.seed + 2)
    with torch.no_grad():
        mtp.enorm.copy_(1 + 0.1 * torch.randn(cfg["hidden_size"], generator=gen))
        mtp.hnorm.copy_(1 + 0.1 * torch.randn(cfg["hidden_size"], generator=gen))
        mtp.eh_proj.weight.copy_(torch.randn(mtp.eh_proj.weight.shape, generator=gen) / (2 * cfg["hidden_size"]) ** 0.5)
        mtp.block.norm.weight.copy_(1 + 0.1 * torch.randn(cfg["hidden_size"], generator=gen))
        mtp.head.weight.copy_(torch.randn(mtp.head.weight.shape, generator=gen) * 2.0 / cfg["hidden_size"] ** 0.5)
        mtp.block.embed_tokens.weight.copy_(state["model.embed_tokens.weight"])
    extra = {k: v for k, v in mtp.hub_state().items() if k.split(".")[3] in ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")}
    state = state | extra   # model.layers.3.{self_attn, mlp, norms} come from the fourth layer drawn
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(state, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})

    from transformers import AutoModelForCausalLM
    target = AutoModelForCausalLM.from_pretrained(a.out, dtype=torch.float32).eval()
    _, ref = mtp_ref.load(a.out)
    prompt = torch.randint(2, cfg["vocab_size"], (14,), generator=gen)
    with torch.no_grad():
        h = target.model(input_ids=prompt[None]).last_hidden_state
        logits, _ = ref(h[:, :-1], prompt[None, 1:])
    kdtr.save(os.path.join(a.out, "expected.kdtr"), {
        "prompt": prompt.numpy().astype(np.int32), "hidden": h[0].numpy().astype(np.float32),
        "logits": logits[0].numpy().astype(np.float32)})
    hit = (logits[0, :-1].argmax(-1) == prompt[2:]).float().mean()
    size = sum(os.path.getsize(os.path.join(a.out, f)) for f in os.listdir(a.out))
    print(f"mtp fixture: {size / 1024:.0f} KiB, {len(state)} tensors, random MTP guesses {hit:.2f} of the prompt")


if __name__ == "__main__":
    main()
