// SimCluster: building the simulated cluster and its representatives, and
// run(), which times everything they issued and reports it.
#include "backends/sim/sim_cluster.h"

#include <algorithm>
#include <string_view>

#include "backends/sim/sim_backend.h"
#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;
using sim_internal::seconds;

Result<std::unique_ptr<SimCluster>> SimCluster::create(const sim::ClusterSpec& spec, int world_size,
                                                       std::vector<int> representatives,
                                                       SimOptions options) {
  if (representatives.empty())
    return make_error("a simulation needs at least one representative rank");
  std::vector<int> sorted = representatives;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return make_error("representative ranks must be distinct");
  if (sorted.front() < 0 || sorted.back() >= world_size)
    return make_error("representative rank {} is outside the world of {} ranks",
                      sorted.front() < 0 ? sorted.front() : sorted.back(), world_size);
  // Links at the share of their line rate that collectives reach
  // (CostConstants), except those a calibration measured (already achieved
  // rates, applied to `spec` by apply_link_calibration). PCIe only carries
  // GPU<->NIC traffic at the NIC's rate and is left as is.
  const sim::CostConstants constants;
  auto measured = [&](std::string_view kind) {
    if (options.calibration == nullptr) return false;
    for (const auto& l : options.calibration->links)
      if (l.kind == kind) return true;
    return false;
  };
  sim::ClusterSpec effective = spec;
  if (!measured("nvlink")) effective.nvlink_bandwidth *= constants.nvlink_efficiency;
  if (!measured("nic")) effective.nic_bandwidth *= constants.network_efficiency;
  MT_ASSIGN(sim::Cluster cluster, sim::Cluster::build(effective, world_size));
  return std::unique_ptr<SimCluster>(
      new SimCluster(std::move(cluster), spec, std::move(representatives), options));
}

SimCluster::SimCluster(sim::Cluster cluster, const sim::ClusterSpec& spec, std::vector<int> reps,
                       SimOptions options)
    : cluster_(std::move(cluster)),
      cost_(spec.device, constants_, options.calibration),
      options_(options),
      reps_(std::move(reps)) {
  executor_ = std::make_unique<sim::Executor>(cluster_, constants_,
                                              sim::ExecutorOptions{options.mode, options.trace});
  for (std::size_t i = 0; i < reps_.size(); ++i) {
    rep_index_[reps_[i]] = i;
    backends_.push_back(std::make_unique<SimBackend>(*this, reps_[i], cluster_.num_gpus()));
  }
}

SimCluster::~SimCluster() = default;

SimBackend& SimCluster::backend(int global_rank) {
  auto it = rep_index_.find(global_rank);
  if (it == rep_index_.end())
    misuse("rank {} is not a representative of this simulation", global_rank);
  return *backends_[it->second];
}

void SimCluster::fail(Error e) {
  if (!error_) error_ = std::move(e);
}

Result<SimReport> SimCluster::run() {
  if (ran_) return make_error("this simulation already ran; build a new SimCluster for another");
  ran_ = true;
  if (error_) return *error_;
  MT_ASSIGN(sim::RunReport r, executor_->run());
  SimReport out;
  out.iteration_s = seconds(r.makespan);
  out.events = r.events;
  out.collectives = analytic_stats_;
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    out.collectives[k].time_s += seconds(r.collective_time[k]);
    out.collectives[k].count += r.collective_count[k];
  }
  for (const sim::StreamReport& s : r.streams) out.tasks += s.tasks;
  for (std::size_t i = 0; i < reps_.size(); ++i) {
    SimBackend& b = *backends_[i];
    SimRankReport rr;
    rr.rank = reps_[i];
    rr.peak_bytes = b.memory_stats().peak_bytes;
    rr.compute_s = b.compute_seconds();
    for (const auto& [name, region] : b.regions()) rr.regions[name] = {region.compute_s, region.sent_bytes};
    for (const sim::StreamReport& s : r.streams)
      if (s.device == reps_[i]) rr.tasks += s.tasks;
    // Reports keep stream creation order within a device, and each
    // backend creates its default (compute) stream first.
    for (const sim::StreamReport& s : r.streams)
      if (s.device == reps_[i]) {
        rr.compute_busy_s = seconds(s.busy);
        break;
      }
    rr.idle_s = std::max(0.0, out.iteration_s - rr.compute_busy_s);
    out.ranks.push_back(rr);
  }
  return out;
}

}  // namespace meshtrain
