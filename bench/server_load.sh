#!/usr/bin/env bash
# Load benchmark of `jambo serve` with the demo model: 1, 16 and 64 concurrent streaming clients for a
# fixed duration each (DURATION_S, default 10); prints requests/s, generated tokens/s and time-to-first-
# token and inter-token latency percentiles. A benchmark prints; it never fails the build.
# Usage: bench/server_load.sh path/to/jambo [model-folder]   (run from the repository root; needs node)
set -uo pipefail
jambo=$1
model=${2:-models/jambo-demo}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if ! command -v node >/dev/null; then
  echo "server_load: node is missing (scripts/install-deps installs it); skipped"
  exit 0
fi
work=$(mktemp -d)
"$jambo" serve --model "$model" --port 0 >"$work/server.log" 2>&1 &
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
  echo "server_load: jambo serve did not start:"
  cat "$work/server.log"
  exit 0
fi
MODEL=$(basename "$model") node "$(dirname "$0")/server_load.mjs" "$url" 1 16 64 || echo "server_load: the benchmark failed"
exit 0
