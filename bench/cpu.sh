#!/usr/bin/env bash
# CPU speed figures: prefill and decode tokens/s and weight GB/s for the demo model and for random
# weights with the shape of Jamba-tiny-dev (319M parameters). Prints figures; never fails on time.
# Usage: bench/cpu.sh [path/to/jambo]
set -euo pipefail
cd "$(dirname "$0")/.."
jambo=${1:-build/jambo}
"$jambo" bench --model models/jambo-demo --prompt-tokens 512 --decode-tokens 64
"$jambo" bench --model bench/shapes/jamba-tiny-dev --random-weights --prompt-tokens 512 --decode-tokens 32 --repeats 2
