#!/usr/bin/env python3
"""Hugging Face transformers' generate on one GPU, for figures side by side with bench/gpu.sh and
bench/rollout.sh: JambaForCausalLM built from a shape's config.json with random weights in bf16 (no
checkpoint, no internet), then

  decode:  tokens/s in total at batch 1, 8, 64 and 256 with 512-token prompts: the time of a decode step is
           (generate of N tokens - generate of 1 token) / (N - 1), both after the same prefill, so it is
           generate's own per-token cost (sampling loop, cache updates, logits processors included);
  rollout: a measured slice of the rollout workload (k prompts x n samples through num_return_sequences,
           512 tokens in, 256 out, do_sample at temperature 1, every sample forced to full length), and the
           whole workload's time projected from it as ceil(prompts / k) such generate calls one after another.

transformers runs the Mamba layers through mamba_ssm and causal_conv1d when both are installed and through
its pure-PyTorch path otherwise; the script says which. --budget-s bounds the whole run: each measurement
is skipped when the time predicted from the ones before it does not fit (the rollout slice's time is kept
in reserve), and the slice takes the largest k that fits. Run on the GPU machine:
  python3 tools/hf_bench.py [--budget-s 120] [--json]
"""
import time

START = time.monotonic()  # the budget covers the imports and the model build too

import argparse
import bisect
import importlib.util
import json
import math
import pathlib

import torch
import transformers
from transformers import AutoModelForCausalLM, JambaConfig

REPO = pathlib.Path(__file__).resolve().parent.parent
FIRST_ORDINARY_TOKEN = 4  # ids below are special tokens
SAFETY_S = 5.0  # kept free of planned work: predictions are estimates


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=str(REPO / "bench/shapes/jamba-reasoning-3b"),
                        help="folder holding the config.json to build the model from")
    parser.add_argument("--batches", default="1,8,64,256", help="decode batch sizes, comma-separated")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32, help="tokens generated per decode measurement")
    parser.add_argument("--rollout-prompts", type=int, default=1024, help="prompts of the whole rollout workload")
    parser.add_argument("--rollout-n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--rollout-max-tokens", type=int, default=256, help="tokens generated per sample")
    parser.add_argument("--budget-s", type=float, default=120.0, help="wall-clock bound of the whole run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="end with one JSON line holding every figure")
    args = parser.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def remaining_s(budget_s):
    return budget_s - (time.monotonic() - START)


def fast_mamba_kernels():
    """Whether mamba_ssm and causal_conv1d can be imported, which transformers' fast Jamba path needs."""
    return {name: importlib.util.find_spec(name) is not None for name in ("mamba_ssm", "causal_conv1d")}


def build_model(shape, use_fast_kernels, seed):
    config = JambaConfig.from_pretrained(shape)
    # With use_mamba_kernels set and the kernels missing, the Mamba layers refuse to run.
    config.use_mamba_kernels = use_fast_kernels
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def random_prompts(batch, prompt_tokens, vocab_size, generator):
    ids = torch.randint(FIRST_ORDINARY_TOKEN, vocab_size, (batch, prompt_tokens), generator=generator)  # [batch, P]
    return ids.cuda()


def timed_generate(model, input_ids, new_tokens, **sampling):
    """Seconds of one generate call making exactly new_tokens tokens per sequence (EOS cannot stop it)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=new_tokens,
                            min_new_tokens=new_tokens, pad_token_id=model.config.pad_token_id, **sampling)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    expected_rows = input_ids.shape[0] * sampling.get("num_return_sequences", 1)
    assert output.shape == (expected_rows, input_ids.shape[1] + new_tokens), f"generate returned {tuple(output.shape)}"
    return seconds


class CostModel:
    """Predicts a generate call's seconds at a batch size from the decode measurements made so far: prefill
    (+ first token) time and decode step time, each linear in the batch between measured batches and beyond
    the largest, never below the nearest smaller measured batch's."""

    def __init__(self):
        self.points = []  # (batch, prefill_s, step_s), by batch

    def add(self, batch, prefill_s, step_s):
        self.points = sorted(self.points + [(batch, prefill_s, step_s)])

    def _estimate(self, batch, column):
        points = [(p[0], p[column]) for p in self.points]
        if len(points) == 1:  # one point: the same cost (small batches are bound by kernel launches)
            return points[0][1]
        batches = [b for b, _ in points]
        if batch <= batches[0]:
            return points[0][1]
        i = min(len(points) - 1, bisect.bisect_left(batches, batch))
        (b0, v0), (b1, v1) = points[i - 1], points[i]
        return max(v0, v0 + (v1 - v0) / (b1 - b0) * (batch - b0))

    def generate_s(self, batch, new_tokens):
        if not self.points:
            return 0.0
        return self._estimate(batch, 1) + (new_tokens - 1) * self._estimate(batch, 2)


def measure_decode(model, batch, args, generator):
    """Warm-up, then generate of 1 token and of decode_tokens tokens on the same prompts (greedy)."""
    input_ids = random_prompts(batch, args.prompt_tokens, model.config.vocab_size, generator)
    torch.cuda.reset_peak_memory_stats()
    timed_generate(model, input_ids, 2, do_sample=False)
    prefill_s = timed_generate(model, input_ids, 1, do_sample=False)
    total_s = timed_generate(model, input_ids, args.decode_tokens, do_sample=False)
    step_s = (total_s - prefill_s) / (args.decode_tokens - 1)
    return {"batch": batch, "prefill_and_first_token_s": prefill_s, "ms_per_step": 1e3 * step_s,
            "tok_per_s": batch / step_s, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def decode_cost_s(costs, batch, args):
    return costs.generate_s(batch, 2) + costs.generate_s(batch, 1) + costs.generate_s(batch, args.decode_tokens)


def rollout_cost_s(costs, num_prompts, args):
    batch = num_prompts * args.rollout_n
    return costs.generate_s(batch, 2) + costs.generate_s(batch, args.rollout_max_tokens)


def measure_rollout_slice(model, num_prompts, args, generator):
    """k prompts x n samples, as an RL rollout asks generate for them: one call, num_return_sequences = n."""
    input_ids = random_prompts(num_prompts, args.prompt_tokens, model.config.vocab_size, generator)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=args.rollout_n)
    timed_generate(model, input_ids, 2, **sampling)
    return timed_generate(model, input_ids, args.rollout_max_tokens, **sampling)


def rollout_figures(prompts, args, seconds):
    """Total tokens count each prompt once, as bench/rollout.sh does (generate prefills it n times)."""
    prompt_tokens = prompts * args.prompt_tokens
    generated = prompts * args.rollout_n * args.rollout_max_tokens
    return {"prompts": prompts, "n": args.rollout_n, "prompt_tokens": prompt_tokens, "generated_tokens": generated,
            "seconds": seconds, "generated_tok_per_s": generated / seconds,
            "total_tok_per_s": (prompt_tokens + generated) / seconds}


def out_of_memory(error):
    """The first sentences of torch's message ("CUDA out of memory. Tried to allocate 40.00 GiB")."""
    torch.cuda.empty_cache()
    return "out of GPU memory: " + str(error).split(". GPU")[0]


def run_decode(model, args, costs, generator):
    results = []
    for batch in args.batches:
        reserve_s = rollout_cost_s(costs, 1, args)
        predicted_s = decode_cost_s(costs, batch, args)
        if costs.points and predicted_s + reserve_s + SAFETY_S > remaining_s(args.budget_s):
            results.append({"batch": batch, "skipped": f"budget: about {predicted_s:.0f} s predicted, "
                                                       f"{remaining_s(args.budget_s):.0f} s left"})
            print(f"decode batch {batch:4d}: skipped ({results[-1]['skipped']})", flush=True)
            continue
        try:
            figures = measure_decode(model, batch, args, generator)
        except torch.cuda.OutOfMemoryError as error:
            results.append({"batch": batch, "skipped": out_of_memory(error)})
            print(f"decode batch {batch:4d}: {results[-1]['skipped']}", flush=True)
            continue
        costs.add(batch, figures["prefill_and_first_token_s"], figures["ms_per_step"] / 1e3)
        results.append(figures)
        print(f"decode batch {batch:4d}: {figures['ms_per_step']:8.2f} ms/step, {figures['tok_per_s']:8.1f} tok/s "
              f"in total (prefill of {batch} x {args.prompt_tokens} tokens + 1 token: "
              f"{figures['prefill_and_first_token_s']:.2f} s; peak {figures['peak_gib']:.1f} GiB)", flush=True)
    return results


def run_rollout(model, args, costs, generator):
    """The largest slice of 2^i prompts (at most 32, batch 256 at n = 8) that the budget leaves room for;
    halved on running out of GPU memory."""
    num_prompts = min(32, args.rollout_prompts)
    while num_prompts > 1 and rollout_cost_s(costs, num_prompts, args) + SAFETY_S > remaining_s(args.budget_s):
        num_prompts //= 2
    if rollout_cost_s(costs, num_prompts, args) + SAFETY_S > remaining_s(args.budget_s):
        skipped = (f"budget: one prompt takes about {rollout_cost_s(costs, 1, args):.0f} s, "
                   f"{remaining_s(args.budget_s):.0f} s left")
        print(f"rollout: skipped ({skipped})", flush=True)
        return {"skipped": skipped}
    print(f"rollout slice: {num_prompts} prompts x n = {args.rollout_n} (about "
          f"{rollout_cost_s(costs, num_prompts, args):.0f} s predicted, {remaining_s(args.budget_s):.0f} s left)",
          flush=True)
    while True:
        try:
            seconds = measure_rollout_slice(model, num_prompts, args, generator)
            break
        except torch.cuda.OutOfMemoryError as error:
            print(f"rollout slice of {num_prompts} prompts: {out_of_memory(error)}", flush=True)
            if num_prompts == 1:
                return {"skipped": "out of GPU memory with one prompt"}
            num_prompts //= 2
    measured = rollout_figures(num_prompts, args, seconds)
    num_calls = math.ceil(args.rollout_prompts / num_prompts)
    projected = rollout_figures(args.rollout_prompts, args, num_calls * seconds)
    projected["generate_calls"] = num_calls
    print(f"rollout measured:  {num_prompts} prompts x n = {args.rollout_n} (one generate call, batch "
          f"{num_prompts * args.rollout_n}), {args.prompt_tokens} in, {args.rollout_max_tokens} out: "
          f"{measured['seconds']:.1f} s, {measured['generated_tok_per_s']:.1f} generated tok/s, "
          f"{measured['total_tok_per_s']:.1f} total tok/s", flush=True)
    print(f"rollout projected for {args.rollout_prompts} x {args.rollout_n} (NOT measured: {num_calls} such calls "
          f"one after another): {projected['seconds']:.0f} s to finish, {projected['generated_tok_per_s']:.1f} "
          f"generated tok/s, {projected['total_tok_per_s']:.1f} total tok/s", flush=True)
    return {"measured": measured, "projected": projected}


def main():
    args = parse_args()
    kernels = fast_mamba_kernels()
    use_fast_kernels = all(kernels.values())
    model = build_model(args.shape, use_fast_kernels, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    environment = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "shape": pathlib.Path(args.shape).name, "dtype": "bfloat16", "weights": "random",
        "parameters": sum(p.numel() for p in model.parameters()),
        "attn_implementation": model.config._attn_implementation,
        "fast_mamba_kernels": use_fast_kernels, "kernels_found": kernels,
    }
    path = "mamba_ssm + causal_conv1d (fast path)" if use_fast_kernels else "pure PyTorch (slow path)"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {environment['gpu']}; "
          f"{environment['shape']}, {environment['parameters'] / 1e9:.2f}B parameters, random bf16 weights, "
          f"attention {environment['attn_implementation']}", flush=True)
    print(f"Mamba layers: {path}; found: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in kernels.items()),
          flush=True)
    print(f"model built at {time.monotonic() - START:.0f} s of a {args.budget_s:.0f} s budget", flush=True)

    costs = CostModel()
    with torch.inference_mode():
        decode = run_decode(model, args, costs, generator)
        rollout = run_rollout(model, args, costs, generator)
    elapsed = time.monotonic() - START
    print(f"done in {elapsed:.0f} s", flush=True)
    if args.json:
        print(json.dumps({"tool": "hf_bench", **environment, "prompt_tokens": args.prompt_tokens,
                          "decode_tokens": args.decode_tokens, "decode": decode, "rollout": rollout,
                          "elapsed_s": elapsed}))


if __name__ == "__main__":
    main()
