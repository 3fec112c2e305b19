#!/usr/bin/env bash
# End-to-end tests of `jambo serve`: starts the server with the demo model on a free loopback port,
# drives it with curl and with the official openai npm client (tests/server/*.test.mjs), and fails
# loudly, with the server's log, on any failure.
# Usage: tests/server/server_test.sh path/to/jambo   (run from the repository root; scripts/install-deps installs
# Node.js and tests/server/node_modules)
set -uo pipefail
jambo=$(realpath "$1")
demo=models/jambo-demo
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # spinning OpenMP threads starve the clients
work=$(mktemp -d)
server_pid=""
failures=0
started=$SECONDS

show_logs() {
  for log in "$work"/*.log; do
    [[ -f $log ]] || continue
    echo "---- $(basename "$log") (last 60 lines)"
    tail -n 60 "$log"
  done
}
stop_server() {
  [[ -n $server_pid ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null
  wait "$server_pid"
  local code=$?
  server_pid=""
  return $code
}
cleanup() { stop_server; rm -rf "$work"; }
trap cleanup EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok:   $*"; }
die() { echo "FAIL: $*"; show_logs; exit 1; }

command -v node >/dev/null || die "node is missing: run scripts/install-deps"
command -v curl >/dev/null || die "curl is missing: run scripts/install-deps"
[[ -f tests/server/node_modules/openai/package.json ]] || die "tests/server/node_modules lacks openai: run scripts/install-deps"

# serve_url LOG PID: the address that `jambo serve` (process PID, output in LOG) prints once it listens; fails
# when the server exits first or takes over 30 s.
serve_url() {
  local log=$1 pid=$2 found
  for _ in $(seq 300); do
    found=$(grep -o 'jambo: serving jambo-demo on http://127\.0\.0\.1:[0-9]*' "$log" | grep -o 'http://.*')
    [[ -n $found ]] && { echo "$found"; return 0; }
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

"$jambo" serve --model "$demo" --port 0 --check --trace "$work/trace.jsonl" --log-interval 1 >"$work/server.log" 2>&1 &
server_pid=$!
url=$(serve_url "$work/server.log" "$server_pid") || die "jambo serve exited, or did not print its address within 30 s"
pass "server listening on $url"

# A second server on the same port must fail, not share it (SO_REUSEPORT would let it listen there too).
address=${url#http://}
timeout 20 "$jambo" serve --model "$demo" --port "${address##*:}" >"$work/second.log" 2>&1
code=$?
if [[ $code == 1 ]] && grep -q "cannot listen on $address: address already in use" "$work/second.log"; then
  pass "a second server on $address exits 1: address already in use"
else
  fail "a second server on $address exited with $code (124: it served too): $(cat "$work/second.log")"
fi

# curl_json NAME STATUS METHOD PATH [BODY]: the response body goes to $work/body, headers to $work/headers.
curl_json() {
  local name=$1 want=$2 method=$3 path=$4 body=${5-}
  local args=(-sS -o "$work/body" -D "$work/headers" -w '%{http_code}' -X "$method" "$url$path")
  [[ -n $body ]] && args+=(-H 'Content-Type: application/json' --data-binary "$body")
  local got
  got=$(curl "${args[@]}" 2>"$work/curl.err")
  if [[ $got == "$want" ]]; then pass "$name"; else fail "$name: HTTP $got, expected $want: $(cat "$work/body" "$work/curl.err")"; fi
}
body_has() {  # body_has NAME JQ-FILTER: the last body satisfies the filter
  if jq -e "$2" "$work/body" >/dev/null 2>&1; then pass "$1"; else fail "$1: $(head -c 600 "$work/body")"; fi
}

curl_json "GET /health" 200 GET /health
body_has "/health says ok" '.status == "ok"'
curl_json "GET /v1/models" 200 GET /v1/models
body_has "/v1/models lists jambo-demo" '.object == "list" and (.data | length) == 1 and .data[0].id == "jambo-demo"'

curl_json "POST /tokenize" 200 POST /tokenize '{"prompt": "Hello, world! The river flows.", "add_special_tokens": false}'
body_has "/tokenize gives ids and a count" '(.tokens | length) == .count and .count > 3 and all(.tokens[]; type == "number")'
tokens=$(jq -c .tokens "$work/body")
curl_json "POST /detokenize" 200 POST /detokenize "{\"tokens\": $tokens}"
body_has "/tokenize + /detokenize round trip" '.prompt == "Hello, world! The river flows."'
curl_json "tokenize adds BOS by default" 200 POST /tokenize '{"prompt": "Hello"}'
body_has "tokenize BOS first" '.tokens[0] == 1'

request='{"model": "jambo-demo", "prompt": "The meaning of life is", "max_tokens": 12, "temperature": 0, "ignore_eos": true}'
curl_json "POST /v1/completions" 200 POST /v1/completions "$request"
body_has "completion body" '.object == "text_completion" and (.choices[0].text | length) > 0
  and .choices[0].finish_reason == "length" and .usage.completion_tokens == 12'
whole_text=$(jq -r '.choices[0].text' "$work/body")

curl -sS -N -D "$work/headers" -H 'Content-Type: application/json' -H 'X-Request-Id: curl-sse-1' \
  --data-binary "${request%\}}, \"stream\": true, \"stream_options\": {\"include_usage\": true}}" \
  "$url/v1/completions" >"$work/sse" 2>"$work/curl.err" || fail "SSE request: $(cat "$work/curl.err")"
grep -qi '^content-type: text/event-stream' "$work/headers" && pass "SSE content type" || fail "SSE headers: $(cat "$work/headers")"
grep -qi '^x-request-id: curl-sse-1' "$work/headers" && pass "X-Request-Id echoed" || fail "X-Request-Id not echoed: $(cat "$work/headers")"
[[ $(grep '^data: ' "$work/sse" | tail -n 1) == "data: [DONE]" ]] && pass "SSE ends with data: [DONE]" \
  || fail "SSE does not end with [DONE]: $(tail -c 400 "$work/sse")"
[[ $(grep -c '^data: \[DONE\]' "$work/sse") -eq 1 ]] && pass "one [DONE]" || fail "[DONE] count: $(grep -c DONE "$work/sse")"
streamed_text=$(grep '^data: {' "$work/sse" | sed 's/^data: //' | jq -j '.choices[]?.text')
[[ $streamed_text == "$whole_text" ]] && pass "SSE text equals the whole response" \
  || fail "SSE text '$streamed_text' vs whole '$whole_text'"
grep '^data: {' "$work/sse" | tail -n 1 | sed 's/^data: //' | jq -e '.choices == [] and .usage.completion_tokens == 12' \
  >/dev/null && pass "SSE usage chunk" || fail "SSE usage chunk: $(tail -c 400 "$work/sse")"

chat='{"model": "jambo-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 6, "temperature": 0}'
curl_json "POST /v1/chat/completions" 200 POST /v1/chat/completions "$chat"
body_has "chat body" '.object == "chat.completion" and .choices[0].message.role == "assistant"
  and (.choices[0].message.content | type) == "string"'

curl_json "bad temperature is a 400" 400 POST /v1/completions '{"model": "jambo-demo", "prompt": "x", "temperature": 3}'
body_has "error names temperature" '.error.param == "temperature" and .error.type == "invalid_request_error"'
curl_json "wrong model is a 404" 404 POST /v1/completions '{"model": "nope", "prompt": "x"}'
curl_json "unknown route is a 404" 404 GET /v1/nothing
body_has "404 is an error object" '.error.message | length > 0'

# curl -d sends application/x-www-form-urlencoded (a server library once read such bodies only up to 8 KiB): the
# body must be read, or the 413 must say that the content type is the reason.
long_request="{\"model\": \"jambo-demo\", \"prompt\": \"$(printf 'word %.0s' {1..2000})\", \"max_tokens\": 1}"
code=$(curl -sS -o "$work/body" -w '%{http_code}' -d "$long_request" "$url/v1/completions")
if [[ $code == 200 ]] || { [[ $code == 413 ]] && grep -q "Content-Type" "$work/body"; }; then
  pass "curl -d with a 10 KB body"
else
  fail "curl -d with a 10 KB body (form content type) got $code: $(cat "$work/body")"
fi

curl_json "GET /metrics" 200 GET /metrics
for name in jambo_time_to_first_token_seconds jambo_inter_token_latency_seconds jambo_e2e_request_latency_seconds; do
  grep -q "^${name}_bucket{le=\"+Inf\"} [1-9]" "$work/body" && grep -q "^${name}_sum " "$work/body" \
    && grep -q "^${name}_count [1-9]" "$work/body" && pass "/metrics has histogram $name" \
    || fail "/metrics lacks histogram $name with observations"
done
for name in jambo_num_requests_running jambo_num_requests_waiting jambo_kv_blocks_used jambo_state_slots_used \
            jambo_slot_reuses_total jambo_preemptions_total jambo_prompt_tokens_total jambo_generation_tokens_total \
            jambo_law_violations_total; do
  grep -q "^$name [0-9]" "$work/body" && pass "/metrics has $name" || fail "/metrics lacks $name"
done
grep -q '^jambo_nonfinite_logit_rows_total 0$' "$work/body" && pass "/metrics counts no rows of non-finite logits" \
  || fail "/metrics lacks jambo_nonfinite_logit_rows_total 0: $(grep nonfinite "$work/body")"
grep -q '^jambo_http_requests_total{status="400"} [1-9]' "$work/body" && pass "/metrics counts 400s" \
  || fail "/metrics does not count the 400s: $(grep http_requests "$work/body")"

# The openai client tests, one file after another (they share the server and check it idles).
for file in tests/server/completions.test.mjs tests/server/chat.test.mjs tests/server/streaming.test.mjs \
            tests/server/concurrency.test.mjs tests/server/malformed.test.mjs tests/server/disconnect.test.mjs \
            tests/server/queue.test.mjs tests/server/transport.test.mjs tests/server/control.test.mjs \
            tests/server/weights.test.mjs tests/server/sleep.test.mjs tests/server/prefix_cache.test.mjs; do
  kill -0 "$server_pid" 2>/dev/null || die "jambo serve is gone before $file"
  echo "---- node $file"
  file_started=$SECONDS
  if JAMBO_URL=$url JAMBO_BIN=$jambo JAMBO_MODEL=$demo JAMBO_WORK=$work JAMBO_TRACE=$work/trace.jsonl \
     node --test-reporter=spec "$file" >"$work/node.out" 2>&1; then
    grep -E '# server bug:|^# ' "$work/node.out" | sed 's/^ *//' | awk '!seen[$0]++'
    pass "$file ($((SECONDS - file_started)) s)"
  else
    cat "$work/node.out"
    fail "$file"
  fi
done

# The access log (seconds after those requests were answered): one line per request, on stderr.
access_log_has() {  # access_log_has NAME REGEX: a line of the shared server's log is "jambo serve: " REGEX
  grep -qE "^jambo serve: $2\$" "$work/server.log" && pass "access log: $1" || fail "access log lacks $1 (/$2/)"
}
access_log_has "a completion" 'POST /v1/completions 200 [0-9]+B [0-9.]+ms id=cmpl-[0-9]+-[0-9]+'
access_log_has "a stream, with its X-Request-Id" 'POST /v1/completions 200 stream [0-9.]+ms id=cmpl-curl-sse-1-[0-9]+'
access_log_has "a 400" 'POST /v1/completions 400 [0-9]+B [0-9.]+ms'
access_log_has "an unknown route" 'GET /v1/nothing 404 [0-9]+B [0-9.]+ms'
occupancy='[0-9]+ running, [0-9]+ waiting, KV blocks [0-9]+/[0-9]+ \([0-9.]+%\), state slots [0-9]+/[0-9]+'
access_log_has "the throughput line (--log-interval 1)" "prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s, $occupancy"

# --quiet: neither the access log nor the throughput line (even with --log-interval 1); the address line stays.
"$jambo" serve --model "$demo" --port 0 --quiet --log-interval 1 >"$work/quiet.log" 2>&1 &
quiet_pid=$!
if quiet_url=$(serve_url "$work/quiet.log" "$quiet_pid"); then
  curl -sS -o /dev/null "$quiet_url/health"
  curl -sS -o /dev/null -H 'Content-Type: application/json' --data-binary "$request" "$quiet_url/v1/completions"
  sleep 2.5  # a throughput line would be due by now
  kill -TERM "$quiet_pid"
  wait "$quiet_pid"
  if grep -q '^jambo serve:' "$work/quiet.log"; then
    fail "--quiet still logs: $(grep '^jambo serve:' "$work/quiet.log" | head -n 3)"
  else
    pass "--quiet: no access log and no throughput line"
  fi
else
  kill -TERM "$quiet_pid" 2>/dev/null
  wait "$quiet_pid"
  fail "jambo serve --quiet did not start: $(cat "$work/quiet.log")"
fi

# A model of fewer positions than the default context: max_model_len is max_position_embeddings, and holds.
mkdir -p "$work/short/jambo-demo" && cp "$demo"/* "$work/short/jambo-demo/"
jq '.max_position_embeddings = 1000' "$demo/config.json" >"$work/short/jambo-demo/config.json"
"$jambo" serve --model "$work/short/jambo-demo" --port 0 --quiet >"$work/short.log" 2>&1 &
short_pid=$!
if short_url=$(serve_url "$work/short.log" "$short_pid"); then
  models=$(curl -sS "$short_url/v1/models")
  too_long=$(curl -sS -H 'Content-Type: application/json' "$short_url/v1/completions" \
    --data-binary '{"model": "jambo-demo", "prompt": "The", "max_tokens": 1000}')
  kill -TERM "$short_pid"
  wait "$short_pid"
  jq -e '.data[0].max_model_len == 1000' <<<"$models" >/dev/null \
    && pass "max_model_len defaults to max_position_embeddings 1000" || fail "short model: $models"
  jq -e '.error.param == "max_tokens" and (.error.message | contains("max_model_len is 1000"))' <<<"$too_long" \
    >/dev/null && pass "a request past max_position_embeddings is a 400" || fail "short model: $too_long"
else
  kill -TERM "$short_pid" 2>/dev/null
  wait "$short_pid"
  fail "jambo serve of a 1000-position model did not start: $(cat "$work/short.log")"
fi
# A request whose logits are not finite is answered 500 server_error naming it and its step, alone: a second server
# on finite weights that overflow past a sequence's first token (tests/support/checkpoint_edits.sh) still answers
# what needs a first token only, before, beside and after the failures, and counts them.
source tests/support/checkpoint_edits.sh
mkdir -p "$work/overflowing" && overflowing_demo "$work/overflowing/jambo-demo"
"$jambo" serve --model "$work/overflowing/jambo-demo" --port 0 --log-interval 0 >"$work/overflowing.log" 2>&1 &
overflowing_pid=$!
if overflowing_url=$(serve_url "$work/overflowing.log" "$overflowing_pid"); then
  shared_url=$url
  url=$overflowing_url
  first_token='{"model": "jambo-demo", "prompt": [5], "max_tokens": 1, "temperature": 0}'
  overflows='{"model": "jambo-demo", "prompt": [5], "max_tokens": 3, "temperature": 0, "ignore_eos": true}'
  curl_json "non-finite logits: a first token is answered" 200 POST /v1/completions "$first_token"
  curl_json "non-finite logits are a 500" 500 POST /v1/completions "$overflows"
  body_has "the 500 is a server_error naming the request and its step" '.error.type == "server_error" and
    (.error.message | test("^request .cmpl-[0-9]+-[0-9]+. sample 0 \\(sequence [0-9]+\\), step [0-9]+: the logits are not finite"))'
  curl -sS -N -H 'Content-Type: application/json' --data-binary "${overflows%\}}, \"stream\": true}" \
    "$url/v1/completions" >"$work/overflow-sse" 2>"$work/curl.err" || fail "SSE request: $(cat "$work/curl.err")"
  grep '^data: {' "$work/overflow-sse" | head -n 1 | sed 's/^data: //' | jq -e '.choices[0].text | type == "string"' \
    >/dev/null && grep '^data: {' "$work/overflow-sse" | tail -n 1 | sed 's/^data: //' \
    | jq -e '.error.type == "server_error" and (.error.message | test("step [0-9]+: the logits are not finite"))' \
    >/dev/null && ! grep -q '^data: \[DONE\]' "$work/overflow-sse" \
    && pass "streamed: the first token, then a server_error event naming the step" \
    || fail "streamed non-finite logits: $(cat "$work/overflow-sse")"
  clients=()
  for i in 1 2 3; do
    curl -sS -o "$work/beside-good-$i" -w '%{http_code}\n' -H 'Content-Type: application/json' \
      --data-binary "$first_token" "$url/v1/completions" >"$work/beside-good-$i.code" &
    clients+=($!)
    curl -sS -o "$work/beside-bad-$i" -w '%{http_code}\n' -H 'Content-Type: application/json' \
      --data-binary "$overflows" "$url/v1/completions" >"$work/beside-bad-$i.code" &
    clients+=($!)
  done
  wait "${clients[@]}"
  [[ $(cat "$work"/beside-good-*.code | sort -u) == 200 && $(cat "$work"/beside-bad-*.code | sort -u) == 500 ]] \
    && pass "side by side: each request gets its own answer (200s and 500s)" \
    || fail "side by side: good $(cat "$work"/beside-good-*.code | tr '\n' ' '), bad $(cat "$work"/beside-bad-*.code | tr '\n' ' ')"
  curl_json "non-finite logits: alive after the failures" 200 GET /health
  curl_json "non-finite logits: answered after the failures" 200 POST /v1/completions "$first_token"
  curl -sS "$url/metrics" >"$work/body"
  grep -q '^jambo_nonfinite_logit_rows_total [1-9]' "$work/body" && grep -q '^jambo_http_requests_total{status="500"} 5$' "$work/body" \
    && grep -q '^jambo_state_slots_used 0$' "$work/body" && grep -q '^jambo_engine_alive 1$' "$work/body" \
    && pass "/metrics counts the rows and the 500s, nothing leaked" || fail "metrics: $(grep -E 'nonfinite|status=|slots_used|alive' "$work/body")"
  grep -qE '^jambo serve: POST /v1/completions 500 [0-9]+B [0-9.]+ms id=cmpl-' "$work/overflowing.log" \
    && pass "access log: a 500" || fail "access log lacks the 500: $(tail -n 5 "$work/overflowing.log")"
  url=$shared_url
else
  fail "jambo serve on the overflowing model did not start: $(cat "$work/overflowing.log")"
fi
kill -TERM "$overflowing_pid" 2>/dev/null
wait "$overflowing_pid"

# Afterwards: alive, idle (nothing leaked), no law violation, and a clean stop on SIGTERM.
curl_json "/health after everything" 200 GET /health
curl -sS "$url/metrics" >"$work/body"
for name in jambo_state_slots_used jambo_kv_blocks_used jambo_num_requests_running jambo_num_requests_waiting \
            jambo_law_violations_total; do
  grep -q "^$name 0$" "$work/body" && pass "$name is 0 at the end" || fail "$(grep "^$name " "$work/body") at the end"
done
if stop_server; then pass "server stops cleanly on SIGTERM"; else fail "server exited with $? on SIGTERM"; fi
grep -q "jambo: server stopped" "$work/server.log" && pass "server says it stopped" || fail "no stop message"

echo "server tests: $((SECONDS - started)) s"
if [[ $failures -gt 0 ]]; then
  echo "$failures server test(s) failed"
  show_logs
  exit 1
fi
echo "all server tests passed"
