// How many threads the cpu backend's kernels get (cpu_backend.h): the cores
// of this process shared out among the rank threads that run in it.
#pragma once

namespace meshtrain::cpu {

// CPUs this process may run on: its affinity set (taskset, mpirun's binding), at least 1.
int available_cores();

// Threads for each of `ranks` rank threads of this process sharing its
// cores: available_cores() / ranks, at least 1.
int threads_per_rank(int ranks);

// The most threads a --threads flag may ask of one rank (far beyond any
// machine's cores; 2^31 - 1 made thread pools that crashed the process).
inline constexpr int kMaxRankThreads = 1 << 16;

// A rank's threads: `requested` when > 0 (a --threads flag), else
// threads_per_rank(ranks). `meshtrain train` and `calibrate` both ask here.
int rank_threads(int requested, int ranks);

// Rank processes of an MPI job on this machine that share this process's
// cores: 1 when the launcher bound the process to a subset of the machine's
// CPUs (mpirun's default for a few ranks), else the launcher's local rank
// count (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS, SLURM_NTASKS_PER_NODE), else 1.
int mpi_ranks_sharing_cores();

}  // namespace meshtrain::cpu
