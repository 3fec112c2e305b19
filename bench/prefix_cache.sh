#!/usr/bin/env bash
# Prefix caching on `jambo serve`: time to first token of a second turn over a shared 4000-token history, cold
# against cached, and a multi-turn agent workload (256 conversations x 8 turns) with and without caching
# (bench/prefix_cache.mjs). Two servers of the same model, one with --no-enable-prefix-caching; extra flags go to
# both (e.g. --backend cuda). A benchmark prints; it never fails the build. Needs node.
# Usage: bench/prefix_cache.sh path/to/jambo [model-folder] [serve flags...]   (from the repository root)
set -uo pipefail
jambo=$1
model=${2:-models/jambo-demo}
shift $(($# < 2 ? $# : 2))
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
if ! command -v node >/dev/null; then
  echo "prefix_cache: node is missing (scripts/install-deps installs it); skipped"
  exit 0
fi
work=$(mktemp -d)
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
start() {  # name, flags...: starts a server, prints its URL
  local name=$1
  shift
  "$jambo" serve --model "$model" --port 0 --max-model-len 8192 --quiet "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    local url
    url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$work/$name.log") && { echo "$url"; return; }
    sleep 0.1
  done
  echo "prefix_cache: the $name server did not start:" >&2
  cat "$work/$name.log" >&2
}
cached=$(start cached --max-num-checkpoints 600 "$@")
cold=$(start cold --no-enable-prefix-caching "$@")
[[ -n $cached && -n $cold ]] || exit 0
head -1 "$work/cached.log"
MODEL=$(basename "$model") node "$(dirname "$0")/prefix_cache.mjs" "$cached" "$cold" || echo "prefix_cache: the benchmark failed"
exit 0
