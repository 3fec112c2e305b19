#!/usr/bin/env python3
"""The server on the GPU: `jambo serve --backend cuda` answers like `--backend cpu`.

Starts the server on each backend with the demo model, sends the same greedy completions (16 at once, with
logprobs) and one streaming chat completion, and checks that the texts are equal and the token logprobs
agree within 1e-4. Standard library only (the GPU machine has no network). Run by scripts/gpu-test:
    tools/serve_smoke.py path/to/jambo [model folder]
"""
import json
import re
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

PROMPTS = [f"{start} number {i} is" for i, start in enumerate(["The meaning of life", "Once upon a time", "A cat"] * 6)][:16]


def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode()


def serve(jambo, model, backend):
    process = subprocess.Popen([jambo, "serve", "--model", model, "--backend", backend, "--port", "0", "--check"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = process.stdout.readline()
    match = re.search(r"http://[0-9.]+:[0-9]+", line)
    if not match:
        process.kill()
        sys.exit(f"serve_smoke: jambo serve --backend {backend} did not start: {line}{process.stdout.read()}")
    return process, match.group(0)


def run(jambo, model, backend):
    process, url = serve(jambo, model, backend)
    try:
        def complete(prompt):
            body = {"model": model.rstrip("/").split("/")[-1], "prompt": prompt, "max_tokens": 32, "temperature": 0,
                    "logprobs": 1, "ignore_eos": True}
            choice = json.loads(post(url + "/v1/completions", body))["choices"][0]
            return choice["text"], choice["logprobs"]["token_logprobs"]
        started = time.time()
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            completions = list(pool.map(complete, PROMPTS))
        seconds = time.time() - started
        chat = {"model": model.rstrip("/").split("/")[-1], "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 16, "temperature": 0, "stream": True}
        events = [line[6:] for line in post(url + "/v1/chat/completions", chat).splitlines() if line.startswith("data: ")]
        if events[-1] != "[DONE]":
            sys.exit(f"serve_smoke: the {backend} stream did not end with [DONE]")
        streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]
                           if json.loads(e)["choices"])
        return completions, streamed, seconds
    except (OSError, ValueError, KeyError) as error:  # a dropped connection or a malformed answer
        process.terminate()
        output = process.communicate(timeout=60)[0]
        sys.exit(f"serve_smoke: the {backend} server failed a request ({error!r}); exit code {process.returncode}, "
                 f"its output ends:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=60)


def main():
    jambo = sys.argv[1]
    model = sys.argv[2] if len(sys.argv) > 2 else "models/jambo-demo"
    cpu, cpu_chat, cpu_seconds = run(jambo, model, "cpu")
    cuda, cuda_chat, cuda_seconds = run(jambo, model, "cuda")
    worst = 0.0
    failures = []
    for prompt, (cpu_text, cpu_logprobs), (cuda_text, cuda_logprobs) in zip(PROMPTS, cpu, cuda):
        if cpu_text != cuda_text:
            failures.append(f"'{prompt}': cpu {cpu_text!r} != cuda {cuda_text!r}")
            continue
        worst = max([worst] + [abs(a - b) for a, b in zip(cpu_logprobs, cuda_logprobs)])
    if cpu_chat != cuda_chat:
        failures.append(f"streamed chat: cpu {cpu_chat!r} != cuda {cuda_chat!r}")
    print(f"[serve smoke] {len(PROMPTS)} concurrent greedy completions + a streamed chat: cpu {cpu_seconds:.2f} s, "
          f"cuda {cuda_seconds:.2f} s, max |dlogprob| {worst:.3g}, {len(failures)} mismatches")
    for failure in failures:
        print("  " + failure)
    sys.exit(1 if failures or worst > 1e-4 else 0)


if __name__ == "__main__":
    main()
