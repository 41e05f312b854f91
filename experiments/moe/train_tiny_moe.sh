#!/usr/bin/env bash
# The tiny MoE against the dense model of equal active parameters on text
# (experiments/RESULTS.md, "Mixture of experts"): five 400-step runs on the
# cpu backend, metrics in $OUT/*.jsonl, summarised by summarize.py.
#   experiments/moe/train_tiny_moe.sh [MESHTRAIN] [OUT]
set -euo pipefail
M=${1:-build/engine/meshtrain}
OUT=${2:-/tmp/moe_train}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
# The corpus of the issue-3 run (RESULTS.md): the first 400,000 bytes of the
# Debian copyright and licence texts.
find /usr/share/common-licenses /usr/share/doc -name copyright -o -name 'GPL*' | sort | xargs cat 2>/dev/null |
  head -c 400000 > "$OUT/text400k.txt"
A="--data $OUT/text400k.txt --steps 400 --seq-len 64 --lr 3e-3 --warmup 20 --eval-every 100 --quiet"
rm -f "$OUT"/*.jsonl
"$M" train --model tiny $A --micro-batch 16 --metrics "$OUT/dense.jsonl"
"$M" train --model tiny-moe $A --micro-batch 16 --metrics "$OUT/moe.jsonl"
"$M" train --model tiny-moe $A --micro-batch 8 --dp 2 --ep 2 --metrics "$OUT/moe_ep2.jsonl"
"$M" train --model "$HERE/tiny-moe-noaux.json" $A --micro-batch 16 --metrics "$OUT/moe_noaux.jsonl"
"$M" train --model "$HERE/tiny-moe-capped.json" $A --micro-batch 16 --metrics "$OUT/moe_capped.jsonl"
python3 "$HERE/summarize.py" "$OUT"
