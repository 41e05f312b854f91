#!/bin/bash
# Straggler and link what-ifs on gpt3-175b, 1024 A100 (RESULTS.md, issue 17).
# Run from the repository root after building.
M=${MESHTRAIN:-./build/engine/meshtrain}
G3="--model gpt3-175b --cluster dgx-a100 --gpus 1024 --tp 8 --pp 16 --dp 8 --micro-batch 1 --global-batch 1536 --schedule interleaved --vpp 2 --ignore-memory --json"
base=$($M simulate $G3 --fidelity full | python3 -c "import json,sys; print(json.load(sys.stdin)['iteration_time_s'])")
echo "baseline (full fidelity): $base s"
for extra in "--straggler 17:1.1" "--straggler 17:1.3" "--straggler 960:1.3" "--straggler 0-7:1.3" \
             "--straggler random:0.01:1.3" "--straggler random:0.01:1.3 --seed 2" "--straggler random:0.1:1.1" \
             "--link-degrade node3.nic5:0.5" "--link-degrade node3.nic5:0.25" "--link-degrade leaf2-spine7:0.25" \
             "--link-fail leaf2-spine7" "--link-fail node3.nic5" "--link-fail node3.nic5 --link-fail node3.nic4"; do
  $M simulate $G3 $extra 2>/dev/null | python3 -c "
import json, sys
j = json.load(sys.stdin); f = j['full_fidelity']; t = j['iteration_time_s']
print(f\"| \`$extra\` | {t:.4f} | {100 * (t / $base - 1):+.1f}% | rank {f['slowest_rank']}, \"
      f\"{f['slowest_compute_s'] / f['median_compute_s']:.2f}x | {j['simulator_wall_s']:.1f} |\")"
done
