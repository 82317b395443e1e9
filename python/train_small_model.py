"""Trains the small DeepSeek-V3-architecture model the project ships: a target with
Kimi K2's / DeepSeek-V3's MLA shapes (kv_lora_rank 512, rope 64, nope 128, v 128), sigmoid noaux_tc MoE
and YaRN rope, and a 1-layer draft model of the same vocabulary, on the Python sources of the installed
packages, with a byte-level BPE tokenizer trained here by `tokenizers`.

    python3 python/train_small_model.py [--out models] [--budget-s 330] [--tiny]

Writes OUT/kdt-small/ and OUT/kdt-small-draft/ in the hub's layout (docs/interfaces.md section 4: config.json with
rope_scaling, bf16 safetensors, one tensor per expert, shards <= 15 MB), each with tokenizer.json and
tokenizer_config.json; OUT/kdt-small/ also gets train_log.txt, eval.json, README.md and the held-out
prompts (heldout_prompts.jsonl: text; heldout_prompts.ids: bos + ids, one prompt per line).

Data: the *.py files under the running python's site-packages, deduplicated by content (sha1); over
--max-bytes, the files of smallest sha1 up to it (a deterministic sample of every package); a file
whose sha1 % HOLDOUT_MOD == 0 is held out (evaluation and prompts only). The whole run, data preparation
included, stops training at --budget-s so that it fits one GPU call. --tiny: a few MB, a small vocabulary and a few dozen steps on the CPU, for checking
the pipeline and the engine's loader before a GPU run.
"""
import argparse
import copy
import hashlib
import json
import math
import os
import site
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

BOS, EOS, USER, ASSISTANT = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
HOLDOUT_MOD = 50
N_PROMPTS = 200
SHARD_BYTES = 15 * 1000 * 1000

# DeepSeek-V3's chat template (its tokenizer_config.json), with the spaces between tags removed (the copy
# found had them and rendered them before the bos token); '\\n' is Jinja's newline escape.
CHAT_TEMPLATE = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + "
    "tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + "
    "'<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}"
    "{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + "
    "'```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor %}"
    "{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + "
    "'<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}"
    "{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}"
    "{{'\\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}"
    "{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}"
)

T0 = time.time()
LOG_PATH = None  # train_log.txt, written line by line so that a crash keeps what came before


def log(*args):
    line = f"[{time.time() - T0:7.1f}s] " + " ".join(str(a) for a in args)
    print(line, flush=True)
    if LOG_PATH:
        with open(LOG_PATH, "a") as f:
            f.write(line + "\n")


# ---- data ----

def site_dirs():
    dirs = []
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        if os.path.isdir(d) and os.path.realpath(d) not in [os.path.realpath(x) for x in dirs]:
            dirs.append(d)
    return dirs


def collect_files(max_bytes, max_file_bytes=400_000):
    """(sha1 int, path, text) of distinct *.py files, sorted by path; over max_bytes, a sample in sha1
    order (deterministic, and spread over every package rather than the first ones by name)."""
    paths = []
    for root in site_dirs():
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            paths += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    paths.sort()
    seen, files = set(), []
    for p in paths:
        try:
            raw = open(p, "rb").read()
        except OSError:
            continue
        if not raw or len(raw) > max_file_bytes:
            continue
        h = hashlib.sha1(raw).digest()
        if h in seen:
            continue
        seen.add(h)
        try:
            files.append((int.from_bytes(h, "big"), p, raw.decode("utf-8")))
        except UnicodeDecodeError:
            continue
    available = sum(len(f[2]) for f in files)
    if available > max_bytes:
        kept, total = [], 0
        for f in sorted(files, key=lambda f: f[0]):
            kept.append(f)
            total += len(f[2])
            if total >= max_bytes:
                break
        files = sorted(kept, key=lambda f: f[1])
    return files, len(paths), available


def make_prompts(held, n, lo=64, hi=256):
    """From held-out files: text from a line starting a def or class, whole lines, lo..hi chars."""
    prompts = []
    for _, path, text in sorted(held, key=lambda f: f[0]):
        lines = text.splitlines(keepends=True)
        for i, line in enumerate(lines):
            s = line.lstrip()
            if not (s.startswith("def ") or s.startswith("class ")) or len(line) > hi:
                continue
            out = ""
            for ln in lines[i:]:
                if len(out) + len(ln) > hi:
                    break
                out += ln
                if len(out) >= lo:
                    break
            if lo <= len(out) <= hi:
                prompts.append({"text": out, "source": os.path.basename(path)})
                break
        if len(prompts) >= n:
            break
    return prompts


def train_tokenizer(texts, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[BOS, EOS, USER, ASSISTANT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos)])
    return tok


def save_tokenizer(tok, path, max_len):
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
           "clean_up_tokenization_spaces": False, "legacy": True, "model_max_length": max_len,
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)


def encode_files(tok, texts, eos):
    """One token stream: each file's ids (bos first, from the post-processor) then eos."""
    out = []
    for i in range(0, len(texts), 512):
        for enc in tok.encode_batch(texts[i:i + 512]):
            out.extend(enc.ids)
            out.append(eos)
    return np.asarray(out, dtype=np.int32)


# ---- models ----

def hub_config(vocab, tiny, draft):
    cfg = dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
        vocab_size=vocab, hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, moe_layer_freq=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        scoring_func="sigmoid", topk_method="noaux_tc", hidden_act="silu",
        rms_norm_eps=1e-6, max_position_embeddings=2048, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, num_nextn_predict_layers=0,
        initializer_range=0.02, bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16", use_cache=True,
    )
    if draft:  # one dense layer, narrower; same vocabulary and attention shapes
        cfg.update(hidden_size=192, intermediate_size=512, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, q_lora_rank=96, first_k_dense_replace=1)
    if tiny:
        cfg.update(num_hidden_layers=1 if draft else 3)
    return cfg


def build(cfg, device, attn):
    """The model on device with attention `attn` (sdpa) and transformers' default experts kernel (grouped_mm
    where torch has it), each falling back to eager (the plain loop) where a trial forward and backward fails
    (MLA's q and v head dims differ: 192 and 128)."""
    config = DeepseekV3Config.from_dict(dict(cfg))
    model = DeepseekV3ForCausalLM(config).to(device)
    default_experts = getattr(model.config, "_experts_implementation", None)
    for impl, experts in ((attn, default_experts), ("eager", default_experts), (attn, "eager"), ("eager", "eager")):
        try:
            model.config._attn_implementation = impl
            if experts != default_experts:
                model.config._experts_implementation = experts
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                model(input_ids=torch.zeros(2, 8, dtype=torch.long, device=device)).logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
            log(f"attention ({cfg['num_hidden_layers']} layers): {impl}; experts: {experts}")
            return model
        except Exception as e:
            log(f"attention {impl}, experts {experts} failed: {type(e).__name__}: {e}")
    raise SystemExit("no attention and experts implementation works")


def n_params(model):
    return sum(p.numel() for p in model.parameters())


class Balancer:
    """DeepSeek-V3's auxiliary-loss-free balancing: after each step, every MoE layer's
    e_score_correction_bias moves by `rate` towards the experts that got fewer tokens than the mean.
    The hooks recompute each router's choice from its input (independent of the router's return form)."""

    def __init__(self, model, rate):
        self.rate, self.gates, self.counts, self.total = rate, [], {}, {}
        self.top_k = model.config.num_experts_per_tok
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if gate is None or not hasattr(gate, "e_score_correction_bias"):
                continue
            self.gates.append((i, gate))
            gate.register_forward_hook(self.hook(i))

    def hook(self, i):
        def fn(mod, inputs, output):
            if not self.active:
                return
            with torch.no_grad():
                x = inputs[0].reshape(-1, mod.weight.shape[1]).float()
                s = torch.sigmoid(x @ mod.weight.float().t()) + mod.e_score_correction_bias
                idx = s.topk(self.top_k, dim=-1)[1]
                c = torch.bincount(idx.flatten(), minlength=s.shape[1]).float()
                self.counts[i] = self.counts.get(i, 0) + c
        return fn

    active = True

    def step(self):
        with torch.no_grad():
            for i, gate in self.gates:
                c = self.counts.get(i)
                if c is None:
                    continue
                gate.e_score_correction_bias += self.rate * torch.sign(c.mean() - c)
                self.total[i] = self.total.get(i, 0) + c
        self.counts = {}

    def loads(self, reset=True):
        """Per layer: each expert's share of the routed tokens since the last call, in percent."""
        out = {i: [round(100 * float(v) / max(1.0, float(c.sum())), 1) for v in c] for i, c in self.total.items()}
        if reset:
            self.total = {}
        return out


def hub_state(model):
    """state_dict in the hub's layout: one tensor per expert (transformers 5 fuses them), bf16."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().float().cpu().contiguous()
        if k.endswith("mlp.experts.gate_up_proj"):
            pre, inter = k[: -len("gate_up_proj")], v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].clone()
                out[f"{pre}{e}.up_proj.weight"] = v[e, inter:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v
    # the router's bias is f32 in DeepSeek-V3's checkpoints; everything else bf16
    return {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)) for k, v in out.items()}


def save_hub(model, cfg, path, shard_bytes):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    state = hub_state(model)
    for old in os.listdir(path):
        if old.startswith("model") and old.endswith((".safetensors", ".json")):
            os.remove(os.path.join(path, old))
    names = list(state)  # state_dict order: layer by layer
    shards, cur, size = [], [], 0
    for k in names:
        b = state[k].numel() * state[k].element_size()
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(k)
        size += b
    shards.append(cur)
    if len(shards) == 1:
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: state[k] for k in part}, os.path.join(path, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---- training ----

def batches(stream, seq, bs, gen):
    n = (len(stream) - 1) // seq
    while True:
        for start in torch.randperm(n, generator=gen).split(bs):
            if len(start) < bs:
                continue
            idx = (start * seq).unsqueeze(1) + torch.arange(seq + 1)
            yield torch.from_numpy(stream[idx.numpy()].astype(np.int64))


@torch.no_grad()
def perplexity(model, stream, seq, bs, device, max_seqs):
    model.eval()
    n = min((len(stream) - 1) // seq, max_seqs)
    tot, cnt = 0.0, 0
    for s in range(0, n, bs):
        idx = (torch.arange(s, min(n, s + bs)) * seq).unsqueeze(1) + torch.arange(seq + 1)
        x = torch.from_numpy(stream[idx.numpy()].astype(np.int64)).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        tot += float(loss)
        cnt += x[:, 1:].numel()
    model.train()
    return math.exp(tot / max(1, cnt)), cnt


@torch.no_grad()
def greedy(model, ids, n, device):
    model.eval()
    x = torch.tensor([ids], device=device)
    try:
        out = model.generate(x, max_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=1)[0, len(ids):]
    except Exception as e:  # a plain loop, without the cache, if generate's API differs
        log(f"generate failed ({type(e).__name__}: {e}); greedy loop without a cache")
        for _ in range(n):
            nxt = model(input_ids=x).logits[:, -1].argmax(-1, keepdim=True)
            x = torch.cat([x, nxt], 1)
        out = x[0, len(ids):]
    model.train()
    return out.tolist()


def readback_diff(model, path, check, device):
    """max |logit diff| / max |logit| between the model with its weights rounded to bf16 (what was saved)
    and from_pretrained(path) in f32, on one prompt."""
    try:
        back = DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        ref_model = copy.deepcopy(model).eval()
        with torch.no_grad():
            for p in ref_model.parameters():
                p.copy_(p.bfloat16().float())
            ref = ref_model(input_ids=check).logits
            got = back(input_ids=check).logits
        return float((ref - got).abs().max() / ref.abs().max())
    except Exception as e:  # a check only; the folder is written
        return f"not checked: {type(e).__name__}: {e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="models")
    ap.add_argument("--budget-s", type=float, default=330, help="the whole run's wall time; training stops in time")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--max-bytes", type=float, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    tiny = a.tiny
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    max_bytes = int(a.max_bytes or (3e6 if tiny else 160e6))
    seq = a.seq or (64 if tiny else 512)
    bs = a.batch or (8 if tiny else 64)
    lr = a.lr or (3e-3 if tiny else 2e-3)
    vocab = 1024 if tiny else 8192
    holdout = 10 if tiny else HOLDOUT_MOD
    torch.manual_seed(a.seed)
    tdir, ddir = os.path.join(a.out, "kdt-small"), os.path.join(a.out, "kdt-small-draft")
    os.makedirs(tdir, exist_ok=True)
    os.makedirs(ddir, exist_ok=True)
    global LOG_PATH
    LOG_PATH = os.path.join(tdir, "train_log.txt")
    open(LOG_PATH, "w").close()
    log(f"device {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}), torch {torch.__version__},"
        f" tiny {tiny}, budget {a.budget_s} s")

    files, n_paths, available = collect_files(max_bytes)
    held = [f for f in files if f[0] % holdout == 0]
    train = [f for f in files if f[0] % holdout != 0]
    nb = lambda fs: sum(len(f[2].encode()) for f in fs)
    log(f"data: {n_paths} .py files under {site_dirs()}, {available / 1e6:.0f} MB distinct; {len(files)} kept ({nb(files) / 1e6:.1f} MB),"
        f" {len(train)} train ({nb(train) / 1e6:.1f} MB), {len(held)} held out (sha1 % {holdout} == 0)")
    pkgs = sorted({os.path.relpath(p, d).split(os.sep)[0] for _, p, _ in files for d in site_dirs() if p.startswith(d)})
    prompts = make_prompts(held, N_PROMPTS)
    log(f"held-out prompts: {len(prompts)}")

    # the tokenizer learns from about 25 MB (time): every k-th training file, so all packages have a say
    stride = max(1, round(nb(train) / 25e6))
    tok = train_tokenizer([f[2] for f in train[::stride]], vocab)
    vocab = tok.get_vocab_size()
    for d in (tdir, ddir):
        save_tokenizer(tok, d, 2048)
    eos = tok.token_to_id(EOS)
    log(f"tokenizer: byte-level BPE, vocab {vocab}, bos {tok.token_to_id(BOS)} eos {eos}")
    train_ids = encode_files(tok, [f[2] for f in train], eos)
    held_ids = encode_files(tok, [f[2] for f in held], eos)
    log(f"tokens: train {len(train_ids)}, held out {len(held_ids)}; {nb(train) / max(1, len(train_ids)):.2f} bytes/token")
    with open(os.path.join(tdir, "heldout_prompts.jsonl"), "w") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    prompt_ids = [tok.encode(p["text"]).ids for p in prompts]
    with open(os.path.join(tdir, "heldout_prompts.ids"), "w") as f:
        for ids in prompt_ids:
            f.write(" ".join(map(str, ids)) + "\n")

    tcfg, dcfg = hub_config(vocab, tiny, False), hub_config(vocab, tiny, True)
    target, draft = build(tcfg, device, a.attn), build(dcfg, device, a.attn)
    pt, pd = n_params(target), n_params(draft)
    log(f"params: target {pt / 1e6:.2f} M, draft {pd / 1e6:.2f} M, together {2 * (pt + pd) / 1e6:.1f} MB in bf16")
    balancer = Balancer(target, 3e-3)
    opt_t = torch.optim.AdamW(target.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda")
    opt_d = torch.optim.AdamW(draft.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(a.seed)
    it = batches(train_ids, seq, bs, gen)
    reserve = 25 if tiny else 45  # seconds kept for evaluation and saving
    deadline = a.budget_s - reserve
    max_steps = a.max_steps or (40 if tiny else 10**9)
    warmup = 10 if tiny else 100
    step, tokens, t_train, last_loads = 0, 0, time.time(), {}
    est_steps = None  # the cosine schedule's length: estimated from the first steps' speed
    target.train()
    draft.train()
    while step < max_steps:
        now = time.time() - T0
        if now >= deadline:
            break
        if step == 20:
            t20 = time.time()
        if step in (20, 200) or (est_steps is None and tiny):  # again at 200: past the first steps' warm-up
            per = (time.time() - (t_train if step <= 20 else t20)) / max(1, step if step <= 20 else step - 20)
            est_steps = min(max_steps, step + int((deadline - now) / max(per, 1e-6))) if step else max_steps
            log(f"schedule: {est_steps} steps estimated ({per * 1e3:.0f} ms/step)")
        total = est_steps or 10**9
        frac = min(1.0, step / max(1, total))
        cur_lr = lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for o in (opt_t, opt_d):
            for g in o.param_groups:
                g["lr"] = cur_lr
        x = next(it).to(device, non_blocking=True)
        inp, tgt = x[:, :-1], x[:, 1:]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            lt = target(input_ids=inp).logits
            loss_t = F.cross_entropy(lt.float().reshape(-1, vocab), tgt.reshape(-1))
            ld = draft(input_ids=inp).logits
            ce_d = F.cross_entropy(ld.float().reshape(-1, vocab), tgt.reshape(-1))
            # the draft also learns the target's distribution (distillation), once the target knows something
            soft = F.softmax(lt.detach().float(), -1).reshape(-1, vocab)
            kd = -(soft * F.log_softmax(ld.float(), -1).reshape(-1, vocab)).sum(-1).mean()
            w = min(0.5, step / max(1, 0.3 * total))
            loss_d = (1 - w) * ce_d + w * kd
        opt_t.zero_grad(set_to_none=True)
        opt_d.zero_grad(set_to_none=True)
        (loss_t + loss_d).backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_t.step()
        opt_d.step()
        balancer.step()
        step += 1
        tokens += inp.numel()
        if step % (5 if tiny else 50) == 0 or step == 1:
            el = time.time() - t_train
            log(f"step {step} loss {loss_t.item():.3f} draft_ce {ce_d.item():.3f} lr {cur_lr:.2e} tokens {tokens}"
                f" ({tokens / el:.0f} tok/s)")
        if step % (20 if tiny else 500) == 0:
            last_loads = balancer.loads()
            log(f"expert loads (% of routed tokens per expert, per MoE layer) since the last report: {last_loads}")
    t_train = time.time() - t_train
    if balancer.total:
        last_loads = balancer.loads()
    log(f"training: {step} steps, {tokens} tokens, {t_train:.0f} s; expert loads of the last steps {last_loads}")
    balancer.active = False
    torch.backends.cuda.matmul.allow_tf32 = False  # the samples in full f32: the engine's CPU check compares them
    with torch.no_grad():  # from here on the models are what is saved: bf16 weights (the router's bias stays f32)
        for m in (target, draft):
            for prm in m.parameters():
                prm.copy_(prm.bfloat16().float())

    ev_seqs = 64 if tiny else 400
    ppl_t, n_ev = perplexity(target, held_ids, seq, bs, device, ev_seqs)
    ppl_d, _ = perplexity(draft, held_ids, seq, bs, device, ev_seqs)
    log(f"held-out perplexity over {n_ev} tokens: target {ppl_t:.3f}, draft {ppl_d:.3f}")

    shard = 4e6 if tiny else SHARD_BYTES  # --tiny shards too, so that path is checked
    save_hub(target, tcfg, tdir, shard)
    save_hub(draft, dcfg, ddir, shard)
    # read back what was written: transformers must compute the same logits from the hub folder
    check = torch.tensor([prompt_ids[0] if prompt_ids else [0, 5, 6, 7]], device=device)
    diffs = {name: readback_diff(m, d, check, device) for name, m, d in (("target", target, tdir), ("draft", draft, ddir))}
    log(f"read back from the hub folders (bf16 weights), max |diff| / max |logit|: {diffs}")

    samples = []
    for p, ids in list(zip(prompts, prompt_ids))[:4]:
        out = greedy(target, ids, 32 if tiny else 128, device)
        samples.append({"prompt": p["text"], "continuation": tok.decode(out), "ids": out})
    for i, smp in enumerate(samples):
        log(f"greedy sample {i} (target, transformers, f32) from a held-out prompt:\n----- prompt -----\n"
            + smp["prompt"] + "\n----- continuation -----\n" + smp["continuation"] + "\n-----")
    ev = {"heldout_perplexity": {"target": ppl_t, "draft": ppl_d}, "heldout_tokens": n_ev,
          "params": {"target": pt, "draft": pd}, "steps": step, "train_tokens": tokens, "train_seconds": t_train,
          "final_loss": {"target": loss_t.item(), "draft_ce": ce_d.item()} if step else None,
          "vocab": vocab, "seq": seq, "batch": bs, "lr": lr, "tiny": tiny, "readback_rel_diff": diffs,
          "samples": samples, "device": str(device)}
    with open(os.path.join(tdir, "eval.json"), "w") as f:
        json.dump(ev, f, indent=2, ensure_ascii=False)
    write_card(tdir, tcfg, dcfg, ev, files, train, held, pkgs, prompts)
    log("done")


def write_card(tdir, tcfg, dcfg, ev, files, train, held, pkgs, prompts):
    mb = lambda fs: sum(len(f[2].encode()) for f in fs) / 1e6
    s = ev["samples"][0] if ev["samples"] else None
    card = f"""# kdt-small: a small DeepSeek-V3-architecture model trained for kdtree-engine

Made by `python/train_small_model.py` (run by `scripts/gpu_train_small.sh` on one H200, a few minutes).
Its weights are trained from scratch here; no one else's weights are used.

## Data
The Python sources (`*.py`) of the packages installed in the training machine's python
(site-packages), deduplicated by content (sha1) and, over the size cap, sampled by sha1 (a deterministic
sample spread over every package): {len(files)} files, {mb(files):.1f} MB.
Files whose sha1 % {HOLDOUT_MOD if not ev['tiny'] else 10} == 0 are held out ({len(held)} files, {mb(held):.1f} MB):
they give the perplexities below and the {len(prompts)} prompts of `heldout_prompts.jsonl` (the first
64-256 characters of a function or class, whole lines; `heldout_prompts.ids`: the same, tokenized, bos first).
Top-level packages seen: {", ".join(pkgs[:80])}{" ..." if len(pkgs) > 80 else ""}.
The sources keep their own licenses (mostly BSD, MIT, Apache-2.0, PSF; see each package's metadata); the
model is a statistical summary of them, shipped for testing an inference engine, not for use as a product.

## Tokenizer
Byte-level BPE trained with `tokenizers` on the training files (vocabulary {ev['vocab']}), ByteLevel
pre-tokenizer (GPT-2's split regex), special tokens `{BOS}` (bos, id 0), `{EOS}` (eos, id 1), `{USER}`,
`{ASSISTANT}`; `tokenizer_config.json` has add_bos_token and DeepSeek-V3's chat template.

## Models
- target (`kdt-small/`): DeepseekV3ForCausalLM, {ev['params']['target'] / 1e6:.2f} M parameters: hidden {tcfg['hidden_size']},
  {tcfg['num_hidden_layers']} layers (first dense, then MoE: {tcfg['n_routed_experts']} routed experts, top-{tcfg['num_experts_per_tok']}, 1 shared,
  sigmoid noaux_tc routing, routed_scaling_factor {tcfg['routed_scaling_factor']}), {tcfg['num_attention_heads']} heads with Kimi K2's
  / DeepSeek-V3's MLA shapes (q_lora_rank {tcfg['q_lora_rank']}, kv_lora_rank 512, rope 64, nope 128, v 128), YaRN
  (factor 4 over 512 positions), untied embeddings.
- draft (`kdt-small-draft/`): the same architecture with 1 dense layer, hidden {dcfg['hidden_size']},
  {dcfg['num_attention_heads']} heads, {ev['params']['draft'] / 1e6:.2f} M parameters, trained in the same run on the same batches
  (cross-entropy, then mixed with distillation from the target's distribution).
- bf16 safetensors in the hub's layout (one tensor per expert; the router's correction bias f32).

## Training
AdamW (0.9, 0.95, weight decay 0.1), lr {ev['lr']} with warm-up and cosine decay to a tenth, sequences of
{ev['seq']} tokens, batch {ev['batch']}, bf16 autocast; {ev['steps']} steps, {ev['train_tokens'] / 1e6:.1f} M tokens in
{ev['train_seconds']:.0f} s. Experts kept balanced DeepSeek-V3's way (no auxiliary loss: each step the
correction bias moves 3e-3 towards the under-loaded experts); the loads are in `train_log.txt`.

## Evaluation (held-out files, {ev['heldout_tokens']} tokens; bf16 autocast on the GPU, bf16 weights)
| model | perplexity |
|---|---|
| target | {ev['heldout_perplexity']['target']:.3f} |
| draft | {ev['heldout_perplexity']['draft']:.3f} |

## A greedy sample (transformers, target)
"""
    if s:
        card += "Prompt:\n```python\n" + s["prompt"] + "\n```\nContinuation:\n```python\n" + s["continuation"] + "\n```\n"
    card += """
## With the engine
    kdt generate --model models/kdt-small --prompt-ids "$(head -1 models/kdt-small/heldout_prompts.ids | tr ' ' ,)" --max-new 96
    ... --spec model --draft-model models/kdt-small-draft
"""
    with open(os.path.join(tdir, "README.md"), "w") as f:
        f.write(card)


if __name__ == "__main__":
    sys.exit(main())
