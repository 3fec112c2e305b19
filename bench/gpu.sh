#!/usr/bin/env bash
# GPU speed figures (random bf16 weights generated on the GPU, the CUDA backend): decode tok/s in total at batch
# 1, 8, 64 and 256 with the weight GB/s each decode step achieves against the H200's 4.8 TB/s and a copy ceiling
# measured in the same run, and prefill tok/s; for the Jamba-Reasoning-3B shape (also a 512- and an 8192-token
# prompt alone) and the Jamba-v0.1 shape (52B MoE, 16 experts top-2; bf16 only: its 103 GB of bf16 weights would
# be 206 GB in f32 mode). Prints figures; never fails on time. Run on the GPU machine:
#   bench/gpu.sh [path/to/jambo] [f32|bf16|f16] [3b|52b|all] [f32|bf16]
#   (weights on the GPU, default bf16; shapes, default all; the recurrent state's storage, default f32)
# First figures (H200, 2026-11-29, bf16, cuBLAS per GEMM, no CUDA graphs; copy ceiling 4.24 TB/s):
#   Reasoning-3B decode tok/s in total: batch 1: 221 (4.53 ms/step, 1.34 TB/s of weights), 8: 1606, 64: 6818,
#   256: 10012; prefill tok/s: 512 tokens 16,500 (23,600 with 8 to 256 prompts packed), 8192 tokens 5,300.
# Reasoning-3B after token choices on the GPU, attention per KV head and the one-token state update (H200,
# 2026-11-29, session 3): decode batch 1: 187-215 (4.65-5.36 ms/step; attention's single block per token is no
# faster than the old block per head there), 8: 1591, 64: 8053-9125, 256: 17,105-18,687 (13.7-15.0 ms/step);
# prefill 512 tokens 19,200 (29,300 packed), 8192 tokens 15,600.
# Reasoning-3B after CUDA graphs, split-key decode attention, skinny GEMMs for one or two rows, the chunked scan,
# tensor-core prefill attention and producer-rounded GEMM inputs (H200, 2026-11-29, session 4, copy ceiling
# 4.26 TB/s): decode batch 1: 266 (3.76 ms/step), 8: 2243, 64: 13,683, 256: 30,417 (8.42 ms/step); prefill 512
# tokens 38,200 (58,800-60,100 packed), 8192 tokens 43,500.
# Session 5 (bf16 state option, skinny GEMMs reading 16-bit inputs, stacked gate_up, vectorized state update;
# H200, copy ceiling 4.26 TB/s, final build): decode batch 1: 336 (2.98 ms/step), 8: 2438, 64: 14,607, 256: 32,109
# (7.97 ms/step; 32,993 and, with a bf16 state, 33,155 in a run of the build before: same kernels at that batch);
# prefill 512 tokens 37,200 (57,500-59,500 packed), 8192 tokens 43,100.
# Session 6 (flash-attention-style prefill attention, conv and scan restructured, producers writing the 16-bit
# GEMM inputs, programmatic dependent launch through the decode chain; H200, copy ceiling 4.23 TB/s, final build):
# decode batch 1: 420 (2.38 ms/step, 2.54 TB/s of weights), 8: 2406, 64: 14,818, 256: 33,869 (7.56 ms/step);
# prefill 512 tokens 50,800 (68,000-69,800 packed), 8192 tokens 65,300.
# Session 7 (conv window loaded before its stores, norms in registers, x_proj on four warps per output, logits
# statistics split over clusters, packed SwiGLU stores, the state streamed past L2; H200, copy ceiling 4.23 TB/s,
# final build): decode batch 1: 439 (2.28 ms/step, of which the GPU spends 2.16 in the layers), 8: 2638,
# 64: 16,077, 256: 37,159 (6.89 ms/step; 6.57 in the layers); prefill 512 tokens 52,200 (68,900-71,000 packed),
# 8192 tokens 66,000.
# Session 8 (the conv fused into in_proj and SwiGLU into gate_up at batch 1-2; H200 x2, copy ceiling 4.23 TB/s,
# nothing else running): decode batch 1: 396 (2.53 ms/step, 2.40 in the layers), 8: 2609, 64: 15,866, 256: 36,550
# (7.00 ms/step; 6.60 in the layers); prefill 512 tokens 52,000 (69,800-71,400 packed), 8192 tokens 66,700. The
# same machines ran session 7's kernels at 378-381 (2.48 ms in the layers) at batch 1: session 7's 439 came from
# one machine that ran the same kernels faster (2.16 ms in the layers).
# Session 9 (the update's B and C in shared memory, no fp32 copies that only 16-bit GEMMs would read, the bench
# copying the hashed logits in its last step only, a faster row check on the host; H200, copy ceiling 4.24 TB/s,
# final build): decode batch 1: 411 (2.44 ms/step, 2.39 in the layers), 8: 2699, 64: 16,604, 256: 38,681
# (6.62 ms/step; 6.46 in the layers; 39,758 on a faster machine with the build before the fp32 copies went);
# prefill 512 tokens 52,500 (69,000-72,100 packed), 8192 tokens 67,000.
# Session 10 (16-bit GEMMs as cuBLASLt matmuls with our choice of algorithm: down_proj at batch 256 without split-K;
# H200, copy ceiling 4.23 TB/s, one GPU alone, runs A B A B against the build before): decode batch 1: 413
# (2.42 ms/step, 2.39 in the layers), 8: 2704-2711, 64: 16,657-16,664, 256: 38,661-38,941 (6.57-6.62 ms/step;
# 6.43-6.46 in the layers; the build before 38,523-38,700); prefill 8192 tokens 67,400-68,000; 512 tokens 53,000
# (68,900-71,800 packed, the other GPU running tests meanwhile).
# Session 11 (dense skinny GEMMs four loads deep instead of eight; H200, one GPU alone, runs A B A B against the
# build before): decode batch 1: 415.8-415.9 (2.40 ms/step, 2.372 in the layers; the build before 413.0-413.7,
# 2.384-2.387), 2: 762.1-762.6 (757.0-757.6), 8: 2707-2710 (unchanged).
# Session 12 (one-token attention on the tensor cores in the 16-bit mode, the one-token update's loads together and
# one channel a thread at 1-2 rows, the splits' combine over lanes; H200, one GPU alone, copy ceiling 4.24 TB/s):
# decode batch 1: 425.7 (2.35 ms/step, 2.32 in the layers), 8: 2722, 64: 17,041, 256: 41,242 (6.21 ms/step, 6.04 in
# the layers; A B A B runs 40,769-41,464; session 11's build 38,256-38,405 on another H200); prefill 512 tokens
# 52,400 (68,500-71,600 packed), 8192 tokens 66,700 (batch 8 and up and prefill measured with skinny GEMMs in 2-warp
# blocks, which they do not run). Those 2-warp blocks took batch 1 to 432.9-434.2 but Jamba-v0.1's batch 1 from
# 101.4 to 84.2 (its grouped expert GEMMs' blocks doubled, most of them for experts without rows): not kept.
# Jamba-v0.1 figures (H200, 2026-11-29, bf16: 103.7 GB of weights held, generated on the GPU, model and caches
# ready in 0.4 s; 111 GiB of GPU memory at most, at batch 256; MoE expert counts read back per layer):
#   decode tok/s in total: batch 1: 91.5 (10.9 ms/step, 2.17 TB/s of the 23.7 GB a token reads = 45% of
#   4.8 TB/s), 8: 310 (25.8 ms), 64: 1447 (44.2 ms), 256: 3528 (72.6 ms/step; a batch reads more experts than the
#   GB/s figure counts); prefill tok/s: 512 tokens 6,070 (9,100 with 8 to 256 prompts packed).
#   Session 4 (experts grouped on the GPU for steps up to 32 tokens, decode as CUDA graphs): decode batch 1:
#   85.9-89.4, 8: 287-301, 64: 1590-1661, 256: 5071-5084 tok/s; prefill 512 tokens 8,900 (16,200-16,700 packed).
#   Session 5 (final build): decode batch 1: 98.3, 8: 288, 64: 1767, 256: 5473 tok/s; prefill 512 tokens 9,300
#   (17,000-17,400 packed, the build before).
#   Session 6 (final build): decode batch 1: 100.5, 8: 299, 64: 1911, 256: 5860 tok/s; prefill 512 tokens 10,500
#   (18,700-19,400 packed).
#   Session 7 (final build): decode batch 1: 103.2, 8: 305, 64: 1958, 256: 5998 tok/s; prefill 512 tokens 10,800
#   (19,200-19,600 packed).
#   Session 8 (the other GPU of the machine running tests meanwhile): decode batch 1: 98.5, 8: 303, 64: 1925,
#   256: 5986 tok/s; prefill 512 tokens 10,600 (18,700-19,200 packed).
#   Session 9 (the other GPU running tests meanwhile): decode batch 1: 100.5, 8: 306, 64: 1961, 256: 5867 tok/s;
#   prefill 512 tokens 10,800 (19,000-19,300 packed).
#   Session 10 (cuBLASLt GEMMs; the other GPU running tests meanwhile): decode batch 1: 100.8, 8: 305, 64: 1925,
#   256: 5988 tok/s; prefill 512 tokens 10,800 (19,000-19,600 packed).
#   Session 12 (one GPU alone): decode batch 1: 101.3-101.5, 8: 307, 64: 1984, 256: 6247 tok/s; prefill 512 tokens
#   10,900 (19,000-19,400 packed).
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
