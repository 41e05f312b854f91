#!/usr/bin/env bash
# Issue 14, overlap and prefetch (and tensor-parallel comm overlap under
# sequence parallelism): each on and off, simulated in the steady
# state (the second of two iterations) on gpt3-175b at 1024 A100 and
# llama3-70b at 512 H100, printed as the rows of RESULTS.md's table.
# Usage: experiments/whatif/overlap.sh [path/to/meshtrain]
set -euo pipefail
M=${1:-build-dev/engine/meshtrain}
gpt3="--model gpt3-175b --cluster dgx-a100 --gpus 1024 --tp 8 --pp 16 --dp 8 --micro-batch 1 --global-batch 1536
      --schedule interleaved --vpp 2 --recompute full"
llama="--model llama3-70b --cluster dgx-h100 --gpus 512 --tp 8 --pp 4 --dp 16 --micro-batch 1 --global-batch 512
       --recompute full"
row() {  # model label, flags...
  local label=$1
  shift
  "$M" simulate "$@" --steady-state --json |
    python3 -c 'import json, sys
r = json.load(sys.stdin)
it = r["iteration_time_s"]
print("| %s | %.3f | %.3f | %.3f | %.2f |" % (sys.argv[1], it, r["exposed_comm_s"], r["bubble_fraction"] * it,
                                           r["peak_memory_bytes"] / 2**30))' "$label"
}
for model in gpt3 llama; do
  flags=${!model}
  row "$model ZeRO 1" $flags --zero 1
  row "$model ZeRO 1, --overlap-update" $flags --zero 1 --overlap-update
  row "$model ZeRO 3, --no-prefetch-across-chunks" $flags --zero 3 --no-prefetch-across-chunks
  row "$model ZeRO 3 (prefetch across chunks)" $flags --zero 3
  row "$model ZeRO 3, prefetch across chunks, --overlap-update" $flags --zero 3 --overlap-update
  row "$model ZeRO 1, sp" $flags --zero 1 --sequence-parallel
  row "$model ZeRO 1, sp, --tp-comm-overlap" $flags --zero 1 --sequence-parallel --tp-comm-overlap
done
