#!/usr/bin/env bash
# GPU speed figures for the Jamba-Reasoning-3B shape (random bf16 weights, the CUDA backend): decode tok/s in
# total at batch 1, 8, 64 and 256 with the weight GB/s each decode step achieves against the H200's 4.8 TB/s
# and a copy ceiling measured in the same run, then prefill tok/s of a 512- and an 8192-token prompt.
# Prints figures; never fails on time. Run on the GPU machine:
#   bench/gpu.sh [path/to/jambo] [f32|bf16]      (weights on the GPU; default bf16)
# First figures (H200, 2026-11-29, bf16, cuBLAS per GEMM, no CUDA graphs; copy ceiling 4.24 TB/s):
#   decode tok/s in total: batch 1: 221 (4.53 ms/step, 1.34 TB/s of weights), 8: 1606, 64: 6818, 256: 10012;
#   prefill tok/s: 512 tokens 16,500 (23,600 with 8 to 256 prompts packed), 8192 tokens 5,300.
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build-gpu/jambo}
weights=${2:-bf16}
shape=bench/shapes/jamba-reasoning-3b
common=(--model "$shape" --random-weights --random-dtype bf16 --backend cuda --cuda-weights "$weights")
"$jambo" bench "${common[@]}" --batch 1,8,64,256 --prompt-tokens 512 --decode-tokens 32 --repeats 2
"$jambo" bench "${common[@]}" --batch 1 --prompt-tokens 8192 --decode-tokens 4 --repeats 2
