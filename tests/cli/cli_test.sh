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
expect_stderr_line() {  # expect_stderr_line NAME TEXT: a line of the last command's stderr contains TEXT
  if grep -qF -- "$2" "$work/err"; then pass "$1"; else fail "$1: stderr lacks '$2': $(cat "$work/err")"; fi
}

# --help everywhere
for sub in "" score generate tokenize detokenize bench; do
  expect_exit 0 "help ${sub:-top}" "$jambo" $sub --help
done

# --version: the project version CMakeLists.txt declares
version=$(sed -n 's/^project(jambo VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
expect_exit 0 "version" "$jambo" --version
[[ -n $version && $(cat "$work/out") == "jambo $version" ]] && pass "version is CMake's" \
  || fail "version: '$(cat "$work/out")', CMakeLists.txt says '$version'"

# bad options and values: one line, exit code 2
expect_exit 2 "unknown subcommand" "$jambo" frobnicate
expect_stderr "unknown subcommand named" "unknown subcommand 'frobnicate' (see --help)"
expect_exit 2 "misspelled subcommand" "$jambo" genrate --model "$demo"
expect_stderr "misspelled subcommand: the nearest named" "unknown subcommand 'genrate'; did you mean 'generate'?"
expect_exit 2 "unknown option" "$jambo" score --model "$demo" --input x --bogus
expect_stderr "unknown option named, nothing near it" "unknown option '--bogus' (see --help)"
expect_exit 2 "misspelled option" "$jambo" generate --model "$demo" --prompt hi --max-token 3
expect_stderr "misspelled option: the nearest named" "unknown option '--max-token'; did you mean '--max-tokens'?"
# a misspelled required option is the error, not the option it failed to give
expect_exit 2 "misspelled required option" "$jambo" score --modle "$demo" --input x
expect_stderr "misspelled required option named" "unknown option '--modle'; did you mean '--model'?"
expect_exit 2 "missing required option" "$jambo" score --input x
expect_stderr "missing option named" "--model"
expect_exit 2 "non-numeric value" "$jambo" generate --model "$demo" --prompt hi --max-tokens lots
expect_stderr "non-numeric value named" "--max-tokens: 'lots' is not an integer"
expect_exit 2 "bad temperature" "$jambo" generate --model "$demo" --prompt hi --temperature -1
expect_stderr "bad temperature named" "temperature"
expect_exit 2 "bad prompt ids" "$jambo" generate --model "$demo" --prompt-ids 1,x,3
expect_exit 2 "no prompt" "$jambo" generate --model "$demo"

# range errors in a few words, whichever file declared the option and its range
expect_exit 2 "count out of range" "$jambo" batch --model "$demo" --input x --output y --max-num-seqs 0
expect_stderr "count out of range named" "--max-num-seqs: 0 is outside [1, 1048576] (see --help)"
expect_exit 2 "rate out of range" "$jambo" stress --model "$demo" --arrival-rate 0
expect_stderr "rate out of range named" "--arrival-rate: 0 is outside [0.001, 1e+06] (see --help)"
expect_exit 2 "port out of range" "$jambo" serve --model "$demo" --port 70000
expect_stderr "port out of range named" "--port: 70000 is outside [0, 65535] (see --help)"
expect_exit 2 "zero prompt tokens" "$jambo" bench --model "$demo" --prompt-tokens 0
expect_stderr "zero prompt tokens named" "--prompt-tokens: 0 is not a positive integer (see --help)"
expect_exit 2 "unsigned option given -1" "$jambo" score --model "$demo" --input x --random-seed -1
expect_stderr "unsigned option given -1 named" "--random-seed: -1 is not a non-negative integer (see --help)"
expect_exit 2 "non-finite threshold" "$jambo" stress --model "$demo" --threshold nan
expect_stderr "non-finite threshold named" "--threshold: nan is not a finite number (see --help)"
# every numeric option of every subcommand (as --help lists them): a non-numeric value and one past its type's
# range each get one short line that names the option
num_options=0
for sub in score generate tokenize detokenize bench batch compare stress trace serve; do
  while read -r option type; do
    num_options=$((num_options + 1))
    huge=99999999999999999999999 && [[ $type == FLOAT ]] && huge=1e999
    for value in x "$huge"; do
      "$jambo" $sub "$option" "$value" >/dev/null 2>"$work/err"
      got=$?
      if [[ $got -ne 2 || $(wc -l <"$work/err") -ne 1 || $(wc -c <"$work/err") -gt 120 ]] ||
         ! grep -qF -- "$option: " "$work/err"; then
        fail "$sub $option $value: exit $got: $(cat "$work/err")"
      fi
    done
  done < <("$jambo" $sub --help | sed -n 's/^ *\(--[a-z-]*\) \(INT\|UINT\|FLOAT\)\b.*/\1 \2/p')
done
[[ $num_options -ge 50 ]] && pass "short messages for all $num_options numeric options" \
  || fail "only $num_options numeric options found in --help"

# bad model folders: exit code 1 with the loader's message
expect_exit 1 "missing model folder" "$jambo" generate --model "$work/nowhere" --prompt-ids 1
expect_stderr "missing folder named" "$work/nowhere: model folder not found"
# a file of the folder given for the folder, in each way a command reads --model
is_a_file="' is a file; give the model folder that holds it"
expect_exit 1 "model folder given as its config.json" "$jambo" generate --model "$demo/config.json" --prompt-ids 1
expect_stderr "config.json named as a file" "'$demo/config.json$is_a_file"
expect_exit 1 "random weights from a file" "$jambo" bench --model "$demo/config.json" --random-weights
expect_stderr "random weights: named as a file" "'$demo/config.json$is_a_file"
expect_exit 1 "tokenizer folder given as its tokenizer.json" "$jambo" tokenize --model "$demo/tokenizer.json" </dev/null
expect_stderr "tokenizer.json named as a file" "'$demo/tokenizer.json$is_a_file"
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
expect_exit 2 "batch unknown slot policy" "$jambo" batch --model "$demo" --input "$work/in.jsonl" --output "$work/o.jsonl" \
  --slot-policy Highest
expect_stderr "unknown slot policy named" "--slot-policy: slot policy 'Highest'"
for budget in lots 0 -1 1.5 2XB tight; do  # tight is stress's alone
  expect_exit 2 "batch memory budget $budget" "$jambo" batch --model "$demo" --input "$work/in.jsonl" --memory-budget "$budget"
  expect_stderr "bad memory budget $budget named" "--memory-budget: memory budget '$budget'"
done
# a malformed line is reported with its number and skipped, the others are scored, and the run exits 4
expect_exit 4 "score malformed line" "$jambo" score --model "$fixture" --input "$work/bad.jsonl"
expect_stderr_line "malformed line named" "bad.jsonl:2: malformed JSON"
expect_stderr_line "skipped lines summed up" "score: 1 malformed input line skipped: exit code 4 (--allow-skipped: 0)"
jq -e -s 'length == 1 and .[0].id == 1' "$work/out" >/dev/null && pass "score goes on past a malformed line" \
  || fail "score past a malformed line: $(cat "$work/out")"
expect_exit 0 "score --allow-skipped" "$jambo" score --model "$fixture" --input "$work/bad.jsonl" --allow-skipped
expect_stderr "score --allow-skipped still names the line" "bad.jsonl:2: malformed JSON"
# score "text": tokenized as generate --prompt tokenizes a prompt (special tokens added); the output names the tokens
prompt="The meaning of life is"
prompt_ids=$("$jambo" generate --model "$demo" --prompt "$prompt" --max-tokens 1 --json | jq -c .prompt_ids)
printf '{"id": "text", "text": "%s"}\n{"id": "ids", "tokens": %s}\n' "$prompt" "$prompt_ids" >"$work/text.jsonl"
expect_exit 0 "score text" "$jambo" score --model "$demo" --input "$work/text.jsonl"
if jq -e -s --argjson ids "$prompt_ids" '.[0].tokens == $ids and (.[0].logprobs | length) == ($ids | length)
             and .[0].logprobs == .[1].logprobs and (.[1] | has("tokens") | not)' "$work/out" >/dev/null
then pass "score text scores the prompt's tokens"; else fail "score text: $prompt_ids $(cat "$work/out")"; fi
printf '{"id": 1, "tokens": [1], "text": "x"}\n' >"$work/both.jsonl"
expect_exit 4 "score tokens and text" "$jambo" score --model "$demo" --input "$work/both.jsonl"
expect_stderr_line "score tokens and text named" "both.jsonl:1: both fields 'tokens' and 'text': give one of them"
printf '{"id": 1}\n' >"$work/neither.jsonl"
expect_exit 4 "score neither tokens nor text" "$jambo" score --model "$demo" --input "$work/neither.jsonl"
expect_stderr_line "score neither named" "neither.jsonl:1: no field 'tokens' (token ids) or 'text': give one of them"
expect_exit 4 "score text without a tokenizer" "$jambo" score --model "$fixture" --input "$work/text.jsonl"
expect_stderr_line "score text without a tokenizer named" "text.jsonl:1: field 'text' needs the model's tokenizer.json"
printf '{"id": 1, "tokens": [1, 99999999]}\n{"id": 2, "tokens": [1, 2]}\n' >"$work/oov.jsonl"
expect_exit 4 "score out-of-vocabulary id" "$jambo" score --model "$fixture" --input "$work/oov.jsonl"
expect_stderr_line "out-of-vocabulary id named" "oov.jsonl:1: token id 99999999 is outside the vocabulary"
jq -e -s 'length == 1 and .[0].id == 2' "$work/out" >/dev/null && pass "score goes on past an out-of-vocabulary id" \
  || fail "score past an out-of-vocabulary id: $(cat "$work/out")"

# hostile input: clear errors, never a crash
python_free_nest() { local n=$1; printf '%*s' "$n" '' | tr ' ' '['; }
python_free_close() { local n=$1; printf '%*s' "$n" '' | tr ' ' ']'; }
{ printf '{"id": %s1%s, "tokens": [1, 2]}\n' "$(python_free_nest 100000)" "$(printf '%*s' 100000 '' | tr ' ' ']')"; } >"$work/nested.jsonl"
expect_exit 4 "score deeply nested id" "$jambo" score --model "$fixture" --input "$work/nested.jsonl"
expect_stderr_line "nested id named" "nested.jsonl:1: field 'id'"
expect_exit 1 "score input is a directory" "$jambo" score --model "$fixture" --input "$work"
expect_stderr "directory input named" "not a regular file"
expect_exit 2 "huge max tokens" "$jambo" generate --model "$fixture" --prompt-ids 1,2 --max-tokens 9223372036854775807
expect_stderr "huge max tokens named" "max-tokens"
expect_exit 2 "negative seed" "$jambo" generate --model "$fixture" --prompt-ids 1 --temperature 1 --seed -5
expect_stderr "negative seed in a few words" "--seed: -5 is not a non-negative integer (see --help)"
expect_exit 1 "overlong model path" "$jambo" generate --model "$work/$(printf 'a%.0s' {1..5000})" --prompt-ids 1
mkdir -p "$work/hugevocab" && sed 's/"vocab_size": *[0-9]*/"vocab_size": 4611686018427387904/' "$fixture/config.json" >"$work/hugevocab/config.json"
expect_exit 1 "absurd vocab size" "$jambo" bench --model "$work/hugevocab" --random-weights
expect_stderr "absurd vocab named" "vocab_size"
printf '%s' "$(python_free_nest 100000)" | "$jambo" detokenize --model "$demo" >/dev/null 2>"$work/err"
[[ $? -eq 1 ]] && pass "detokenize deeply nested input" || fail "detokenize deeply nested input: $(cat "$work/err")"
# a million levels: every JSON reader refuses past 256 levels while parsing, naming the top-level field
printf '{"id": %s1%s, "tokens": [1, 2]}\n' "$(python_free_nest 1000000)" "$(python_free_close 1000000)" >"$work/nested.jsonl"
expect_exit 4 "score a million levels deep" "$jambo" score --model "$fixture" --input "$work/nested.jsonl"
expect_stderr_line "score depth named" "nested.jsonl:1: field 'id': JSON nested deeper than 256 levels"
printf '{"type": "event", "request": %s1%s}\n' "$(python_free_nest 1000000)" "$(python_free_close 1000000)" \
  >"$work/nested-trace.jsonl"
expect_exit 1 "trace a million levels deep" "$jambo" trace --input "$work/nested-trace.jsonl" --request 1
expect_stderr "trace of a nested line finds nothing" "no event or row of request '1'"
mkdir -p "$work/nested-template" && cp "$demo"/* "$work/nested-template/"
config=$(jq -c '.chat_template = [{"name": "NAME", "template": "x"}]' "$demo/tokenizer_config.json")
{ printf '%s' "${config%%\"NAME\"*}"; python_free_nest 1000000; python_free_close 1000000; printf '%s' "${config#*\"NAME\"}"; } \
  >"$work/nested-template/tokenizer_config.json"
expect_exit 1 "serve with a chat template a million levels deep" timeout 60 "$jambo" serve --model "$work/nested-template"
expect_stderr "nested chat template named" \
  "nested-template/tokenizer_config.json: field 'chat_template': JSON nested deeper than 256 levels"
printf '{"id": "huge", "prompt_ids": [1], "max_tokens": 18446744073709551615}\n' >"$work/huge.jsonl"
expect_exit 4 "batch max_tokens past int64" "$jambo" batch --model "$demo" --input "$work/huge.jsonl" \
  --output "$work/huge-out.jsonl"
expect_stderr_line "max_tokens past int64 named as written" "field 'max_tokens' = 18446744073709551615 is out of range"
printf '{"id": "long-stop", "prompt_ids": [1], "stop": "%s"}\n' "$(printf 'x%.0s' {1..300})" >"$work/stop.jsonl"
expect_exit 4 "batch scalar stop over 256 bytes" "$jambo" batch --model "$demo" --input "$work/stop.jsonl" \
  --output "$work/stop-out.jsonl"
expect_stderr_line "scalar stop over 256 bytes named" "field 'stop' holds a string of 300 bytes; at most 256"
printf '{"id": 1, "tokens": [1, 18446744073709551615]}\n' >"$work/huge-id.jsonl"
expect_exit 4 "score token id past int64" "$jambo" score --model "$fixture" --input "$work/huge-id.jsonl"
expect_stderr_line "token id past int64 named as written" "token id 18446744073709551615 is negative or too large"
# only regular files are read: a FIFO would block its reader forever
mkdir -p "$work/fifo-model" && cp "$fixture"/config.json "$work/fifo-model/" && mkfifo "$work/fifo-model/model.safetensors"
expect_exit 1 "a FIFO for the weights" timeout 20 "$jambo" generate --model "$work/fifo-model" --prompt-ids 1
expect_stderr "FIFO weights named" "fifo-model/model.safetensors: not a regular file"
mkfifo "$work/fifo.jsonl"
expect_exit 1 "a FIFO for the trace" timeout 20 "$jambo" trace --input "$work/fifo.jsonl" --request 1
expect_stderr "FIFO trace named" "fifo.jsonl' does not exist or is not a regular file"
expect_exit 1 "a FIFO for the batch output" timeout 20 "$jambo" batch --model "$demo" --input "$work/huge.jsonl" \
  --output "$work/fifo.jsonl"
expect_stderr "FIFO batch output named" "output file '$work/fifo.jsonl' is not a regular file"
# every id the tokenizer makes must be a row of the model's embedding
mkdir -p "$work/small-vocab" && cp "$demo"/tokenizer*.json "$work/small-vocab/"
jq '.vocab_size = 4100' "$demo/config.json" >"$work/small-vocab/config.json"
expect_exit 1 "a tokenizer beyond the model's vocabulary" "$jambo" generate --model "$work/small-vocab" --random-weights \
  --prompt hi
expect_stderr "tokenizer beyond the vocabulary named" "has id 4100, beyond the model's vocab_size 4100 (config.json)"
# max_model_len within config.json's max_position_embeddings
mkdir -p "$work/short" && cp "$demo"/* "$work/short/"
jq '.max_position_embeddings = 1000' "$demo/config.json" >"$work/short/config.json"
expect_exit 1 "serve past max_position_embeddings" timeout 60 "$jambo" serve --model "$work/short" --max-model-len 1001
expect_stderr "serve past max_position_embeddings named" "max_model_len 1001 exceeds the model's max_position_embeddings (1000)"
jq '.max_position_embeddings = -5' "$demo/config.json" >"$work/short/config.json"
expect_exit 1 "negative max_position_embeddings" "$jambo" generate --model "$work/short" --prompt-ids 1
expect_stderr "negative max_position_embeddings named" "field 'max_position_embeddings' = -5 must be positive"

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
# score checks its --output before the long part of the run (here, before even looking at the model)
expect_exit 1 "score to an unwritable path" "$jambo" score --model "$work/no-such-model" --input /dev/null \
  --output "$work/missing/scores.jsonl"
expect_stderr "score output path named first" "cannot write output file '$work/missing/scores.jsonl'"
expect_exit 1 "bench plot to an unwritable path" "$jambo" bench --model "$work/shape" --random-weights \
  --plot "$work/missing/bench.svg"
expect_stderr "bench plot path named" "cannot write output file '$work/missing/bench.svg'"

# batch: one line per sample, a malformed line reported by number and skipped (exit code 4), a rerun resumes
cat >"$work/batch.jsonl" <<'LINES'
{"id": "greedy", "prompt": "The meaning of life is", "max_tokens": 8}
{"id": "sampled", "prompt_ids": [1, 296, 1842], "n": 3, "temperature": 0.8, "seed": 3, "max_tokens": 6, "logprobs": 2}
{"id": "broken", "prompt": 12}
not json at all
LINES
expect_exit 4 "batch" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" --output "$work/batch-out.jsonl" \
  --max-num-batched-tokens 5 --slot-policy highest --check --trace "$work/trace.jsonl"
grep -q "batch.jsonl:3: field 'prompt' must be a string" "$work/err" && grep -q "batch.jsonl:4: malformed JSON" "$work/err" \
  && pass "batch names malformed lines" || fail "batch malformed lines: $(cat "$work/err")"
if jq -e -s 'length == 4 and (map(.id) | sort) == ["greedy", "sampled", "sampled", "sampled"]
             and all(.[]; has("prompt_ids") and has("ids") and has("text") and has("logprobs") and has("top_logprobs")
                           and has("finish_reason") and has("sample"))
             and ([.[] | select(.id == "sampled") | .top_logprobs[0] | length] | all(. == 2))' \
     "$work/batch-out.jsonl" >/dev/null; then pass "batch output format"; else fail "batch output: $(cat "$work/batch-out.jsonl")"; fi
expect_exit 0 "batch rerun" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" --output "$work/batch-out.jsonl" \
  --allow-skipped
[[ $(wc -l <"$work/batch-out.jsonl") -eq 4 ]] && grep -q "2 already done, 2 skipped as malformed" "$work/err" \
  && pass "batch rerun skips finished ids" || fail "batch rerun: $(cat "$work/err")"

# batch --shard I/N: three shards of one file run disjoint slices of its request lines; their outputs, concatenated,
# are the unsharded run's samples bit for bit; an id repeated in another shard is still refused; a shard resumes
# from its own output; a malformed --shard is refused naming the flag
cat >"$work/shards.jsonl" <<'LINES'
{"prompt_ids": [1, 5, 9], "max_tokens": 4, "n": 2, "seed": 1, "temperature": 0.8}
{"id": "b", "prompt_ids": [1, 7], "max_tokens": 3}

{"id": "c", "prompt_ids": [1, 8, 8, 8], "max_tokens": 5, "n": 3, "seed": 2, "temperature": 1.0, "logprobs": 2}
{"id": 7, "prompt_ids": [1, 2], "max_tokens": 2}
{"id": "d", "prompt": "The meaning of life is", "max_tokens": 6}
{"id": "b", "prompt_ids": [1, 3], "max_tokens": 2}
LINES
expect_exit 4 "batch unsharded" "$jambo" batch --model "$demo" --input "$work/shards.jsonl" --output "$work/whole.jsonl"
for i in 0 1 2; do
  code=0
  "$jambo" batch --model "$demo" --input "$work/shards.jsonl" --output "$work/shard$i.jsonl" --shard "$i/3" \
    --max-num-batched-tokens 3 2>"$work/shard$i.err" >/dev/null || code=$?
  [[ $code -eq $([[ $i == 2 ]] && echo 4 || echo 0) ]] && pass "batch shard $i/3 exit $code" ||
    fail "batch shard $i/3 exit $code: $(cat "$work/shard$i.err")"
done
grep -q "shards.jsonl:7: id 'b' appears on an earlier line" "$work/shard2.err" &&
  pass "batch shard refuses an id of another shard's line" || fail "batch shard duplicate id: $(cat "$work/shard2.err")"
grep -q "batch: shard 0/3, 2 requests run" "$work/shard0.err" && pass "batch shard summary names the shard" ||
  fail "batch shard summary: $(cat "$work/shard0.err")"
if cmp -s <(jq -c -S . "$work/whole.jsonl" | sort) <(cat "$work"/shard{0,1,2}.jsonl | jq -c -S . | sort); then
  pass "batch shards concatenated are the unsharded run"
else
  fail "batch shards differ from the unsharded run"
fi
expect_exit 0 "batch shard rerun" "$jambo" batch --model "$demo" --input "$work/shards.jsonl" \
  --output "$work/shard0.jsonl" --shard 0/3
grep -q "0 requests run, 2 already done" "$work/err" && pass "batch shard resumes from its own output" ||
  fail "batch shard rerun: $(cat "$work/err")"
for bad in 3/3 1 -1/2 a/b 1/0; do
  expect_exit 2 "batch --shard $bad" "$jambo" batch --model "$demo" --input "$work/shards.jsonl" --output "$work/x.jsonl" \
    --shard "$bad"
  expect_stderr "batch --shard $bad names the flag" "--shard must be I/N"
done

# --tensor-parallel-size: the demo split over 2 ranks gives the same tokens with logprobs within 1e-5, its lines
# naming the ranks; 3 ranks do not divide the demo's 512 channels, and are refused naming why
expect_exit 0 "batch over 2 tensor-parallel ranks" "$jambo" batch --model "$demo" --input "$work/shards.jsonl" \
  --output "$work/tp2.jsonl" --tensor-parallel-size 2 --allow-skipped
if jq -e -s --slurpfile whole "$work/whole.jsonl" '
     (map({key: "\(.id)/\(.sample)", value: .}) | from_entries) as $tp
     | ($whole | map({key: "\(.id)/\(.sample)", value: .}) | from_entries) as $one
     | ($tp | keys) == ($one | keys)
       and all($tp | keys[]; . as $k | $tp[$k].ids == $one[$k].ids
               and ([$tp[$k].logprobs, $one[$k].logprobs] | transpose | all(.[0] - .[1] | fabs < 1e-5)))
       and all($tp[]; .backend == "cpu (f32 state, 2 tensor-parallel ranks)")' "$work/tp2.jsonl" >/dev/null; then
  pass "tensor-parallel batch within 1e-5 of one rank"
else
  fail "tensor-parallel batch: $(head -c 400 "$work/tp2.jsonl")"
fi
expect_exit 1 "batch over 3 tensor-parallel ranks" "$jambo" batch --model "$demo" --input "$work/shards.jsonl" \
  --output "$work/tp3.jsonl" --tensor-parallel-size 3
expect_stderr_line "tensor-parallel size that does not divide named" "3 ranks do not divide the 512 Mamba channels"
# The reference split the same way gives the engine's bits: compare re-scores the split batch at threshold 0 (its
# default for samples of its own choice); stress over 2 ranks flags nothing at 0 and flags both historical bugs;
# threshold 0 against a reference split otherwise is refused, naming both splits
expect_exit 0 "compare of split samples by a reference split alike" "$jambo" compare --model "$demo" \
  --input "$work/tp2.jsonl" --tensor-parallel-size 2 --summary "$work/tp2_compare.json"
if jq -e '.threshold == 0 and .max_abs_diff == 0' "$work/tp2_compare.json" >/dev/null; then
  pass "split samples re-scored bit for bit at threshold 0"
else
  fail "split compare: $(head -c 400 "$work/tp2_compare.json")"
fi
expect_exit 0 "stress over 2 tensor-parallel ranks" "$jambo" stress --model "$demo" --tensor-parallel-size 2 \
  --requests 24
grep -q "every |Δ logprob| is 0" "$work/out" && pass "split stress: every logprob the reference's bits" ||
  fail "split stress: $(tail -2 "$work/out")"
for inject in decode-before-prefill offset-wrap; do  # the wrap at each rank's share of the slot
  expect_exit 3 "stress over 2 ranks flags $inject" "$jambo" stress --model "$demo" --tensor-parallel-size 2 \
    --requests 24 --inject "$inject"
done
expect_exit 2 "threshold 0 against a reference split otherwise" "$jambo" stress --model "$demo" \
  --tensor-parallel-size 2 --reference-tensor-parallel-size 1 --threshold 0 --requests 4
expect_stderr "threshold 0 across splits names both" "over 2 tensor-parallel ranks and the reference over 1"

# trace: the life of one request
expect_exit 0 "trace" "$jambo" trace --input "$work/trace.jsonl" --request sampled
grep -q "prefill" "$work/out" && grep -q "decode" "$work/out" && grep -q "finished" "$work/out" \
  && pass "trace tells prefill, decode and finish" || fail "trace output: $(cat "$work/out")"
expect_exit 1 "trace of an unknown request" "$jambo" trace --input "$work/trace.jsonl" --request nobody
# a trace with an unreadable line follows the malformed-line policy: exit 4, or 0 with --allow-skipped
{ cat "$work/trace.jsonl"; echo "not json"; } >"$work/trace-torn.jsonl"
expect_exit 4 "trace that skipped a line" "$jambo" trace --input "$work/trace-torn.jsonl" --request sampled
expect_stderr_line "trace counts the skipped line" "1 unreadable lines skipped"
expect_exit 0 "trace --allow-skipped" "$jambo" trace --input "$work/trace-torn.jsonl" --request sampled --allow-skipped
# a trace of only unreadable lines (here nested past the JSON depth limit) says so, naming the first
python3 -c 'print("{\"a\": " * 300 + "1" + "}" * 300)' >"$work/trace-deep.jsonl"
expect_exit 1 "trace of unreadable lines only" "$jambo" trace --input "$work/trace-deep.jsonl" --request sampled
expect_stderr_line "trace names the first unreadable line" \
  "jambo: error: $work/trace-deep.jsonl: no event or row of request 'sampled' (1 unreadable lines skipped; the first, line 1: field 'a': JSON nested deeper than 256 levels)"

# compare: a clean batch passes; one perturbed logprob is flagged with exit code 3. Batch lines name their backend,
# the reference's own and bitwise-invariant (the CPU's), so the threshold is 0 by default.
jq -e -s 'all(.backend == "cpu (f32 state)")' "$work/batch-out.jsonl" >/dev/null \
  && pass "batch lines name their backend" || fail "batch backend: $(jq -c .backend "$work/batch-out.jsonl")"
# and the weights that sampled their tokens: one span of the default name over all of them
jq -e -s 'all(.weight_versions == [{"version": "default", "start": 0, "end": (.ids | length)}])' \
  "$work/batch-out.jsonl" >/dev/null && pass "batch lines name their weights" ||
  fail "batch weight_versions: $(jq -c .weight_versions "$work/batch-out.jsonl")"
# return_routed_experts in a batch line: every token read, the demo's 4 MoE layers of 2 experts each; a value not true
# or false is refused naming the field
printf '{"id": "routed", "prompt_ids": [1, 5, 9], "max_tokens": 4, "return_routed_experts": true}\n' >"$work/routed.jsonl"
expect_exit 0 "batch return_routed_experts" "$jambo" batch --model "$demo" --input "$work/routed.jsonl" \
  --output "$work/routed-out.jsonl"
jq -e '(.prompt_routed_experts | length) == 3 and (.routed_experts | length) == (.ids | length) - 1 and
       ([.prompt_routed_experts[], .routed_experts[]] | all(length == 4 and all(length == 2)))' \
  "$work/routed-out.jsonl" >/dev/null && pass "batch routed experts shaped per token, layer and k" ||
  fail "batch routed experts: $(jq -c '{prompt_routed_experts, routed_experts}' "$work/routed-out.jsonl")"
printf '{"id": "routed", "prompt_ids": [1], "return_routed_experts": 1}\n' >"$work/routed-bad.jsonl"
expect_exit 4 "batch return_routed_experts not a boolean" "$jambo" batch --model "$demo" --input "$work/routed-bad.jsonl" \
  --output "$work/routed-bad-out.jsonl"
expect_stderr_line "return_routed_experts named" "field 'return_routed_experts' must be true or false, got 1"
expect_exit 0 "compare clean" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" --report "$work/report.html"
grep -q "<svg" "$work/report.html" && pass "compare writes an HTML report" || fail "compare report lacks a plot"
# its one-line verdict: numbers never run into the next clause; no sample named when every |Δ| is 0
expect_stderr_line "compare's verdict, clean" "compare: 0 of 4 samples flagged (|Δ logprob| above 0); \
$(jq .num_tokens "$work/out") generated tokens compared; every |Δ logprob| is 0"
# samples that do not say where they come from (another engine's), or from another backend: 1e-3
jq -c 'del(.backend)' "$work/batch-out.jsonl" >"$work/anonymous.jsonl"
jq -c '.backend = "cuda (bf16 weights, cublas GEMMs, f32 state)"' "$work/batch-out.jsonl" >"$work/elsewhere.jsonl"
for input in anonymous elsewhere; do
  expect_exit 0 "compare $input samples" "$jambo" compare --model "$demo" --input "$work/$input.jsonl"
  expect_stderr_line "compare $input samples at 1e-3" "(|Δ logprob| above 0.001)"
done
jq -c 'if .id == "greedy" then .logprobs[2] += 0.5 else . end' "$work/batch-out.jsonl" >"$work/perturbed.jsonl"
expect_exit 3 "compare flags a perturbed sample" "$jambo" compare --model "$demo" --input "$work/perturbed.jsonl" \
  --report "$work/perturbed.html"
jq -e '.samples | map(select(.flagged)) | length == 1 and .[0].id == "greedy" and .[0].first_divergent_position == 2' \
  "$work/out" >/dev/null && pass "compare names the sample and position" || fail "compare summary: $(cat "$work/out")"
greedy_line=$(jq '.samples[] | select(.id == "greedy") | .line' "$work/out")
verdict="1 of 4 samples flagged (|Δ logprob| above 0); $(jq .num_tokens "$work/out") generated tokens compared; \
largest |Δ logprob| 0.5 (id \"greedy\", sample 0, line $greedy_line, position 2)"
expect_stderr_line "compare's verdict names the largest |Δ| and where it is" "compare: $verdict"
grep -qF "<p class=\"verdict flagged\">$(sed 's/"/\&quot;/g' <<<"$verdict").</p>" "$work/perturbed.html" \
  && pass "the report's verdict is the same" \
  || fail "report verdict: $(grep -o '<p class="verdict.*' "$work/perturbed.html")"

jq -c 'if .id == "greedy" then .logprobs[1] = null else . end' "$work/batch-out.jsonl" >"$work/nan.jsonl"
expect_exit 3 "compare flags a NaN (null) logprob" "$jambo" compare --model "$demo" --input "$work/nan.jsonl"
# the reference packed into steps of 4 tokens and 1 row (each sample alone) still equals jambo bitwise
expect_exit 0 "compare in small reference steps" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" \
  --backend cpu --cuda-weights f32 --step-tokens 4 --step-rows 1
jq -e '.num_samples == 4 and .max_abs_diff == 0' "$work/out" >/dev/null && pass "small reference steps: exact" \
  || fail "compare in small steps: $(cat "$work/out")"
expect_exit 2 "compare on an unknown backend" "$jambo" compare --model "$demo" --input "$work/batch-out.jsonl" --backend tpu
# a malformed line: reported and skipped, the rest compared, exit code 4 (0 with --allow-skipped); a flagged sample's 3
# wins over it
{ cat "$work/batch-out.jsonl"; echo '{"prompt_ids": [1], "ids": [2]}'; } >"$work/with-bad-line.jsonl"
expect_exit 4 "compare with a malformed line" "$jambo" compare --model "$demo" --input "$work/with-bad-line.jsonl"
expect_stderr_line "compare names the malformed line" "with-bad-line.jsonl:5: no logprobs of the generated ids"
jq -e '.num_samples == 4 and .num_malformed_lines == 1' "$work/out" >/dev/null \
  && pass "compare goes on past a malformed line" || fail "compare past a malformed line: $(cat "$work/out")"
expect_exit 0 "compare --allow-skipped" "$jambo" compare --model "$demo" --input "$work/with-bad-line.jsonl" \
  --allow-skipped
{ cat "$work/perturbed.jsonl"; echo 'not json'; } >"$work/perturbed-bad-line.jsonl"
expect_exit 3 "compare: flagged wins over skipped" "$jambo" compare --model "$demo" \
  --input "$work/perturbed-bad-line.jsonl"

# stress: clean without faults; each historical bug injected is caught (exit code 3)
expect_exit 0 "stress clean" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40
for fault in decode-before-prefill offset-wrap; do
  expect_exit 3 "stress catches $fault" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40 --inject "$fault"
done
# a stale prefix-cache checkpoint is caught too; it needs shared prefixes, and says so
expect_exit 3 "stress catches stale-checkpoint" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 60 \
  --shared-prefixes 3 --inject stale-checkpoint
expect_exit 2 "stress stale-checkpoint without shared prefixes" "$jambo" stress --model "$demo" --inject stale-checkpoint
expect_stderr "stress stale-checkpoint names --shared-prefixes" "--shared-prefixes"

# stress at scale's knobs: n exactly 3 (min-n = max-n), the reference on a named backend in small packed steps;
# the summary places the state pool and its top slot against 2^32 elements
expect_exit 0 "stress with fixed n and a packed reference" "$jambo" stress --model "$demo" --requests 12 \
  --max-prompt-tokens 20 --min-n 3 --max-n 3 --reference-backend cpu --reference-step-tokens 16 \
  --reference-step-rows 2 --output "$work/stress.jsonl"
jq -e -s 'length == 36 and (group_by(.id) | all(length == 3))' "$work/stress.jsonl" >/dev/null \
  && pass "stress --min-n/--max-n fix n" || fail "stress samples per request: $(jq -c '[.id, .sample]' "$work/stress.jsonl")"
grep -q '0 of 36 samples flagged.*state pool [0-9]* slots x [0-9]* = [0-9]* elements (within 2^32); top slot used [0-9]*: elements' \
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
# a threshold of 0 where the engine cannot be bitwise is refused, saying why; the CPU's default is 0
expect_exit 2 "stress bf16 state at threshold 0" "$jambo" stress --model "$demo" --state-dtype bf16 --threshold 0
expect_stderr "stress at threshold 0 says why" "rounded at every chunk boundary"
expect_exit 0 "stress at the CPU's default threshold" "$jambo" stress --model "$demo" --requests 10 --max-prompt-tokens 20
grep -qF "(|Δ logprob| above 0);" "$work/out" && pass "stress on the CPU defaults to threshold 0" \
  || fail "stress threshold: $(cat "$work/out")"
expect_exit 2 "stress with min-n above max-n" "$jambo" stress --model "$demo" --min-n 5 --max-n 4
expect_stderr "min-n above max-n named" "--min-n 5 is more than --max-n 4"

# checked mode turns the historical stale read into a loud law 2 error naming request and slot
expect_exit 1 "checked mode stops a stale read" "$jambo" stress --model "$demo" --requests 30 --max-prompt-tokens 40 \
  --inject decode-before-prefill --check
grep -q "law 2 violation: request 'stress-" "$work/err" && grep -q "slot" "$work/err" \
  && pass "checked mode names request and slot" || fail "checked stale read: $(cat "$work/err")"

# a torn last output line (an interrupted run) is cut before the rerun appends
head -c -20 "$work/batch-out.jsonl" >"$work/torn.jsonl"
expect_exit 0 "batch resumes after a torn line" "$jambo" batch --model "$demo" --input "$work/batch.jsonl" \
  --output "$work/torn.jsonl" --allow-skipped
jq -e -s 'length == 4' "$work/torn.jsonl" >/dev/null && pass "torn line replaced by a whole one" \
  || fail "torn resume: $(tail -c 300 "$work/torn.jsonl")"

# weights holding NaN or infinity are refused at load, naming the file, the tensor and the first bad index
source tests/support/checkpoint_edits.sh
cp -r "$demo" "$work/inf-weight"
set_bf16 "$work/inf-weight" model.layers.2.feed_forward.down_proj.weight 12345 '\x80\x7f'
expect_exit 1 "a weight holding inf is refused at load" "$jambo" generate --model "$work/inf-weight" --prompt-ids 1
expect_stderr "the inf weight named with its index" "$work/inf-weight/model.safetensors: tensor \
'model.layers.2.feed_forward.down_proj.weight' holds inf at index 12345 (row 48, column 57)"

# logits that are not finite fail every command loudly with exit code 5, naming the request or sequence and the
# step: finite weights whose activations overflow past a sequence's first token (a first token computes)
overflowing_demo "$work/overflow"
overflow=$work/overflow
nonfinite="the logits are not finite (NaN or infinity)"
nonfinite_pattern="the logits are not finite \\(NaN or infinity\\)"
expect_exit 0 "non-finite logits: a first token computes" "$jambo" generate --model "$overflow" --prompt-ids 5 \
  --max-tokens 1
expect_exit 5 "generate: non-finite logits" "$jambo" generate --model "$overflow" --prompt-ids 5 --max-tokens 3 --json
expect_stderr "generate names request and step" \
  "jambo: error: request 'generate' sample 0 (sequence 0), step 1: $nonfinite"
[[ ! -s $work/out ]] && pass "generate --json prints no result" || fail "generate --json printed $(cat "$work/out")"
printf '{"id": "two", "tokens": [5, 9]}\n' >"$work/overflow-score.jsonl"
expect_exit 5 "score: non-finite logits" "$jambo" score --model "$overflow" --input "$work/overflow-score.jsonl"
expect_stderr "score names the line and its tokens" \
  "jambo: error: $work/overflow-score.jsonl:1 (id \"two\"), tokens 0 to 1: $nonfinite"
printf '{"id": "first-token", "prompt_ids": [5], "max_tokens": 1}\n{"id": "overflows", "prompt_ids": [5], "max_tokens": 3}\n' \
  >"$work/overflow-batch.jsonl"
expect_exit 5 "batch: non-finite logits" "$jambo" batch --model "$overflow" --input "$work/overflow-batch.jsonl" \
  --output "$work/overflow-batch-out.jsonl"
expect_stderr_line "batch names request and step" "jambo: error: request 'overflows' sample 0 (sequence 1), step 1: $nonfinite"
jq -e -s 'length == 1 and .[0].id == "first-token"' "$work/overflow-batch-out.jsonl" >/dev/null \
  && pass "batch keeps what finished before" || fail "batch output: $(cat "$work/overflow-batch-out.jsonl")"
expect_exit 5 "compare: non-finite reference logits" "$jambo" compare --model "$overflow" --input "$work/batch-out.jsonl"
grep -qE "^jambo: error: sample \"[a-z]+\" [0-9] \(line [0-9]\), reference step 0: $nonfinite_pattern" "$work/err" \
  && pass "compare names the sample and the reference step" || fail "compare: $(cat "$work/err")"
expect_exit 5 "stress: non-finite logits" "$jambo" stress --model "$overflow" --requests 4 --max-prompt-tokens 8
grep -qE "^jambo: error: request 'stress-[0-9]+' sample [0-9]+ \(sequence [0-9]+\), step [0-9]+: $nonfinite_pattern" "$work/err" \
  && pass "stress names request and step" || fail "stress: $(cat "$work/err")"
expect_exit 5 "bench: non-finite logits" "$jambo" bench --model "$overflow" --prompt-tokens 8 --decode-tokens 2 --repeats 1
expect_stderr "bench names the sequence and step" "jambo: error: sequence 0, prefill: $nonfinite"

echo "$failures failure(s)"
[[ $failures -eq 0 ]]
