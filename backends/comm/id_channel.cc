#include "backends/comm/id_channel.h"

#include <mpi.h>

#include "backends/comm/mpi_environment.h"

namespace meshtrain {

struct MpiIdChannel::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
};

Result<std::unique_ptr<MpiIdChannel>> MpiIdChannel::create() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised)
    return make_error("MPI is not initialised: a multi-rank cuda backend needs an MpiEnvironment");
  auto comm = std::make_unique<Comm>();
  if (int e = MPI_Comm_dup(MPI_COMM_WORLD, &comm->comm); e != MPI_SUCCESS)
    return make_error("MPI_Comm_dup: {}", mpi_error_text(e));
  MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN);
  int rank = 0, world = 1;
  MPI_Comm_rank(comm->comm, &rank);
  MPI_Comm_size(comm->comm, &world);
  return std::unique_ptr<MpiIdChannel>(new MpiIdChannel(std::move(comm), rank, world));
}

MpiIdChannel::MpiIdChannel(std::unique_ptr<Comm> comm, int rank, int world)
    : comm_(std::move(comm)), rank_(rank), world_(world) {}

MpiIdChannel::~MpiIdChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_->comm != MPI_COMM_NULL) MPI_Comm_free(&comm_->comm);
}

Status MpiIdChannel::send(std::span<const std::byte> bytes, int to, int tag) {
  if (int e = MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, tag, comm_->comm);
      e != MPI_SUCCESS)
    return make_error("MPI_Send to rank {}: {}", to, mpi_error_text(e));
  return ok_status();
}

Status MpiIdChannel::recv(std::span<std::byte> bytes, int from, int tag) {
  if (int e = MPI_Recv(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, from, tag,
                       comm_->comm, MPI_STATUS_IGNORE);
      e != MPI_SUCCESS)
    return make_error("MPI_Recv from rank {}: {}", from, mpi_error_text(e));
  return ok_status();
}

}  // namespace meshtrain
