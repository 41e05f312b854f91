// The MPI side of the NCCL bootstrap: an IdChannel over a private duplicate
// of MPI_COMM_WORLD (so its messages never meet the job's other MPI traffic).
// MPI must already be initialised (MpiEnvironment in main).
#pragma once

#include <memory>

#include "backends/cuda/bootstrap.h"

namespace meshtrain::cuda {

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

}  // namespace meshtrain::cuda
