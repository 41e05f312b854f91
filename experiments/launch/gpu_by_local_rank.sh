#!/usr/bin/env bash
# Wraps one rank: pins it to the GPU of its node-local rank, then runs the
# command. Open MPI sets OMPI_COMM_WORLD_LOCAL_RANK, srun SLURM_LOCALID. With
# CUDA_VISIBLE_DEVICES narrowed to one device, the cuda backend uses device 0
# (backends/cuda/device_select.h), and NCCL still sees the NVLink topology.
set -euo pipefail
local_rank="${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-${LOCAL_RANK:-}}}"
if [[ -z "$local_rank" ]]; then
  echo "gpu_by_local_rank.sh: no local rank (run under mpirun or srun)" >&2
  exit 2
fi
if [[ -z "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  export CUDA_VISIBLE_DEVICES="$local_rank"
fi
exec "$@"
