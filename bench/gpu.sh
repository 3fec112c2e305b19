#!/usr/bin/env bash
# GPU speed figures (random bf16 weights generated on the GPU, the CUDA backend): decode tok/s in total at batch
# 1, 8, 64 and 256 with the weight GB/s each decode step achieves against the H200's 4.8 TB/s and a copy ceiling
# measured in the same run, and prefill tok/s; for the Jamba-Reasoning-3B shape (also a 512- and an 8192-token
# prompt alone) and the Jamba-v0.1 shape (52B MoE, 16 experts top-2; bf16 only: its 103 GB of bf16 weights would
# be 206 GB in f32 mode). Prints figures; never fails on time. Run on the GPU machine:
#   bench/gpu.sh [path/to/jambo] [f32|bf16|f16] [3b|52b|all] [f32|bf16] [invariant|cublas]
#   (weights on the GPU, default bf16; shapes, default all; the recurrent state's storage, default f32; the GEMMs,
#   default invariant, the engine's default)
# Figures of one run with cublas (H200, copy ceiling 4.26 TB/s, the other GPU of the machine running the 52b shapes):
# Reasoning-3B decode batch 1: 437.1 tok/s (2.29 ms/step, 2.65 TB/s of weights = 55% of 4.8 TB/s), 8: 2729,
# 64: 17,126, 256: 41,093 (6.23 ms/step, 6.06 in the layers); prefill 512 tokens 53,100 (69,200-72,200 with 8 to 256
# prompts packed), 8192 tokens 66,900. Jamba-v0.1 decode batch 1: 128.1 (3.03 TB/s), 8: 308, 64: 1962, 256: 6278;
# prefill 512 tokens 10,900 (19,000-19,400 packed). Every run's figures, and what changed before it:
# bench/HISTORY.md.
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build-gpu/jambo}
weights=${2:-bf16}
shapes=${3:-all}
state=${4:-f32}
gemm=${5:-invariant}
[[ $shapes =~ ^(3b|52b|all)$ ]] || { echo "gpu.sh: shapes must be 3b, 52b or all, got '$shapes'" >&2; exit 2; }

bench() {
  local shape=$1
  shift
  "$jambo" bench --model "bench/shapes/$shape" --random-weights --random-dtype bf16 --backend cuda \
    --cuda-weights "$weights" --state-dtype "$state" --cuda-gemm "$gemm" "$@"
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
