#include "engine/cli/backend_registry.h"

#include <algorithm>

#include "backends/cpu/comm/in_process.h"
#include "backends/cpu/comm/mpi_communicator.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/threads.h"
#include "backends/cuda/cuda_factory.h"
#include "core/names.h"

namespace meshtrain {

namespace {

bool is_cpu(std::string_view name) { return name == "cpu"; }

CpuBackendOptions cpu_options(const BackendRequest& r, int ranks_sharing) {
  return {cpu::rank_threads(r.threads, ranks_sharing)};
}

}  // namespace

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> names{"cpu", "cuda"};
  return names;
}

Status check_backend_name(std::string_view name) {
  const auto& names = backend_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return ok_status();
  return Error(unknown_name_message("--backend", std::string(name), names));
}

Result<std::unique_ptr<Backend>> make_backend(const BackendRequest& r) {
  MT_TRY(check_backend_name(r.name));
  if (is_cpu(r.name)) return std::unique_ptr<Backend>(std::make_unique<CpuBackend>(cpu_options(r, r.ranks_sharing)));
  return make_cuda_backend({.device = -1, .use_mpi = false, .comm_timeout = r.comm_timeout});
}

Result<MpiRankBackend> MpiRankBackend::create(const BackendRequest& r) {
  MT_TRY(check_backend_name(r.name));
  MpiRankBackend made;
  if (is_cpu(r.name)) {
    MT_ASSIGN(std::unique_ptr<MpiCommunicator> comm, MpiCommunicator::create(CommOptions{r.comm_timeout}));
    made.backend_ = std::make_unique<CpuBackend>(*comm, cpu_options(r, cpu::mpi_ranks_sharing_cores()));
    made.communicator_ = std::shared_ptr<MpiCommunicator>(std::move(comm));
  } else {
    MT_ASSIGN(made.backend_, make_cuda_backend({.device = -1, .use_mpi = true, .comm_timeout = r.comm_timeout}));
  }
  return made;
}

Status run_thread_ranks(const BackendRequest& r, int world,
                        const std::function<Status(int rank, Backend& backend)>& body) {
  MT_TRY(check_backend_name(r.name));
  if (!is_cpu(r.name))
    return make_error("the {} backend runs one rank per process, and {} ranks were asked for; launch them with "
                      "`mpirun -np {} meshtrain ...` or srun",
                      r.name, world, world);
  return run_ranks(
      world,
      [&](int rank, Communicator& comm) {
        CpuBackend backend(comm, cpu_options(r, world));
        return body(rank, backend);
      },
      CommOptions{r.comm_timeout});
}

std::string backend_device_name(std::string_view name) { return is_cpu(name) ? "" : cuda_device_name(); }

Result<std::function<void()>> backend_fp8_gemm_call(Backend& backend, std::int64_t m, std::int64_t n, std::int64_t k,
                                                    bool split_accumulator) {
  return cuda_fp8_gemm_call(backend, m, n, k, split_accumulator);
}

int available_cpu_cores() { return cpu::available_cores(); }

int max_cpu_threads_per_rank() { return cpu::kMaxRankThreads; }

int cpu_threads_per_rank(int requested, int ranks_sharing) { return cpu::rank_threads(requested, ranks_sharing); }

}  // namespace meshtrain
