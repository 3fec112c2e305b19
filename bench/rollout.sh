#!/usr/bin/env bash
# An RL rollout through `jambo batch`: PROMPTS prompts of PROMPT_TOKENS random token ids, N samples each,
# MAX_TOKENS generated per sample (--ignore-eos, so every sample makes all of them), temperature 1.0, seeded.
# Prints the time to finish and generated and total (prompt + generated) tokens/s; never fails on time, but
# fails when the engine did not generate the whole workload.
# Usage: bench/rollout.sh [path/to/jambo] [gpu|cpu-demo]
#   gpu (default): the Jamba-Reasoning-3B shape, random bf16 weights, the CUDA backend: 1024 prompts x n = 8,
#     512 tokens in, 256 out (2.1M generated tokens; one H200 run on --cuda-gemm cublas: 55.9 s, 37,500 generated
#     tok/s and 46,900 in all, 0.67 ms a step outside the forward calls; other runs in bench/HISTORY.md; run it on
#     the GPU machine). CUDA_GEMM picks the GEMMs (default invariant, the engine's default; or cublas).
#   cpu-demo: models/jambo-demo on the CPU, 16 prompts x n = 4, 32 tokens in, 32 out (seconds).
# Any of PROMPTS, N, PROMPT_TOKENS, MAX_TOKENS, MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS, MEMORY_BUDGET, SEED and
# STATE_DTYPE (the engine's --state-dtype, f32 or bf16; default f32) in the environment overrides the preset's value.
# SHARDS=K (default 1) runs the rollout data-parallel: K engines at once, each on `jambo batch --shard I/K` of the
# same prompts (on the gpu preset, engine I on GPU I via CUDA_VISIBLE_DEVICES); the figures sum the shards' tokens
# and rates, and the time to finish is the slowest shard's.
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build/jambo}
preset=${2:-gpu}
case "$preset" in
  gpu)
    model=bench/shapes/jamba-reasoning-3b
    model_args=(--model "$model" --random-weights --random-dtype bf16 --backend cuda --cuda-weights bf16
                --cuda-gemm "${CUDA_GEMM:-invariant}")
    # 512 sequences in flight (64 prompts' samples); each step decodes them all and prefills up to 3584 prompt
    # tokens beside. The budget holds bf16 weights (6.1 GB), 512 fp32 state slots (10.1 MB each) and their KV.
    : "${PROMPTS:=1024}" "${N:=8}" "${PROMPT_TOKENS:=512}" "${MAX_TOKENS:=256}"
    : "${MAX_NUM_SEQS:=512}" "${MAX_NUM_BATCHED_TOKENS:=4096}" "${MEMORY_BUDGET:=32GiB}" ;;
  cpu-demo)
    model=models/jambo-demo
    model_args=(--model "$model")
    : "${PROMPTS:=16}" "${N:=4}" "${PROMPT_TOKENS:=32}" "${MAX_TOKENS:=32}"
    : "${MAX_NUM_SEQS:=64}" "${MAX_NUM_BATCHED_TOKENS:=512}" "${MEMORY_BUDGET:=1GiB}" ;;
  *) echo "bench/rollout.sh: unknown preset '$preset' (gpu or cpu-demo)" >&2; exit 2 ;;
esac
: "${SEED:=1}" "${STATE_DTYPE:=f32}" "${SHARDS:=1}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One request line per prompt: random ids from 4 up (below are the special tokens), a seed per request.
python3 - "$model/config.json" "$PROMPTS" "$PROMPT_TOKENS" "$SEED" >"$work/in.jsonl" <<'PY'
import json, random, sys
config_path, num_prompts, prompt_tokens, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
vocab_size = json.load(open(config_path))["vocab_size"]
rng = random.Random(seed)
for r in range(num_prompts):
    ids = [rng.randrange(4, vocab_size) for _ in range(prompt_tokens)]
    print(json.dumps({"id": f"r{r}", "prompt_ids": ids, "seed": seed * 1_000_003 + r}))
PY

echo "rollout ($preset): $PROMPTS prompts x n = $N = $((PROMPTS * N)) samples, $PROMPT_TOKENS prompt tokens," \
     "$MAX_TOKENS generated tokens each (ignore_eos, temperature 1.0, seed $SEED)"
echo "engine: ${model_args[*]} --max-num-seqs $MAX_NUM_SEQS --max-num-batched-tokens $MAX_NUM_BATCHED_TOKENS" \
     "--memory-budget $MEMORY_BUDGET --state-dtype $STATE_DTYPE"
[[ $SHARDS =~ ^[1-9][0-9]*$ ]] || { echo "bench/rollout.sh: SHARDS must be a positive count, got '$SHARDS'" >&2; exit 2; }
(( SHARDS > 1 )) && echo "data-parallel: $SHARDS engines, each on --shard I/$SHARDS$([[ $preset == gpu ]] && echo ', GPU I')"
run_shard() {  # run_shard I: the whole rollout, or its shard I; progress every 5 s (shard 0's), then the summary
  local shard=() devices=${CUDA_VISIBLE_DEVICES-}
  if (( SHARDS > 1 )); then
    shard=(--shard "$1/$SHARDS")
    [[ $preset == gpu ]] && devices=$1
  fi
  CUDA_VISIBLE_DEVICES=$devices "$jambo" batch "${model_args[@]}" --input "$work/in.jsonl" --output "$work/out$1.jsonl" \
    --n "$N" --max-tokens "$MAX_TOKENS" --ignore-eos --temperature 1.0 \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$MAX_NUM_BATCHED_TOKENS" \
    --memory-budget "$MEMORY_BUDGET" --state-dtype "$STATE_DTYPE" --max-model-len $((PROMPT_TOKENS + MAX_TOKENS)) \
    "${shard[@]}" 2>&1 >/dev/null | tee "$work/err$1" | { if (( $1 == 0 )); then cat >&2; else cat >/dev/null; fi; }
}
start=$(date +%s.%N)
for ((i = 0; i < SHARDS; ++i)); do run_shard "$i" & done
wait
end=$(date +%s.%N)

# Figures from each shard's summary line: "batch: [shard I/K, ]R requests run, ...; G tokens generated, P prompt
# tokens computed in T s: X generated tok/s, ...; E preemptions, ...": counts and rates summed over the shards,
# times the slowest shard's, and the per-step host time the shards' mean.
summaries=$(grep -h '^batch: ' "$work"/err*) || { echo "jambo batch printed no summary" >&2; exit 1; }
[[ $(wc -l <<<"$summaries") -eq $SHARDS ]] || { echo "a shard of jambo batch printed no summary" >&2; exit 1; }
numbers() { sed -nE "s|$1|\1|p" <<<"$summaries"; }  # numbers REGEX: each shard's number captured by REGEX
figure() { numbers ".*[;:,] ([0-9.]+) $1.*"; }     # figure PHRASE: each shard's number before PHRASE
sum() { awk '{ s += $1 } END { print s }'; }
longest() { awk '$1 > m { m = $1 } END { print m + 0 }'; }
mean() { awk '{ s += $1 } END { print s / NR }'; }
requests=$(figure 'requests run' | sum)
generated=$(figure 'tokens generated' | sum)
computed=$(figure 'prompt tokens computed' | sum)
seconds=$(numbers '.* in ([0-9.]+) s: .*' | longest)
generated_per_s=$(figure 'generated tok/s' | sum)
preemptions=$(figure preemptions | sum)
forward_seconds=$(numbers ".*\(([0-9.]+) s in the backend's forward calls.*" | longest)
host_ms=$(figure 'ms a step outside them' | mean)
steps=$(figure 'steps' | sum)
expected=$((PROMPTS * N * MAX_TOKENS))
if [[ $requests -ne $PROMPTS || $generated -ne $expected ]]; then
  echo "the engine ran $requests of $PROMPTS requests and generated $generated of $expected tokens" >&2
  exit 1
fi
prompt_tokens=$((PROMPTS * PROMPT_TOKENS))
wall=$(awk -v start="$start" -v end="$end" 'BEGIN { print end - start }')
printf 'prompt tokens:    %d (%d computed: each prompt once for its n samples, and recomputed after preemption)\n' \
  "$prompt_tokens" "$computed"
printf 'generated tokens: %d\n' "$generated"
printf 'time to finish:   %.1f s in the engine loop (%.1f s for the whole command, model build included)\n' \
  "$seconds" "$wall"
printf 'generated tok/s:  %.1f\n' "$generated_per_s"
printf 'total tok/s:      %.1f (prompt + generated tokens of the workload over the engine loop time)\n' \
  "$(awk -v rate="$generated_per_s" -v prompts="$prompt_tokens" -v generated="$generated" \
       'BEGIN { print rate * (prompts + generated) / generated }')"
printf 'preemptions:      %d\n' "$preemptions"
printf 'steps:            %d: %.1f s in the backend'"'"'s forward calls, %.2f ms a step outside them (scheduling,\n' \
  "$steps" "$forward_seconds" "$host_ms"
printf '                  state copies for forks, outputs)\n'
