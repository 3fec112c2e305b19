#!/usr/bin/env python3
"""Weight updates by CUDA IPC on the GPU: a trainer process's state_dict, sent with tools/jambo_ipc.py, serves bit
for bit as the same weights written to a folder and sent to /update_weights_from_disk, and the update, a sleep at
each level and the wake are timed, with the GPU memory in use asleep as another process (nvidia-smi) sees it.

Starts `jambo serve --backend cuda` (bf16 weights) on the demo model, then in this process (the trainer): loads the
demo's safetensors onto the GPU with torch, scales every norm weight by 1.5, and
  1. sends them by IPC: the greedy logprobs change, and GET /weight_version names the update;
  2. writes them to a folder and sends that from disk: the logprobs are the same bits as by IPC;
  3. sends a tensor of the wrong shape and one holding NaN: both answer 400 naming the tensor, nothing changes;
  4. sleeps at level 1 and 2 and wakes, timing each.
Run by scripts/gpu-test; prints one line per check, exits 1 on the first that fails:
    tools/ipc_update_check.py path/to/jambo [model folder]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jambo_ipc import send_state_dict  # noqa: E402


def request(url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=300) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read().decode())


def gpu_memory_used():
    return subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"]).decode().strip()


def main(jambo, model):
    folder = tempfile.mkdtemp(prefix="jambo-ipc-")
    server = subprocess.Popen([jambo, "serve", "--model", model, "--backend", "cuda", "--cuda-weights", "bf16",
                               "--port", "0", "--enable-control-endpoints", "--allowed-weight-paths", folder],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    match = re.search(r"http://[0-9.]+:[0-9]+", server.stdout.readline())
    if not match:
        sys.exit(f"ipc_update_check: jambo serve did not start: {server.stdout.read()}")
    url = match.group(0)
    threading.Thread(target=server.stdout.read, daemon=True).start()  # drained: a full pipe would block jambo
    name = model.rstrip("/").split("/")[-1]

    def logprobs():
        status, body = request(url, "/v1/completions", {"model": name, "prompt": "The meaning of life is",
                                                        "max_tokens": 16, "temperature": 0, "logprobs": 1,
                                                        "ignore_eos": True})
        assert status == 200, body
        return body["choices"][0]["logprobs"]["token_logprobs"]

    def check(ok, what):
        print(f"[ipc] {what}: {'ok' if ok else 'FAILED'}")
        if not ok:
            server.terminate()
            sys.exit(1)

    try:
        before = logprobs()
        weights = {k: v.cuda() for k, v in load_file(os.path.join(model, "model.safetensors")).items()}
        for key in weights:
            if "norm" in key:
                weights[key] = weights[key] * 1.5
        started = time.time()
        answer = send_state_dict(url, weights, "ipc-1")
        by_ipc = logprobs()
        check(by_ipc != before and request(url, "/weight_version")[1]["weight_version"] == "ipc-1",
              f"an IPC update of {answer['num_tensors']} tensors changes the logprobs "
              f"(update {answer['update_seconds']:.3f} s, {time.time() - started:.3f} s end to end)")
        save_file({k: v.contiguous().cpu() for k, v in weights.items()}, os.path.join(folder, "model.safetensors"))
        status, answer = request(url, "/update_weights_from_disk", {"model_path": folder, "weight_version": "disk-1"})
        check(status == 200 and logprobs() == by_ipc, "the same weights from disk give the same bits as by IPC")

        norm = next(k for k in weights if "final_layernorm" in k)
        wrong = {norm: torch.ones(weights[norm].numel() + 1, dtype=weights[norm].dtype, device="cuda")}
        try:
            send_state_dict(url, wrong, "wrong-shape")
            refused = ""
        except RuntimeError as error:
            refused = str(error)
        check("400" in refused and norm in refused and logprobs() == by_ipc,
              "a tensor of the wrong shape is refused naming it, nothing changed")
        nan = {norm: torch.full_like(weights[norm], float("nan"))}
        try:
            send_state_dict(url, nan, "nan")
            refused = ""
        except RuntimeError as error:
            refused = str(error)
        check("NaN" in refused and logprobs() == by_ipc, "a tensor holding NaN is refused, nothing changed")

        awake = gpu_memory_used()
        for level in (1, 2):
            started = time.time()
            status, slept = request(url, f"/sleep?level={level}", {})
            asleep = gpu_memory_used()
            status, woken = request(url, "/wake_up", {})
            print(f"[ipc] sleep level {level}: {slept['sleep_seconds']:.3f} s, GPU memory in use {awake} awake, "
                  f"{asleep} asleep; wake {woken['wake_seconds']:.3f} s")
        check(logprobs() == before, "after a level 2 sleep the checkpoint's logprobs are back")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "models/jambo-demo")
