#!/bin/bash
# Representative vs full fidelity on plans without variation (RESULTS.md,
# issue 17): iteration time in each mode, the full run's host and CPU time,
# its tasks and flows. Run from the repository root after building.
M=${MESHTRAIN:-./build/engine/meshtrain}
run() {  # label, simulate flags
  local label="$1"; shift
  local rep full cpu
  rep=$($M simulate "$@" --ignore-memory --json | python3 -c \
    "import json,sys; j=json.load(sys.stdin); print(j['iteration_time_s'])")
  full=$( { /usr/bin/time -f "%U" -o /tmp/fidelity_cpu $M simulate "$@" --ignore-memory --json --fidelity full; } |
    python3 -c "import json,sys; j=json.load(sys.stdin); f=j['full_fidelity']; print(j['iteration_time_s'], f['tasks_run'], f['flows'])")
  cpu=$(tail -1 /tmp/fidelity_cpu)
  python3 - "$label" $rep $full "$cpu" <<'PY'
import sys
label = sys.argv[1]
rep, full, tasks, flows, cpu = map(float, sys.argv[2:])
print(f"| {label} | {rep:.4f} | {full:.4f} | {100 * (full / rep - 1):+.2f}% | {cpu:.1f} | {tasks / 1e6:.1f} M | {flows / 1e6:.1f} M |")
PY
}
G3="--model gpt3-175b --cluster dgx-a100 --gpus 1024 --tp 8 --pp 16 --dp 8 --micro-batch 1 --global-batch 1536 --schedule interleaved --vpp 2"
run "gpt3-175b, 1024 A100, tp8 pp16 dp8 vpp2 (overlap)" $G3
run "the same, --grad-sync after-backward" $G3 --grad-sync after-backward
run "the same, --grad-bucket-mb 25" $G3 --grad-bucket-mb 25
run "megatron-18.4b, 64 A100, tp8 pp2 dp4" --model megatron-18.4b --cluster dgx-a100 --gpus 64 --tp 8 --pp 2 --micro-batch 1 --global-batch 256
run "llama2-70b, 256 H100, tp8 pp4 dp8, ZeRO 1, recompute full" --model llama2-70b --cluster dgx-h100 --gpus 256 --tp 8 --pp 4 --micro-batch 1 --global-batch 512 --zero 1 --recompute full
run "llama3-8b, 128 H100, tp2 dp64, ZeRO 1, seq 4096" --model llama3-8b --cluster dgx-h100 --gpus 128 --tp 2 --micro-batch 2 --global-batch 512 --zero 1 --seq-len 4096
run "gpt2-350m, 32 A100, tp2 pp2 dp8" --model gpt2-350m --cluster dgx-a100 --gpus 32 --tp 2 --pp 2 --global-batch 64
