#!/usr/bin/env bash
# Rules of the CUDA sources that no compiler checks, run by ctest on every machine (CI too: no GPU needed):
#   no read-only global loads (__ldg, ld.global.nc) and no __restrict__ (which lets the compiler emit them). Our
#   kernels start early (programmatic dependent launch, device_math.cuh), while the kernel that writes their inputs
#   may still run; a read-only load may then be served stale or issued before the wait for it. It happened: the
#   skinny GEMM's __ldg of x gave wrong decode logits now and then (Bf16DecodeTest).
# Comments are not code: the text after // is ignored.
#   tests/backend/cuda/source_rules.sh [source folder]   (default: src/backend/cuda)
set -euo pipefail
cd "$(dirname "$0")/../../.."
folder=${1:-src/backend/cuda}
[[ -d $folder ]] || { echo "cuda_source_rules: no folder '$folder'" >&2; exit 2; }
status=0
while IFS= read -r -d '' file; do
  # file:line: code, with comments stripped, for every line that breaks a rule
  hits=$(sed 's#//.*##' "$file" | grep -nE '__ldg\b|\.nc\b|__restrict__' || true)
  if [[ -n $hits ]]; then
    while IFS= read -r hit; do
      echo "$file:${hit%%:*}: read-only load or __restrict__ (kernels start early; see tests/backend/cuda/source_rules.sh):${hit#*:}"
    done <<<"$hits"
    status=1
  fi
done < <(find "$folder" -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.h' \) -print0)
[[ $status -eq 0 ]] && echo "cuda_source_rules: $(find "$folder" -type f | wc -l) files of $folder keep the rules"
exit $status
