#!/usr/bin/env bash
# Writes the seed corpus of every fuzz target into OUT/<target>/, made from the fixtures, the demo model and the
# chat templates of the source tree, plus a short `jambo batch` run on the demo model for the sample file and the
# trace. Usage: make_seeds.sh SOURCE_DIR OUT JAMBO
set -euo pipefail
source_dir=$1 out=$2 jambo=$3
demo=$source_dir/models/jambo-demo
fixtures=$source_dir/tests/fixtures
rm -rf "$out"
mkdir -p "$out"

# seed TARGET NAME: stdin becomes OUT/TARGET/NAME.
seed() {
  mkdir -p "$out/$1"
  cat >"$out/$1/$2"
}

# A JSONL seed as a whole and one seed per line.
jsonl_seeds() {
  local target=$1 name=$2 file=$3 n=0 line
  seed "$target" "$name" <"$file"
  while IFS= read -r line; do
    n=$((n + 1))
    printf '%s\n' "$line" | seed "$target" "$name-$n"
  done <"$file"
}

# The 8 little-endian bytes of a number.
le64() {
  local i
  for i in 0 1 2 3 4 5 6 7; do printf "\\$(printf '%03o' $((($1 >> (8 * i)) & 255)))"; done
}

# A small valid safetensors file from a checkpoint's header: its eight smallest tensors, back to back over zero
# bytes (the loader checks the layout, not the values).
small_safetensors() {
  local length header end
  length=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  header=$(head -c $((8 + length)) "$1" | tail -c +9 | jq -c '
    to_entries | map(select(.key != "__metadata__"))
    | sort_by(.value.data_offsets[1] - .value.data_offsets[0]) | .[:8]
    | reduce .[] as $t ({header: {"__metadata__": {"format": "pt"}}, end: 0};
        .end as $begin | ($t.value.data_offsets[1] - $t.value.data_offsets[0]) as $bytes
        | .header[$t.key] = ($t.value + {data_offsets: [$begin, $begin + $bytes]}) | .end = $begin + $bytes)')
  end=$(jq -r .end <<<"$header")
  header=$(jq -c .header <<<"$header")
  le64 ${#header}
  printf '%s' "$header"
  head -c "$end" /dev/zero
}

for file in "$fixtures"/models/*/*.safetensors "$demo/model.safetensors"; do
  small_safetensors "$file" | seed safetensors_header "$(basename "$(dirname "$file")")-$(basename "$file")"
done

index=$fixtures/models/sharded-gqa4-bf16/model.safetensors.index.json
seed safetensors_index full.json <"$index"
jq '.weight_map |= (to_entries | .[:3] | from_entries)' "$index" | seed safetensors_index three-tensors.json

for file in "$fixtures"/models/*/config.json "$demo/config.json"; do
  seed config "$(basename "$(dirname "$file")").json" <"$file"
done

# A tokenizer.json cut to its first 400 ids and the merges among them, added tokens past them renumbered from 400:
# as valid as the original at a sixtieth of the size, so that fuzzing it is fast.
small_tokenizer() {
  jq -c '(.added_tokens | map(select(.id >= 400)) | to_entries
          | map({key: (.value.id | tostring), value: (400 + .key)}) | from_entries) as $renumbered
    | .model.vocab |= with_entries(select(.value < 400))
    | .model.vocab as $vocab
    | .model.merges |= map(select((if type == "string" then split(" ") else . end) as [$a, $b]
                                  | $vocab | has($a) and has($b) and has($a + $b)))
    | .added_tokens |= map(.id = ($renumbered[.id | tostring] // .id))
    | if .post_processor.special_tokens? then .post_processor.special_tokens[].ids |= map($renumbered[tostring] // .)
      else . end' "$1"
}

for file in "$fixtures"/tokenizers/*/tokenizer.json; do
  family=$(basename "$(dirname "$file")")
  seed tokenizer "$family.json" <"$file"
  small_tokenizer "$file" | seed tokenizer "$family-small.json"
done

# tokenizer_encode: a byte choosing the fixture tokenizer (in the target's order), then the text of each case.
choice=0
for family in sp-jamba sp-prepend metaspace bytelevel jambo-demo; do
  n=0
  while IFS= read -r -d '' text; do
    n=$((n + 1))
    { printf "\\$(printf '%03o' $choice)"; printf '%s' "$text"; } | seed tokenizer_encode "$family-$n"
  done < <(jq -j '.cases[].text + "\u0000"' "$fixtures/tokenizers/$family/cases.json")
  choice=$((choice + 1))
done

for file in "$fixtures"/tokenizers/*/tokenizer_config.json "$demo/tokenizer_config.json"; do
  seed tokenizer_config "$(basename "$(dirname "$file")").json" <"$file"
done
for file in "$source_dir"/tests/chat_template/data/*.jinja; do
  name=$(basename "$file" .jinja)
  jq -n --rawfile template "$file" \
    '{bos_token: "<|startoftext|>", eos_token: {content: "<|endoftext|>"}, chat_template: $template}' |
    seed tokenizer_config "$name.json"
  jq -n --rawfile template "$file" \
    '{bos_token: "<|startoftext|>", chat_template: [{name: "default", template: $template}, {name: "rag", template: "{{ x }}"}]}' |
    seed tokenizer_config "$name-list.json"
  seed chat_template "$name.jinja" <"$file"
done
jq -j .chat_template "$demo/tokenizer_config.json" | seed chat_template demo.jinja

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/score.jsonl" <<'EOF'
{"id": "a", "tokens": [1, 1686, 483, 1735]}
{"id": 7, "text": "Once upon a time"}
{"tokens": [1]}
{"id": "b", "text": "caf\u00e9 <|endoftext|>"}
EOF
jsonl_seeds score_line lines "$work/score.jsonl"

cat >"$work/requests.jsonl" <<'EOF'
{"id": "1", "prompt": "Once upon a time", "n": 2, "max_tokens": 4, "temperature": 0.8, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "logprobs": 2, "stop": [" the"], "stop_token_ids": [2]}
{"id": "2", "prompt_ids": [1, 5, 9], "max_tokens": 3, "prompt_logprobs": 1}
{"prompt": "The meaning of life is", "max_tokens": 2, "stop": "\n"}
EOF
jsonl_seeds batch_line lines "$work/requests.jsonl"

# compare's samples and the trace come from a real run.
"$jambo" batch --model "$demo" --input "$work/requests.jsonl" --output "$work/samples.jsonl" \
  --trace "$work/trace.jsonl" --memory-budget 1GiB 2>/dev/null
jsonl_seeds compare_samples jambo "$work/samples.jsonl"
jsonl_seeds trace_lines trace "$work/trace.jsonl"
seed compare_samples vllm.jsonl <<'EOF'
{"request_id": "a", "prompt_token_ids": [1, 5, 9], "outputs": [{"index": 0, "token_ids": [264, 387], "logprobs": [{"264": {"logprob": -2.9}, "7": {"logprob": -3.5}}, {"387": {"logprob": -0.05}}]}, {"index": 1, "token_ids": [12], "logprobs": [[[12, -1.5]]]}]}
EOF
jq -nc '{id: 3, input_ids: [[1, 5, 9]], sequences: [[1, 5, 9, 264]], scores: [[[range(0; 4101)] | map(. / 4101)]]}' |
  seed compare_samples transformers.jsonl

seed completion_request prompt.json <<'EOF'
{"model": "jambo-demo", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "n": 2, "logprobs": 2, "echo": true, "stop": ["\n", "."], "seed": 1, "stream": true, "stream_options": {"include_usage": true}}
EOF
seed completion_request prompts.json <<'EOF'
{"model": "jambo-demo", "prompt": [[1, 5, 9], "Hello"], "max_tokens": 4, "best_of": 1, "prompt_logprobs": 1, "frequency_penalty": 0, "user": "u"}
EOF
seed chat_request chat.json <<'EOF'
{"model": "jambo-demo", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Why?"}], "max_completion_tokens": 8, "logprobs": true, "top_logprobs": 2, "stop": "\n", "stream": true, "response_format": {"type": "text"}}
EOF
seed chat_request tools.json <<'EOF'
{"model": "jambo-demo", "messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}], "max_tokens": 4, "n": 2, "seed": 5}
EOF
seed tokenize_request prompt.json <<<'{"prompt": "Hello world", "add_special_tokens": false}'
seed tokenize_request messages.json <<<'{"messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": true}'
seed detokenize_request tokens.json <<<'{"tokens": [1, 1686, 483, 1735, 393, 763]}'

# http_request: a byte setting the read size, then what a client sends on one connection.
http_seed() {  # NAME READ_SIZE: the bytes on stdin
  { printf "\\$(printf '%03o' "$2")"; cat; } | seed http_request "$1"
}
body='{"model": "jambo-demo", "prompt": "Hello", "max_tokens": 4}'
printf 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' | http_seed get 63
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-Id: r1\r\n\r\n%s' \
  ${#body} "$body" | http_seed content-length 0
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x;ext=1\r\n%s\r\n0\r\nTrailer: t\r\n\r\n' \
  ${#body} "$body" | http_seed chunked 6
{
  printf 'POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n' \
    "$(printf '%s' "$body" | gzip -c | wc -c)"
  printf '%s' "$body" | gzip -c
} | http_seed gzip 12
printf 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHEAD /health HTTP/1.1\r\nConnection: close\r\n\r\n' |
  http_seed pipelined 1
