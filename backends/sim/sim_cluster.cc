// SimCluster: building the simulated cluster, its jobs and their
// representatives (and, in full fidelity, every other rank as a replica),
// and run(), which times everything they issued and reports it.
#include "backends/sim/sim_cluster.h"

#include <algorithm>
#include <string_view>

#include "backends/sim/sim_backend.h"
#include "backends/sim/sim_internal.h"

namespace meshtrain {

using sim_internal::misuse;
using sim_internal::seconds;

namespace {

Status check_job(const SimJob& job, int index, int num_gpus, bool full) {
  const std::string where = fmt::format("job {}", index);
  if (job.world_size < 1) return make_error("{}: needs at least one rank", where);
  if (job.representatives.empty()) return make_error("a simulation needs at least one representative rank");
  std::vector<int> sorted = job.representatives;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return make_error("representative ranks must be distinct");
  if (sorted.front() < 0 || sorted.back() >= job.world_size)
    return make_error("representative rank {} is outside the world of {} ranks",
                      sorted.front() < 0 ? sorted.front() : sorted.back(), job.world_size);
  if (!job.gpus.empty() && static_cast<int>(job.gpus.size()) != job.world_size)
    return make_error("{}: {} GPUs placed for {} ranks", where, job.gpus.size(), job.world_size);
  for (int g : job.gpus)
    if (g < 0 || g >= num_gpus) return make_error("{}: GPU {} is outside the cluster of {}", where, g, num_gpus);
  if (!full && (!job.stragglers.empty() || !job.replicas.empty()))
    return make_error("{}: stragglers and replicas need full fidelity (every rank simulated)", where);
  if (!job.stands_for.empty() && job.stands_for.size() != job.representatives.size())
    return make_error("{}: {} class sizes for {} representatives", where, job.stands_for.size(),
                      job.representatives.size());
  if (full) {
    if (job.replicas.size() != job.representatives.size() || !job.rank_map)
      return make_error("{}: full fidelity needs each representative's class of ranks and a rank map", where);
    std::vector<int> covered = job.representatives;
    for (const auto& members : job.replicas) covered.insert(covered.end(), members.begin(), members.end());
    std::sort(covered.begin(), covered.end());
    for (int r = 0; r < job.world_size; ++r)
      if (r >= static_cast<int>(covered.size()) || covered[static_cast<std::size_t>(r)] != r)
        return make_error("{}: the classes of ranks must cover ranks 0..{} once each", where, job.world_size - 1);
  }
  for (const auto& [rank, f] : job.stragglers) {
    if (rank < 0 || rank >= job.world_size)
      return make_error("{}: straggler rank {} is outside the world of {} ranks", where, rank, job.world_size);
    if (!(f > 0) || !std::isfinite(f)) return make_error("{}: straggler factor {} must be > 0", where, f);
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<SimCluster>> SimCluster::create(const sim::ClusterSpec& spec, int world_size,
                                                       std::vector<int> representatives,
                                                       SimOptions options) {
  SimJob job;
  job.world_size = world_size;
  job.representatives = std::move(representatives);
  return create_jobs(spec, world_size, std::vector<SimJob>{std::move(job)}, std::move(options));
}

Result<std::unique_ptr<SimCluster>> SimCluster::create_jobs(const sim::ClusterSpec& spec, int num_gpus,
                                                            std::vector<SimJob> jobs, SimOptions options) {
  if (jobs.empty()) return make_error("a simulation needs at least one job");
  const bool full = options.fidelity == Fidelity::full;
  std::vector<int> owner(static_cast<std::size_t>(std::max(num_gpus, 0)), -1);
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    MT_TRY(check_job(jobs[j], static_cast<int>(j), num_gpus, full));
    if (jobs.size() > 1 && !full) return make_error("several jobs on one cluster need full fidelity");
    for (int r = 0; r < jobs[j].world_size; ++r) {
      const int g = jobs[j].gpus.empty() ? r : jobs[j].gpus[static_cast<std::size_t>(r)];
      if (g >= num_gpus) return make_error("job {}: rank {} is on GPU {}, outside the cluster of {}", j, r, g, num_gpus);
      if (owner[static_cast<std::size_t>(g)] >= 0)
        return make_error("GPU {} is given twice (job {} and job {})", g, owner[static_cast<std::size_t>(g)], j);
      owner[static_cast<std::size_t>(g)] = static_cast<int>(j);
    }
  }
  if (!full && !options.links.empty())
    return make_error("degraded or failed links need full fidelity (every rank's flows on the network)");
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
  MT_ASSIGN(sim::Cluster cluster, sim::Cluster::build(effective, num_gpus));
  for (const LinkChange& change : options.links) {
    MT_ASSIGN(auto cable, cluster.cable(change.cable));
    if (!change.fail && !(change.factor > 0 && std::isfinite(change.factor)))
      return make_error("link '{}': factor {} must be > 0", change.cable, change.factor);
    for (sim::LinkId l : cable) {
      if (change.fail) cluster.fail(l);
      else cluster.scale_bandwidth(l, change.factor);
    }
  }
  const sim::HostSharing sharing = options.host_sharing;
  std::unique_ptr<SimCluster> sim(new SimCluster(std::move(cluster), spec, std::move(jobs), std::move(options)));
  if (sharing.on()) {
    // A representative computes for every rank of its class (they run the same ops at the same time).
    std::vector<double> ranks(static_cast<std::size_t>(num_gpus), 1.0);
    if (!full)
      for (std::size_t j = 0; j < sim->jobs_.size(); ++j) {
        const SimJob& job = sim->jobs_[j];
        for (std::size_t i = 0; i < job.representatives.size(); ++i)
          ranks[static_cast<std::size_t>(sim->gpu(static_cast<int>(j), job.representatives[i]))] =
              job.stands_for.empty()
                  ? static_cast<double>(job.world_size) / static_cast<double>(job.representatives.size())
                  : job.stands_for[i];
      }
    MT_TRY(sim->executor_->share_host(sharing, std::move(ranks)));
  }
  return sim;
}

SimCluster::SimCluster(sim::Cluster cluster, const sim::ClusterSpec& spec, std::vector<SimJob> jobs,
                       SimOptions options)
    : cluster_(std::move(cluster)),
      spec_(spec),
      cost_(spec.device, constants_, options.calibration),
      options_(options),
      jobs_(std::move(jobs)),
      rank_of_gpu_(static_cast<std::size_t>(cluster_.num_gpus()), {-1, -1}) {
  sim::ExecutorOptions eo{options.mode, options.trace};
  if (full() && options.isolate_exclusive) {
    eo.isolate_exclusive = true;
    eo.merge_compute = !options.trace;  // a trace shows every op
  }
  executor_ = std::make_unique<sim::Executor>(cluster_, constants_, eo);
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    const int job = static_cast<int>(j);
    for (int r = 0; r < jobs_[j].world_size; ++r) rank_of_gpu_[static_cast<std::size_t>(gpu(job, r))] = {job, r};
    for (int rep : jobs_[j].representatives) {
      rep_index_[{job, rep}] = backends_.size();
      backends_.push_back(std::make_unique<SimBackend>(*this, job, rep, jobs_[j].world_size, gpu(job, rep)));
    }
    stage_of_rank_.push_back(jobs_[j].stage_of);
    if (!jobs_[j].stages) continue;
    // A representative's stage is its index; its replicas' (full fidelity) the same.
    std::vector<int>& stage = stage_of_rank_.back();
    stage.assign(static_cast<std::size_t>(jobs_[j].world_size), -1);
    for (std::size_t s = 0; s < jobs_[j].representatives.size(); ++s) {
      stage[static_cast<std::size_t>(jobs_[j].representatives[s])] = static_cast<int>(s);
      if (s < jobs_[j].replicas.size())
        for (int r : jobs_[j].replicas[s]) stage[static_cast<std::size_t>(r)] = static_cast<int>(s);
    }
  }
}

SimCluster::~SimCluster() = default;

sim::Time SimCluster::host_copy(double bytes, int world_size) const {
  bool measured = false;
  if (options_.calibration != nullptr)
    for (const auto& l : options_.calibration->links) measured = measured || l.kind == "pcie";
  const double sharing = std::min(spec_.gpus_per_pcie_switch, world_size);
  const double rate = spec_.pcie_bandwidth * (measured ? 1.0 : constants_.pcie_copy_efficiency) / sharing;
  return spec_.pcie_latency + sim::from_seconds(bytes / rate);
}

int SimCluster::gpu(int job, int rank) const {
  const SimJob& j = jobs_[static_cast<std::size_t>(job)];
  return j.gpus.empty() ? rank : j.gpus[static_cast<std::size_t>(rank)];
}

SimBackend& SimCluster::backend(int job, int rank) {
  auto it = rep_index_.find({job, rank});
  if (it == rep_index_.end()) misuse("rank {} of job {} is not a representative of this simulation", rank, job);
  return *backends_[it->second];
}

void SimCluster::fail(Error e) {
  if (!error_) error_ = std::move(e);
}

Status SimCluster::replicate() {
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    const SimJob& job = jobs_[j];
    const int ji = static_cast<int>(j);
    for (std::size_t i = 0; i < job.representatives.size(); ++i) {
      const int rep = job.representatives[i];
      for (int member : job.replicas[i]) {
        // Devices the representative's tasks name -> the member's.
        auto map = [this, ji, rep, member, &job](int device) {
          const auto [owner, rank] = rank_of_gpu_[static_cast<std::size_t>(device)];
          if (owner != ji) return -1;
          const int mapped = job.rank_map(rep, member, rank);
          return mapped < 0 || mapped >= job.world_size ? -1 : gpu(ji, mapped);
        };
        MT_TRY(executor_->replicate(gpu(ji, rep), gpu(ji, member), map)
                   .context(fmt::format("job {}: rank {} as rank {}", j, member, rep)));
      }
    }
    for (const auto& [rank, f] : job.stragglers) MT_TRY(executor_->set_compute_factor(gpu(ji, rank), f));
  }
  return ok_status();
}

Result<SimReport> SimCluster::run() {
  if (ran_) return make_error("this simulation already ran; build a new SimCluster for another");
  ran_ = true;
  if (error_) return *error_;
  if (full()) MT_TRY(replicate());
  MT_ASSIGN(sim::RunReport r, executor_->run());
  SimReport out;
  out.iteration_s = seconds(r.makespan);
  out.events = r.events;
  out.tasks_run = r.tasks_run;
  out.flows = r.flows;
  out.isolated_collectives = r.isolated_collectives;
  out.isolated_overlaps = r.isolated_overlaps;
  out.collectives = analytic_stats_;
  for (int k = 0; k < sim::kNumCollectiveKinds; ++k) {
    out.collectives[k].time_s += seconds(r.collective_time[k]);
    out.collectives[k].count += r.collective_count[k];
    // In full fidelity every collective is an executor collective: its
    // bytes are the executor's (the representatives' issue counts none twice).
    if (full()) out.collectives[k].bytes = r.collective_bytes[k];
  }
  // Reports keep stream creation order within a device, and each backend
  // creates its default (compute) stream first.
  std::vector<const sim::StreamReport*> first(static_cast<std::size_t>(cluster_.num_gpus()), nullptr);
  std::vector<sim::Time> end(first.size(), 0);
  for (const sim::StreamReport& s : r.streams) {
    out.tasks += s.tasks;
    const auto d = static_cast<std::size_t>(s.device);
    if (first[d] == nullptr) first[d] = &s;
    end[d] = std::max(end[d], s.end);
  }
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    SimJobReport jr;
    sim::Time last = 0;
    for (int rank = 0; rank < jobs_[j].world_size; ++rank) {
      const auto d = static_cast<std::size_t>(gpu(static_cast<int>(j), rank));
      last = std::max(last, end[d]);
      if (!full()) continue;
      jr.compute_s.push_back(first[d] ? seconds(first[d]->compute) : 0.0);
      jr.end_s.push_back(seconds(end[d]));
    }
    jr.iteration_s = seconds(last);
    out.jobs.push_back(std::move(jr));
  }
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    SimBackend& b = *backends_[i];
    SimRankReport rr;
    rr.rank = b.rank();
    rr.peak_bytes = b.memory_stats().peak_bytes;
    rr.host_peak_bytes = b.memory_stats().host_peak_bytes;
    rr.host_work = b.host_work();
    rr.compute_s = b.compute_seconds();
    rr.compute_stream_s = b.compute_stream_seconds();
    const auto d = static_cast<std::size_t>(b.device());
    for (const auto& [name, region] : b.regions()) rr.regions[name] = {region.compute_s, region.sent_bytes};
    for (const sim::StreamReport& s : r.streams)
      if (s.device == b.device()) rr.tasks += s.tasks;
    if (first[d] != nullptr) rr.compute_busy_s = seconds(first[d]->busy);
    if (first[d] != nullptr) rr.idle_causes = first[d]->idle;
    rr.idle_s = std::max(0.0, out.jobs[static_cast<std::size_t>(b.job())].iteration_s - rr.compute_busy_s);
    out.ranks.push_back(rr);
  }
  return out;
}

}  // namespace meshtrain
