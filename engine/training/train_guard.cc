#include "engine/training/train_guard.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "backends/allocation_failure.h"
#include "core/host_memory.h"
#include "core/json_input.h"
#include "engine/memory/memory_model.h"
#include "engine/memory/out_of_memory.h"
#include "engine/plan/segment_plan.h"
#include "engine/training/stop_request.h"
#include "models/parameters.h"

namespace meshtrain {

void warn(std::string_view message) {
  std::fflush(stdout);
  fmt::print(stderr, "meshtrain train: warning: {}\n", message);
}

namespace {

// One rank's estimated host memory, standing for `count` ranks alike.
struct RankNeed {
  int rank = 0;
  std::string where;  // position_holders: who holds the same
  MemoryBreakdown model;
  int count = 0;
};

// By pipeline position (pipeline_positions: ranks holding the same stage of
// every segment hold the same memory), its lowest rank's need.
std::vector<RankNeed> rank_needs(const ModelSpec& m, const Plan& p, const std::vector<int>& positions) {
  std::vector<RankNeed> out;
  for (int rank = 0; rank < p.world_size(); ++rank) {
    // Positions are numbered in order of first appearance: a new one is the next index.
    const auto at = static_cast<std::size_t>(positions[static_cast<std::size_t>(rank)]);
    if (at == out.size()) out.push_back({rank, position_holders(p, rank), rank_memory(m, p, rank)});
    ++out[at].count;
  }
  return out;
}

}  // namespace

namespace {

// What a rank of this run holds on the host besides its model state: its
// copy of the data and, when checkpointing, the gathered full state
// (parameters and both moments).
std::vector<MemoryConsumer> host_extras(const TrainOptions& o, const ModelSpec& m) {
  std::vector<MemoryConsumer> out;
  std::error_code ec;
  const auto file_bytes = std::filesystem::file_size(o.data, ec);
  if (!ec && file_bytes > 0) out.push_back({"copy of the --data file", static_cast<double>(file_bytes)});
  if (!o.checkpoint_dir.empty())
    out.push_back({"checkpoint's gathered full state", 3.0 * static_cast<double>(count_parameters(m).total) * sizeof(float)});
  return out;
}

double total_of(const RankNeed& n, const std::vector<MemoryConsumer>& extras) {
  double t = n.model.total();
  for (const MemoryConsumer& e : extras) t += e.bytes;
  return t;
}

// What every rank of the run needs together: rank threads share this machine, so their sum is what must fit.
double all_ranks_total(const std::vector<RankNeed>& needs, const std::vector<MemoryConsumer>& extras) {
  double together = 0;
  for (const RankNeed& n : needs) together += total_of(n, extras) * n.count;
  return together;
}

std::vector<MemoryConsumer> consumers_of(const RankNeed& n, const std::vector<MemoryConsumer>& extras) {
  std::vector<MemoryConsumer> out = memory_consumers(n.model);
  out.insert(out.end(), extras.begin(), extras.end());
  return out;
}

constexpr const char* kHostMemoryFix =
    "Use a smaller model, --micro-batch or --seq-len, --recompute full, more pipeline stages, or spread the "
    "ranks over processes (mpirun)";

}  // namespace

Status check_train_memory(const TrainOptions& o, const ModelSpec& m, const Plan& p, int host_ranks) {
  if (host_ranks <= 0) return ok_status();
  // Each rank here holds its stage's parameters, gradients, AdamW state and
  // activations (memory_model.h) and the extras above.
  const std::vector<MemoryConsumer> extras = host_extras(o, m);
  const std::vector<RankNeed> needs = rank_needs(m, p, pipeline_positions(p));
  const RankNeed* top = &needs.front();
  for (const RankNeed& n : needs)
    if (total_of(n, extras) > total_of(*top, extras)) top = &n;
  const double needed = host_ranks == 1 ? total_of(*top, extras) : all_ranks_total(needs, extras);
  const double have = host_memory_bytes();
  if (needed <= have) return ok_status();
  OutOfMemory oom;
  oom.rank = top->rank;
  oom.where = top->where;
  oom.peak = total_of(*top, extras);
  oom.capacity = have;
  oom.capacity_of = "this machine";
  oom.sharing_ranks = host_ranks;
  oom.shared_total = needed;
  oom.consumers = consumers_of(*top, extras);
  oom.detail = fmt::format("training model '{}' on the cpu backend with {} rank{} in this process", m.name, host_ranks,
                           host_ranks == 1 ? "" : "s");
  oom.fix = kHostMemoryFix;
  return make_error("{}", out_of_memory_message(oom));
}

Status explain_allocation_failure(Status status, const TrainOptions& o, const ModelSpec& m, const Plan& p, int rank,
                                  int host_ranks) {
  if (status.ok() || !is_allocation_failure(status.error())) return status;
  if (rank < 0 || rank >= p.world_size()) return status;
  const std::vector<int> positions = pipeline_positions(p);
  const std::vector<RankNeed> needs = rank_needs(m, p, positions);
  const std::size_t at = static_cast<std::size_t>(positions[static_cast<std::size_t>(rank)]);
  // The data copy and the gathered checkpoint state live in host memory: they count against a host
  // failure only, not against a GPU's (host_ranks 0: the cuda backend).
  const std::vector<MemoryConsumer> extras = host_ranks > 0 ? host_extras(o, m) : std::vector<MemoryConsumer>{};
  const RankNeed& need = needs[at];
  const MemoryConsumer top = largest_consumer(consumers_of(need, extras));
  std::string why = fmt::format("rank {} ran out of memory; the memory model estimates its peak at {}, "
                                "of which the largest consumer is the {} ({})",
                                rank, human_bytes(total_of(need, extras)), top.name, human_bytes(top.bytes));
  if (host_ranks > 0) {
    why += fmt::format(", against this machine's {}{}. {}", human_bytes(host_memory_bytes()),
                       host_ranks > 1 ? fmt::format(" for the {} ranks of this process, which need {} together",
                                                    host_ranks, human_bytes(all_ranks_total(needs, extras)))
                                      : "",
                       kHostMemoryFix);
  }
  return Error(status.error().message() + ". " + why);
}

namespace {

// The float as the shortest decimal that reads back as it (0.99, not
// 0.9900000095367432): what a person typed, and what names it in messages.
double shortest(float v) { return std::stod(fmt::format("{}", v)); }

}  // namespace

nlohmann::json run_record(const TrainOptions& o, const std::string& data_path, std::span<const std::uint8_t> data) {
  return {{"data", {{"path", data_path}, {"bytes", data.size()}, {"crc32", checkpoint_crc32(data)}}},
          {"steps", o.steps},
          {"lr", o.lr},
          {"min_lr", o.min_lr},
          {"warmup", warmup_steps(o)},
          {"lr_decay", lr_decay_name(o.lr_decay)},
          {"decay_steps", decay_steps(lr_schedule(o))},
          {"dropout", o.step.dropout},
          {"weight_decay", o.step.optimizer.weight_decay},
          {"weight_decay_params", decayed_params_name(o.step.optimizer.decayed)},
          {"adam_beta1", shortest(o.step.optimizer.beta1)},
          {"adam_beta2", shortest(o.step.optimizer.beta2)},
          {"adam_eps", shortest(o.step.optimizer.eps)},
          {"grad_clip", o.step.optimizer.max_grad_norm}};
}

// The run record's keys that define the optimizer state, with their flags.
constexpr std::pair<const char*, const char*> kOptimizerState[] = {{"adam_beta1", "--adam-beta1"},
                                                                   {"adam_beta2", "--adam-beta2"},
                                                                   {"adam_eps", "--adam-eps"},
                                                                   {"weight_decay_params", "--weight-decay-params"}};

Status check_resume(const CheckpointMeta& meta, const TrainOptions& o, const nlohmann::json& run, bool leader) {
  const std::string& dir = o.checkpoint_dir;
  if (meta.step > o.steps)
    return make_error("the checkpoint in '{}' is at step {}, beyond --steps {}; resume with --steps {} or more to "
                      "continue it", dir, meta.step, o.steps, meta.step + 1);
  if (o.stop_at > 0 && o.stop_at <= meta.step)
    return make_error("--stop-at {} is not after the checkpoint's step {} in '{}'; pass a later --stop-at",
                      o.stop_at, meta.step, dir);
  const nlohmann::json& was = meta.run;
  if (!was.is_object()) return ok_status();  // written before checkpoints recorded their run
  // The same bytes are the same data, wherever the file now lies.
  const nlohmann::json& b = run["data"];
  const nlohmann::json a = was.contains("data") && was["data"].is_object() ? was["data"] : nlohmann::json::object();
  if (was.contains("data") && (a.value("bytes", nlohmann::json()) != b["bytes"] ||
                               a.value("crc32", nlohmann::json()) != b["crc32"])) {
    return make_error("the checkpoint in '{}' was trained on --data {} ({} bytes, crc32 {}), this run reads {} ({} "
                      "bytes, crc32 {}); the data loader's position refers to the first: resume with that --data, "
                      "or start a new run in another --checkpoint directory",
                      dir, json_excerpt(a.value("path", nlohmann::json())), json_excerpt(a.value("bytes", nlohmann::json())),
                      json_excerpt(a.value("crc32", nlohmann::json())), json_excerpt(b["path"]), json_excerpt(b["bytes"]),
                      json_excerpt(b["crc32"]));
  }
  // AdamW's moments were accumulated under these: a resume keeps them (the
  // CLI takes them from the checkpoint unless given), and refuses others.
  for (const auto& [key, flag] : kOptimizerState) {
    if (!was.contains(key) || was[key] == run[key]) continue;
    return make_error("the checkpoint in '{}' was trained with {} {}, this run gives {} {}; its AdamW state was "
                      "accumulated under the first: resume without {} (the checkpoint's value is used), or start a "
                      "new run in another --checkpoint directory",
                      dir, flag, json_excerpt(was[key]), flag, json_excerpt(run[key]), flag);
  }
  if (!leader) return ok_status();
  std::string changes;
  for (const char* key :
       {"steps", "lr", "min_lr", "warmup", "lr_decay", "decay_steps", "dropout", "weight_decay", "grad_clip"}) {
    if (!was.contains(key) || was[key] == run[key]) continue;
    changes += fmt::format("{}{} {} (was {})", changes.empty() ? "" : ", ", key, json_excerpt(run[key]),
                           json_excerpt(was[key]));
  }
  if (!changes.empty())
    warn(fmt::format("resuming '{}' at step {} with {}; the run continues under the new settings", dir, meta.step,
                     changes));
  return ok_status();
}

StopVote::StopVote(Backend& b, Group world) : b_(b), world_(std::move(world)), flag_(b.empty(Shape{1})) {}

Result<int> StopVote::agree() {
  float v = static_cast<float>(stop_signal());
  if (world_.size() > 1) {
    b_.write(flag_, std::span<const float>(&v, 1));
    b_.all_reduce(flag_, world_, ReduceOp::max);
    MT_TRY(b_.read(flag_, std::span<float>(&v, 1)));
  }
  const int signal = static_cast<int>(v);
  if (signal != 0) request_stop(signal);
  return signal;
}

Status StopVote::barrier() {
  if (world_.size() > 1) b_.barrier(world_);
  return b_.synchronize();
}

}  // namespace meshtrain
