"""Shared by make_model_fixtures.py and train_demo.py: checkpoint writing in the released or fused
expert layout, and reference logprobs / greedy continuations from HF JambaForCausalLM in fp32.

All references use full-sequence forwards without a cache (HF's cached multi-token path is not a
reference, see jamba-spec.md §3.6), on the pure-PyTorch path (use_mamba_kernels=False).
"""
import json
import pathlib
import re

import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from transformers import JambaForCausalLM

PER_EXPERT_KEY = re.compile(r"^(.*\.feed_forward\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
FUSED_KEY = re.compile(r"^(.*\.feed_forward\.experts)\.(gate_up_proj|down_proj)$")


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


# ---- expert layouts -------------------------------------------------------------------------------

def fuse_experts(tensors):
    """Released per-expert names -> transformers-5 fused names (gate_up_proj [E,2I,H], down_proj [E,H,I])."""
    out, experts = {}, {}
    for name, tensor in tensors.items():
        match = PER_EXPERT_KEY.match(name)
        if match:
            prefix, expert, kind = match.group(1), int(match.group(2)), match.group(3)
            experts.setdefault(prefix, {}).setdefault(expert, {})[kind] = tensor
        else:
            out[name] = tensor
    for prefix, by_expert in experts.items():
        ordered = [by_expert[e] for e in sorted(by_expert)]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([x["gate"], x["up"]], dim=0) for x in ordered])
        out[f"{prefix}.down_proj"] = torch.stack([x["down"] for x in ordered])
    return out


def split_experts(tensors):
    """transformers-5 fused names -> released per-expert names."""
    out = {}
    for name, tensor in tensors.items():
        match = FUSED_KEY.match(name)
        if not match:
            out[name] = tensor
            continue
        prefix, kind = match.groups()
        for expert, weight in enumerate(tensor):
            if kind == "down_proj":
                out[f"{prefix}.{expert}.down_proj.weight"] = weight.clone()
            else:
                gate, up = weight.chunk(2, dim=0)
                out[f"{prefix}.{expert}.gate_proj.weight"] = gate.clone()
                out[f"{prefix}.{expert}.up_proj.weight"] = up.clone()
    return out


def read_checkpoint_tensors(folder):
    tensors = {}
    for path in sorted(pathlib.Path(folder).glob("*.safetensors")):
        tensors.update(safetensors.torch.load_file(str(path)))
    return tensors


def write_checkpoint_tensors(folder, tensors, shard_bytes=None):
    """Writes model.safetensors, or HF-style shards plus model.safetensors.index.json."""
    folder = pathlib.Path(folder)
    for stale in list(folder.glob("*.safetensors")) + list(folder.glob("*.safetensors.index.json")):
        stale.unlink()
    names = sorted(tensors)
    tensors = {name: tensors[name].contiguous() for name in names}
    if shard_bytes is None:
        safetensors.torch.save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    shards, current, current_bytes = [], [], 0
    for name in names:
        size = tensors[name].numel() * tensors[name].element_size()
        if current and current_bytes + size > shard_bytes:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(name)
        current_bytes += size
    shards.append(current)
    weight_map = {}
    for index, shard in enumerate(shards, start=1):
        file_name = f"model-{index:05d}-of-{len(shards):05d}.safetensors"
        safetensors.torch.save_file({n: tensors[n] for n in shard}, str(folder / file_name), metadata={"format": "pt"})
        weight_map.update({n: file_name for n in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save_checkpoint(model, folder, storage_dtype, shard_bytes=None):
    """save_pretrained (config.json and weights), then rewrites the weights in the released per-expert
    layout, dtype and sharding, leaving out lm_head.weight when embeddings are tied (as released tied
    models do). The model stays in fp32 but holds the storage-rounded weights afterwards."""
    folder = pathlib.Path(folder)
    model.to(storage_dtype).save_pretrained(str(folder))
    model.to(torch.float32)
    tensors = split_experts(read_checkpoint_tensors(folder))
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    tensors = {name: t.to(storage_dtype) for name, t in tensors.items()}
    write_checkpoint_tensors(folder, tensors, shard_bytes)


def convert_to_fused_layout(folder):
    write_checkpoint_tensors(folder, fuse_experts(read_checkpoint_tensors(folder)))


def edit_config_json(folder, edits):
    """Writes values save_pretrained resolves away (mamba_dt_rank "auto", num_key_value_heads null)."""
    path = pathlib.Path(folder) / "config.json"
    config = json.loads(path.read_text())
    config.update(edits)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ---- loading the reference model ------------------------------------------------------------------

def load_reference_model(folder, device="cpu"):
    """HF JambaForCausalLM in fp32 from a checkpoint folder (bf16 files are upcast after loading)."""
    model, info = JambaForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, use_mamba_kernels=False, attn_implementation="eager",
        output_loading_info=True,
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:  # callers check the loaded model's logits, so this is a note, not a verdict
        print(f"NOTE {folder}: HF loading reported {problems}", flush=True)
    return model.to(device).eval()


def max_logprob_difference(model_a, model_b, tokens):
    return (log_probs(model_a, tokens) - log_probs(model_b, tokens)).abs().max().item()


# ---- reference computations -----------------------------------------------------------------------

@torch.no_grad()
def log_probs(model, tokens):
    """log_softmax in float64 of the fp32 logits of one full-sequence forward (no cache): [T, V]."""
    device = next(model.parameters()).device
    input_ids = torch.tensor([tokens], dtype=torch.long, device=device)
    logits = model(input_ids=input_ids, use_cache=False).logits[0]
    assert logits.dtype == torch.float32
    return torch.log_softmax(logits.double().cpu(), dim=-1)


def teacher_forced(model, tokens, top_k=5):
    lp = log_probs(model, tokens)
    logprobs, top = [None], [None]
    for i in range(1, len(tokens)):
        row = lp[i - 1]
        logprobs.append(row[tokens[i]].item())
        values, ids = row.topk(top_k)
        top.append([[int(t), v] for t, v in zip(ids.tolist(), values.tolist())])
    return {"tokens": list(tokens), "logprobs": logprobs, "top_logprobs": top}


def greedy(model, prompt, steps):
    """Manual argmax loop, one full-sequence forward per step, no stopping at EOS."""
    ids, margins = list(prompt), []
    for _ in range(steps):
        values, top2 = log_probs(model, ids)[-1].topk(2)
        ids.append(int(top2[0]))
        margins.append((values[0] - values[1]).item())
    return {"prompt": list(prompt), "ids": ids[len(prompt):], "top2_margins": margins}


def peakedness(model, tokens):
    """Mean top-1 probability over positions: how far the model is from uniform."""
    return log_probs(model, tokens).max(dim=-1).values.exp().mean().item()


def write_reference(path, document):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document) + "\n")
