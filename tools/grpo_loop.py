#!/usr/bin/env python3
"""A real RL loop on the GPU machine: GRPO on the demo model, transformers' JambaForCausalLM training with PyTorch and
`jambo serve --backend cuda` rolling out, colocated on one GPU. Each step:

  1. rollouts: P prompts x n samples from jambo, with logprobs and token ids; reward = the share of the letter "e"
     in the completion's text (simple, and the policy can move it);
  2. the trainer recomputes the logprobs of the same tokens: max and mean |jambo - trainer| per step (the check
     that runs every step, and the plot);
  3. jambo sleeps (level 1) while the trainer takes one GRPO gradient step (group-normalized advantages);
  4. jambo wakes its weights, takes the new ones by CUDA IPC (tools/jambo_ipc.py) or from disk (--mode disk),
     and wakes its caches;
  5. the update took effect: jambo's prompt logprobs of a probe sequence match the trainer's new weights within the
     tolerance, and not the old ones; no state slot or KV block is left held (GET /metrics).

The trainer keeps its weights bf16-representable (rounded after each step), so that jambo, serving the demo's bf16
checkpoint in its f32 weight mode, computes with exactly the trainer's weights. Per step it prints the reward, the
mismatch, the weight versions of the outputs, the seconds of rollout, training, sleep, update and wake, and the
GPU memory the sleep freed; it writes grpo_steps.json and grpo_mismatch.svg to --out. Exits 1 when a check fails.
    tools/grpo_loop.py path/to/jambo [--steps 10] [--mode ipc|disk] [--out DIR]
scripts/gpu-test runs a short form (--steps 3).
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jambo_ipc import send_state_dict  # noqa: E402

PROMPTS = ["Once upon a time", "The cat", "In the morning", "A story about", "She said", "The river",
           "On a cold day", "My friend"]
TOLERANCE = 2e-3  # |jambo - trainer| of a logprob: jambo's f32 mode against transformers' fp32 on the same weights


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jambo")
    parser.add_argument("--model", default="models/jambo-demo")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--mode", choices=["ipc", "disk"], default="ipc")
    parser.add_argument("--out", default=".")
    return parser.parse_args()


class Jambo:
    """The rollout engine: jambo serve with the control endpoints, weights from disk allowed under `folder`."""

    def __init__(self, jambo, model, folder):
        self.process = subprocess.Popen(
            [jambo, "serve", "--model", model, "--backend", "cuda", "--cuda-weights", "f32", "--port", "0",
             "--enable-control-endpoints", "--allowed-weight-paths", folder, "--check"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        match = re.search(r"http://[0-9.]+:[0-9]+", self.process.stdout.readline())
        if not match:
            sys.exit(f"grpo_loop: jambo serve did not start: {self.process.stdout.read()}")
        self.url = match.group(0)
        threading.Thread(target=self.process.stdout.read, daemon=True).start()  # a full pipe would block jambo
        self.name = model.rstrip("/").split("/")[-1]

    def call(self, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"},
                                         method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            sys.exit(f"grpo_loop: {path} answered {error.code}: {error.read().decode()}")
        return text if path == "/metrics" else json.loads(text)

    def held(self):
        """State slots and KV blocks in use, from /metrics."""
        metrics = self.call("/metrics")
        value = lambda name: float(re.search(rf"^{name} ([0-9.e+]+)$", metrics, re.M).group(1))
        return value("jambo_state_slots_used"), value("jambo_kv_blocks_used")

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def gpu_memory_used_mib():
    out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    return float(out.decode().split()[0])


def token_logprobs(model, prompt_ids, ids):
    """log p(ids[i] | prompt_ids + ids[:i]) under the trainer's model, fp32, with the graph kept for backward."""
    tokens = torch.tensor([prompt_ids + ids], device="cuda")
    logits = model(tokens).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, tokens[0, len(prompt_ids):, None])[:, 0]


def rollout(jambo, step, n, max_tokens):
    body = lambda i, prompt: {"model": jambo.name, "prompt": prompt, "n": n, "max_tokens": max_tokens,
                              "temperature": 1.0, "seed": 1000 * step + i, "logprobs": 0, "ignore_eos": True,
                              "return_token_ids": True}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda pair: jambo.call("/v1/completions", body(*pair)), enumerate(PROMPTS)))
    groups = []
    for answer in answers:
        groups.append([{"prompt_ids": c["prompt_token_ids"], "ids": c["token_ids"],
                        "logprobs": c["logprobs"]["token_logprobs"], "text": c["text"],
                        "versions": {v["version"] for v in c["weight_versions"]}} for c in answer["choices"]])
    return groups


def reward(text):
    return text.count("e") / max(1, len(text))


def probe_logprobs(jambo, ids):
    """jambo's logprob of each token of a fixed sequence after the first (prompt logprobs)."""
    answer = jambo.call("/v1/completions", {"model": jambo.name, "prompt": ids, "max_tokens": 1, "temperature": 0,
                                            "prompt_logprobs": 0})
    return [next(iter(entry.values()))["logprob"] for entry in answer["choices"][0]["prompt_logprobs"][1:]]


def send_weights(jambo, model, version, mode, folder):
    state = {k: v for k, v in model.state_dict().items()}
    if mode == "ipc":
        return send_state_dict(jambo.url, state, version, dtype=torch.bfloat16)
    save_file({k: v.to(torch.bfloat16).contiguous().cpu() for k, v in state.items()},
              os.path.join(folder, "model.safetensors"))
    return jambo.call("/update_weights_from_disk", {"model_path": folder, "weight_version": version})


def write_plot(path, steps):
    """The mismatch per step, max and mean, on a log scale: the seeds' spike plot as a per-step check."""
    width, height, left, bottom = 640, 320, 60, 40
    values = [s["mismatch_max"] for s in steps] + [s["mismatch_mean"] for s in steps] + [TOLERANCE]
    low = math.floor(math.log10(max(min(v for v in values if v > 0), 1e-9))) if any(values) else -9
    high = max(math.ceil(math.log10(max(max(values), 1e-9))), low + 1)
    x = lambda i: left + (width - left - 20) * (i / max(1, len(steps) - 1))
    y = lambda v: height - bottom - (height - bottom - 20) * ((math.log10(max(v, 10 ** low)) - low) / (high - low))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="11"><rect width="{width}" height="{height}" fill="white"/>'
             f'<text x="{left + 120}" y="14">|jambo logprob - trainer logprob| per GRPO step</text>']
    for e in range(low, high + 1):
        parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{y(10 ** e):.1f}" y2="{y(10 ** e):.1f}" '
                     f'stroke="#ddd"/><text x="4" y="{y(10 ** e) + 4:.1f}">1e{e}</text>')
    tolerance_y = y(TOLERANCE)
    parts.append(f'<line x1="{left}" x2="{width - 20}" y1="{tolerance_y:.1f}" y2="{tolerance_y:.1f}" '
                 f'stroke="#c00" stroke-dasharray="4"/><text x="{width - 120}" y="{tolerance_y - 4:.1f}" '
                 f'fill="#c00">tolerance {TOLERANCE:g}</text>')
    for key, color in (("mismatch_max", "#1f77b4"), ("mismatch_mean", "#2ca02c")):
        points = " ".join(f"{x(i):.1f},{y(s[key]):.1f}" for i, s in enumerate(steps))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"/>'
                     f'<text x="{left + 10}" y="{34 if key == "mismatch_max" else 48}" fill="{color}">'
                     f'{key.split("_")[1]}</text>')
    for i in range(len(steps)):
        parts.append(f'<text x="{x(i) - 3:.1f}" y="{height - 22}">{i}</text>')
    parts.append(f'<text x="{width / 2 - 20:.0f}" y="{height - 6}">step</text></svg>')
    with open(path, "w") as out:
        out.write("".join(parts))


def main():
    args = parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as fp32: the mismatch is held to 2e-3
    torch.backends.cudnn.allow_tf32 = False
    folder = tempfile.mkdtemp(prefix="jambo-grpo-")
    os.makedirs(args.out, exist_ok=True)
    jambo = Jambo(args.jambo, args.model, folder)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    probe = list(range(5, 69))
    steps, failed = [], []
    old_probe = torch.tensor(probe_logprobs(jambo, probe), device="cuda")  # of the weights before each update
    try:
        for step in range(args.steps):
            record = {"step": step}
            started = time.time()
            groups = rollout(jambo, step, args.n, args.max_tokens)
            record["rollout_s"] = time.time() - started
            record["weight_versions"] = sorted({v for g in groups for s in g for v in s["versions"]})
            record["held_after_rollout"] = jambo.held()
            if record["held_after_rollout"] != (0.0, 0.0):
                failed.append(f"step {step}: slots and KV blocks still held after the rollout: "
                              f"{record['held_after_rollout']}")

            started = time.time()
            differences = []
            with torch.no_grad():
                for group in groups:
                    for sample in group:
                        ours = token_logprobs(model, sample["prompt_ids"], sample["ids"])
                        differences += (ours - torch.tensor(sample["logprobs"], device="cuda")).abs().tolist()
            record["mismatch_max"], record["mismatch_mean"] = max(differences), sum(differences) / len(differences)
            if record["mismatch_max"] > TOLERANCE:
                failed.append(f"step {step}: rollout against trainer logprobs differ by {record['mismatch_max']:.3g}")

            memory_awake = gpu_memory_used_mib()
            slept = jambo.call("/sleep?level=1", {})
            record["sleep_s"], record["freed_mib"] = slept["sleep_seconds"], memory_awake - gpu_memory_used_mib()

            rewards = [[reward(s["text"]) for s in g] for g in groups]
            record["reward"] = sum(map(sum, rewards)) / sum(map(len, rewards))
            optimizer.zero_grad()
            loss = 0.0
            for group, group_rewards in zip(groups, rewards):
                mean = sum(group_rewards) / len(group_rewards)
                std = (sum((r - mean) ** 2 for r in group_rewards) / len(group_rewards)) ** 0.5
                for sample, r in zip(group, group_rewards):
                    advantage = (r - mean) / (std + 1e-6)
                    loss = loss - advantage * token_logprobs(model, sample["prompt_ids"], sample["ids"]).mean()
            (loss / sum(map(len, groups))).backward()
            optimizer.step()
            with torch.no_grad():  # weights the bf16 checkpoint can hold, so that both sides compute with the same
                for parameter in model.parameters():
                    parameter.copy_(parameter.bfloat16().float())
            record["train_s"] = time.time() - started - record["sleep_s"]

            started = time.time()
            jambo.call("/wake_up?tags=weights", {})
            update = send_weights(jambo, model, f"step-{step + 1}", args.mode, folder)
            record["update_s"] = time.time() - started
            started = time.time()
            jambo.call("/wake_up?tags=kv_cache", {})
            record["wake_s"] = time.time() - started

            # The update took effect: jambo now matches the trainer's new weights, and its old logprobs did not.
            served = torch.tensor(probe_logprobs(jambo, probe), device="cuda")
            with torch.no_grad():
                trainer_probe = token_logprobs(model, probe[:1], probe[1:])
            record["probe_difference"] = (served - trainer_probe).abs().max().item()
            record["old_probe_difference"] = (old_probe - trainer_probe).abs().max().item()
            if record["probe_difference"] > TOLERANCE:
                failed.append(f"step {step}: after the update jambo's probe logprobs differ from the trainer's by "
                              f"{record['probe_difference']:.3g}")
            if record["old_probe_difference"] <= record["probe_difference"]:
                failed.append(f"step {step}: the old weights' probe logprobs are as near the trainer's "
                              f"({record['old_probe_difference']:.3g}) as the new ones")
            old_probe = served
            record["update_answer"] = {k: update[k] for k in ("weight_version", "num_tensors") if k in update}
            steps.append(record)
            print(f"[grpo] step {step}: reward {record['reward']:.4f}, mismatch max {record['mismatch_max']:.2e} "
                  f"mean {record['mismatch_mean']:.2e}, versions {record['weight_versions']}, rollout "
                  f"{record['rollout_s']:.2f} s, train {record['train_s']:.2f} s, sleep {record['sleep_s']:.3f} s "
                  f"({record['freed_mib']:.0f} MiB freed), update ({args.mode}) {record['update_s']:.3f} s, wake "
                  f"{record['wake_s']:.3f} s, probe |d| {record['probe_difference']:.2e} (old weights "
                  f"{record['old_probe_difference']:.2e})", flush=True)
    finally:
        jambo.stop()
    with open(os.path.join(args.out, "grpo_steps.json"), "w") as out:
        json.dump(steps, out, indent=1)
    write_plot(os.path.join(args.out, "grpo_mismatch.svg"), steps)
    for failure in failed:
        print(f"[grpo] FAILED {failure}")
    print(f"[grpo] {len(steps)} steps, {len(failed)} checks failed; {args.out}/grpo_steps.json, grpo_mismatch.svg")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
