#!/usr/bin/env bash
# End-to-end tests of the `jambo` command: exit codes, error messages and output formats.
# Usage: tests/cli/cli_test.sh path/to/jambo   (run from the repository root)
set -uo pipefail
jambo=$1
demo=models/jambo-demo
fixture=$(ls -d tests/fixtures/models/*/ | head -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }

# expect_exit CODE NAME COMMAND...: runs COMMAND, checks its exit code; stderr goes to $work/err.
expect_exit() {
  local want=$1 name=$2; shift 2
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  if [[ $got -eq $want ]]; then pass "$name"; else fail "$name: exit $got, expected $want; stderr: $(cat "$work/err")"; fi
}
expect_stderr() {  # expect_stderr NAME TEXT: the last command's stderr contains TEXT in one line
  if grep -qF -- "$2" "$work/err" && [[ $(wc -l <"$work/err") -le 1 ]]; then pass "$1"
  else fail "$1: stderr lacks '$2' or is not one line: $(cat "$work/err")"; fi
}

# --help everywhere
for sub in "" score generate tokenize detokenize bench; do
  expect_exit 0 "help ${sub:-top}" "$jambo" $sub --help
done

# bad options and values: one line, exit code 2
expect_exit 2 "unknown subcommand" "$jambo" frobnicate
expect_exit 2 "unknown option" "$jambo" score --model "$demo" --input x --bogus
expect_stderr "unknown option named" "--bogus"
expect_exit 2 "missing required option" "$jambo" score --input x
expect_stderr "missing option named" "--model"
expect_exit 2 "non-numeric value" "$jambo" generate --model "$demo" --prompt hi --max-tokens lots
expect_exit 2 "bad temperature" "$jambo" generate --model "$demo" --prompt hi --temperature -1
expect_stderr "bad temperature named" "temperature"
expect_exit 2 "bad prompt ids" "$jambo" generate --model "$demo" --prompt-ids 1,x,3
expect_exit 2 "no prompt" "$jambo" generate --model "$demo"

# bad model folders: exit code 1 with the loader's message
expect_exit 1 "missing model folder" "$jambo" generate --model "$work/nowhere" --prompt-ids 1
expect_stderr "missing folder named" "nowhere"
mkdir -p "$work/badconfig" && echo '{"hidden_size": 64,' >"$work/badconfig/config.json"
expect_exit 1 "malformed config.json" "$jambo" generate --model "$work/badconfig" --prompt-ids 1
expect_stderr "malformed config named" "config.json"

# score: input order, null first logprob, top_logprobs shape
printf '{"id": "b", "tokens": [5, 9, 3, 7]}\n{"id": 1, "tokens": [4]}\n' >"$work/in.jsonl"
expect_exit 0 "score" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --output "$work/scores.jsonl" --top-logprobs 3
if jq -e -s 'length == 2 and .[0].id == "b" and (.[0].logprobs | length) == 4 and .[0].logprobs[0] == null
             and (.[0].logprobs[1] | type) == "number" and .[0].top_logprobs[0] == null
             and (.[0].top_logprobs[1] | length) == 3 and .[1].id == 1 and .[1].logprobs == [null]' \
     "$work/scores.jsonl" >/dev/null; then pass "score output format"; else fail "score output format: $(cat "$work/scores.jsonl")"; fi
printf '{"id": 1, "tokens": [1, 2]}\nnot json\n' >"$work/bad.jsonl"
expect_exit 0 "score --backend cpu" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --output "$work/scores_cpu.jsonl" --top-logprobs 3 --backend cpu
if cmp -s "$work/scores.jsonl" "$work/scores_cpu.jsonl"; then pass "score --backend cpu is the default"; else fail "score --backend cpu differs from the default"; fi
expect_exit 2 "score unknown backend" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --backend tpu
expect_stderr "unknown backend named" "--backend"
expect_exit 0 "score --state-dtype bf16" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --output "$work/scores_bf16.jsonl" --state-dtype bf16
if jq -e -s 'length == 2 and (.[0].logprobs[3] | type) == "number"' "$work/scores_bf16.jsonl" >/dev/null; then
  pass "score with a bf16 state"; else fail "score --state-dtype bf16: $(cat "$work/scores_bf16.jsonl")"; fi
expect_exit 2 "score unknown state dtype" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --state-dtype f16
expect_stderr "unknown state dtype named" "--state-dtype"
expect_exit 2 "score unknown CUDA weight mode" "$jambo" score --model "$fixture" --input "$work/in.jsonl" --cuda-weights fp8
expect_stderr "unknown CUDA weight mode named" "--cuda-weights: CUDA weight mode 'fp8'"
for budget in lots 0 -1 1.5 2XB tight; do  # tight is stress's alone
  expect_exit 2 "batch memory budget $budget" "$jambo" batch --model "$demo" --input "$work/in.jsonl" --memory-budget "$budget"
  expect_stderr "bad memory budget $budget named" "--memory-budget: memory budget '$budget'"
done
expect_exit 1 "score malformed line" "$jambo" score --model "$fixture" --input "$work/bad.jsonl"
expect_stderr "malformed line named" "bad.jsonl:2"
printf '{"id": 1, "tokens": [1, 99999999]}\n' >"$work/oov.jsonl"
expect_exit 1 "score out-of-vocabulary id" "$jambo" score --model "$fixture" --input "$work/oov.jsonl"
expect_stderr "out-of-vocabulary id named" "99999999"

# hostile input: clear errors, never a crash
python_free_nest() { local n=$1; printf '%*s' "$n" '' | tr ' ' '['; }
{ printf '{"id": %s1%s, "tokens": [1, 2]}\n' "$(python_free_nest 100000)" "$(printf '%*s' 100000 '' | tr ' ' ']')"; } >"$work/nested.jsonl"
expect_exit 1 "score deeply nested id" "$jambo" score --model "$fixture" --input "$work/nested.jsonl"
expect_stderr "nested id named" "'id'"
expect_exit 1 "score input is a directory" "$jambo" score --model "$fixture" --input "$work"
expect_stderr "directory input named" "not a regular file"
expect_exit 2 "huge max tokens" "$jambo" generate --model "$fixture" --prompt-ids 1,2 --max-tokens 9223372036854775807
expect_stderr "huge max tokens named" "max-tokens"
expect_exit 2 "negative seed" "$jambo" generate --model "$fixture" --prompt-ids 1 --temperature 1 --seed -5
expect_exit 1 "overlong model path" "$jambo" generate --model "$work/$(printf 'a%.0s' {1..5000})" --prompt-ids 1
mkdir -p "$work/hugevocab" && sed 's/"vocab_size": *[0-9]*/"vocab_size": 4611686018427387904/' "$fixture/config.json" >"$work/hugevocab/config.json"
expect_exit 1 "absurd vocab size" "$jambo" bench --model "$work/hugevocab" --random-weights
expect_stderr "absurd vocab named" "vocab_size"
printf '%s' "$(python_free_nest 100000)" | "$jambo" detokenize --model "$demo" >/dev/null 2>"$work/err"
[[ $? -eq 1 ]] && pass "detokenize deeply nested input" || fail "detokenize deeply nested input: $(cat "$work/err")"

# tokenize works on a folder holding only tokenizer.json; detokenize inverts it
mkdir -p "$work/tok" && cp "$demo/tokenizer.json" "$work/tok/"
printf 'Hello, world!' | "$jambo" tokenize --model "$work/tok" >"$work/ids.json" 2>"$work/err" \
  && pass "tokenize with tokenizer.json only" || fail "tokenize: $(cat "$work/err")"
text=$("$jambo" detokenize --model "$work/tok" --skip-special <"$work/ids.json")
[[ $text == "Hello, world!" ]] && pass "detokenize round trip" || fail "detokenize round trip gave '$text'"

# generate --json: the documented fields; greedy is deterministic; seeded sampling is reproducible
expect_exit 0 "generate json" "$jambo" generate --model "$demo" --prompt "The" --max-tokens 8 --logprobs 2 --json
if jq -e '(.prompt_ids | length) > 0 and (.ids | length) > 0 and (.logprobs | length) == (.ids | length)
          and (.top_logprobs[0] | length) == 2 and (.text | type) == "string"
          and (.finish_reason == "stop" or .finish_reason == "length")' "$work/out" >/dev/null
then pass "generate json fields"; else fail "generate json fields: $(cat "$work/out")"; fi
a=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 12 --temperature 0.9 --seed 5 --json | jq -c .ids)
b=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 12 --temperature 0.9 --seed 5 --json | jq -c .ids)
[[ -n $a && $a == "$b" ]] && pass "seeded sampling reproducible" || fail "seeded sampling: $a vs $b"
streamed=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 12)
json_text=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 12 --json | jq -r .text)
[[ $streamed == "$json_text" ]] && pass "streamed text equals json text" || fail "streamed '$streamed' vs json '$json_text'"
# generate --stop cuts the text before the stop string, streamed and in JSON; --logprobs without --json prints a
# line per generated token on stderr, the logprobs of the JSON object
full=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 24 --json | jq -r .text)
stop=$(head -n 1 <<<"$full" | cut -d' ' -f4)
cut_json=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 24 --stop " $stop" --json)
cut_streamed=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 24 --stop " $stop")
want=${full%% "$stop"*}
if [[ -n $stop && $(jq -r .text <<<"$cut_json") == "$want" && $cut_streamed == "$want" &&
      $(jq -r .finish_reason <<<"$cut_json") == stop ]]
then pass "generate --stop"; else fail "generate --stop ' $stop': json $(jq -c '[.text, .finish_reason]' <<<"$cut_json"), streamed '$cut_streamed', full '$full'"; fi
"$jambo" generate --model "$demo" --prompt "The" --max-tokens 6 --logprobs 2 >"$work/out" 2>"$work/err"
json_logprobs=$("$jambo" generate --model "$demo" --prompt "The" --max-tokens 6 --logprobs 2 --json | jq -r '.logprobs[] | . * 1e6 | round')
text_logprobs=$(awk -F'\t' '{printf "%.0f\n", $3 * 1e6}' "$work/err")
if [[ $(wc -l <"$work/err") -ge 1 && $(awk -F'\t' 'NF == 4' "$work/err" | wc -l) -eq $(wc -l <"$work/err") &&
      $json_logprobs == "$text_logprobs" ]]
then pass "generate --logprobs without --json"; else fail "generate --logprobs: stderr $(cat "$work/err"), json $json_logprobs"; fi

# bench runs on random weights from a config.json alone
mkdir -p "$work/shape" && cp "$fixture/config.json" "$work/shape/"
expect_exit 0 "bench random weights" "$jambo" bench --model "$work/shape" --random-weights --prompt-tokens 8 --decode-tokens 2 --repeats 1
grep -q "tok/s" "$work/out" && pass "bench prints tok/s" || fail "bench output: $(cat "$work/out")"
expect_exit 0 "bench plot" "$jambo" bench --model "$work/shape" --random-weights --prompt-tokens 8 --decode-tokens 2 \
  --repeats 1 --batch 1,3 --plot "$work/bench.svg"
[[ $(grep -o '<rect x=[^>]*fill="#4a78b5"' "$work/bench.svg" | wc -l) -eq 2 ]] && grep -q "batch 3" "$work/bench.svg" &&
  pass "bench plot: one bar per batch" || fail "bench plot: $(head -c 300 "$work/bench.svg")"
expect_exit 1 "bench plot to an unwritable path" "$jambo" bench --model "$work/shape" --random-weights \
  --plot "$work/missing/bench.svg"
expect_stderr "bench plot path named" "cannot write output file '$work/missing/bench.svg'"

# batch: one line per sample, a malformed line reported by number and skipped, a rerun resumes
cat >"$work/batch.jsonl" <<'LINES'
{"id": "greedy", "prompt": "The meaning of life is", "max_tokens": 8}
{"id": "sampled", "prompt_ids": [1, 296, 1842], "n": 3, "temperature": 0.8, "seed": 3, "max_tokens": 6, "logprobs": 2}
{"id": "broken", "prompt": 12}
not json at all
LINES
expect_exit 0 "batch" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" --output "$work/batch-out.jsonl" \
  --max-num-batched-tokens 5 --slot-policy highest --check --trace "$work/trace.jsonl"
grep -q "batch.jsonl:3: field 'prompt' must be a string" "$work/err" && grep -q "batch.jsonl:4: malformed JSON" "$work/err" \
  && pass "batch names malformed lines" || fail "batch malformed lines: $(cat "$work/err")"
if jq -e -s 'length == 4 and (map(.id) | sort) == ["greedy", "sampled", "sampled", "sampled"]
             and all(.[]; has("prompt_ids") and has("ids") and has("text") and has("logprobs") and has("top_logprobs")
                           and has("finish_reason") and has("sample"))
             and ([.[] | select(.id == "sampled") | .top_logprobs[0] | length] | all(. == 2))' \
     "$work/batch-out.jsonl" >/dev/null; then pass "batch output format"; else fail "batch output: $(cat "$work/batch-out.jsonl")"; fi
expect_exit 0 "batch rerun" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" --output "$work/batch-out.jsonl"
[[ $(wc -l <"$work/batch-out.jsonl") -eq 4 ]] && grep -q "2 already done" "$work/err" \
  && pass "batch rerun skips finished ids" || fail "batch rerun: $(cat "$work/err")"

# trace: the life of one request
expect_exit 0 "trace" "$jambo" trace --input "$work/trace.jsonl" --request sampled
grep -q "prefill" "$work/out" && grep -q "decode" "$work/out" && grep -q "finished" "$work/out" \
  && pass "trace tells prefill, decode and finish" || fail "trace output: $(cat "$work/out")"
expect_exit 1 "trace of an unknown request" "$jambo" trace --input "$work/trace.jsonl" --request nobody

# compare: a clean batch passes; one perturbed logprob is flagged with exit code 3
expect_exit 0 "compare clean" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" --report "$work/report.html"
grep -q "<svg" "$work/report.html" && pass "compare writes an HTML report" || fail "compare report lacks a plot"
jq -c 'if .id == "greedy" then .logprobs[2] += 0.5 else . end' "$work/batch-out.jsonl" >"$work/perturbed.jsonl"
expect_exit 3 "compare flags a perturbed sample" "$jambo" compare --model "$demo" --input "$work/perturbed.jsonl"
jq -e '.samples | map(select(.flagged)) | length == 1 and .[0].id == "greedy" and .[0].first_divergent_position == 2' \
  "$work/out" >/dev/null && pass "compare names the sample and position" || fail "compare summary: $(cat "$work/out")"

jq -c 'if .id == "greedy" then .logprobs[1] = null else . end' "$work/batch-out.jsonl" >"$work/nan.jsonl"
expect_exit 3 "compare flags a NaN (null) logprob" "$jambo" compare --model "$demo" --input "$work/nan.jsonl"
# the reference packed into steps of 4 tokens and 1 row (each sample alone) still equals jambo bitwise
expect_exit 0 "compare in small reference steps" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" \
  --backend cpu --cuda-weights f32 --step-tokens 4 --step-rows 1
jq -e '.num_samples == 4 and .max_abs_diff == 0' "$work/out" >/dev/null && pass "small reference steps: exact" \
  || fail "compare in small steps: $(cat "$work/out")"
expect_exit 2 "compare on an unknown backend" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" --backend tpu

# stress: clean without faults; each historical bug injected is caught (exit code 3)
expect_exit 0 "stress clean" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40
for fault in decode-before-prefill offset-wrap; do
  expect_exit 3 "stress catches $fault" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40 --inject "$fault"
done

# stress at scale's knobs: n exactly 3 (min-n = max-n), the reference on a named backend in small packed steps;
# the summary places the state pool and its top slot against 2^32 elements
expect_exit 0 "stress with fixed n and a packed reference" "$jambo" stress --model "$demo" --requests 12 \
  --max-prompt-tokens 20 --min-n 3 --max-n 3 --reference-backend cpu --reference-step-tokens 16 \
  --reference-step-rows 2 --output "$work/stress.jsonl"
jq -e -s 'length == 36 and (group_by(.id) | all(length == 3))' "$work/stress.jsonl" >/dev/null \
  && pass "stress --min-n/--max-n fix n" || fail "stress samples per request: $(jq -c '[.id, .sample]' "$work/stress.jsonl")"
grep -q '36 samples, 0 flagged.*state pool [0-9]* slots x [0-9]* = [0-9]* elements (within 2^32); top slot used [0-9]*: elements' \
  "$work/out" && pass "stress summary places the pool and top slot" || fail "stress summary: $(cat "$work/out")"
# a bf16 state against the fp32 reference: refused at the default threshold, naming it; at 0.5 clean, and both
# historical bugs still caught
expect_exit 2 "stress bf16 state at the default threshold" "$jambo" stress --model "$demo" --state-dtype bf16
expect_stderr "stress bf16 state names --threshold" "--threshold"
expect_exit 0 "stress bf16 state clean at 0.5" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40 \
  --state-dtype bf16 --threshold 0.5
for fault in decode-before-prefill offset-wrap; do
  expect_exit 3 "stress bf16 state catches $fault" "$jambo" stress --model "$demo" --requests 30 \
    --max-prompt-tokens 40 --state-dtype bf16 --threshold 0.5 --inject "$fault"
done
expect_exit 2 "stress with min-n above max-n" "$jambo" stress --model "$demo" --min-n 5 --max-n 4
expect_stderr "min-n above max-n named" "--min-n 5 is more than --max-n 4"

# checked mode turns the historical stale read into a loud law 2 error naming request and slot
expect_exit 1 "checked mode stops a stale read" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40 \
  --inject decode-before-prefill --check
grep -q "law 2 violation: request 'stress-" "$work/err" && grep -q "slot" "$work/err" \
  && pass "checked mode names request and slot" || fail "checked stale read: $(cat "$work/err")"

# a torn last output line (an interrupted run) is cut before the rerun appends
head -c -20 "$work/batch-out.jsonl" >"$work/torn.jsonl"
expect_exit 0 "batch resumes after a torn line" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" --output "$work/torn.jsonl"
jq -e -s 'length == 4' "$work/torn.jsonl" >/dev/null && pass "torn line replaced by a whole one" \
  || fail "torn resume: $(tail -c 300 "$work/torn.jsonl")"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
