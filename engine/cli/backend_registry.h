// The backends the commands run ranks on, asked for by name (--backend).
//
// This is the one place outside backends/ that knows the concrete backends
// (backends/cpu/, backends/cuda/): `train`, `generate`, `calibrate` and its
// op profile build every rank's backend here, in each of the three ways a
// rank can run (alone, as a thread of this process, as a process of an MPI
// job), and everything else sees only backends/backend.h.
// tests/architecture/include_order.py holds the rest of the code to that.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "core/status.h"

namespace meshtrain {

// What a command asks of one rank's backend.
struct BackendRequest {
  std::string name = "cpu";  // one of backend_names()
  // cpu: the rank's threads (a --threads flag); 0 shares this process's
  // cores among the ranks that run in it.
  int threads = 0;
  // cpu: ranks of this process that share its cores (rank threads, or other
  // world-of-one backends measuring at once). MPI ranks work it out themselves.
  int ranks_sharing = 1;
  // How long a rank waits for its peers before failing (cpu collectives, NCCL's watchdog).
  std::chrono::milliseconds comm_timeout{std::chrono::minutes(5)};
};

// The names a --backend flag takes, in the order help texts list them.
const std::vector<std::string>& backend_names();

// An Error listing backend_names() unless `name` is one of them.
Status check_backend_name(std::string_view name);

// The one rank of a world of one.
Result<std::unique_ptr<Backend>> make_backend(const BackendRequest& r);

// This process's rank of the MPI job it is in (MPI initialised): the cpu
// backend over MPI, the cuda backend over NCCL. Every rank must call it:
// the set-up is collective.
class MpiRankBackend {
 public:
  static Result<MpiRankBackend> create(const BackendRequest& r);
  MpiRankBackend(MpiRankBackend&&) = default;
  // Assigning over a live rank would free its communicator (the first member)
  // while its backend still uses it.
  MpiRankBackend& operator=(MpiRankBackend&&) = delete;
  Backend& backend() { return *backend_; }

 private:
  MpiRankBackend() = default;
  std::shared_ptr<void> communicator_;  // the cpu backend's; declared first so that it outlives the backend
  std::unique_ptr<Backend> backend_;
};

// Runs body(rank, backend) for `world` ranks as threads of this process,
// each with its own backend of `r` over one in-process communicator, and
// joins them. A failing rank stops the others (backends/cpu/comm/in_process.h);
// returns the first error.
Status run_thread_ranks(const BackendRequest& r, int world,
                        const std::function<Status(int rank, Backend& backend)>& body);

// The name of the device `name` runs on here ("NVIDIA H200" for cuda), for
// records such as a calibration's device; "" when there is none.
std::string backend_device_name(std::string_view name);

// One FP8 GEMM on `backend` as Transformer Engine runs a linear's, for
// calibrate to time (cuda_fp8_gemm_call: the cuda backend's cuBLASLt FP8
// GEMM, fast or split accumulator); an Error on a backend without FP8 GEMMs
// (the cpu backend emulates FP8 in fp32).
Result<std::function<void()>> backend_fp8_gemm_call(Backend& backend, std::int64_t m, std::int64_t n, std::int64_t k,
                                                    bool split_accumulator);

// CPUs this process may run on, and the most threads a --threads flag may
// ask of one cpu rank.
int available_cpu_cores();
int max_cpu_threads_per_rank();

// The threads each of `ranks_sharing` cpu ranks of this process gets for a
// --threads flag of `requested` (0: an even share of the cores).
int cpu_threads_per_rank(int requested, int ranks_sharing);

}  // namespace meshtrain
