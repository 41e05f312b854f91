#include "backends/cuda/nccl_comm.h"

#include <cstring>

#include <fmt/format.h>

namespace meshtrain::cuda {

static_assert(sizeof(ncclUniqueId) == kUniqueIdBytes);

namespace {
std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  if (comm != nullptr)
    if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0')
      s += fmt::format(" ({})", last);
  return s;
}
}  // namespace

NcclComms::NcclComms(int rank, int world, int device, std::unique_ptr<IdChannel> channel,
                     std::chrono::milliseconds timeout, Sink sink)
    : rank_(rank),
      world_(world),
      device_(device),
      channel_(std::move(channel)),
      sink_(std::move(sink)),
      watchdog_(rank, timeout) {
  if (world_ > 1) thread_ = std::thread([this] { watch(); });
}

NcclComms::~NcclComms() {
  {
    std::lock_guard lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (auto& [id, c] : comms_) {
    if (aborted_) continue;  // ncclCommAbort already released them
    ncclCommDestroy(c);
  }
}

Result<ncclComm_t> NcclComms::create(const Group& g) {
  if (channel_ == nullptr)
    return make_error("group {} has {} ranks but this backend has no MPI bootstrap", g.id, g.size());
  auto make_id = []() -> Result<UniqueId> {
    ncclUniqueId id;
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      return make_error("ncclGetUniqueId: {}", ncclGetErrorString(r));
    UniqueId out;
    std::memcpy(out.data(), id.internal, kUniqueIdBytes);
    return out;
  };
  MT_ASSIGN(const UniqueId uid, share_unique_id(*channel_, g, rank_, make_id));
  ncclUniqueId id;
  std::memcpy(id.internal, uid.data(), kUniqueIdBytes);
  cudaSetDevice(device_);
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, g.size(), id, g.index_of(rank_)); r != ncclSuccess)
    return make_error("ncclCommInitRank for group {} ({} ranks, index {}): {}", g.id, g.size(),
                      g.index_of(rank_), nccl_error(r, comm));
  std::lock_guard lock(mu_);
  comms_[g.id] = comm;
  return comm;
}

Status NcclComms::init_world() {
  Group all{kWorldGroup, {}};
  for (int r = 0; r < world_; ++r) all.ranks.push_back(r);
  MT_TRY(create(all));
  return ok_status();
}

ncclComm_t NcclComms::world() const {
  std::lock_guard lock(mu_);
  auto it = comms_.find(kWorldGroup);
  return it == comms_.end() ? nullptr : it->second;
}

Result<ncclComm_t> NcclComms::get(const Group& g) {
  {
    std::lock_guard lock(mu_);
    if (aborted_) return make_error("the NCCL communicators were aborted after an earlier failure");
    if (auto it = comms_.find(g.id); it != comms_.end()) return it->second;
  }
  return create(g);
}

void NcclComms::track(std::string op, int group, std::string peers, cudaStream_t stream) {
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    if (done != nullptr) cudaEventDestroy(done);
    return;  // the op runs unwatched; a device fault still surfaces at the next sync
  }
  watchdog_.track(std::move(op), group, std::move(peers), Clock::now(), [done]() {
    const cudaError_t e = cudaEventQuery(done);
    if (e == cudaErrorNotReady) return false;
    cudaEventDestroy(done);
    return true;  // a device error is reported by the backend's next blocking call
  });
}

void NcclComms::abort_all() {
  std::lock_guard lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  for (auto& [id, c] : comms_) ncclCommAbort(c);
}

void NcclComms::watch() {
  cudaSetDevice(device_);
  const auto async_error = [this](int group) -> std::optional<std::string> {
    std::lock_guard lock(mu_);
    auto it = comms_.find(group);
    if (aborted_ || it == comms_.end()) return std::nullopt;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(it->second, &state) != ncclSuccess || state == ncclSuccess ||
        state == ncclInProgress)
      return std::nullopt;
    return fmt::format("NCCL async error: {}", nccl_error(state, it->second));
  };
  std::unique_lock lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; })) {
    if (auto err = watchdog_.poll(Clock::now(), async_error)) {
      sink_(std::move(*err));
      abort_all();
      return;
    }
  }
}

}  // namespace meshtrain::cuda
