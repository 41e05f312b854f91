#!/usr/bin/env bash
# The same 2 x 8 GPU job with Open MPI's mpirun, for clusters without Slurm:
#   HOSTS=node1:8,node2:8 experiments/launch/mpirun_2x8.sh
# Ranks 0-7 land on node1, 8-15 on node2 (--map-by ppr:8:node), so tp=8
# groups stay inside a node.
set -euo pipefail
cd "$(dirname "$0")/../.."

HOSTS="${HOSTS:?set HOSTS, e.g. node1:8,node2:8}"
MESHTRAIN="${MESHTRAIN:-build/engine/meshtrain}"
DATA="${DATA:-data/train.txt}"
STEPS="${STEPS:-1000}"

mpirun -np 16 --host "$HOSTS" --map-by ppr:8:node --bind-to numa \
  -x NCCL_DEBUG="${NCCL_DEBUG:-WARN}" -x NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-0}" \
  -x PATH -x LD_LIBRARY_PATH \
  experiments/launch/gpu_by_local_rank.sh \
  "$MESHTRAIN" train --backend cuda --ranks mpi \
    --model gpt2-124m --tp 8 --dp 2 --pp 1 \
    --micro-batch 8 --seq-len 1024 --precision bf16 \
    --data "$DATA" --steps "$STEPS" --metrics meshtrain-mpirun.jsonl \
    ${EXTRA:-}
