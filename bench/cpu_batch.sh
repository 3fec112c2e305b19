#!/usr/bin/env bash
# Offline batch throughput on the CPU: generated tokens/s of `jambo batch` with 1, 64 and 256 requests in
# flight, against the same requests run one at a time (--max-num-seqs 1), for the demo model and random
# weights with the Jamba-tiny-dev shape. Prints a table; never fails on time.
# Usage: bench/cpu_batch.sh [path/to/jambo]
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build/jambo}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# make_requests COUNT VOCAB PROMPT_TOKENS MAX_TOKENS: sampled requests with random prompts, seeded.
make_requests() {
  awk -v count="$1" -v vocab="$2" -v prompt="$3" -v max_tokens="$4" 'BEGIN {
    srand(7);
    for (r = 0; r < count; r++) {
      ids = "";
      for (t = 0; t < prompt; t++) ids = ids (t ? "," : "") int(4 + rand() * (vocab - 4));
      printf "{\"id\": \"r%d\", \"prompt_ids\": [%s], \"max_tokens\": %d, \"temperature\": 0.8, \"seed\": %d}\n", r, ids, max_tokens, r;
    }
  }'
}

# tokens_per_second ARGS...: runs jambo batch and prints "generated_tok/s all_tok/s" (all = prompt + generated).
tokens_per_second() {
  rm -f "$work/out.jsonl"
  "$jambo" batch --output "$work/out.jsonl" "$@" 2>&1 |
    sed -n 's/.*: \([0-9.]*\) generated tok\/s, \([0-9.]*\) tok\/s in all.*/\1 \2/p'
}

run_model() {  # run_model NAME MODEL_ARGS VOCAB MAX_TOKENS NUM_SEQUENTIAL
  local name=$1 model_args=$2 vocab=$3 max_tokens=$4 num_sequential=$5
  make_requests "$num_sequential" "$vocab" 32 "$max_tokens" >"$work/sequential.jsonl"
  local sequential batched
  sequential=($(tokens_per_second $model_args --input "$work/sequential.jsonl" --max-num-seqs 1))
  for concurrency in 1 64 256; do
    make_requests "$concurrency" "$vocab" 32 "$max_tokens" >"$work/in.jsonl"
    batched=($(tokens_per_second $model_args --input "$work/in.jsonl" --max-num-seqs "$concurrency" \
               --max-num-batched-tokens 2048 --max-model-len 64))
    printf '%-15s %4d in flight: %7.1f generated tok/s (%7.1f with prompts); one at a time %6.1f (%6.1f): x%.1f\n' \
      "$name" "$concurrency" "${batched[0]}" "${batched[1]}" "${sequential[0]}" "${sequential[1]}" \
      "$(awk -v a="${batched[1]}" -v b="${sequential[1]}" 'BEGIN { print a / b }')"
  done
}

echo "prompts of 32 tokens, sampled at temperature 0.8; $(nproc) cores"
run_model jambo-demo "--model models/jambo-demo" 4101 32 64
run_model jamba-tiny-dev "--model bench/shapes/jamba-tiny-dev --random-weights" 65536 16 8
