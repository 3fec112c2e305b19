#!/usr/bin/env bash
# GPU speed figures (random bf16 weights generated on the GPU, the CUDA backend): decode tok/s in total at batch
# 1, 8, 64 and 256 with the weight GB/s each decode step achieves against the H200's 4.8 TB/s and a copy ceiling
# measured in the same run, and prefill tok/s; for the Jamba-Reasoning-3B shape (also a 512- and an 8192-token
# prompt alone) and the Jamba-v0.1 shape (52B MoE, 16 experts top-2; bf16 only: its 103 GB of bf16 weights would
# be 206 GB in f32 mode). Prints figures; never fails on time. Run on the GPU machine:
#   bench/gpu.sh [path/to/jambo] [f32|bf16|f16] [3b|52b|all] [f32|bf16]
#   (weights on the GPU, default bf16; shapes, default all; the recurrent state's storage, default f32)
# Figures of session 13 (H200, one GPU alone, copy ceiling 4.26 TB/s): Reasoning-3B decode batch 1: 428.5 tok/s
# (2.33 ms/step, 2.60 TB/s of weights = 54% of 4.8 TB/s; 431.8-434.5 in A B runs), 8: 2705, 64: 17,208, 256: 40,744
# (6.28 ms/step, 6.02 in the layers); prefill 512 tokens 52,800 (68,000-71,500 with 8 to 256 prompts packed), 8192
# tokens 66,700. Jamba-v0.1 decode batch 1: 125.3 (2.97 TB/s), 8: 305, 64: 1947, 256: 6247; prefill 512 tokens
# 10,800 (18,900-19,300 packed). Every earlier session's figures, and what changed in each: bench/HISTORY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build-gpu/jambo}
weights=${2:-bf16}
shapes=${3:-all}
state=${4:-f32}
[[ $shapes =~ ^(3b|52b|all)$ ]] || { echo "gpu.sh: shapes must be 3b, 52b or all, got '$shapes'" >&2; exit 2; }

bench() {
  local shape=$1
  shift
  "$jambo" bench --model "bench/shapes/$shape" --random-weights --random-dtype bf16 --backend cuda \
    --cuda-weights "$weights" --state-dtype "$state" "$@"
}

if [[ $shapes != 52b ]]; then
  bench jamba-reasoning-3b --batch 1,8,64,256 --prompt-tokens 512 --decode-tokens 32 --repeats 2
  bench jamba-reasoning-3b --batch 1 --prompt-tokens 8192 --decode-tokens 4 --repeats 2
fi
if [[ $shapes != 3b ]]; then
  if [[ $weights == f32 ]]; then
    echo "gpu.sh: the Jamba-v0.1 shape does not fit on one GPU in f32 mode; skipped" >&2
  else
    bench jamba-v0.1 --batch 1,8,64,256 --prompt-tokens 512 --decode-tokens 32 --repeats 2
  fi
fi
