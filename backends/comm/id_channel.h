// The channel that carries a communicator's set-up id between processes
// before the communicator exists (NCCL's unique id: backends/cuda/bootstrap.h),
// and its implementation over MPI.
#pragma once

#include <memory>
#include <span>

#include "core/status.h"

namespace meshtrain {

// Blocking point-to-point byte messages between global ranks. Messages
// between one pair with one tag arrive in the order sent.
class IdChannel {
 public:
  virtual ~IdChannel() = default;
  virtual Status send(std::span<const std::byte> bytes, int to_global_rank, int tag) = 0;
  virtual Status recv(std::span<std::byte> bytes, int from_global_rank, int tag) = 0;
};

// An IdChannel over a private duplicate of MPI_COMM_WORLD (so its messages
// never meet the job's other MPI traffic). MPI must already be initialised
// (MpiEnvironment in main, mpi_environment.h).
class MpiIdChannel final : public IdChannel {
 public:
  // Collective over MPI_COMM_WORLD.
  static Result<std::unique_ptr<MpiIdChannel>> create();
  ~MpiIdChannel() override;
  int rank() const { return rank_; }
  int world_size() const { return world_; }
  Status send(std::span<const std::byte> bytes, int to_global_rank, int tag) override;
  Status recv(std::span<std::byte> bytes, int from_global_rank, int tag) override;

 private:
  struct Comm;
  MpiIdChannel(std::unique_ptr<Comm> comm, int rank, int world);
  std::unique_ptr<Comm> comm_;
  int rank_, world_;
};

}  // namespace meshtrain
