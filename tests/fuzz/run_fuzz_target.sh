#!/usr/bin/env bash
# Fuzzes one target for a bounded time, from its seeds and what earlier runs kept in WORK/corpus. Fails on the
# first finding, which libFuzzer saves as WORK/crash-*, leak-*, timeout-* or oom-* (rerun the target on that file
# to reproduce it). Usage: run_fuzz_target.sh TARGET SEEDS WORK SECONDS DICTIONARY
set -euo pipefail
target=$1 seeds=$2 work=$3 seconds=$4 dictionary=$5
mkdir -p "$work/corpus"
# -timeout: an input that takes this long is a hang; -rss_limit_mb: more memory is unbounded growth.
exec "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -dict="$dictionary" \
  -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus" "$seeds"
