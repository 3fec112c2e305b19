#!/usr/bin/env python3
"""Trains jambo's demo model: a small Jamba with its own Jamba-style BPE tokenizer, on English text
from Debian packages (fortunes, fortunes-min, debian-reference-en; see prepare_demo_corpus.py).

HF's Jamba forward scans time step by step in Python, which is too slow to train with, so training
runs a compact re-implementation of the same math (jamba-spec.md §3) on the parameters of a
transformers JambaForCausalLM: the names, shapes and parametrisation are HF's own. After training the
checkpoint is saved in bf16, reloaded with transformers, and both forwards are compared in fp32.

Writes models/jambo-demo/{config.json, model.safetensors, tokenizer.json, tokenizer_config.json, README.md},
tests/fixtures/models/jambo-demo/reference.json and tests/fixtures/tokenizers/jambo-demo/.
"""
import argparse
import json
import math
import pathlib
import random
import shutil
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import JambaConfig, JambaForCausalLM

import jamba_reference as ref
import tokenizer_kit as kit

SPECIALS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|unk|>"]  # ids 0..3, as in Jamba
CHAT_TOKENS = ["<|bom|>", "<|eom|>", "<|system|>", "<|user|>", "<|assistant|>"]
BOS_ID, EOS_ID = 1, 2
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|bom|><|{{ message['role'] }}|> {{ message['content'] }}<|eom|>"
    "{% endfor %}{% if add_generation_prompt %}<|bom|><|assistant|>{% endif %}"
)
VOCAB_SIZE = 4096
ARCHITECTURE = dict(
    hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    attn_layer_period=4, attn_layer_offset=2, num_experts=4, num_experts_per_tok=2,
    expert_layer_period=2, expert_layer_offset=1, intermediate_size=256, mamba_d_state=16,
    mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto", tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=BOS_ID, eos_token_id=EOS_ID, use_mamba_kernels=False,
)
# About 9 passes over the ~1.1M training tokens; the validation loss bottoms out well before the
# end (the model starts memorising), and the weights of the best evaluation are kept.
SEQUENCE_LENGTH, BATCH_SIZE, TRAIN_STEPS = 256, 32, 1200
PEAK_LR, FINAL_LR, WARMUP_STEPS, WEIGHT_DECAY = 2e-3, 1e-4, 100, 0.1
EVAL_EVERY, VALIDATION_BATCHES = 50, 8
SAMPLE_PROMPTS = ["The Debian package system", "A fool and his money", "You will"]
TEACHER_FORCED_LENGTHS = [1, 2, 3, 5, 17, 64, 129, 320]


# ---- tokenizer and data ---------------------------------------------------------------------------

def build_tokenizer(documents, model_dir, fixture_dir):
    tokenizer = kit.build_jamba_style(documents, VOCAB_SIZE, SPECIALS, "<|startoftext|>", extra_special=CHAT_TOKENS)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>", "unk_token": "<|unk|>", "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE, "model_max_length": 4096,
    }
    kit.write_tokenizer(tokenizer, model_dir, config)
    fixture_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_dir / name, fixture_dir / name)
    reloaded = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    kit.write_cases(reloaded, fixture_dir, "sentencepiece", ["<|bom|>", "<|user|>", "<|endoftext|>", "<|eom|>"])
    return reloaded


def token_stream(tokenizer, documents):
    """Each document as BOS + pieces + EOS, all concatenated."""
    ids = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=True):
        ids.extend(encoding.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream, generator, device):
    starts = torch.randint(0, len(stream) - SEQUENCE_LENGTH - 1, (BATCH_SIZE,), generator=generator)
    windows = torch.stack([stream[s:s + SEQUENCE_LENGTH + 1] for s in starts.tolist()]).to(device)
    return windows[:, :-1], windows[:, 1:]


# ---- the training forward: jamba-spec.md §3 on HF's parameters --------------------------------------

class LinearRecurrence(torch.autograd.Function):
    """h[t] = a[t] * h[t-1] + b[t] along dim 0 from h[-1] = 0; one fused kernel per step each way."""

    @staticmethod
    def forward(ctx, a, b):
        h = torch.empty_like(b)
        h[0] = b[0]
        for t in range(1, len(b)):
            torch.addcmul(b[t], a[t], h[t - 1], out=h[t])
        ctx.save_for_backward(a, h)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h = ctx.saved_tensors
        grad_h = grad_h.contiguous()
        grad_b = torch.empty_like(grad_h)  # dL/db[t] = grad_h[t] + a[t+1] * dL/db[t+1]
        grad_b[-1] = grad_h[-1]
        for t in range(len(grad_h) - 2, -1, -1):
            torch.addcmul(grad_h[t], a[t + 1], grad_b[t + 1], out=grad_b[t])
        grad_a = torch.zeros_like(a)
        grad_a[1:] = grad_b[1:] * h[:-1]
        return grad_a, grad_b


class JambaTrainingForward:
    """Reads a JambaForCausalLM's parameters by their HF names; same math as HF's forward."""

    def __init__(self, model):
        self.config = model.config
        self.params = dict(model.named_parameters())

    def p(self, name):
        return self.params.get(name)

    def rms_norm(self, x, name):
        xf = x.float()
        normalized = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return self.p(name) * normalized.to(x.dtype)

    def mamba(self, x, prefix):
        c = self.config
        length = x.shape[1]
        d_inner, d_state, rank = c.mamba_expand * c.hidden_size, c.mamba_d_state, c.mamba_dt_rank
        u, z = F.linear(x, self.p(f"{prefix}.in_proj.weight"), self.p(f"{prefix}.in_proj.bias")).chunk(2, dim=-1)
        conv = F.conv1d(u.transpose(1, 2), self.p(f"{prefix}.conv1d.weight"), self.p(f"{prefix}.conv1d.bias"),
                        padding=c.mamba_d_conv - 1, groups=d_inner)[..., :length]
        u = F.silu(conv).transpose(1, 2)
        dt, b, cc = F.linear(u, self.p(f"{prefix}.x_proj.weight")).split([rank, d_state, d_state], dim=-1)
        dt = self.rms_norm(dt, f"{prefix}.dt_layernorm.weight")
        b = self.rms_norm(b, f"{prefix}.b_layernorm.weight").float()
        cc = self.rms_norm(cc, f"{prefix}.c_layernorm.weight").float()
        delta = F.softplus(F.linear(dt, self.p(f"{prefix}.dt_proj.weight"), self.p(f"{prefix}.dt_proj.bias"))).float()
        a = -torch.exp(self.p(f"{prefix}.A_log").float())
        uf = u.float()
        decay = torch.exp(delta.unsqueeze(-1) * a).transpose(0, 1).contiguous()  # [T, B, Di, N]
        drive = (delta.unsqueeze(-1) * b.unsqueeze(2) * uf.unsqueeze(-1)).transpose(0, 1).contiguous()
        states = LinearRecurrence.apply(decay, drive)
        y = torch.einsum("tbdn,btn->btd", states, cc)
        y = (y + uf * self.p(f"{prefix}.D").float()) * F.silu(z.float())
        return F.linear(y.to(x.dtype), self.p(f"{prefix}.out_proj.weight"), self.p(f"{prefix}.out_proj.bias"))

    def attention(self, x, prefix):
        c = self.config
        batch, length, _ = x.shape
        head_dim = c.hidden_size // c.num_attention_heads

        def heads(name, count):
            return F.linear(x, self.p(f"{prefix}.{name}.weight")).view(batch, length, count, head_dim).transpose(1, 2)

        q = heads("q_proj", c.num_attention_heads)
        group = c.num_attention_heads // c.num_key_value_heads
        k = heads("k_proj", c.num_key_value_heads).repeat_interleave(group, dim=1)
        v = heads("v_proj", c.num_key_value_heads).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(out.transpose(1, 2).reshape(batch, length, -1), self.p(f"{prefix}.o_proj.weight"))

    def mlp(self, x, prefix):
        gate = F.linear(x, self.p(f"{prefix}.gate_proj.weight"))
        return F.linear(F.silu(gate) * F.linear(x, self.p(f"{prefix}.up_proj.weight")), self.p(f"{prefix}.down_proj.weight"))

    def expert_weights(self, prefix):
        """(gate_up [E, 2I, H], down [E, H, I]) from HF's fused or per-expert parameters."""
        c = self.config
        fused = self.p(f"{prefix}.experts.gate_up_proj")
        if fused is not None:
            gate_up, down = fused, self.p(f"{prefix}.experts.down_proj")
        else:
            experts = range(c.num_experts)
            gate_up = torch.stack([torch.cat([self.p(f"{prefix}.experts.{e}.gate_proj.weight"),
                                              self.p(f"{prefix}.experts.{e}.up_proj.weight")]) for e in experts])
            down = torch.stack([self.p(f"{prefix}.experts.{e}.down_proj.weight") for e in experts])
        expected = (c.num_experts, 2 * c.intermediate_size, c.hidden_size)
        assert tuple(gate_up.shape) == expected, f"{prefix}: gate_up {tuple(gate_up.shape)} != {expected}"
        return gate_up, down

    def moe(self, x, prefix):
        """Softmax over all experts in fp32, top-k, no renormalisation; every expert computed densely."""
        c = self.config
        router_logits = F.linear(x, self.p(f"{prefix}.router.weight"))
        probabilities = torch.softmax(router_logits.float(), dim=-1)
        top_weights, top_ids = probabilities.topk(c.num_experts_per_tok, dim=-1)
        weights = torch.zeros_like(probabilities).scatter(-1, top_ids, top_weights).to(x.dtype)
        gate_up, down = self.expert_weights(prefix)
        gate, up = torch.einsum("bth,eih->ebti", x, gate_up.to(x.dtype)).chunk(2, dim=-1)
        per_expert = torch.einsum("ebti,ehi->ebth", F.silu(gate) * up, down.to(x.dtype))
        return torch.einsum("ebth,bte->bth", per_expert, weights)

    def is_moe_layer(self, i):
        c = self.config
        return c.num_experts > 1 and i % c.expert_layer_period == c.expert_layer_offset

    def logits(self, input_ids):
        c = self.config
        h = F.embedding(input_ids, self.p("model.embed_tokens.weight"))
        for i in range(c.num_hidden_layers):
            prefix = f"model.layers.{i}"
            normed = self.rms_norm(h, f"{prefix}.input_layernorm.weight")
            if i % c.attn_layer_period == c.attn_layer_offset:
                h = h + self.attention(normed, f"{prefix}.self_attn")
            else:
                h = h + self.mamba(normed, f"{prefix}.mamba")
            normed = self.rms_norm(h, f"{prefix}.pre_ff_layernorm.weight")
            ffn = self.moe if self.is_moe_layer(i) else self.mlp
            h = h + ffn(normed, f"{prefix}.feed_forward")
        h = self.rms_norm(h, "model.final_layernorm.weight")
        head = self.p("lm_head.weight") if not c.tie_word_embeddings else self.p("model.embed_tokens.weight")
        return F.linear(h, head)


# ---- training -------------------------------------------------------------------------------------

@torch.no_grad()
def init_dt_bias(model):
    """Mamba's time-step initialisation: softplus(bias) log-uniform in [0.001, 0.1]."""
    for name, p in model.named_parameters():
        if name.endswith("dt_proj.bias"):
            dt = torch.exp(torch.rand(p.shape) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
            p.copy_(dt + torch.log(-torch.expm1(-dt)))


def make_optimizer(model):
    decayed = [p for n, p in model.named_parameters() if p.dim() >= 2 and "A_log" not in n]
    others = [p for n, p in model.named_parameters() if p.dim() < 2 or "A_log" in n]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": WEIGHT_DECAY}, {"params": others, "weight_decay": 0.0}],
                             lr=PEAK_LR, betas=(0.9, 0.95), fused=True)


def learning_rate(step):
    if step < WARMUP_STEPS:
        return PEAK_LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / (TRAIN_STEPS - WARMUP_STEPS)
    return FINAL_LR + 0.5 * (PEAK_LR - FINAL_LR) * (1 + math.cos(math.pi * progress))


def loss_of(forward, inputs, targets):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = forward.logits(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


@torch.no_grad()
def validation_loss(forward, batches):
    return sum(loss_of(forward, x, y).item() for x, y in batches) / len(batches)


def train(model, train_stream, validation_stream, seconds, device):
    """TRAIN_STEPS steps, or fewer if the wall-clock budget runs out; keeps the best-validation weights."""
    forward = JambaTrainingForward(model)
    optimizer = make_optimizer(model)
    generator = torch.Generator().manual_seed(0)
    validation = [random_windows(validation_stream, torch.Generator().manual_seed(i), device) for i in range(VALIDATION_BATCHES)]
    best = (float("inf"), None, 0)
    start, step, history = time.time(), 0, []
    while step < TRAIN_STEPS and time.time() - start < seconds:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        loss = loss_of(forward, *random_windows(train_stream, generator, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if step % EVAL_EVERY == 0:
            validation_value = validation_loss(forward, validation)
            history.append({"step": step, "seconds": round(time.time() - start, 1), "train_loss": round(loss.item(), 4),
                            "validation_loss": round(validation_value, 4)})
            print(json.dumps(history[-1]), flush=True)
            if validation_value < best[0]:
                best = (validation_value, {n: p.detach().clone() for n, p in model.named_parameters()}, step)
    final_validation = validation_loss(forward, validation)
    if final_validation < best[0]:
        best = (final_validation, None, step)
    elif best[1] is not None:
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(best[1][name])
    return {"steps": step, "seconds": round(time.time() - start, 1), "best_step": best[2],
            "validation_loss": round(best[0], 4), "last_train_loss": round(loss.item(), 4), "history": history}


# ---- checking against transformers and writing the references -------------------------------------

@torch.no_grad()
def compare_with_transformers(reference_model, tokens, device):
    """Max |logit difference| between HF's forward and the training forward, both fp32 without TF32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    reference_model.to(device)
    input_ids = torch.tensor([tokens], device=device)
    hf_logits = reference_model(input_ids=input_ids, use_cache=False).logits.float()
    ours = JambaTrainingForward(reference_model).logits(input_ids).float()
    reference_model.to("cpu")
    return (hf_logits - ours).abs().max().item(), hf_logits.abs().max().item()


def write_references(reference_model, tokenizer, validation_documents, fixture_dir):
    text_ids = tokenizer.encode("\n\n".join(validation_documents[:40])).ids
    assert len(text_ids) >= max(TEACHER_FORCED_LENGTHS)
    teacher = [ref.teacher_forced(reference_model, text_ids[:n]) for n in TEACHER_FORCED_LENGTHS]
    greedy = [ref.greedy(reference_model, tokenizer.encode(p).ids, 48) for p in SAMPLE_PROMPTS]
    ref.write_reference(fixture_dir / "reference.json", {
        "name": "jambo-demo", "model_dir": "models/jambo-demo", "storage_dtype": "bfloat16",
        "covers": "the trained demo model (bf16 checkpoint) on real text tokenized with its own tokenizer",
        "teacher_forced": teacher, "greedy": greedy,
    })
    samples = []
    for prompt, entry in zip(SAMPLE_PROMPTS, greedy):
        text = tokenizer.decode(entry["ids"], skip_special_tokens=False)
        samples.append({"prompt": prompt, "continuation": text})
        print(f"SAMPLE {json.dumps(prompt)} -> {json.dumps(text)}", flush=True)
    return samples


def write_model_card(model_dir, facts):
    samples = "\n".join(f"- `{s['prompt']}` → `{s['continuation']!r}`" for s in facts["samples"])
    card = f"""# jambo-demo

A tiny Jamba (AI21's hybrid Mamba/attention architecture) trained from scratch for jambo's README
demo and tests. It writes English-looking text; it knows nothing useful.

- **Architecture**: `JambaForCausalLM`, {facts['parameters']:,} parameters, bf16 weights. Hidden 256,
  8 layers: attention at layers 2 and 6 (8 heads, 2 KV heads), Mamba elsewhere (d_state 16, d_conv 4,
  expand 2, dt_rank 16), sparse MoE (4 experts, top-2) on odd layers and dense SwiGLU MLPs on even
  layers, intermediate size 256, untied embeddings, vocabulary {facts['vocab_size']}.
- **Tokenizer**: BPE trained on the same text with HF `tokenizers`, laid out like Jamba's: normalizer
  `Replace(" ", "▁")` (no dummy prefix), byte fallback (`<0x00>`…`<0xFF>`), `<|pad|>`=0,
  `<|startoftext|>`=1 (BOS, added by the post-processor), `<|endoftext|>`=2 (EOS), `<|unk|>`=3, and the
  special tokens {', '.join(CHAT_TOKENS)} used by a small chat template.
- **Data**: {facts['documents']:,} documents ({facts['characters']:,} characters, {facts['tokens']:,} tokens)
  from Debian packages: every fortune in `fortunes` and `fortunes-min`
  (`/usr/share/games/fortunes`, one document each) and the text of `debian-reference-en`
  (`debian-reference.en.txt.gz`, documents of a few paragraphs). Each document is
  `<|startoftext|> … <|endoftext|>`; 2% of documents are held out for validation.
- **Training**: {facts['training']['steps']} steps of {BATCH_SIZE}×{SEQUENCE_LENGTH} tokens in
  {facts['training']['seconds']} s on one NVIDIA H200 (AdamW, peak lr {PEAK_LR}, cosine, bf16 autocast,
  a compact re-implementation of HF's forward with identical parameter names). Kept the weights of step
  {facts['training']['best_step']} with validation loss {facts['training']['validation_loss']}
  (last training loss {facts['training']['last_train_loss']}).
- **Check**: after saving, transformers {facts['versions']['transformers']} loads the checkpoint and its fp32
  logits match the training forward's within {facts['max_logit_difference']:.2e} (largest logit
  {facts['max_logit']:.1f}).

Greedy continuations (from `jambo generate`-style prompts, BOS prepended):

{samples}

Reproduce (see tools/README.md): `python3 tools/prepare_demo_corpus.py` on a machine with the three
Debian packages, then on a GPU machine with torch, transformers and tokenizers:
`python3 tools/train_demo.py --corpus .carry/demo_corpus.json`.
Versions used: {json.dumps(facts['versions'])}.
"""
    (model_dir / "README.md").write_text(card)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", default=".carry/demo_corpus.json")
    parser.add_argument("--model-dir", default="models/jambo-demo")
    parser.add_argument("--fixtures", default="tests/fixtures")
    parser.add_argument("--train-seconds", type=float, default=400, help="wall-clock cap on training")
    args = parser.parse_args()
    device = "cuda"
    torch.manual_seed(0)
    torch.set_num_threads(4)
    model_dir = pathlib.Path(args.model_dir)
    model_fixture_dir = pathlib.Path(args.fixtures) / "models" / "jambo-demo"
    print(json.dumps(ref.versions()), flush=True)

    documents = kit.load_corpus(args.corpus)
    random.Random(0).shuffle(documents)
    held_out = len(documents) // 50
    validation_documents, training_documents = documents[:held_out], documents[held_out:]
    tokenizer = build_tokenizer(documents, model_dir, pathlib.Path(args.fixtures) / "tokenizers" / "jambo-demo")
    train_stream = token_stream(tokenizer, training_documents)
    validation_stream = token_stream(tokenizer, validation_documents)
    print(f"tokens: train {len(train_stream)}, validation {len(validation_stream)}", flush=True)

    config = JambaConfig(vocab_size=tokenizer.get_vocab_size(), **ARCHITECTURE)
    model = JambaForCausalLM(config)
    init_dt_bias(model)
    model.to(device).train()
    parameters = sum(p.numel() for p in model.parameters())
    print(f"parameters: {parameters}", flush=True)
    training = train(model, train_stream, validation_stream, args.train_seconds, device)
    model.to("cpu").eval()

    ref.save_checkpoint(model, model_dir, torch.bfloat16)
    reference_model = ref.load_reference_model(model_dir)
    difference, largest = compare_with_transformers(reference_model, validation_stream[:256].tolist(), device)
    print(f"HF vs training forward (fp32): max |logit diff| {difference:.3g}, max |logit| {largest:.3g}", flush=True)
    torch.set_num_threads(8)
    samples = write_references(reference_model, tokenizer, validation_documents, model_fixture_dir)
    write_model_card(model_dir, {
        "parameters": parameters, "vocab_size": config.vocab_size, "documents": len(documents),
        "characters": sum(map(len, documents)), "tokens": len(train_stream) + len(validation_stream),
        "training": training, "max_logit_difference": difference, "max_logit": largest,
        "samples": samples, "versions": ref.versions(),
    })


if __name__ == "__main__":
    main()
