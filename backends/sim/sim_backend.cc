// SimBackend construction, streams and events, mapped to executor streams
// and events.
#include "backends/sim/sim_backend.h"

#include <fmt/format.h>

#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;

SimBackend::SimBackend(SimCluster& cluster, int job, int rank, int world_size, int device)
    : cluster_(cluster),
      job_(job),
      rank_(rank),
      world_size_(world_size),
      device_(device),
      accounting_(std::make_shared<Accounting>()) {
  create_stream("compute");
}

SimBackend::~SimBackend() = default;

Stream SimBackend::create_stream(std::string_view name) {
  const int id = static_cast<int>(streams_.size());
  // Executor streams are named per device; the id keeps equal names apart.
  auto s = cluster_.executor_->stream(device_,
                                      id == 0 ? std::string(name) : fmt::format("{} {}", name, id));
  if (!s) misuse("create_stream: {}", s.error().message());
  streams_.push_back(*s);
  return Stream{id};
}

void SimBackend::set_stream(Stream s) {
  if (s.id < 0 || s.id >= static_cast<int>(streams_.size()))
    misuse("set_stream: stream {} was not created here", s.id);
  current_ = s;
}

sim::StreamId SimBackend::executor_stream(Stream s) const {
  if (s.id < 0 || s.id >= static_cast<int>(streams_.size()))
    misuse("stream {} was not created here", s.id);
  return streams_[static_cast<std::size_t>(s.id)];
}

Event SimBackend::record(Stream s) {
  const sim::StreamId st = executor_stream(s);
  const Event e{static_cast<std::int64_t>(events_.size())};
  events_.push_back(cluster_.executor_->intern(fmt::format("event {}", e.id)));
  if (Status r = cluster_.executor_->record(st, events_.back()); !r)
    cluster_.fail(std::move(r).error());
  return e;
}

void SimBackend::wait(Stream s, Event e) {
  const sim::StreamId st = executor_stream(s);
  if (!e.valid() || e.id >= static_cast<std::int64_t>(events_.size()))
    misuse("wait: event {} was not recorded here", e.id);
  if (Status r = cluster_.executor_->wait(st, events_[static_cast<std::size_t>(e.id)]); !r)
    cluster_.fail(std::move(r).error());
}

Status SimBackend::synchronize() {
  if (cluster_.error_) return *cluster_.error_;
  return ok_status();
}

}  // namespace meshtrain
