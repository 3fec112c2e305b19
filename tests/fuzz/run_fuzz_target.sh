#!/usr/bin/env bash
# Fuzzes one target for a bounded time, from its seeds, what earlier runs kept in WORK/corpus and the inputs of
# past findings (FINDINGS, when the target has any: each must now be refused cleanly). Fails on the first finding,
# which libFuzzer saves as WORK/crash-*, leak-*, timeout-* or oom-* (rerun the target on that file to reproduce it).
# Usage: run_fuzz_target.sh TARGET SEEDS FINDINGS WORK SECONDS [DICTIONARY]
set -euo pipefail
target=$1 seeds=$2 findings=$3 work=$4 seconds=$5 dictionary=${6:-}
mkdir -p "$work/corpus"
inputs=("$work/corpus" "$seeds")
[[ -d $findings ]] && inputs+=("$findings")
options=()
[[ -n $dictionary ]] && options+=(-dict="$dictionary")
# -timeout: an input that takes this long is a hang; -rss_limit_mb: more memory is unbounded growth.
exec "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 "${options[@]}" -artifact_prefix="$work/" \
  -print_final_stats=1 "${inputs[@]}"
