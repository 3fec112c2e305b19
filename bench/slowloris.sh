#!/usr/bin/env bash
# Slowloris benchmark of `jambo serve` with the demo model: CONNECTIONS (default 2000) connections trickle request
# headers a byte a second for SECONDS (default 30) while /health and greedy completions from other clients are timed
# and the server's resident memory is sampled. Prints p50/max latencies and RSS before/peak; never fails the build.
# Usage: bench/slowloris.sh path/to/jambo [model-folder]   (run from the repository root; needs node)
set -uo pipefail
jambo=$1
model=${2:-models/jambo-demo}
connections=${CONNECTIONS:-2000}
seconds=${SECONDS_OF_ATTACK:-30}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if ! command -v node >/dev/null; then
  echo "slowloris: node is missing (scripts/install-deps installs it); skipped"
  exit 0
fi
# The clients' side needs a descriptor per connection too.
ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d)
"$jambo" serve --model "$model" --port 0 --quiet >"$work/server.log" 2>&1 &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; rm -rf "$work"' EXIT
url=""
for _ in $(seq 300); do
  url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/server.log")
  [[ -n $url ]] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $url ]]; then
  echo "slowloris: jambo serve did not start:"
  cat "$work/server.log"
  exit 0
fi
node "$(dirname "$0")/slowloris.mjs" "$url" "$server_pid" "$connections" "$seconds" || echo "slowloris: the benchmark failed"
exit 0
