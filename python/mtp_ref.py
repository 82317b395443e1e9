"""A PyTorch reference of DeepSeek-V3's multi-token-prediction (MTP) layer, written from the
DeepSeek-V3 report (section 2.2) and the hub checkpoint's names, for the engine's tests and for
python/train_drafters.py. transformers' DeepseekV3 has no MTP module; the layer's decoder block is
transformers' own DeepseekV3 decoder layer, run as a one-layer DeepseekV3Model whose final norm is
shared_head.norm.

Checkpoint (model.layers.N, N = num_hidden_layers, num_nextn_predict_layers >= 1): enorm, hnorm
[hid], eh_proj [hid, 2 * hid], the decoder layer's usual tensors, shared_head.norm [hid],
shared_head.head [V, hid] (else the model's lm_head), embed_tokens [V, hid] (else the model's).

Row i of the MTP sequence: x_i = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)]) at position i, h_i
the target's final hidden state (after its last norm) at position i; causal attention over rows
0 .. i; logits_i = head(shared_head.norm(layer(x))_i) predict t_{i+2}. The engine chains further
depths on the layer's own normed output state in place of h.
"""
import copy
import json
import os

import torch
from safetensors.torch import load_file
from transformers import DeepseekV3Config, DeepseekV3Model


def is_moe(cfg, layer):
    return cfg.get("n_routed_experts") is not None and layer >= cfg["first_k_dense_replace"] and layer % cfg["moe_layer_freq"] == 0


class MTP(torch.nn.Module):
    """The MTP layer of a hub config dict cfg (one decoder layer as model.layers.N is)."""

    def __init__(self, cfg):
        super().__init__()
        n, hid, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
        one = copy.deepcopy(cfg)
        one.update(num_hidden_layers=1, first_k_dense_replace=0 if is_moe(cfg, n) else 1, moe_layer_freq=1)
        one.pop("mlp_layer_types", None)
        self.n = n
        self.block = DeepseekV3Model(DeepseekV3Config.from_dict(one)).float()
        self.block.config._attn_implementation = "eager"
        self.enorm = torch.nn.Parameter(torch.ones(hid))
        self.hnorm = torch.nn.Parameter(torch.ones(hid))
        self.eh_proj = torch.nn.Linear(2 * hid, hid, bias=False)
        self.head = torch.nn.Linear(hid, V, bias=False)
        self.eps = cfg["rms_norm_eps"]

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, h, next_tokens, positions=None):
        """h [B, T, hid] the target's final states, next_tokens [B, T]: (logits [B, T, V], state [B, T, hid])."""
        e = self.block.embed_tokens(next_tokens)
        x = self.eh_proj(torch.cat([self.rms(e, self.enorm), self.rms(h, self.hnorm)], dim=-1))
        out = self.block(inputs_embeds=x, position_ids=positions).last_hidden_state
        return self.head(out), out

    def hub_state(self):
        """This layer's tensors under the checkpoint's names (model.layers.N.*)."""
        p = f"model.layers.{self.n}."
        out = {p + "enorm.weight": self.enorm, p + "hnorm.weight": self.hnorm, p + "eh_proj.weight": self.eh_proj.weight,
               p + "shared_head.norm.weight": self.block.norm.weight, p + "shared_head.head.weight": self.head.weight,
               p + "embed_tokens.weight": self.block.embed_tokens.weight}
        for k, v in self.block.layers[0].state_dict().items():
            out[p + k] = v
        return {k: v.detach().clone().contiguous() for k, v in out.items()}

    def load_hub(self, state):
        """The inverse of hub_state; embed_tokens and head fall back to the model's."""
        p = f"model.layers.{self.n}."
        with torch.no_grad():
            self.enorm.copy_(state[p + "enorm.weight"])
            self.hnorm.copy_(state[p + "hnorm.weight"])
            self.eh_proj.weight.copy_(state[p + "eh_proj.weight"])
            self.block.norm.weight.copy_(state[p + "shared_head.norm.weight"])
            self.head.weight.copy_(state.get(p + "shared_head.head.weight", state.get("lm_head.weight")))
            self.block.embed_tokens.weight.copy_(state.get(p + "embed_tokens.weight", state["model.embed_tokens.weight"]))
        layer = {k[len(p):]: v for k, v in state.items() if k.startswith(p) and k[len(p):].split(".")[0] in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")}
        fused = {}
        E = self.block.config.n_routed_experts
        if E and "mlp.experts.0.gate_proj.weight" in layer:  # the hub's one tensor per expert -> transformers' fused
            fused["mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([layer.pop(f"mlp.experts.{e}.gate_proj.weight"), layer.pop(f"mlp.experts.{e}.up_proj.weight")]) for e in range(E)])
            fused["mlp.experts.down_proj"] = torch.stack([layer.pop(f"mlp.experts.{e}.down_proj.weight") for e in range(E)])
        self.block.layers[0].load_state_dict(layer | fused, strict=True)


def load(path):
    """(config dict, MTP module in float32) from a checkpoint folder with one model.safetensors."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    state = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    m = MTP(cfg)
    m.load_hub(state)
    return cfg, m.eval()
